"""Diagnose the split-KV path: profile the kernels of one split config."""
import torch
from torch.profiler import ProfilerActivity, profile

import flashsci

q, k, v = (torch.randn(1, 1, 512, 64, device="cuda", dtype=torch.float16) for _ in range(3))
for _ in range(10):
    flashsci.attention(q, k, v)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(20):
        flashsci.attention(q, k, v)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
