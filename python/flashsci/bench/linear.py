"""Benchmark of flashsci.linear / flashsci.swiglu against torch (python -m flashsci.bench --sets linear).

Shapes from ESM2-3B, ProtT5-XL and ESM-C-600M at M = 8192 tokens, 8192^3, and small M = 256 / 1024.
Per shape, in one run on one GPU:
- plain: flashsci.linear(x, w) vs torch x @ w.T and F.linear(x, w) (the faster is "torch");
- epilogue: flashsci.linear(x, w, b, activation=...) vs F.act(F.linear(x, w, b)) (two kernels) and, for
  gelu / relu, torch._addmm_activation (cuBLASLt's fused bias + activation epilogue);
- swiglu: flashsci.swiglu(x, w_packed) vs torch's two GEMMs + silu + mul, and vs one packed GEMM + chunk +
  silu + mul (the faster is "torch").
Kernel times by CUDA-graph replay over input sets larger than L2 (median), per-call times of back-to-back
Python calls, TF/s = 2 M N K / time (SwiGLU: 2 M (2N) K), max difference to torch's output.
"""
import math
import time

import flashsci
from flashsci.bench.results import fmt, md_table, slug, write_plot, write_results
from flashsci.bench.timing import graph_kernel_times_us, per_call_us

M = 8192
# name, M, K, N, mode (plain | bias | gelu | relu | swiglu)
SHAPES = [
    ("ESM2-3B qkv", M, 2560, 7680, "plain"), ("ESM2-3B qkv", M, 2560, 7680, "bias"),
    ("ESM2-3B fc1", M, 2560, 10240, "plain"), ("ESM2-3B fc1", M, 2560, 10240, "gelu"),
    ("ESM2-3B fc2", M, 10240, 2560, "plain"), ("ESM2-3B fc2", M, 10240, 2560, "bias"),
    ("ProtT5-XL wi", M, 1024, 16384, "plain"), ("ProtT5-XL wi", M, 1024, 16384, "relu"),
    ("ProtT5-XL wo", M, 16384, 1024, "plain"),
    ("ESM-C-600M ffn", M, 1152, 3072, "swiglu"),
    ("square", 8192, 8192, 8192, "plain"),
    ("small M", 256, 2560, 10240, "plain"), ("small M", 256, 2560, 10240, "gelu"),
    ("small M", 1024, 2560, 10240, "plain"), ("small M", 1024, 2560, 10240, "gelu"),
]


def _torch_variants(torch, mode):
    """torch callables (name -> fn(x, w, b)) for a mode; the first is the one the ratio target names."""
    F = torch.nn.functional
    if mode == "plain":
        return {"matmul": lambda x, w, b: x @ w.T, "F.linear": lambda x, w, b: F.linear(x, w)}
    if mode == "bias":
        return {"F.linear": lambda x, w, b: F.linear(x, w, b)}
    if mode == "swiglu":
        def two(x, w, b):
            n = w.shape[0] // 2
            return F.silu(F.linear(x, w[:n])) * F.linear(x, w[n:])

        def packed(x, w, b):
            g, u = F.linear(x, w).chunk(2, dim=-1)
            return F.silu(g) * u
        return {"2 GEMMs+silu*mul": two, "packed GEMM+silu*mul": packed}
    act = F.gelu if mode == "gelu" else F.relu
    return {"F.linear+F." + mode: lambda x, w, b: act(F.linear(x, w, b)),
            "_addmm_activation": lambda x, w, b: torch._addmm_activation(b, x, w.T, use_gelu=mode == "gelu")}


def _flashsci_fn(mode):
    if mode == "plain":
        return lambda x, w, b: flashsci.linear(x, w)
    if mode == "bias":
        return lambda x, w, b: flashsci.linear(x, w, b)
    if mode == "swiglu":
        return lambda x, w, b: flashsci.swiglu(x, w)
    return lambda x, w, b: flashsci.linear(x, w, b, activation=mode)


def run_linear(dtype_name, out_dir):
    import torch
    dtype = getattr(torch, dtype_name)
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    print(f"GPU: {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}; dtype {dtype_name}", flush=True)
    rows = []
    for name, m, k, n, mode in SHAPES:
        n_w = 2 * n if mode == "swiglu" else n
        set_bytes = 2 * (m * k + n_w * k + m * n)
        n_sets = max(2, min(16, math.ceil(2 * l2 / set_bytes)))
        inputs = [(torch.randn(m, k, device="cuda", dtype=dtype),
                   torch.randn(n_w, k, device="cuda", dtype=dtype) / math.sqrt(k),
                   torch.randn(n, device="cuda", dtype=dtype)) for _ in range(n_sets)]
        fs = _flashsci_fn(mode)
        variants = _torch_variants(torch, mode)
        x, w, b = inputs[0]
        ours = fs(x, w, b)
        theirs = next(iter(variants.values()))(x, w, b)
        fl = 2.0 * m * n_w * k
        plan = flashsci._flashsci._gemm_plan(m, n, k, swiglu=mode == "swiglu")
        row = {"shape": name, "M": m, "K": k, "N": n, "mode": mode, "dtype": dtype_name, "kernel": plan["kernel"],
               "tile": f"{plan['BM']}x{plan['BN']}", "grid": plan["grid"], "tiles": plan["tiles"],
               "max_abs_diff_vs_torch": (ours.float() - theirs.float()).abs().max().item(),
               "max_abs_torch": theirs.float().abs().max().item()}
        times = graph_kernel_times_us(torch, {"flashsci": fs, **variants}, inputs)
        row["flashsci_us"] = times.pop("flashsci")
        row["torch"] = times
        best_name = min(row["torch"], key=row["torch"].get)
        row["torch_best"], row["torch_best_us"] = best_name, row["torch"][best_name]
        row["flashsci_tflops"] = fl / row["flashsci_us"] / 1e6
        row["torch_best_tflops"] = fl / row["torch_best_us"] / 1e6
        row["speedup_vs_torch_best"] = row["torch_best_us"] / row["flashsci_us"]
        row["speedup_vs_torch"] = {v: t / row["flashsci_us"] for v, t in row["torch"].items()}
        calls = max(10, min(300, int(30000 / row["flashsci_us"])))
        row["flashsci_per_call_us"] = per_call_us(torch, fs, inputs[0], n=calls)
        row["torch_per_call_us"] = per_call_us(torch, variants[best_name], inputs[0], n=calls)
        rows.append(row)
        print(_fmt_row(row), flush=True)
        del inputs, x, w, b, ours, theirs
        torch.cuda.empty_cache()
    meta = {"gpu": props.name, "sm_count": props.multi_processor_count, "torch": torch.__version__,
            "flashsci_build": flashsci.build_info(), "dtype": dtype_name, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if out_dir:
        stem = f"linear_{slug(props.name)}_{dtype_name}"
        write_results(out_dir, stem, meta, rows, _markdown(rows, meta))
        write_plot(out_dir, stem, f"fused linear on {props.name}, {dtype_name}: TFLOP/s",
                   [f"{r['shape']} {r['mode']}" for r in rows],
                   {"flashsci": [r["flashsci_tflops"] for r in rows], "fastest torch": [r["torch_best_tflops"] for r in rows]},
                   "TFLOP/s")
    return rows


COLS = ["shape", "M", "K", "N", "mode", "kernel", "tile", "CTAs", "flashsci us", "TF/s", "torch best", "torch us", "torch TF/s",
        "speedup", "per variant", "fs call", "torch call", "max diff"]


def _cells(r):
    per = ", ".join(f"{v} {s:.2f}x" for v, s in r["speedup_vs_torch"].items())
    return [r["shape"], str(r["M"]), str(r["K"]), str(r["N"]), r["mode"], r["kernel"], r["tile"],
            f"{r['grid']} of {r['tiles']}", fmt(r["flashsci_us"]),
            fmt(r["flashsci_tflops"]), r["torch_best"], fmt(r["torch_best_us"]), fmt(r["torch_best_tflops"]),
            fmt(r["speedup_vs_torch_best"], ".3f"), per, fmt(r["flashsci_per_call_us"]), fmt(r["torch_per_call_us"]),
            f"{r['max_abs_diff_vs_torch']:.1e} (of {r['max_abs_torch']:.1f})"]


def _fmt_row(r):
    return " | ".join(_cells(r))


def _markdown(rows, meta):
    lines = [f"# flashsci.linear / swiglu vs torch — {meta['gpu']}", "",
             f"torch {meta['torch']}, dtype {meta['dtype']}, {meta['date']}. Kernel times by CUDA-graph replay over "
             "input sets larger than L2 (median); speedup = torch time / flashsci time (> 1: flashsci faster), against "
             "the fastest torch variant and each one; TF/s = 2·M·N·K / time (SwiGLU counts both GEMMs); calls = "
             "back-to-back Python calls.", ""]
    lines += md_table(COLS, [_cells(r) for r in rows])
    return "\n".join(lines) + "\n"
