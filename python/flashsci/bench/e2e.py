"""End-to-end protein embedding benchmark (python -m flashsci.bench --e2e): HF transformers models built from
the real configs with random weights (no hub downloads), run over a fixed sample of real UniProt proteins
in token-budget batches (flashsci.batching.embed: the same batches for every variant), stock HF
(attn_implementation "sdpa" and "eager") against the same model after flashsci.integrations.patch (default:
plain projections on cuBLAS; and plain_linear="flashsci": every GEMM on flashsci), plus an
ESM-C-600M-shaped torch module (models/esmc.py) run stock (SDPA) and on flashsci.

Per model and variant: proteins/s and tokens/s (wall time of the whole pass, synchronized, after a warm-up),
peak GPU memory of the pass. Accuracy on a subset: last hidden states of stock fp16 and of patched fp16
against stock fp32 (the same weights), max and mean relative error; patched must be within 2x stock's.
Sequences are cropped to 1022 residues (ESM2's trained length, as fair-esm's extract script does).
"""
import random
import time

from flashsci.bench.proteins import read_fasta
from flashsci.bench.results import slug, write_plot, write_results

CROP = 1022
ESM_VOCAB = ["<cls>", "<pad>", "<eos>", "<unk>", *"LAGVSERTIDPKQNFYMHWCXBUZO.-"]
T5_RESIDUES = "ALGVSREDTIPKFQNYMHWCX"    # ProtT5 maps the rare U, Z, O, B to X
ESM = dict(vocab_size=33, pad_token_id=1, mask_token_id=32, position_embedding_type="rotary", token_dropout=True,
           emb_layer_norm_before=False, max_position_embeddings=1026, layer_norm_eps=1e-5)
MODELS = {
    "ESM2-650M": ("esm", dict(ESM, hidden_size=1280, num_hidden_layers=33, num_attention_heads=20,
                              intermediate_size=5120)),
    "ESM2-3B": ("esm", dict(ESM, hidden_size=2560, num_hidden_layers=36, num_attention_heads=40,
                            intermediate_size=10240)),
    "ProtT5-XL": ("t5", dict(vocab_size=128, d_model=1024, d_kv=128, num_heads=32, num_layers=24, d_ff=16384,
                             feed_forward_proj="relu", relative_attention_num_buckets=32,
                             relative_attention_max_distance=128, pad_token_id=0, eos_token_id=1)),
    "ESM-C-600M": ("esmc", None),
}


ESM_INDEX = {t: i for i, t in enumerate(ESM_VOCAB)}


def esm_tokens(seq):
    """ESM2's alphabet: <cls> residues <eos>."""
    return [0] + [ESM_INDEX.get(c, 3) for c in seq] + [2]


def t5_tokens(seq):
    """ProtT5-like ids: residues (3 + position in T5_RESIDUES, X for the rest) then </s> = 1."""
    return [3 + T5_RESIDUES.index(c if c in T5_RESIDUES else "X") for c in seq] + [1]


def build(torch, kind, config, layers=None):
    """The model (fp32, eval, on the current device) with its random init, seeded."""
    import transformers
    torch.manual_seed(0)
    if kind == "esm":
        cfg = transformers.EsmConfig(**dict(config, **({"num_hidden_layers": layers} if layers else {})))
        model = transformers.EsmModel(cfg, add_pooling_layer=False)
    elif kind == "t5":
        cfg = transformers.T5Config(**dict(config, **({"num_layers": layers} if layers else {})))
        model = transformers.T5EncoderModel(cfg)
    else:
        from flashsci.bench.models.esmc import ESMC_600M, EsmCLike
        model = EsmCLike(**dict(ESMC_600M, **({"layers": layers} if layers else {})))
    return model.eval()


VARIANTS = {"sdpa": None, "eager": None, "flashsci": "torch", "flashsci-all": "flashsci"}  # -> plain_linear


def set_variant(model, kind, variant):
    """Switch model to stock sdpa / eager, or patch() it: "flashsci" (plain projections on cuBLAS, the default)
    or "flashsci-all" (every GEMM on flashsci)."""
    from flashsci.integrations import patch, unpatch
    plain = VARIANTS[variant]
    if kind == "esmc":
        model.use_flashsci = plain or False
        return
    unpatch(model)
    model.set_attn_implementation("sdpa" if plain else variant)
    if plain:
        patch(model, plain_linear=plain)


def rel_errors(torch, outs, refs):
    """(max, mean) relative error over all residues: max|x - ref| / max|ref|, mean|x - ref| / mean|ref|."""
    diff = torch.cat([(o.float() - r.float()).abs().flatten() for o, r in zip(outs, refs)])
    ref = torch.cat([r.float().abs().flatten() for r in refs])
    return (diff.max() / ref.max()).item(), (diff.mean() / ref.mean()).item()


def timed_pass(torch, model, tokens, max_tokens):
    """(seconds, peak bytes) of one synchronized embed() pass over all tokens lists, after a warm-up."""
    from flashsci.batching import embed
    embed(model, tokens[:8], max_tokens=max_tokens, pool="mean")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    embed(model, tokens, max_tokens=max_tokens, pool="mean")
    torch.cuda.synchronize()
    return time.perf_counter() - t0, torch.cuda.max_memory_allocated()


def bench_model(torch, name, dtype, tokens, n_check, max_tokens, layers=None):
    """Rows for one model, one per variant (VARIANTS; no eager for the ESM-C module), each with its speed, peak
    memory and its accuracy against stock fp32 on the first n_check proteins."""
    from flashsci.batching import embed
    kind, config = MODELS[name]
    special = (0, 1) if kind == "t5" else (1, 1)
    check = tokens[:n_check]
    with torch.device("cuda"):
        model = build(torch, kind, config, layers)
    set_variant(model, kind, "sdpa")
    ref = embed(model, check, max_tokens=max_tokens, special=special)                   # stock fp32
    model.to(dtype)
    stock = embed(model, check, max_tokens=max_tokens, special=special)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    n_tok = sum(len(t) for t in tokens)
    rows = []
    for variant in [v for v in VARIANTS if not (kind == "esmc" and v == "eager")]:
        set_variant(model, kind, variant)
        secs, peak = timed_pass(torch, model, tokens, max_tokens)
        rows.append({"model": name, "variant": variant, "proteins": len(tokens), "tokens": n_tok, "seconds": secs,
                     "proteins_per_s": len(tokens) / secs, "tokens_per_s": n_tok / secs, "peak_gib": peak / 2**30,
                     "weights_gib": weights / 2**30})
        print(f"  {name:10s} {variant:12s} {len(tokens) / secs:8.1f} proteins/s {n_tok / secs:10.0f} tokens/s "
              f"peak {peak / 2**30:6.2f} GiB", flush=True)
    outs = {}
    for variant in ("flashsci", "flashsci-all"):
        set_variant(model, kind, variant)
        outs[variant] = embed(model, check, max_tokens=max_tokens, special=special)
    set_variant(model, kind, "sdpa")
    s_max, s_mean = rel_errors(torch, stock, ref)
    for r in rows:
        mx, mn = rel_errors(torch, outs[r["variant"]], ref) if r["variant"] in outs else (s_max, s_mean)
        r.update({"check_proteins": len(check), "max_rel": mx, "mean_rel": mn, "stock_max_rel": s_max,
                  "stock_mean_rel": s_mean, "accuracy_ok": mx <= 2 * s_max and mn <= 2 * s_mean})
        print(f"  {name:10s} {r['variant']:12s} vs fp32: max {mx:.2e} mean {mn:.2e} (stock fp16 max {s_max:.2e} "
              f"mean {s_mean:.2e}) -> {'ok' if r['accuracy_ok'] else 'FAIL'}", flush=True)
    base = {r["variant"]: r for r in rows}
    for r in rows:
        r["speedup_vs_sdpa"] = r["proteins_per_s"] / base["sdpa"]["proteins_per_s"]
        r["speedup_vs_eager"] = r["proteins_per_s"] / base["eager"]["proteins_per_s"] if "eager" in base else None
    del model
    torch.cuda.empty_cache()
    return rows


def run_e2e(dtype_name, out_dir, fasta=None, n_proteins=2000, models=None, n_check=128, max_tokens=16384,
            layers=None):
    """The end-to-end benchmark on the current GPU; writes e2e_<gpu>_<dtype>.json/.md."""
    import torch
    import transformers
    dtype = getattr(torch, dtype_name)
    path, seqs = read_fasta(fasta)
    sample = [s[:CROP] for s in random.Random(0).sample(seqs, n_proteins)]
    props = torch.cuda.get_device_properties(0)
    meta = {"gpu": props.name, "dtype": dtype_name, "torch": torch.__version__, "transformers": transformers.__version__,
            "fasta": path, "proteins": n_proteins, "crop": CROP, "max_tokens": max_tokens, "layers": layers or "full",
            "mean_length": sum(map(len, sample)) / len(sample)}
    print(f"e2e on {props.name}, {dtype_name}, {n_proteins} proteins (mean {meta['mean_length']:.0f} residues, "
          f"crop {CROP}), {max_tokens}-token batches", flush=True)
    rows = []
    for name in models or MODELS:
        tok = t5_tokens if MODELS[name][0] == "t5" else esm_tokens
        rows += bench_model(torch, name, dtype, [tok(s) for s in sample], n_check, max_tokens, layers)
    if out_dir:
        stem = f"e2e_{slug(props.name)}_{dtype_name}"
        write_results(out_dir, stem, meta, rows, _markdown(rows, meta))
        write_plot(out_dir, stem, f"protein models on {props.name}, {dtype_name}: proteins/s",
                   [f"{r['model']} {r['variant']}" for r in rows], {"proteins/s": [r["proteins_per_s"] for r in rows]},
                   "proteins/s")
    return rows


def _ratio(x):
    """A speedup cell: '1.23x', or '—' where the variant does not exist."""
    return "—" if x is None else f"{x:.2f}x"


def _markdown(rows, meta):
    """The results table: one line per model and variant."""
    lines = [f"# End-to-end protein embedding, {meta['gpu']}, {meta['dtype']}", "",
             f"torch {meta['torch']}, transformers {meta['transformers']}; {meta['proteins']} UniProt proteins "
             f"(fixed sample, mean {meta['mean_length']:.0f} residues, cropped at {meta['crop']}), "
             f"{meta['max_tokens']}-token length-sorted batches, random weights from the real configs, one run. "
             "Accuracy: last hidden states against stock fp32 on the first "
             f"{rows[0]['check_proteins'] if rows else 0} proteins (relative to max / mean |ref|).", "",
             "| model | variant | proteins/s | tokens/s | vs sdpa | vs eager | peak GiB (weights) | max rel err | "
             "mean rel err |", "|---|---|---|---|---|---|---|---|---|"]
    # peak: max_memory_allocated during the timed pass; weights: the model's parameters
    for r in rows:
        mx, mn = r["max_rel"], r["mean_rel"]
        lines.append(f"| {r['model']} | {r['variant']} | {r['proteins_per_s']:.1f} | {r['tokens_per_s']:.0f} | "
                     f"{r['speedup_vs_sdpa']:.2f}x | {_ratio(r['speedup_vs_eager'])} | {r['peak_gib']:.2f} "
                     f"({r['weights_gib']:.2f}) | {mx:.2e} | {mn:.2e} |")
    lines += ["", "Error of sdpa/eager rows: stock fp16 (sdpa) against stock fp32; flashsci rows: patched fp16 "
              "against stock fp32. Accuracy target: flashsci within 2x of stock on both. flashsci = patch(model): "
              "attention and the GEMMs with a fused activation on flashsci, the plain projections on cuBLAS "
              "(F.linear); flashsci-all = patch(model, plain_linear=\"flashsci\"): every GEMM on flashsci."]
    return "\n".join(lines) + "\n"
