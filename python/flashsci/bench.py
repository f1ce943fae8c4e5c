"""Benchmark flashsci.attention (and flashsci.linear: --sets linear).

    python -m flashsci.bench                      # GPU + torch: seed, protein and sweep configs vs torch SDPA
                                                  # CPU-only machine: the C CPU path on its default configs
    python -m flashsci.bench --sets seed --out benchmarks/results
    python -m flashsci.bench --sets features        # protein options vs torch on real UniProt lengths
    python -m flashsci.bench --sets gqa             # grouped-query attention vs SDPA enable_gqa (bench_gqa.py)
    python -m flashsci.bench --sets linear          # fused linear / SwiGLU vs torch GEMMs (bench_linear.py)
    python -m flashsci.bench --e2e                  # HF ESM2 / ProtT5 stock vs patched, proteins/s (bench_e2e.py)

On the GPU every config is timed in one run for flashsci and torch SDPA (default, and each backend: flash,
cudnn, efficient): kernel time by CUDA-graph replay over input sets that together exceed the L2, flashsci taking
turns with one of them at a time (paired_kernel_times_us), per-call
time of back-to-back Python calls, flashsci's host overhead alone (the loop time of calls that do not wait
for the GPU; the three call loops take turns), TFLOP/s (4*B*H*Sq*Sk*D, half for causal), and the max
difference to SDPA's output.
"""
import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import numpy as np

import flashsci

SEED = [(1, 1, 32, 64), (1, 1, 64, 64), (1, 1, 128, 64), (1, 1, 256, 64), (1, 1, 512, 64), (4, 8, 128, 64),
        (8, 8, 128, 64), (8, 8, 256, 64), (16, 8, 512, 64)]
PROTEIN = {"ESM2-3B": (8, 40, 1024, 64), "ESM-C-600M": (8, 18, 1024, 64), "ProtT5-XL": (8, 32, 1024, 128),
           "long": (1, 40, 6144, 64)}
SWEEP = [(16384 // s, 2048 // d, s, d) for d in (64, 128) for s in (512, 1024, 2048, 4096, 8192, 16384)]
CPU_CONFIGS = [(1, 8, 256, 64), (2, 8, 512, 64), (1, 4, 1024, 64), (1, 8, 512, 128)]


def flops(b, h, sq, sk, d, causal):
    f = 4.0 * b * h * sq * sk * d
    return f / 2 if causal else f


def gpu_configs(sets):
    out = []
    if "seed" in sets:
        out += [("seed", c, False) for c in SEED]
    if "protein" in sets:
        out += [(name, c, False) for name, c in PROTEIN.items()]
    if "sweep" in sets:
        out += [("sweep", c, causal) for causal in (False, True) for c in SWEEP]
    return out


# ---------------------------------------------------------------- GPU (torch as the reference point)

def _median_event_time_us(torch, replay, calls, iters=15):
    return statistics.median(_event_times_us(torch, replay, calls, iters))


def _event_times_us(torch, replay, calls, iters):
    times = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / calls)
    return times


def _capture(torch, fn, inputs, calls):
    """A CUDA graph of `calls` calls of fn over the rotating input sets (after one warm-up pass off the graph)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for x in inputs:
            fn(*x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(*inputs[i % len(inputs)])
    graph.replay()
    torch.cuda.synchronize()
    return graph


def graph_kernel_times_us(torch, fns, inputs, optional=(), rounds=5, iters=3):
    """Median per-call device time of each function of fns (name -> fn) from CUDA-graph replays over rotating
    input sets; those named in optional give None where they raise RuntimeError (an SDPA backend that does not
    take the inputs). The functions take turns, `iters` replays each per round, so that clock and power drift
    over the measurement falls on all of them alike (a GPU that has just idled runs its first large GEMMs at
    higher clocks than later ones). Each turn starts with one untimed replay: at the board's power cap a turn
    runs slower right after some kernels than after others (H100, 1x16x16384x128: whichever followed SDPA's
    efficient backend lost 3-4%, benchmarks/power_turns.py --order), and with the order fixed that place fell
    to the same function every round."""
    calls = max(len(inputs), 20)
    graphs, times = {}, {}
    for name, fn in fns.items():
        try:
            graphs[name] = _capture(torch, fn, inputs, calls)
            times[name] = []
        except RuntimeError:
            if name not in optional:
                raise
            graphs[name] = None
    for _ in range(rounds):
        for name, graph in graphs.items():
            if graph is not None:
                graph.replay()
                times[name] += _event_times_us(torch, graph.replay, calls, iters)
    del graphs
    return {name: statistics.median(times[name]) if name in times else None for name in fns}


def paired_kernel_times_us(torch, ref, fns, inputs, optional=()):
    """Kernel times of ref against each function of fns, each pair timed on its own by graph_kernel_times_us:
    {name: (ref's time in that pair, the function's time)}, the latter None where an optional function raises. With
    five kernels in one rotation the turn order moved flashsci / cuDNN by up to 10% either way at the H100's power
    cap (8 x 32 x 1024 x 128: 0.95 in the recorded order, 1.10 reversed; 1.00-1.03 as a pair, 0.99 each alone by
    back-to-back calls; benchmarks/turn_order.py, NOTES.md session 20); in a pair each kernel follows the other."""
    out = {}
    for name, fn in fns.items():
        t = graph_kernel_times_us(torch, {"ref": ref, name: fn}, inputs, optional=optional)
        out[name] = (t["ref"], t[name])
    return out


def graph_kernel_time_us(torch, fn, inputs):
    """Median per-call device time of fn over rotating input sets, from CUDA-graph replay."""
    return graph_kernel_times_us(torch, {"fn": fn}, inputs)["fn"]


def per_call_turns_us(torch, loops, x, rounds=7):
    """Median wall time per call of back-to-back calls, for each loop of loops ({name: (fn, n, sync)}: n calls, then
    with sync a wait for the GPU; without, the host loop alone), the loops taking turns round by round so that a
    host whose speed drifts moves them all alike (SDPA's call on an H100 host went from 32 to 20 µs within one run)."""
    for fn, _, _ in loops.values():
        for _ in range(20):
            fn(*x)
    runs = {name: [] for name in loops}
    for _ in range(rounds):
        for name, (fn, n, sync) in loops.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                fn(*x)
            if sync:
                torch.cuda.synchronize()
            runs[name].append((time.perf_counter() - t0) * 1e6 / n)
    torch.cuda.synchronize()
    return {name: statistics.median(r) for name, r in runs.items()}


def per_call_us(torch, fn, x, n=300, sync=True):
    """Median wall time per call of n back-to-back calls (sync=False: the host loop alone)."""
    return per_call_turns_us(torch, {"fn": (fn, n, sync)}, x)["fn"]


def _with_backend(sdpa_kernel, backend, sdpa):
    """sdpa restricted to one SDPA backend (raises RuntimeError where that backend does not take the inputs)."""
    def fn(q, k, v):
        with sdpa_kernel(backend):
            return sdpa(q, k, v)
    return fn


def forced(kernel, fn):
    """fn with flashsci's attention dispatch set to kernel ('sm80' or 'auto') while it runs (and is captured)."""
    def call(*args):
        flashsci._flashsci._set_attention_kernel(kernel)
        try:
            return fn(*args)
        finally:
            flashsci._flashsci._set_attention_kernel("auto")
    return call


def attention_input_sets(torch, b, h, s, d, dtype, sk=None):
    """Rotating (q, k, v) sets of shape (b, h, s, d) (k, v: sk rows if given) whose bytes, outputs included, together
    reach twice the L2."""
    sk = s if sk is None else sk
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    n_sets = max(1, min(64, math.ceil(2 * l2 / (2 * b * h * (s + sk) * d * 2))))
    return [(torch.randn(b, h, s, d, device="cuda", dtype=dtype),
             *(torch.randn(b, h, sk, d, device="cuda", dtype=dtype) for _ in range(2))) for _ in range(n_sets)]


def run_gpu(sets, dtype_name, out_dir, head_dim=None):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    dtype = getattr(torch, dtype_name)
    props = torch.cuda.get_device_properties(0)
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    rows = []
    print(f"GPU: {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}; dtype {dtype_name}", flush=True)
    for group, (b, h, s, d), causal in gpu_configs(sets):
        if head_dim and d != head_dim:
            continue
        inputs = attention_input_sets(torch, b, h, s, d, dtype)
        fs = lambda q, k, v: flashsci.attention(q, k, v, causal=causal)
        sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        q, k, v = inputs[0]
        ref = sdpa(q, k, v)
        row = {"group": group, "B": b, "H": h, "Sq": s, "Sk": s, "D": d, "causal": causal, "dtype": dtype_name,
               "max_abs_diff_vs_sdpa": (fs(q, k, v).float() - ref.float()).abs().max().item()}
        fl = flops(b, h, s, s, d, causal)
        fns = {"sdpa": sdpa}
        fns.update({name: _with_backend(sdpa_kernel, be, sdpa) for name, be in backends.items()})
        pairs = paired_kernel_times_us(torch, fs, fns, inputs, optional=backends)
        row.update({f"{name}_kernel_us": t for name, (_, t) in pairs.items()})
        fs_in = row["flashsci_pair_kernel_us"] = {name: t_fs for name, (t_fs, t) in pairs.items() if t}
        best = min(fs_in, key=lambda name: row[f"{name}_kernel_us"])   # fastest SDPA variant; flashsci's time beside it
        row["flashsci_kernel_us"] = fs_in[best]
        plan = flashsci._flashsci._launch_plan(b, h, s, s, d, causal)
        row.update(kernel=plan["kernel"], variant=plan["variant"], blocks=plan["blocks"], kv_splits=plan["kv_splits"],
                   waves=plan["waves"])
        # per call of each, and flashsci's host loop alone: 1000 calls where the kernel is short enough that they
        # cannot fill the launch queue
        host_n = 1000 if row["flashsci_kernel_us"] < 50 else 100
        calls = per_call_turns_us(torch, {"flashsci": (fs, 300, True), "sdpa": (sdpa, 300, True),
                                          "host": (fs, host_n, False)}, inputs[0])
        row["flashsci_per_call_us"], row["sdpa_per_call_us"] = calls["flashsci"], calls["sdpa"]
        row["flashsci_host_us"] = calls["host"]
        for name in ("flashsci", "sdpa", "flash", "cudnn", "efficient"):
            t = row[f"{name}_kernel_us"]
            row[f"{name}_tflops"] = fl / t / 1e6 if t else None
        row["ratio_kernel_vs_flash"] = fs_in["flash"] / row["flash_kernel_us"] if "flash" in fs_in else None
        row["ratio_kernel_vs_best"] = fs_in[best] / row[f"{best}_kernel_us"]
        row["ratio_per_call_vs_sdpa"] = row["flashsci_per_call_us"] / row["sdpa_per_call_us"]
        rows.append(row)
        print(_fmt_gpu_row(row), flush=True)
        del inputs, q, k, v, ref
        torch.cuda.empty_cache()
    meta = {"gpu": props.name, "sm_count": props.multi_processor_count, "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "flashsci_build": flashsci.build_info(), "dtype": dtype_name,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node()}
    _print_gpu_table(rows, meta)
    if out_dir:
        _write_results(out_dir, f"attention_{_slug(props.name)}_{dtype_name}", meta, rows, _gpu_markdown(rows, meta))
    return rows


def _fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


GPU_COLS = [("config", 22), ("causal", 6), ("fs us", 8), ("flash us", 8), ("cudnn us", 8), ("fs TF/s", 7),
            ("flash TF/s", 10), ("cudnn TF/s", 10), ("fs/flash", 8), ("fs/best", 7), ("fs call", 7),
            ("sdpa call", 9), ("call ratio", 10), ("fs host", 7), ("kernel", 6), ("blocks", 7), ("waves", 6), ("max diff", 8)]


def _gpu_cells(r):
    return [f"{r['group']} {r['B']}x{r['H']}x{r['Sq']}x{r['D']}", "yes" if r["causal"] else "no",
            _fmt(r["flashsci_kernel_us"]), _fmt(r["flash_kernel_us"]), _fmt(r["cudnn_kernel_us"]),
            _fmt(r["flashsci_tflops"]), _fmt(r["flash_tflops"]), _fmt(r["cudnn_tflops"]),
            _fmt(r["ratio_kernel_vs_flash"], ".2f"), _fmt(r["ratio_kernel_vs_best"], ".2f"),
            _fmt(r["flashsci_per_call_us"]), _fmt(r["sdpa_per_call_us"]), _fmt(r["ratio_per_call_vs_sdpa"], ".2f"),
            _fmt(r["flashsci_host_us"]), r["kernel"], str(r["blocks"]), _fmt(r["waves"], ".2f"), _fmt(r["max_abs_diff_vs_sdpa"], ".1e")]


def _fmt_gpu_row(r):
    return " ".join(c.rjust(w) for c, (_, w) in zip(_gpu_cells(r), GPU_COLS))


def _print_gpu_table(rows, meta):
    print(f"\nflashsci vs torch SDPA on {meta['gpu']} ({meta['dtype']}; kernel = CUDA-graph replay, call = "
          "back-to-back Python calls, host = flashsci host overhead; times in us)")
    print(" ".join(n.rjust(w) for n, w in GPU_COLS))
    for r in rows:
        print(_fmt_gpu_row(r))


def _gpu_markdown(rows, meta):
    lines = [f"# flashsci attention vs torch SDPA — {meta['gpu']}", "",
             f"torch {meta['torch']}, cuDNN {meta['cudnn']}, dtype {meta['dtype']}, {meta['date']}. "
             "Kernel times by CUDA-graph replay over input sets larger than L2 (median), flashsci taking turns with one "
             "SDPA variant at a time: fs us is its time in the pair with the fastest variant, fs/flash divides its time "
             "in the pair with flash; per-call = back-to-back "
             "Python calls including host overhead; TF/s = 4·B·H·S²·D (half for causal) / kernel time; blocks = "
             "thread blocks launched (query tiles × KV splits × B·H), waves = blocks / (resident blocks per SM × SMs).", "",
             "| " + " | ".join(n for n, _ in GPU_COLS) + " |", "|" + "---|" * len(GPU_COLS)]
    lines += ["| " + " | ".join(_gpu_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- CPU

def _numpy_attention(q, k, v):
    s = (q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def _median_wall_us(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(ts)


def run_cpu(out_dir, reps=5):
    rng = np.random.default_rng(0)
    rows = []
    threads = flashsci.build_info()["num_threads"]
    print(f"CPU path ({platform.processor() or platform.machine()}, {threads} threads); NumPy = S x S softmax in float32")
    print(f"{'config':>20} {'dtype':>8} {'flashsci ms':>12} {'GFLOP/s':>8} {'numpy ms':>9} {'speedup':>8} {'max diff':>9}")
    for (b, h, s, d) in CPU_CONFIGS:
        for dt in ("float32", "float16"):
            q, k, v = (rng.standard_normal((b, h, s, d)).astype(dt) for _ in range(3))
            t_fs = _median_wall_us(lambda: flashsci.attention(q, k, v), reps)
            q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
            t_np = _median_wall_us(lambda: _numpy_attention(q32, k32, v32), reps)
            diff = float(np.abs(flashsci.attention(q, k, v).astype(np.float64) - _numpy_attention(q32, k32, v32)).max())
            row = {"B": b, "H": h, "S": s, "D": d, "dtype": dt, "flashsci_ms": t_fs / 1e3, "numpy_ms": t_np / 1e3,
                   "gflops": flops(b, h, s, s, d, False) / t_fs / 1e3, "speedup_vs_numpy": t_np / t_fs,
                   "max_abs_diff_vs_numpy": diff}
            rows.append(row)
            print(f"{f'{b}x{h}x{s}x{d}':>20} {dt:>8} {row['flashsci_ms']:>12.2f} {row['gflops']:>8.1f} "
                  f"{row['numpy_ms']:>9.2f} {row['speedup_vs_numpy']:>8.2f} {diff:>9.1e}")
    meta = {"device": "cpu", "machine": platform.machine(), "threads": threads, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if out_dir:
        md = ["# flashsci CPU attention", "", f"{threads} threads, {meta['date']}", "",
              "| config | dtype | flashsci ms | GFLOP/s | NumPy ms | speedup | max diff |", "|---|---|---|---|---|---|---|"]
        md += [f"| {r['B']}x{r['H']}x{r['S']}x{r['D']} | {r['dtype']} | {r['flashsci_ms']:.2f} | {r['gflops']:.1f} | "
               f"{r['numpy_ms']:.2f} | {r['speedup_vs_numpy']:.2f} | {r['max_abs_diff_vs_numpy']:.1e} |" for r in rows]
        _write_results(out_dir, "attention_cpu", meta, rows, "\n".join(md) + "\n")
    return rows


# ---------------------------------------------------------------- shared

def _slug(name):
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def _write_results(out_dir, stem, meta, rows, markdown):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, stem + ".json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(out_dir, stem + ".md"), "w") as f:
        f.write(markdown)
    print(f"wrote {os.path.join(out_dir, stem)}.json/.md")


def _gpu_ready():
    if flashsci.cuda_device_count() == 0:
        return False
    try:
        import torch
    except ImportError:
        print("a CUDA device is present but torch is not installed: the GPU benchmark compares with torch SDPA",
              file=sys.stderr)
        return False
    return torch.cuda.is_available()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m flashsci.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="seed,protein,sweep",
                    help="GPU config sets: seed, protein, sweep; features (protein options, bench_features.py); "
                         "gqa (grouped-query attention, bench_gqa.py); linear (GEMMs, bench_linear.py)")
    ap.add_argument("--fasta", default=None, help="uniprot20k.fasta.gz for the features set's length mix")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--head-dim", type=int, default=None, help="only configs with this head dim")
    ap.add_argument("--out", default=None, help="folder for JSON + markdown results")
    ap.add_argument("--cpu", action="store_true", help="run the CPU benchmark even when a GPU is present")
    ap.add_argument("--e2e", action="store_true", help="only the end-to-end model benchmark (bench_e2e.py)")
    ap.add_argument("--e2e-proteins", type=int, default=2000, help="proteins in the e2e sample")
    ap.add_argument("--e2e-models", default=None, help="comma-separated subset of ESM2-650M,ESM2-3B,ProtT5-XL")
    ap.add_argument("--e2e-layers", type=int, default=None, help="override the layer count (quick checks)")
    args = ap.parse_args(argv)
    sets = set(args.sets.split(","))
    if args.e2e:
        if not _gpu_ready():
            sys.exit("the end-to-end benchmark needs a CUDA device, torch and transformers")
        from flashsci.bench_e2e import run_e2e
        run_e2e(args.dtype, args.out, args.fasta, args.e2e_proteins,
                args.e2e_models.split(",") if args.e2e_models else None, layers=args.e2e_layers)
    elif _gpu_ready() and not args.cpu:
        if sets - {"features", "linear", "gqa"}:
            run_gpu(sets, args.dtype, args.out, args.head_dim)
        if "gqa" in sets:
            from flashsci.bench_gqa import run_gqa
            run_gqa(args.dtype, args.out)
        if "linear" in sets:
            from flashsci.bench_linear import run_linear
            run_linear(args.dtype, args.out)
        if "features" in sets:
            from flashsci.bench_features import run_features
            run_features(args.dtype, args.out, args.fasta)
    else:
        run_cpu(args.out)


if __name__ == "__main__":
    main()
