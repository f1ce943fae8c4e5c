"""Small attention problems for Nsight Compute (one launch each after a warm-up):
    ncu --clock-control none --section SpeedOfLight --section WarpStateStats -k regex:attention_fwd \
        python benchmarks/profile_small.py"""
import sys

import torch

import flashsci

CONFIGS = [(1, 1, 64), (1, 1, 256), (1, 1, 512), (8, 8, 256)] if len(sys.argv) < 2 else \
    [tuple(int(x) for x in c.split("x")) for c in sys.argv[1:]]
for b, h, s in CONFIGS:
    q, k, v = (torch.randn(b, h, s, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    flashsci.attention(q, k, v)
    torch.cuda.synchronize()
    print((b, h, s), flashsci._flashsci._launch_plan(b, h, s, s, 64), flush=True)
