"""One causal attention forward with rotary at (4, H, 2048, D), five calls under torch.profiler, the top kernels per
call: D = 72 (padded to 128 through head copies on Hopper), 80 (read directly by the D = 128 kernel), 128 and 64, each
with its launch plan.
    python benchmarks/experiments/padded_head_dim_profile.py"""
import torch

import flashsci
from flashsci.profile.report import summary
from flashsci.profile.trace import capture

for D, H in ((72, 32), (80, 32), (128, 20), (64, 40)):
    print(D, flashsci._flashsci._launch_plan(4, H, 2048, 2048, D, True))
    q, k, v = (torch.randn(4, 2048, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def f():
        with torch.profiler.record_function("inference"):
            for _ in range(5):
                flashsci.attention(q, k, v, causal=True, layout="bshd", rotary=True)
    f()
    _, t = capture(f)
    s = summary(t, "inference", top=6)
    for n, c, ms in s["top"]:
        print(f"   {ms/5:8.3f} ms  {c//5}  {n[:110]}")
