"""flashsci's Hopper kernel and SDPA's cuDNN backend on the two longest D = 128 non-causal sweep shapes
(2 x 16 x 8192 and 1 x 16 x 16384, fp16) for Nsight Compute, one launch each after a warm-up, inside
cudaProfilerStart / Stop (so --profile-from-start off), in the order fs 8192, cuDNN 8192, fs 16384, cuDNN 16384:
    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        python benchmarks/profile_long.py"""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashsci
from flashsci.bench.timing import with_backend

F = torch.nn.functional
shapes = [(2, 16, 8192, 128), (1, 16, 16384, 128)]
inputs = [tuple(torch.randn(*s, device="cuda", dtype=torch.float16) for _ in range(3)) for s in shapes]

cudnn = with_backend(sdpa_kernel, SDPBackend.CUDNN_ATTENTION, F.scaled_dot_product_attention)

outs = [torch.empty_like(q) for q, _, _ in inputs]
for _ in range(2):
    for (q, k, v), o in zip(inputs, outs):
        flashsci.attention(q, k, v, out=o)
        cudnn(q, k, v)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for (q, k, v), o in zip(inputs, outs):
    flashsci.attention(q, k, v, out=o)
    cudnn(q, k, v)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("profiled in order: fs 8192, cudnn 8192, fs 16384, cudnn 16384", flush=True)
