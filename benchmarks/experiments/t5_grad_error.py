"""The T5 table's gradient: max error against float64 of the Hopper kernel's, the portable kernel's (forced) and torch's
own low-precision one (SDPA's math backend, bf16), three fresh draws per case (B, H, S = 2, 4, 333).
   python3 benchmarks/experiments/t5_grad_error.py"""
import sys

import torch

import flashsci

sys.path.insert(0, "tests")
from test_attention_backward_gpu import attention64, attention_lowp, bias_t5_grads, rand  # noqa: E402

for d, scale in [(128, 1.0), (64, 1.0), (128, 128 ** -0.5), (64, 64 ** -0.5)]:
    for _ in range(3):
        b, h, s = 2, 4, 333
        q, k, v, dout = (rand(b, h, s, d, dtype=torch.bfloat16) for _ in range(4))
        table = torch.randn(h, 32, device="cuda")
        kw = dict(t5_bias=(table, 32, 128, True), scale=scale)
        out, lse = flashsci.attention(q, k, v, return_lse=True, **kw)
        (ref,) = bias_t5_grads(attention64, q.double(), k.double(), v.double(), dout.double(), table=table.double(),
                               scale=scale)
        (theirs,) = bias_t5_grads(attention_lowp, q, k, v, dout, table=table, dtype=q.dtype, scale=scale)
        errs = {}
        for kernel in ("auto", "sm80"):
            flashsci._flashsci._set_attention_kernel(kernel)
            dtable = flashsci.attention_backward(dout, q, k, v, out, lse, t5_grad=True, **kw)[3]
            errs[kernel] = (dtable.double() - ref).abs().max().item()
        flashsci._flashsci._set_attention_kernel("auto")
        print(f"D = {d}, scale {scale:.3f}: dtable max error Hopper {errs['auto']:.4f}, portable {errs['sm80']:.4f}, "
              f"torch {(theirs.double() - ref).abs().max().item():.4f} (largest entry {ref.abs().max().item():.3f})",
              flush=True)
