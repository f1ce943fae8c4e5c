"""One causal attention backward at (4, 32, 2048, D), five calls under torch.profiler: the kernels
of each call with their times, D = 80 (the 2.7B LM's), 96, 128 and 64, so that a head dim's passes around the main
kernel show beside it.
    python benchmarks/experiments/backward_dim_profile.py [D ...]"""
import sys

import torch

import flashsci
from flashsci.profile.report import summary
from flashsci.profile.trace import capture

dims = [int(x) for x in sys.argv[1:]] or [80, 96, 128, 64]
for D in dims:
    H = 32
    q, k, v, dout = (torch.randn(4, H, 2048, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = flashsci.attention(q, k, v, causal=True, return_lse=True)

    def f():
        with torch.profiler.record_function("backward"):
            for _ in range(5):
                flashsci.attention_backward(dout, q, k, v, out, lse, causal=True)
    f()
    _, t = capture(f)
    s = summary(t, "backward", top=8)
    print(f"D = {D}, H = {H}: {s['total_ms'] / 5:.3f} ms a call")
    for n, c, ms in s["top"]:
        print(f"   {ms / 5:8.3f} ms  {c // 5}  {n[:110]}")
