"""Where a differentiable linear layer's time goes, flashsci against cuBLAS (torch), by CUDA-graph replay in turns:
the forward product, the two backward products (dx = dh W, dW = dh^T x) and the elementwise passes, at the
linear_train benchmark's shapes (16k tokens, bf16) and two without a partial last round of tiles.
    python3 benchmarks/experiments/linear_backward_split.py [first shape index]"""
import math
import sys

import torch

import flashsci
from flashsci.bench.timing import graph_kernel_times_us

F = torch.nn.functional
SHAPES = [("ESM2-3B fc1", 16384, 2560, 10240), ("ESM2-3B fc2", 16384, 10240, 2560), ("ESM-C ffn (2N)", 16384, 1152, 6144),
          ("square", 8192, 8192, 8192), ("square, 8 rounds", 8192, 4096, 16896)]
for name, m, k, n in SHAPES[int(sys.argv[1]) if len(sys.argv) > 1 else 0:]:
    sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k),
             torch.randn(m, n, device="cuda", dtype=torch.bfloat16)) for _ in range(2)]
    fwd = graph_kernel_times_us(torch, {"flashsci": lambda x, w, d: flashsci.linear(x, w), "torch": lambda x, w, d: F.linear(x, w)}, sets)
    dx = graph_kernel_times_us(torch, {"flashsci": lambda x, w, d: flashsci.linear_backward(d, x, w)[0],
                                       "torch": lambda x, w, d: (d @ w, d.T @ x)}, sets)
    dxa = graph_kernel_times_us(torch, {"flashsci": lambda x, w, d: flashsci.linear_backward(d, x, w, preactivation=d, activation="gelu", bias_grad=True),
                                        "torch": lambda x, w, d: (lambda g: (g @ w, g.T @ x, g.sum(0)))(torch.ops.aten.gelu_backward(d, d))}, sets)
    print(f"{name}: forward product {fwd['flashsci']:.0f} vs {fwd['torch']:.0f} us ({fwd['torch'] / fwd['flashsci']:.3f}x); "
          f"backward products {dx['flashsci']:.0f} vs {dx['torch']:.0f} us ({dx['torch'] / dx['flashsci']:.3f}x); "
          f"with gelu' + bias sum {dxa['flashsci']:.0f} vs {dxa['torch']:.0f} us ({dxa['torch'] / dxa['flashsci']:.3f}x)", flush=True)
    del sets
