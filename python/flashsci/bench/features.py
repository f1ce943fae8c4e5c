"""Benchmark of the protein options against torch (python -m flashsci.bench --sets features).

- varlen: ESM2-3B heads (H=40, D=64) on 16k-token batches of real UniProt lengths (capped at 4096),
  length-sorted buckets and random order: flashsci.attention_varlen vs SDPA with a key padding mask, SDPA
  without a mask (padded work, for reference), torch.nn.attention.varlen.varlen_attn, and flashsci.attention
  with key_padding_mask on the padded batch.
- t5: ProtT5-XL heads (H=32, D=128, scale 1, 32 buckets, max distance 128), B*S = 16384: in-kernel T5 bias
  vs SDPA with the materialised [1, H, S, S] bias, and vs flashsci without bias.
- rotary: ESM2-3B shapes: attention with fused rotary vs torch (q * scale, HF's rotate_half rotary on q and
  k, SDPA), and vs flashsci without rotary.
Kernel times by CUDA-graph replay (median), one run, one GPU.
"""
import itertools
import os
import random
import statistics
import time

import flashsci
from flashsci.bench.proteins import TOKENS, read_lengths, token_batches
from flashsci.bench.results import slug, write_plot, write_results
from flashsci.bench.timing import graph_kernel_time_us, paired_kernel_times_us

def _time(torch, fn, inputs):
    """Kernel time; capture-unfriendly functions fall back to events around back-to-back calls."""
    try:
        return graph_kernel_time_us(torch, fn, inputs)
    except Exception:  # noqa: BLE001 - any capture failure: time it uncaptured
        torch.cuda.synchronize()
        for x in inputs:
            fn(*x)
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(15):
            e0.record()
            for x in inputs * 4:
                fn(*x)
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) * 1e3 / (4 * len(inputs)))
        return sorted(times)[len(times) // 2]


def varlen_batches(lengths, order, n_batches=6):
    """(index, lengths) of the 16k-token batches the varlen benchmark times, lengths capped at 4096: length-sorted,
    six spread over the sorted list; random order (a fixed shuffle), the first n_batches."""
    capped = [min(n, 4096) for n in lengths]
    if order == "sorted":
        batches = token_batches(sorted(capped))
        picks = sorted({min(len(batches) - 1, int(f * len(batches))) for f in (0.05, 0.25, 0.5, 0.75, 0.95, 0.999)})
    else:
        random.Random(0).shuffle(capped)
        batches = token_batches(capped)
        picks = list(range(n_batches))
    return [(i, batches[i]) for i in picks]


def bench_varlen(torch, dtype, lengths, order, n_batches=6):
    F = torch.nn.functional
    from torch.nn.attention.varlen import varlen_attn
    h, d = 40, 64
    rows = []
    for i, lens in varlen_batches(lengths, order, n_batches):
        b, s, total = len(lens), max(lens), sum(lens)
        cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
        packed = tuple(torch.randn(total, h, d, device="cuda", dtype=dtype) for _ in range(3))
        padded = tuple(torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
        lens_t = torch.tensor(lens, device="cuda")[:, None]
        keep = torch.arange(s, device="cuda")[None, :] < lens_t
        keep_left = torch.arange(s, device="cuda")[None, :] >= s - lens_t  # the same batch padded on the left
        mask = keep[:, None, None, :]
        t = {
            "flashsci_varlen": _time(torch, lambda q, k, v: flashsci.attention_varlen(q, k, v, cu, cu, s, s), [packed]),
            "flashsci_kpm": _time(torch, lambda q, k, v: flashsci.attention(q, k, v, key_padding_mask=keep), [padded]),
            "flashsci_kpm_left": _time(torch, lambda q, k, v: flashsci.attention(q, k, v, key_padding_mask=keep_left), [padded]),
            "sdpa_mask": _time(torch, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), [padded]),
            "sdpa_nomask": _time(torch, lambda q, k, v: F.scaled_dot_product_attention(q, k, v), [padded]),
            "torch_varlen": _time(torch, lambda q, k, v: varlen_attn(q, k, v, cu, cu, s, s), [packed]),
        }
        useful = 4.0 * h * d * sum(n * n for n in lens)
        row = {"set": f"varlen-{order}", "batch": i, "B": b, "S": s, "tokens": total,
               "useful_tokens": total / (b * s), "useful_fraction": sum(n * n for n in lens) / (b * s * s), **{f"{k}_us": v for k, v in t.items()},
               "flashsci_varlen_tflops": useful / t["flashsci_varlen"] / 1e6,
               "speedup_vs_sdpa_mask": t["sdpa_mask"] / t["flashsci_varlen"],
               "speedup_vs_torch_varlen": t["torch_varlen"] / t["flashsci_varlen"]}
        rows.append(row)
        print(f"varlen {order:6} batch {i:4} {b:3}x{s:5} ({total} tok, {row['useful_tokens']:.0%} of tokens, {row['useful_fraction']:.0%} of work useful): "
              f"flashsci {t['flashsci_varlen']:.1f} us ({row['flashsci_varlen_tflops']:.0f} TF/s), kpm {t['flashsci_kpm']:.1f} "
              f"(left {t['flashsci_kpm_left']:.1f}), "
              f"SDPA+mask {t['sdpa_mask']:.1f}, SDPA {t['sdpa_nomask']:.1f}, torch varlen {t['torch_varlen']:.1f} -> "
              f"{row['speedup_vs_sdpa_mask']:.2f}x / {row['speedup_vs_torch_varlen']:.2f}x", flush=True)
        del packed, padded
    return rows


def t5_table_bias(torch, table, s, num_buckets=32, max_distance=128):
    """The materialised (1, H, S, S) bias HF's T5 builds (bidirectional encoder)."""
    rel = torch.arange(s)[None, :] - torch.arange(s)[:, None]
    try:
        from transformers.models.t5.modeling_t5 import T5Attention
        buckets = T5Attention._relative_position_bucket(rel, bidirectional=True, num_buckets=num_buckets, max_distance=max_distance)
    except ImportError:
        raise SystemExit("the T5 benchmark needs transformers for HF's bucket function")
    return table[:, buckets.to(table.device)][None]


def bench_t5(torch, dtype):
    F = torch.nn.functional
    h, d, rows = 32, 128, []
    for s in (512, 1024, 2048):
        b = TOKENS // s
        inputs = [tuple(torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3)) for _ in range(2)]
        table = torch.randn(h, 32, device="cuda", dtype=torch.float32)
        bias = t5_table_bias(torch, table, s).to(dtype)
        pairs = paired_kernel_times_us(torch, lambda q, k, v: flashsci.attention(q, k, v, scale=1.0, t5_bias=(table, 32, 128, True)), {
            "flashsci_nobias": lambda q, k, v: flashsci.attention(q, k, v, scale=1.0),
            "sdpa_bias": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0),
            "sdpa_nobias": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=1.0),
        }, inputs)   # flashsci with the T5 bias in turns with each of the others (timing.paired_kernel_times_us)
        t = {"flashsci_t5": statistics.median(t5 for t5, _ in pairs.values()), **{k: v for k, (_, v) in pairs.items()}}
        fl = 4.0 * b * h * s * s * d
        row = {"set": "t5", "B": b, "H": h, "S": s, "D": d, **{f"{k}_us": v for k, v in t.items()},
               **{f"{k}_tflops": fl / v / 1e6 for k, v in t.items()},
               "speedup_vs_sdpa_bias": pairs["sdpa_bias"][1] / pairs["sdpa_bias"][0],
               "t5_vs_own_nobias": pairs["flashsci_nobias"][1] / pairs["flashsci_nobias"][0]}
        rows.append(row)
        print(f"t5 {b}x{h}x{s}x{d}: flashsci+T5 {t['flashsci_t5']:.1f} us ({row['flashsci_t5_tflops']:.0f} TF/s), own no-bias "
              f"{t['flashsci_nobias']:.1f}, SDPA+bias {t['sdpa_bias']:.1f} ({row['sdpa_bias_tflops']:.0f} TF/s), SDPA "
              f"{t['sdpa_nobias']:.1f} -> {row['speedup_vs_sdpa_bias']:.2f}x vs SDPA+bias, {row['t5_vs_own_nobias']:.2f} of own",
              flush=True)
        inputs = bias = None   # freed before the next length's tensors
    return rows


def bench_rotary(torch, dtype):
    F = torch.nn.functional
    rows = []
    for name, (b, h, s, d) in {"ESM2-3B": (8, 40, 1024, 64), "ESM2-3B long": (1, 40, 4096, 64)}.items():
        inputs = [tuple(torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3)) for _ in range(2)]
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device="cuda", dtype=torch.float32) / d))
        emb = torch.cat([torch.outer(torch.arange(s, device="cuda", dtype=torch.float32), inv_freq)] * 2, -1)
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)   # computed once per forward by HF, outside the layers
        try:
            from transformers.models.esm.modeling_esm import apply_rotary_pos_emb
        except ImportError:
            raise SystemExit("the rotary benchmark needs transformers for HF's ESM rotary")

        def torch_rotary_sdpa(q, k, v):
            q, k = apply_rotary_pos_emb(q * d ** -0.5, k, cos[None], sin[None])   # (1, S, D), unsqueezed over heads
            return F.scaled_dot_product_attention(q, k, v, scale=1.0)

        t = {
            "flashsci_rotary": _time(torch, lambda q, k, v: flashsci.attention(q, k, v, rotary=True), inputs),
            "flashsci_plain": _time(torch, lambda q, k, v: flashsci.attention(q, k, v), inputs),
            "torch_rotary_sdpa": _time(torch, torch_rotary_sdpa, inputs),
            "sdpa_plain": _time(torch, lambda q, k, v: F.scaled_dot_product_attention(q, k, v), inputs),
        }
        row = {"set": "rotary", "name": name, "B": b, "H": h, "S": s, "D": d, **{f"{k}_us": v for k, v in t.items()},
               "speedup_vs_torch": t["torch_rotary_sdpa"] / t["flashsci_rotary"]}
        rows.append(row)
        print(f"rotary {name} {b}x{h}x{s}x{d}: flashsci+rotary {t['flashsci_rotary']:.1f} us, plain {t['flashsci_plain']:.1f}; "
              f"torch rotary+SDPA {t['torch_rotary_sdpa']:.1f}, SDPA {t['sdpa_plain']:.1f} -> {row['speedup_vs_torch']:.2f}x",
              flush=True)
        del inputs
    return rows


def run_features(dtype_name, out_dir, fasta=None):
    """The varlen, T5 and rotary rows; with out_dir, features_<GPU>_<dtype>.json/.md/.png."""
    import torch
    dtype = getattr(torch, dtype_name)
    props = torch.cuda.get_device_properties(0)
    path, lengths = read_lengths(fasta)
    print(f"GPU: {props.name}; torch {torch.__version__}; {dtype_name}; {len(lengths)} proteins from {path} "
          f"(mean {sum(lengths) / len(lengths):.0f}, max {max(lengths)})", flush=True)
    rows = bench_varlen(torch, dtype, lengths, "sorted") + bench_varlen(torch, dtype, lengths, "random")
    rows += bench_t5(torch, dtype) + bench_rotary(torch, dtype)
    meta = {"gpu": props.name, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "dtype": dtype_name,
            "proteins": len(lengths), "fasta": os.path.basename(path), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if out_dir:
        stem = f"features_{slug(props.name)}_{dtype_name}"
        write_results(out_dir, stem, meta, rows, _markdown(rows, meta))
        labels = [f"{r['set']} {r.get('batch', r.get('name', r['S']))}" for r in rows]
        speedup = [r.get("speedup_vs_sdpa_mask", r.get("speedup_vs_sdpa_bias", r.get("speedup_vs_torch"))) for r in rows]
        write_plot(out_dir, stem, f"protein options on {props.name}, {dtype_name}: speedup over torch (> 1: faster)",
                   labels, {"flashsci / torch": speedup}, "torch time / flashsci time")
    return rows


def _markdown(rows, meta):
    out = [f"# flashsci protein options vs torch — {meta['gpu']}", "",
           f"torch {meta['torch']}, cuDNN {meta['cudnn']}, {meta['dtype']}, {meta['date']}; lengths from {meta['fasta']} "
           f"({meta['proteins']} proteins, capped at 4096). Kernel times (µs) by CUDA-graph replay, median; the T5 "
           "rows time flashsci with the bias in turns with each other kernel in its own pair, and divide times from one "
           "pair.", "",
           "## Packed variable length, ESM2-3B heads (H=40, D=64), 16k-token batches", "",
           "| order | batch | B×S | tokens | useful tokens / work | flashsci varlen | TF/s | flashsci kpm (left padding) | SDPA+mask | SDPA no mask | torch varlen | vs SDPA+mask | vs torch varlen |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["set"].startswith("varlen")):
        out.append(f"| {r['set'][7:]} | {r['batch']} | {r['B']}×{r['S']} | {r['tokens']} | {r['useful_tokens']:.0%} / {r['useful_fraction']:.0%} | "
                   f"{r['flashsci_varlen_us']:.1f} | {r['flashsci_varlen_tflops']:.0f} | {r['flashsci_kpm_us']:.1f} ({r['flashsci_kpm_left_us']:.1f}) | "
                   f"{r['sdpa_mask_us']:.1f} | {r['sdpa_nomask_us']:.1f} | {r['torch_varlen_us']:.1f} | "
                   f"{r['speedup_vs_sdpa_mask']:.2f}× | {r['speedup_vs_torch_varlen']:.2f}× |")
    out += ["", "## In-kernel T5 bias, ProtT5-XL heads (H=32, D=128, scale 1)", "",
            "| B×S | flashsci T5 | TF/s | flashsci no bias | TF/s | SDPA + [1,H,S,S] bias | TF/s | SDPA no bias | vs SDPA+bias | of own no-bias speed |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["set"] == "t5"):
        out.append(f"| {r['B']}×{r['S']} | {r['flashsci_t5_us']:.1f} | {r['flashsci_t5_tflops']:.0f} | {r['flashsci_nobias_us']:.1f} | "
                   f"{r['flashsci_nobias_tflops']:.0f} | {r['sdpa_bias_us']:.1f} | {r['sdpa_bias_tflops']:.0f} | {r['sdpa_nobias_us']:.1f} | "
                   f"{r['speedup_vs_sdpa_bias']:.2f}× | {r['t5_vs_own_nobias']:.2f} |")
    out += ["", "## Fused rotary (ESM2: q scaled, then rotated)", "",
            "| shape | flashsci + rotary | flashsci plain | torch rotary + SDPA | SDPA plain | speedup |", "|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["set"] == "rotary"):
        out.append(f"| {r['name']} {r['B']}×{r['H']}×{r['S']}×{r['D']} | {r['flashsci_rotary_us']:.1f} | {r['flashsci_plain_us']:.1f} | "
                   f"{r['torch_rotary_sdpa_us']:.1f} | {r['sdpa_plain_us']:.1f} | {r['speedup_vs_torch']:.2f}× |")
    return "\n".join(out) + "\n"
