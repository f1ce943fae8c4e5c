"""The attention set on the GPU (python -m flashsci.bench; sets seed, protein, sweep): flashsci against torch SDPA
(default, and each backend: flash, cudnn, efficient) on the same GPU in the same run. Kernel time by CUDA-graph
replay over input sets that together exceed the L2, flashsci taking turns with one of them at a time
(paired_kernel_times_us); per-call time of back-to-back Python calls; flashsci's host overhead alone (the loop time
of calls that do not wait for the GPU; the three call loops take turns); TFLOP/s (4*B*H*Sq*Sk*D, half for causal);
and the max difference to SDPA's output."""
import platform
import time

import flashsci
from flashsci.bench.results import fmt, md_table, slug, write_plot, write_results
from flashsci.bench.timing import (attention_input_sets, flops, paired_kernel_times_us, per_call_turns_us,
                                   with_backend)

SEED = [(1, 1, 32, 64), (1, 1, 64, 64), (1, 1, 128, 64), (1, 1, 256, 64), (1, 1, 512, 64), (4, 8, 128, 64),
        (8, 8, 128, 64), (8, 8, 256, 64), (16, 8, 512, 64)]
PROTEIN = {"ESM2-3B": (8, 40, 1024, 64), "ESM-C-600M": (8, 18, 1024, 64), "ProtT5-XL": (8, 32, 1024, 128),
           "long": (1, 40, 6144, 64)}
SWEEP = [(16384 // s, 2048 // d, s, d) for d in (64, 128) for s in (512, 1024, 2048, 4096, 8192, 16384)]
SETS = ("seed", "protein", "sweep")


def gpu_configs(sets):
    """(group, (B, H, S, D), causal) of the configs in the named sets."""
    out = []
    if "seed" in sets:
        out += [("seed", c, False) for c in SEED]
    if "protein" in sets:
        out += [(name, c, False) for name, c in PROTEIN.items()]
    if "sweep" in sets:
        out += [("sweep", c, causal) for causal in (False, True) for c in SWEEP]
    return out


# ---------------------------------------------------------------- GPU (torch as the reference point)

def run_gpu(sets, dtype_name, out_dir, head_dim=None):
    """Time every config of the sets (only those with head dim head_dim if given); print a table and with out_dir
    write attention_<GPU>_<dtype>.json/.md/.png. Returns the rows."""
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
        fns.update({name: with_backend(sdpa_kernel, be, sdpa) for name, be in backends.items()})
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
        stem = f"attention_{slug(props.name)}_{dtype_name}"
        write_results(out_dir, stem, meta, rows, _gpu_markdown(rows, meta))
        write_plot(out_dir, stem, f"attention on {props.name}, {dtype_name}: TFLOP/s",
                   [f"{r['B']}x{r['H']}x{r['Sq']}x{r['D']}{' causal' if r['causal'] else ''}" for r in rows],
                   {name: [r[f"{key}_tflops"] for r in rows] for name, key in
                    (("flashsci", "flashsci"), ("SDPA flash", "flash"), ("SDPA cuDNN", "cudnn"))}, "TFLOP/s")
    return rows


GPU_COLS = [("config", 22), ("causal", 6), ("fs us", 8), ("flash us", 8), ("cudnn us", 8), ("fs TF/s", 7),
            ("flash TF/s", 10), ("cudnn TF/s", 10), ("fs/flash", 8), ("fs/best", 7), ("fs call", 7),
            ("sdpa call", 9), ("call ratio", 10), ("fs host", 7), ("kernel", 6), ("blocks", 7), ("waves", 6), ("max diff", 8)]


def _gpu_cells(r):
    """The table cells of one row."""
    return [f"{r['group']} {r['B']}x{r['H']}x{r['Sq']}x{r['D']}", "yes" if r["causal"] else "no",
            fmt(r["flashsci_kernel_us"]), fmt(r["flash_kernel_us"]), fmt(r["cudnn_kernel_us"]),
            fmt(r["flashsci_tflops"]), fmt(r["flash_tflops"]), fmt(r["cudnn_tflops"]),
            fmt(r["ratio_kernel_vs_flash"], ".2f"), fmt(r["ratio_kernel_vs_best"], ".2f"),
            fmt(r["flashsci_per_call_us"]), fmt(r["sdpa_per_call_us"]), fmt(r["ratio_per_call_vs_sdpa"], ".2f"),
            fmt(r["flashsci_host_us"]), r["kernel"], str(r["blocks"]), fmt(r["waves"], ".2f"), fmt(r["max_abs_diff_vs_sdpa"], ".1e")]


def _fmt_gpu_row(r):
    """One row as a fixed-width line."""
    return " ".join(c.rjust(w) for c, (_, w) in zip(_gpu_cells(r), GPU_COLS))


def _print_gpu_table(rows, meta):
    """The whole table on stdout."""
    print(f"\nflashsci vs torch SDPA on {meta['gpu']} ({meta['dtype']}; kernel = CUDA-graph replay, call = "
          "back-to-back Python calls, host = flashsci host overhead; times in us)")
    print(" ".join(n.rjust(w) for n, w in GPU_COLS))
    for r in rows:
        print(_fmt_gpu_row(r))


def _gpu_markdown(rows, meta):
    """The results file: a header and the table."""
    lines = [f"# flashsci attention vs torch SDPA — {meta['gpu']}", "",
             f"torch {meta['torch']}, cuDNN {meta['cudnn']}, dtype {meta['dtype']}, {meta['date']}. "
             "Kernel times by CUDA-graph replay over input sets larger than L2 (median), flashsci taking turns with one "
             "SDPA variant at a time: fs us is its time in the pair with the fastest variant, fs/flash divides its time "
             "in the pair with flash; per-call = back-to-back "
             "Python calls including host overhead; TF/s = 4·B·H·S²·D (half for causal) / kernel time; blocks = "
             "thread blocks launched (query tiles × KV splits × B·H), waves = blocks / (resident blocks per SM × SMs).", ""]
    lines += md_table([n for n, _ in GPU_COLS], [_gpu_cells(r) for r in rows])
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- CPU
