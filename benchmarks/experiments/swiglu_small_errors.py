"""SwiGLU gradients at a tiny shape, 50 fresh draws per kernel: each gradient's max error against float64 next to
torch's own bf16 error (how often does the 2x rule fail, and by how much)."""
import math

import torch

import flashsci
import flashsci.torch_ops  # noqa: F401

F = torch.nn.functional


def grads(fn, inputs, dy):
    leaves = [t.detach().requires_grad_() for t in inputs]
    out = fn(*leaves)
    return torch.autograd.grad(out, leaves, dy.to(out.dtype))


for kern in ("sm80", "auto"):
    flashsci._flashsci._set_gemm_kernel(kern)
    worst, fails = 0.0, 0
    for _ in range(50):
        m, k, n = 5, 64, 24
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        wg, wu = ((torch.randn(n, k, device="cuda") / math.sqrt(k)).bfloat16() for _ in range(2))
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        ref_fn = lambda x, a, b: F.silu(x @ a.T) * (x @ b.T)  # noqa: E731
        ref = grads(ref_fn, (x.double(), wg.double(), wu.double()), dy.double())
        theirs = grads(ref_fn, (x, wg, wu), dy)
        dx, dw = grads(lambda x, w: torch.ops.flashsci.swiglu(x, w), (x, torch.cat([wg, wu])), dy)
        for a, b, r in zip((dx, dw[:n], dw[n:]), theirs, ref):
            e, t = (a.double() - r).abs().max().item(), (b.double() - r).abs().max().item()
            worst = max(worst, e / t)
            fails += e > 2 * t + 1e-6
    print(kern, "worst ratio to torch's error", round(worst, 2), "failures of 150", fails, flush=True)
