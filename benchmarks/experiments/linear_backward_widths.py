"""The backward products (dx = dh W, dW = dh^T x) at each Hopper tile width against cuBLAS, by CUDA-graph replay,
every width and torch taking turns, at the linear_train shapes and the LM grid's xl SwiGLU (16k tokens, bf16): does
the width rule's choice hold for transposed operands?
    python benchmarks/experiments/linear_backward_widths.py"""
import math

import torch

import flashsci
from flashsci.bench.timing import graph_kernel_times_us

WIDTHS = ("auto", "sm90:128", "sm90:192", "sm90:256")


def products(width):
    """dx and dW by flashsci.linear_backward on the Hopper GEMM at the given width (captured with it)."""
    def run(x, w, d):
        flashsci._flashsci._set_gemm_kernel(width)
        return flashsci.linear_backward(d, x, w)
    return run


print(torch.cuda.get_device_name())
for name, m, k, n in [("ESM2-3B fc1", 16384, 2560, 10240), ("ESM2-3B fc2", 16384, 10240, 2560),
                      ("ESM2-650M fc1", 16384, 1280, 5120), ("ESM-C ffn (2N)", 16384, 1152, 6144),
                      ("LM xl SwiGLU (2N)", 16384, 1600, 12800)]:
    sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
             (torch.randn(n, k, device="cuda") / math.sqrt(k)).to(torch.bfloat16),
             torch.randn(m, n, device="cuda", dtype=torch.bfloat16)) for _ in range(2)]
    fns = {width: products(width) for width in WIDTHS}
    fns["torch"] = lambda x, w, d: (d @ w, d.T @ x)
    try:
        t = graph_kernel_times_us(torch, fns, sets)
    finally:
        flashsci._flashsci._set_gemm_kernel("auto")
    cells = [f"{w.replace('sm90:', '')} {us:7.1f} us ({t['torch'] / us:.3f}x)" for w, us in t.items() if w != "torch"]
    print(f"{name:18s} " + "  ".join(cells) + f"  torch {t['torch']:7.1f} us", flush=True)
    del sets
