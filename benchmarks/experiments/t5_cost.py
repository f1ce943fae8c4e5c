"""Where the in-kernel T5 bias costs time on the Hopper kernel (ProtT5-XL heads, D=128, scale 1): the plain
kernel, the protein-option kernel without a bias (seqlens = full lengths), the T5 bias with ProtT5's buckets
(32, max distance 128), and a T5 bias whose buckets saturate two positions off the diagonal (the per-tile
constant path on every tile that does not cross the diagonal). CUDA-graph replay, inputs rotated past L2, the
four taking turns.
    python benchmarks/t5_cost.py"""
import torch

import flashsci
from flashsci.bench.timing import graph_kernel_times_us


def call(kw):
    """flashsci.attention at scale 1 with the options kw."""
    return lambda q, k, v: flashsci.attention(q, k, v, scale=1.0, **kw)


for b, s in ((32, 512), (16, 1024), (8, 2048)):
    h, d = 32, 128
    sets = [tuple(torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3)) for _ in range(4)]
    full = torch.full((b,), s, dtype=torch.int32, device="cuda")
    table = torch.randn(h, 32, device="cuda")
    variants = {"plain": {}, "seqlens=full": {"seqlens": full}, "t5 (32, 128)": {"t5_bias": (table, 32, 128, True)},
                "t5 (4, 2)": {"t5_bias": (table[:, :4], 4, 2, True)}}
    times = graph_kernel_times_us(torch, {name: call(kw) for name, kw in variants.items()}, sets)
    print(f"{b}x{h}x{s}x{d}: " + ", ".join(f"{name} {t:.1f}" for name, t in times.items()) + " us", flush=True)
