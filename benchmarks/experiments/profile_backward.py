"""flashsci's sm80 attention backward (main kernel) and SDPA's FlashAttention-2 backward at B * S = 16k, H * D = 2048,
S = 4096, bf16, for Nsight Compute: one backward each after a warm-up, inside cudaProfilerStart / Stop:
    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section WarpStateStats \
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis python benchmarks/experiments/profile_backward.py 64"""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashsci

F = torch.nn.functional
d = int(sys.argv[1]) if len(sys.argv) > 1 else 128
flashsci._flashsci._set_attention_kernel("sm80")  # on Hopper the wgmma backward would take these
b, h, s = 4, 2048 // d, 4096
q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
out, lse = flashsci.attention(q, k, v, return_lse=True)
leaves = [x.detach().requires_grad_() for x in (q, k, v)]
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    o = F.scaled_dot_product_attention(*leaves)
for _ in range(2):
    flashsci.attention_backward(do, q, k, v, out, lse)
    torch.autograd.grad(o, leaves, do, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
flashsci.attention_backward(do, q, k, v, out, lse)
torch.autograd.grad(o, leaves, do, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
