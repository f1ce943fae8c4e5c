"""Quick GEMM timing while iterating on gemm_sm90 (the recorded comparison is python -m flashsci.bench --sets linear):
flashsci.linear against torch on a few shapes, then a K sweep at M = 8192, N = 16384 whose straight-line fit
time = rounds x (a + b K) splits each kernel's time into a per-tile cost a (prologue, epilogue, pipeline refill)
and a per-K cost b (what found the serialised epilogue: a = 2.4 us against cuBLAS's 1.1, b 821 against 830 ns per
64 of K). CUDA-graph replays taking turns, medians.
--small: the small-M shapes with every Hopper tile width forced in turn, and the names of the cuBLAS kernels torch runs
there (their tile, cluster and split-K choices). --epilogue: what the bias and each activation cost on a few shapes,
flashsci's and cuBLAS's (matmul, F.linear with bias, _addmm_activation), timed in turns.
    python benchmarks/gemm_quick.py [--dtype bfloat16] [--no-sweep] [--small | --epilogue]"""
import argparse
import math

import torch

import flashsci
from flashsci.bench.timing import graph_kernel_times_us

F = torch.nn.functional
SHAPES = [("qkv+bias", 8192, 2560, 7680, "bias"), ("fc1 gelu", 8192, 2560, 10240, "gelu"),
          ("T5 wi", 8192, 1024, 16384, None), ("M=1024", 1024, 2560, 10240, None), ("M=256", 256, 2560, 10240, None)]
SWEEP_K = [512, 1024, 2048, 4096]
SMALL = [(256, 2560, 10240), (512, 2560, 10240), (1024, 2560, 10240), (2048, 2560, 10240), (1024, 2560, 7680),
         (1024, 10240, 2560), (1024, 2560, 2560)]
TILES = ["auto", "sm90:128", "sm90:160", "sm90:192", "sm90:256"]
EPILOGUE = [("T5 wi", 8192, 1024, 16384), ("qkv", 8192, 2560, 7680), ("M=256", 256, 2560, 10240), ("M=1024", 1024, 2560, 10240)]


def inputs(m, k, n, dtype, sets):
    return [(torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(n, k, device="cuda", dtype=dtype) / math.sqrt(k),
             torch.randn(n, device="cuda", dtype=dtype)) for _ in range(sets)]


def n_sets(m, k, n):
    """Rotating input sets that together go beyond the 50 MB L2."""
    return max(2, min(8, int(150e6 // (2 * (m * k + n * k + m * n)))))


def time_pair(m, k, n, mode, dtype):
    act = "gelu" if mode == "gelu" else None
    fns = {"fs": lambda x, w, b: flashsci.linear(x, w, b if mode else None, activation=act),
           "torch": (lambda x, w, b: F.gelu(F.linear(x, w, b))) if mode == "gelu" else
                    (lambda x, w, b: F.linear(x, w, b)) if mode else (lambda x, w, b: x @ w.T)}
    t = graph_kernel_times_us(torch, fns, inputs(m, k, n, dtype, n_sets(m, k, n)))
    return t["fs"], t["torch"]


def cublas_kernels(m, k, n, dtype):
    """Names of the CUDA kernels torch runs for x @ w.T (profiler)."""
    x, w, _ = inputs(m, k, n, dtype, 1)[0]
    for _ in range(3):
        x @ w.T
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        x @ w.T
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def small(dtype):
    """Each small-M shape: torch and flashsci with every tile width, timed in turns."""
    print(f"{'M':>6} {'K':>6} {'N':>6} {'torch':>8} " + " ".join(f"{t:>9}" for t in TILES))
    for m, k, n in SMALL:
        fns = {"torch": lambda x, w, b: x @ w.T}
        for tile in TILES:
            def fn(x, w, b, tile=tile):
                flashsci._flashsci._set_gemm_kernel(tile)
                return flashsci.linear(x, w)
            fns[tile] = fn
        t = graph_kernel_times_us(torch, fns, inputs(m, k, n, dtype, n_sets(m, k, n)))
        flashsci._flashsci._set_gemm_kernel("auto")
        print(f"{m:6d} {k:6d} {n:6d} {t['torch']:8.1f} " + " ".join(f"{t[x]:9.1f}" for x in TILES) +
              "   x torch: " + " ".join(f"{t['torch'] / t[x]:.3f}" for x in TILES), flush=True)
    for m, k, n in SMALL[:4]:
        print(f"cuBLAS {m}x{k}x{n}: {cublas_kernels(m, k, n, dtype)}")


def epilogue(dtype):
    """flashsci and cuBLAS with no epilogue, a bias, bias + ReLU and bias + GELU on each shape, timed in turns."""
    fns = {"fs plain": lambda x, w, b: flashsci.linear(x, w), "fs bias": lambda x, w, b: flashsci.linear(x, w, b),
           "fs relu": lambda x, w, b: flashsci.linear(x, w, b, activation="relu"),
           "fs gelu": lambda x, w, b: flashsci.linear(x, w, b, activation="gelu"),
           "matmul": lambda x, w, b: x @ w.T, "F.linear": lambda x, w, b: F.linear(x, w, b),
           "addmm relu": lambda x, w, b: torch._addmm_activation(b, x, w.T),
           "addmm gelu": lambda x, w, b: torch._addmm_activation(b, x, w.T, use_gelu=True),
           "F.gelu": lambda x, w, b: F.gelu(F.linear(x, w, b))}
    print(f"{'shape':>8} " + " ".join(f"{name:>10}" for name in fns))
    for name, m, k, n in EPILOGUE:
        t = graph_kernel_times_us(torch, fns, inputs(m, k, n, dtype, n_sets(m, k, n)))
        print(f"{name:>8} " + " ".join(f"{t[f]:10.1f}" for f in fns), flush=True)
        print(f"{'':>8} relu vs addmm {t['addmm relu'] / t['fs relu']:.3f}, gelu vs addmm {t['addmm gelu'] / t['fs gelu']:.3f}, "
              f"vs F.gelu {t['F.gelu'] / t['fs gelu']:.3f}, bias vs F.linear {t['F.linear'] / t['fs bias']:.3f}, "
              f"plain vs matmul {t['matmul'] / t['fs plain']:.3f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--epilogue", action="store_true")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.small:
        return small(dtype)
    if args.epilogue:
        return epilogue(dtype)
    print(f"{torch.cuda.get_device_name()}  {dtype}\n{'shape':>10} {'M':>6} {'K':>6} {'N':>6} {'fs us':>8} {'torch':>8} "
          f"{'fs TF/s':>8} {'x torch':>8}")
    for name, m, k, n, mode in SHAPES:
        fs, th = time_pair(m, k, n, mode, dtype)
        print(f"{name:>10} {m:6d} {k:6d} {n:6d} {fs:8.1f} {th:8.1f} {2 * m * n * k / fs / 1e6:8.1f} {th / fs:8.3f}")
    if args.no_sweep:
        return
    m, n = 8192, 16384
    plan = flashsci._flashsci._gemm_plan(m, n, 1024)
    rounds = math.ceil(plan["tiles"] / plan["grid"])
    rows = [(k, *time_pair(m, k, n, None, dtype)) for k in SWEEP_K]
    for k, fs, th in rows:
        print(f"{'sweep':>10} {m:6d} {k:6d} {n:6d} {fs:8.1f} {th:8.1f} {2 * m * n * k / fs / 1e6:8.1f} {th / fs:8.3f}")
    for col, who in ((1, "flashsci"), (2, "torch")):
        ks = [r[0] for r in rows]
        ts = [r[col] for r in rows]
        kbar, tbar = sum(ks) / len(ks), sum(ts) / len(ts)
        b = sum((x - kbar) * (y - tbar) for x, y in zip(ks, ts)) / sum((x - kbar) ** 2 for x in ks)
        a = tbar - b * kbar
        print(f"fit {who}: {a:.1f} us + {b:.4f} us x K; per round of {rounds}: {a / rounds:.2f} us + "
              f"{b * 64 / rounds * 1e3:.1f} ns per 64 of K")


if __name__ == "__main__":
    main()
