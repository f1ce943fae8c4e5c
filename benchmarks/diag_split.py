"""Diagnose the split-KV path: event timing of split and unsplit configs (run under ncu for details)."""
import sys

import torch

import flashsci

CONFIGS = [(1, 1, 512, 512), (1, 1, 256, 256), (1, 2, 64, 4000), (2, 8, 512, 512)]
for b, h, sq, sk in CONFIGS:
    q = torch.randn(b, h, sq, 64, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(b, h, sk, 64, device="cuda", dtype=torch.float16) for _ in range(2))
    for _ in range(5):
        flashsci.attention(q, k, v)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(50):
        flashsci.attention(q, k, v)
    e1.record()
    e1.synchronize()
    print(f"{(b, h, sq, sk)}: {e0.elapsed_time(e1) * 1e3 / 50:.1f} us per call", flush=True)
    if len(sys.argv) > 1:
        break
