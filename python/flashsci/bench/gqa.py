"""Benchmark of grouped-query attention against torch (python -m flashsci.bench --sets gqa).

K and V with Hkv heads serving H / Hkv query heads each (Llama-style shapes, B * S = 16384; multi-query with Hkv = 1):
flashsci.attention on the grouped K/V against SDPA with enable_gqa=True (default dispatch and each backend that takes
it) and against SDPA's cuDNN backend on K/V repeated to H heads beforehand (the repeat not timed: torch's best case).
flashsci on the repeated K/V is beside it, to show what reading each K/V head once saves. Multi-query K/V given as
torch's expand (head stride 0) is timed as dispatched (one shared head: the Hopper kernel) and on the portable kernel
(forced), which took it before grouped heads existed. Kernel times by CUDA-graph replay over input sets larger than
L2, flashsci in a pair of turns with each torch variant; ratios divide two times from one pair.
"""
import math
import time

import flashsci
from flashsci.bench.results import slug, write_plot, write_results
from flashsci.bench.timing import flops, forced, graph_kernel_times_us, paired_kernel_times_us, with_backend

CONFIGS = [  # (B, H, Hkv, S, D)
    (16, 32, 8, 1024, 128), (4, 32, 8, 4096, 128), (4, 32, 4, 4096, 64), (16, 32, 1, 1024, 128), (1, 32, 8, 2048, 128),
]


def gqa_input_sets(torch, b, h, hkv, s, d, dtype):
    """Rotating (q, k, v, k repeated, v repeated) sets whose bytes together reach twice the L2."""
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    n_sets = max(1, min(32, math.ceil(2 * l2 / (2 * b * (2 * h + 2 * hkv) * s * d))))
    sets = []
    for _ in range(n_sets):
        q, k, v = (torch.randn(b, n, s, d, device="cuda", dtype=dtype) for n in (h, hkv, hkv))
        sets.append((q, k, v, *(x.repeat_interleave(h // hkv, dim=1) for x in (k, v))))
    return sets


def run_gqa(dtype_name, out_dir):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    dtype = getattr(torch, dtype_name)
    props = torch.cuda.get_device_properties(0)
    rows = []
    print(f"GPU: {props.name}; torch {torch.__version__}; dtype {dtype_name}", flush=True)
    for (b, h, hkv, s, d), causal in ((c, causal) for c in CONFIGS for causal in (False, True)):
        inputs = gqa_input_sets(torch, b, h, hkv, s, d, dtype)
        fs = lambda q, k, v, kr, vr: flashsci.attention(q, k, v, causal=causal)
        gqa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        torch_fns = {"sdpa gqa": lambda q, k, v, kr, vr: gqa(q, k, v)}
        for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                         ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            one = with_backend(sdpa_kernel, be, gqa)
            torch_fns[f"{name} gqa"] = lambda q, k, v, kr, vr, one=one: one(q, k, v)
        cudnn = with_backend(sdpa_kernel, SDPBackend.CUDNN_ATTENTION,
                              lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        torch_fns["cudnn repeated"] = lambda q, k, v, kr, vr: cudnn(q, kr, vr)
        pairs = paired_kernel_times_us(torch, fs, torch_fns, inputs, optional=tuple(torch_fns))
        times = {name: t for name, (_, t) in pairs.items() if t}
        best = min(times, key=times.get)
        row = {"B": b, "H": h, "Hkv": hkv, "S": s, "D": d, "causal": causal, "dtype": dtype_name,
               **{f"{name} us": times.get(name) for name in torch_fns}, "best torch": best,
               "flashsci us": pairs[best][0], "speedup vs best": times[best] / pairs[best][0]}
        own = graph_kernel_times_us(torch, {"grouped": fs, "repeated": lambda q, k, v, kr, vr: flashsci.attention(
            q, kr, vr, causal=causal)}, inputs)
        row["flashsci grouped us"], row["flashsci repeated us"] = own["grouped"], own["repeated"]
        if hkv == 1:   # the same K/V as torch's expand (head stride 0): as dispatched, and on the portable kernel
            wide = lambda q, k, v, kr, vr: flashsci.attention(q, k.expand(q.shape), v.expand(q.shape), causal=causal)
            t = graph_kernel_times_us(torch, {"auto": wide, "sm80": forced("sm80", wide)}, inputs)
            row["expand us"], row["expand sm80 us"] = t["auto"], t["sm80"]
        q, k, v, kr, vr = inputs[0]
        row["max diff vs sdpa"] = (fs(q, k, v, kr, vr).float() - gqa(q, k, v).float()).abs().max().item()
        row["flashsci TF/s"] = flops(b, h, s, s, d, causal) / row["flashsci us"] / 1e6
        rows.append(row)
        print(" ".join(f"{key}={val:.4g}" if isinstance(val, float) else f"{key}={val}" for key, val in row.items()),
              flush=True)
        del inputs, q, k, v, kr, vr
        torch.cuda.empty_cache()
    meta = {"gpu": props.name, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "dtype": dtype_name,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if out_dir:
        stem = f"gqa_{slug(props.name)}_{dtype_name}"
        write_results(out_dir, stem, meta, rows, _markdown(rows, meta))
        write_plot(out_dir, stem, f"grouped-query attention on {props.name}, {dtype_name}",
                   [f"{r['B']}x{r['H']}/{r['Hkv']}x{r['S']}x{r['D']}{' causal' if r['causal'] else ''}" for r in rows],
                   {"flashsci / fastest torch": [r["speedup vs best"] for r in rows]}, "torch time / flashsci time")
    return rows


def _cell(x):
    return "—" if x is None else f"{x:.1f}"


def _markdown(rows, meta):
    names = ["sdpa gqa", "flash gqa", "cudnn gqa", "efficient gqa", "cudnn repeated"]
    out = [f"# flashsci grouped-query attention vs torch — {meta['gpu']}", "",
           f"torch {meta['torch']}, cuDNN {meta['cudnn']}, {meta['dtype']}, {meta['date']}. Kernel times (µs) by "
           "CUDA-graph replay, median. Torch: SDPA with enable_gqa=True (default dispatch, then each backend; — where "
           "it refuses), and cuDNN on K/V repeated to H heads beforehand (repeat not timed). flashsci is timed in a pair "
           "with each; its time and the speedup are from the pair with the fastest torch variant. \"fs repeated\": "
           "flashsci on the repeated K/V; \"expand\": multi-query K/V given as torch's expand, as dispatched / on the "
           "portable kernel (forced).", "",
           "| B×H×S×D | Hkv | causal | " + " | ".join(names)
           + " | flashsci | TF/s | speedup vs best | fs repeated | expand | expand sm80 | max diff |",
           "|" + "---|" * (len(names) + 10)]
    for r in rows:
        shape = f"{r['B']}×{r['H']}×{r['S']}×{r['D']}"
        out.append(f"| {shape} | {r['Hkv']} | {'yes' if r['causal'] else 'no'} | "
                   + " | ".join(_cell(r[f'{n} us']) for n in names)
                   + f" | {r['flashsci us']:.1f} | {r['flashsci TF/s']:.0f} | {r['speedup vs best']:.2f}× "
                   f"({r['best torch']}) | {r['flashsci repeated us']:.1f} | {_cell(r.get('expand us'))} | "
                   f"{_cell(r.get('expand sm80 us'))} | {r['max diff vs sdpa']:.1e} |")
    return "\n".join(out) + "\n"
