"""The LM grid's SwiGLU up-projection at the 2.7B model's shape (K = 2560, 2 x 10240 gate | up rows; M = 4 x context
tokens) or another size's (--d-model: K = d_model, N = 4 K), forward and backward, flashsci against torch, kernel by
kernel: CUDA-graph replays taking turns, medians.
    python benchmarks/experiments/lm_swiglu.py [--d-model 1280] [M ...]"""
import argparse

import torch
import torch.nn.functional as F

import flashsci
from flashsci.bench.timing import graph_kernel_times_us

ap = argparse.ArgumentParser()
ap.add_argument("--d-model", type=int, default=2560)
ap.add_argument("m", type=int, nargs="*", default=[4096, 8192])
args = ap.parse_args()
K, N = args.d_model, 4 * args.d_model


def inputs(m, sets=3):
    out = []
    for _ in range(sets):
        x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(2 * N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        h = x @ w.T
        dy = torch.randn(m, N, device="cuda", dtype=torch.bfloat16)
        out.append((x, w, h, dy))
    return out


def torch_swiglu_grad_h(h, dy):
    """dh of y = silu(g) * u by torch's elementwise ops (what autograd runs)."""
    g, u = h.chunk(2, -1)
    s = torch.sigmoid(g)
    return torch.cat([dy * u * (s * (1 + g * (1 - s))), dy * g * s], -1)


print(torch.cuda.get_device_name())
for m in args.m:
    fns = {
        "fs swiglu (h kept)": lambda x, w, h, dy: flashsci.swiglu(x, w, preactivation=h),
        "fs swiglu": lambda x, w, h, dy: flashsci.swiglu(x, w),
        "torch x @ w.T": lambda x, w, h, dy: x @ w.T,
        "torch x @ w.T + silu * mul": lambda x, w, h, dy: (lambda t: F.silu(t[0]) * t[1])((x @ w.T).chunk(2, -1)),
        "fs swiglu_backward": lambda x, w, h, dy: flashsci.swiglu_backward(dy, x, w, preactivation=h),
        "torch dh, dh @ w, dh.T @ x": lambda x, w, h, dy: (lambda d: (d @ w, d.T @ x))(torch_swiglu_grad_h(h, dy)),
        "torch dh @ w, dh.T @ x only": lambda x, w, h, dy: (h @ w, h.T @ x),
    }
    t = graph_kernel_times_us(torch, fns, inputs(m))
    flop = 2 * m * K * 2 * N
    for name, us in t.items():
        tf = (2 if "backward" in name or "@ w, " in name else 1) * flop / us / 1e6
        print(f"M = {m:5d}  {name:30s} {us:9.1f} us  {tf:6.0f} TF/s")
