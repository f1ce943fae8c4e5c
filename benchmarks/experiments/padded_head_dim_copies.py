"""Head dims without a kernel of their own, kernel by kernel: one causal forward and one backward of the 2.7B LM's
attention (4, 32, S, D, rotary, bf16) under torch.profiler, every kernel in launch order with its time, at D = 80 and
112 (on Hopper the D = 128 kernel reading them directly), 72 (padded copies) and 128 (native); then whole-call times
by CUDA events (median of 20) against SDPA without rotary, and D = 96 on the Hopper kernel against the portable one.
    python benchmarks/experiments/padded_head_dim_copies.py [S]"""
import sys

import torch
import flashsci
import flashsci.torch_ops
from flashsci.profile.report import launch_listing
from flashsci.profile.trace import capture

S = int(sys.argv[1]) if len(sys.argv) > 1 else 2048


def inputs(D, grad=True):
    return [torch.randn(4, S, 32, D, device="cuda", dtype=torch.bfloat16, requires_grad=grad) for _ in range(3)]


def fwd_bwd(q, k, v):
    o = flashsci.torch_ops.attention(q, k, v, causal=True, layout="bshd", rotary_base=10000.0)
    o.backward(torch.randn_like(o))


def timed(fn, n=20):
    ts = []
    for _ in range(n + 3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts[3:])[n // 2]


print(torch.cuda.get_device_name(), f"S = {S}")
for D in (72, 80, 112, 128):
    q, k, v = inputs(D)
    fwd_bwd(q, k, v)
    _, t = capture(lambda: fwd_bwd(q, k, v))
    print(f"D = {D}: kernels of one forward + backward")
    print("\n".join(launch_listing(t, 100)))
    print(f"D = {D}: forward+backward {timed(lambda: fwd_bwd(q, k, v)):.3f} ms")
for D in (80, 112):
    q, k, v = inputs(D)

    def sdpa():
        o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                             is_causal=True)
        o.backward(torch.randn_like(o))
    print(f"SDPA D = {D} (no rotary): forward+backward {timed(sdpa):.3f} ms")
q, k, v = inputs(96)
for turn in range(2):
    for kernel in ("auto", "sm80"):
        flashsci._flashsci._set_attention_kernel(kernel)
        try:
            print(f"D = 96 {kernel}: forward+backward {timed(lambda: fwd_bwd(q, k, v)):.3f} ms")
        finally:
            flashsci._flashsci._set_attention_kernel("auto")
