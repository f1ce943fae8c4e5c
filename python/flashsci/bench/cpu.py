"""The CPU sets (python -m flashsci.bench on a machine without a CUDA GPU, or with --cpu): flashsci's C kernels
against the plain NumPy computation of the same result on the same inputs.

- attention: flashsci.attention against NumPy's S x S attention (q k^T materialised, exp, normalise, @ v), in float32
  (NumPy has no fast float16 matmul: float16 inputs are cast to float32 for it, which its time includes).
- linear: flashsci.linear with the tanh GELU against NumPy's x @ w.T + b and the same GELU (NumPy has no erf).

Both sides are called once before timing (NumPy's first call is slower than its later ones), then timed over `reps`
calls each, taking turns; the median is reported. speedup = NumPy time / flashsci time (> 1: flashsci faster).
"""
import math
import platform
import statistics
import time

import numpy as np

import flashsci
from flashsci.bench.results import write_plot, write_results
from flashsci.bench.timing import flops

SETS = ("attention", "linear")
DTYPES = ("float32", "float16")
ATTENTION = [(1, 8, 256, 64), (2, 8, 512, 64), (1, 4, 1024, 64), (1, 8, 512, 128)]
LINEAR = [(512, 1024, 1024), (1024, 1280, 5120), (256, 2560, 2560)]     # (M, K, N)


def numpy_attention(q, k, v):
    """softmax(q k^T / sqrt(D)) v with the S x S scores materialised, in float32."""
    q, k, v = (x.astype(np.float32, copy=False) for x in (q, k, v))
    s = (q @ k.swapaxes(-1, -2)) * np.float32(1.0 / math.sqrt(q.shape[-1]))
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def numpy_linear_gelu(x, w, b):
    """gelu_tanh(x @ w.T + b) in float32."""
    y = x.astype(np.float32, copy=False) @ w.astype(np.float32, copy=False).T + b
    return 0.5 * y * (1.0 + np.tanh(np.float32(math.sqrt(2.0 / math.pi)) * (y + np.float32(0.044715) * y * y * y)))


def timed_in_turns(fns, reps):
    """Median wall time (us) of each function of fns ({name: fn}): one untimed call each, then reps rounds in which
    each is called once in turn."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e6)
    return {name: statistics.median(t) for name, t in times.items()}


def _attention_rows(dtypes, reps, rng):
    """One row per attention config and dtype."""
    rows = []
    for (b, h, s, d) in ATTENTION:
        for dt in dtypes:
            q, k, v = (rng.standard_normal((b, h, s, d)).astype(dt) for _ in range(3))
            t = timed_in_turns({"flashsci": lambda: flashsci.attention(q, k, v),
                                "numpy": lambda: numpy_attention(q, k, v)}, reps)
            diff = float(np.abs(flashsci.attention(q, k, v).astype(np.float64) - numpy_attention(q, k, v)).max())
            rows.append({"set": "attention", "config": f"{b}x{h}x{s}x{d}", "dtype": dt, "flashsci_ms": t["flashsci"] / 1e3,
                         "numpy_ms": t["numpy"] / 1e3, "gflops": flops(b, h, s, s, d, False) / t["flashsci"] / 1e3,
                         "speedup_vs_numpy": t["numpy"] / t["flashsci"], "max_abs_diff_vs_numpy": diff})
            _print_row(rows[-1])
    return rows


def _linear_rows(dtypes, reps, rng):
    """One row per GEMM shape and dtype (tanh-GELU epilogue)."""
    rows = []
    for (m, k, n) in LINEAR:
        for dt in dtypes:
            x = rng.standard_normal((m, k)).astype(dt)
            w = (rng.standard_normal((n, k)) / math.sqrt(k)).astype(dt)
            b = rng.standard_normal(n).astype(np.float32)
            t = timed_in_turns({"flashsci": lambda: flashsci.linear(x, w, b, activation="gelu_tanh"),
                                "numpy": lambda: numpy_linear_gelu(x, w, b)}, reps)
            diff = float(np.abs(flashsci.linear(x, w, b, activation="gelu_tanh").astype(np.float64) -
                                numpy_linear_gelu(x, w, b)).max())
            rows.append({"set": "linear", "config": f"{m}x{k}->{n} gelu_tanh", "dtype": dt, "flashsci_ms": t["flashsci"] / 1e3,
                         "numpy_ms": t["numpy"] / 1e3, "gflops": 2.0 * m * n * k / t["flashsci"] / 1e3,
                         "speedup_vs_numpy": t["numpy"] / t["flashsci"], "max_abs_diff_vs_numpy": diff})
            _print_row(rows[-1])
    return rows


def _print_row(r):
    """One result line."""
    print(f"{r['set']:>9} {r['config']:>20} {r['dtype']:>8} {r['flashsci_ms']:>12.2f} {r['gflops']:>8.1f} "
          f"{r['numpy_ms']:>9.2f} {r['speedup_vs_numpy']:>8.2f} {r['max_abs_diff_vs_numpy']:>9.1e}", flush=True)


def run_cpu(sets, dtypes, out_dir, reps=7):
    """The CPU sets; with out_dir, cpu_<machine>.json/.md/.png. Returns the rows."""
    rng = np.random.default_rng(0)
    threads = flashsci.build_info()["num_threads"]
    cpu = platform.processor() or platform.machine()
    print(f"CPU path ({cpu}, {threads} threads). Baseline: NumPy {np.__version__} computing the same result in float32 "
          f"(attention with the S x S scores materialised); both warmed up, medians of {reps} calls taken in turns; "
          f"speedup = NumPy time / flashsci time (> 1: flashsci faster)")
    print(f"{'set':>9} {'config':>20} {'dtype':>8} {'flashsci ms':>12} {'GFLOP/s':>8} {'numpy ms':>9} {'speedup':>8} "
          f"{'max diff':>9}")
    rows = []
    if "attention" in sets:
        rows += _attention_rows(dtypes, reps, rng)
    if "linear" in sets:
        rows += _linear_rows(dtypes, reps, rng)
    meta = {"device": "cpu", "cpu": cpu, "threads": threads, "numpy": np.__version__, "reps": reps,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if out_dir:
        md = ["# flashsci CPU kernels against NumPy", "",
              f"{cpu}, {threads} threads, NumPy {np.__version__}, {meta['date']}. Both sides warmed up, medians of {reps} "
              "calls taken in turns; NumPy computes the same result in float32 (attention with the S x S scores "
              "materialised). speedup = NumPy time / flashsci time.", "",
              "| set | config | dtype | flashsci ms | GFLOP/s | NumPy ms | speedup | max diff |", "|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['set']} | {r['config']} | {r['dtype']} | {r['flashsci_ms']:.2f} | {r['gflops']:.1f} | {r['numpy_ms']:.2f} | "
               f"{r['speedup_vs_numpy']:.2f} | {r['max_abs_diff_vs_numpy']:.1e} |" for r in rows]
        stem = f"cpu_{platform.machine()}"
        write_results(out_dir, stem, meta, rows, "\n".join(md) + "\n")
        write_plot(out_dir, stem, f"flashsci CPU kernels vs NumPy ({threads} threads)",
                   [f"{r['set']} {r['config']} {r['dtype']}" for r in rows],
                   {"NumPy time / flashsci time": [r["speedup_vs_numpy"] for r in rows]}, "speedup (> 1: flashsci faster)")
    return rows
