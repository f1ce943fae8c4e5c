"""Where the in-kernel T5 bias costs time on the Hopper kernel (ProtT5-XL heads, D=128, scale 1): the plain
kernel, the protein-option kernel without a bias (seqlens = full lengths), the T5 bias with ProtT5's buckets
(32, max distance 128), and a T5 bias whose buckets saturate two positions off the diagonal (the per-tile
constant path almost everywhere). CUDA-graph replay, inputs rotated past L2.
    python benchmarks/t5_cost.py"""
import torch

import flashsci
from flashsci.bench import graph_kernel_time_us

for b, s in ((32, 512), (16, 1024), (8, 2048)):
    h, d = 32, 128
    sets = [tuple(torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3)) for _ in range(4)]
    full = torch.full((b,), s, dtype=torch.int32, device="cuda")
    table = torch.randn(h, 32, device="cuda")
    variants = {"plain": {}, "seqlens=full": {"seqlens": full}, "t5 (32, 128)": {"t5_bias": (table, 32, 128, True)},
                "t5 (4, 2)": {"t5_bias": (table[:, :4], 4, 2, True)}}
    row = []
    for name, kw in variants.items():
        t = graph_kernel_time_us(torch, lambda q, k, v: flashsci.attention(q, k, v, scale=1.0, **kw), sets)
        row.append(f"{name} {t:.1f}")
    print(f"{b}x{h}x{s}x{d}: " + ", ".join(row) + " us", flush=True)
