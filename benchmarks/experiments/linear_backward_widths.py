"""The backward products (dx = dh W, dW = dh^T x) at each Hopper tile width against cuBLAS, by CUDA-graph replay
in turns, at the linear_train shapes (16k tokens, bf16): does the width rule's choice hold for transposed operands?"""
import math

import torch

import flashsci
from flashsci.bench.timing import graph_kernel_times_us

for name, m, k, n in [("ESM2-3B fc1", 16384, 2560, 10240), ("ESM2-3B fc2", 16384, 10240, 2560),
                      ("ESM2-650M fc1", 16384, 1280, 5120), ("ESM-C ffn (2N)", 16384, 1152, 6144)]:
    sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k),
             torch.randn(m, n, device="cuda", dtype=torch.bfloat16)) for _ in range(2)]
    res = {}
    for width in ("auto", "sm90:128", "sm90:192", "sm90:256"):
        flashsci._flashsci._set_gemm_kernel(width)
        t = graph_kernel_times_us(torch, {"fs": lambda x, w, d: flashsci.linear_backward(d, x, w)[0],
                                          "torch": lambda x, w, d: (d @ w, d.T @ x)}, sets)
        res[width] = t["torch"] / t["fs"]
    flashsci._flashsci._set_gemm_kernel("auto")
    print(name, " ".join(f"{w} {r:.3f}x" for w, r in res.items()), flush=True)
    del sets
