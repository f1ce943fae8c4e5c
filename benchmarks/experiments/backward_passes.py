"""The attention backward's kernels one by one, flashsci against SDPA's cuDNN backend: one backward each (bhsd, bf16)
under torch.profiler, every kernel in launch order with its time, then the whole backward calls by CUDA events
(median of 30, two turns). Shapes as B,H,S,D[,c] (c: causal):
    python benchmarks/experiments/backward_passes.py 32,16,512,128 8,18,1024,64 16,16,1024,128,c"""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashsci
from flashsci.bench.timing import median_event_time_us
from flashsci.profile.report import launch_listing
from flashsci.profile.trace import capture

print(torch.cuda.get_device_name())
for spec in sys.argv[1:] or ["32,16,512,128"]:
    parts = spec.split(",")
    B, H, S, D = (int(x) for x in parts[:4])
    causal = len(parts) > 4 and parts[4] == "c"
    q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = flashsci.attention(q, k, v, causal=causal, return_lse=True)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)

    def ours():
        flashsci.attention_backward(do, q, k, v, out, lse, causal=causal)

    def cudnn():
        torch.autograd.grad(o, leaves, do, retain_graph=True)

    for name, fn in (("flashsci", ours), ("cudnn", cudnn)):
        fn()
        _, t = capture(fn)
        print(f"{spec} {name}: kernels of one backward")
        print("\n".join(launch_listing(t, 110)))
    for turn in range(2):
        t_ours, t_cudnn = (median_event_time_us(torch, fn, 1, iters=30) for fn in (ours, cudnn))
        print(f"{spec}: flashsci {t_ours:.1f} us, cudnn {t_cudnn:.1f} us, ratio {t_cudnn / t_ours:.3f}")
