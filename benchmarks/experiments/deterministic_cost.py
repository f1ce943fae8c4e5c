"""deterministic=True against the default attention backward on the backward sweep's shapes (B·S = 16k, H·D = 2048,
D = 64 and 128, causal and not; bf16), with cuDNN's backward for scale: python benchmarks/experiments/deterministic_cost.py."""
import torch

from flashsci.bench.backward import SWEEP, bench_dense

print(torch.cuda.get_device_name())
for causal in (False, True):
    for b, h, s, d in SWEEP:
        r = bench_dense(torch, torch.bfloat16, causal, "sweep", b, h, s, d)
        print(f"{b}x{h}x{s}x{d} causal={causal}: {r['flashsci TF/s']:.0f} TF/s, vs cuDNN {r['speedup vs cudnn']:.2f}x, "
              f"deterministic {r['deterministic us']:.0f} us = {r['deterministic / default']:.2f}x the default", flush=True)
