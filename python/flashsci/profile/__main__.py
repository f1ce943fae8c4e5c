"""python -m flashsci.profile: protein models (real configs, random weights) on token-budget batches of real UniProt
proteins, stock (transformers sdpa; the esm package's ESM-C) and patched, under torch.profiler: kernel time per
category, the top kernels with call counts, the GEMM fraction, CUDA time per batch, dtype-conversion copies, and from
an unprofiled pass proteins/s and peak memory. Writes profile_<gpu>_<dtype>.md / .json / .png with --out."""
import argparse
import sys
import time

MODELS = ("ESM2-3B", "ESM-C-600M", "ProtT5-XL", "ESM2-650M")


def parse(argv):
    ap = argparse.ArgumentParser(prog="python -m flashsci.profile", description=__doc__)
    ap.add_argument("models", nargs="*", default=["ESM2-3B", "ESM-C-600M", "ProtT5-XL"],
                    help=f"any of {', '.join(MODELS)} (default the first three)")
    ap.add_argument("--batches", type=int, default=3, help="16384-token batches profiled per run (default 3)")
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    ap.add_argument("--fasta", default=None, help="uniprot20k.fasta.gz (default: data/ or ../shared/data/)")
    ap.add_argument("--out", default=None, help="folder for the markdown, JSON and PNG")
    args = ap.parse_args(argv)
    bad = [m for m in args.models if m not in MODELS]
    if bad:
        ap.error(f"unknown model {', '.join(bad)}; choose from {', '.join(MODELS)}")
    return args


def build(torch, name):
    """(model fp32 on CUDA, eval; call(model, ids, mask); family; patch(model)), or None for ESM-C without the esm
    package."""
    from flashsci.bench.e2e import MODELS as CONFIGS, build as hf_build
    from flashsci.integrations import patch
    kind, cfg = CONFIGS[name]
    if kind != "esmc":
        with torch.device("cuda"):
            model = hf_build(torch, kind, cfg)
        model.set_attn_implementation("sdpa")
        return model, lambda m, ids, mask: m(input_ids=ids, attention_mask=mask).last_hidden_state, kind, patch
    try:
        from esm.models.esmc import ESMC
        from esm.tokenization import get_esmc_model_tokenizers
    except ImportError:
        return None
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = ESMC(1152, 18, 36, get_esmc_model_tokenizers(), use_flash_attn=False).eval()
    return model, lambda m, ids, mask: m(sequence_tokens=ids, sequence_id=mask.bool()).embeddings, kind, patch


def batches(torch, name, kind, n, fasta):
    """n 16384-token batches spread over the length-sorted batches of the first 4,000 UniProt proteins (cropped to 1022
    residues), from the longest to the shortest: (ids, mask) on CUDA, and the protein count."""
    from flashsci.batching import pad_batch, token_batches
    from flashsci.bench.e2e import CROP, esm_tokens, t5_tokens
    from flashsci.bench.proteins import read_fasta
    _, seqs = read_fasta(fasta)
    toks = [(t5_tokens if kind == "t5" else esm_tokens)(s[:CROP]) for s in seqs[:4000]]
    out, count = [], 0
    every = token_batches([len(t) for t in toks], 16384)
    for b in every[:: max(1, len(every) // n)][:n]:
        ids, mask = pad_batch([toks[i] for i in b], 0 if kind == "t5" else 1)
        out.append((torch.from_numpy(ids).cuda(), torch.from_numpy(mask).cuda()))
        count += len(b)
    return out, count


def run(torch, name, variant, model, call, data, proteins):
    """The profile summary and the speed of one variant."""
    from flashsci.profile.report import summary
    from flashsci.profile.trace import capture

    def pass_():
        with torch.inference_mode():
            for ids, mask in data:
                with torch.profiler.record_function("inference"):
                    call(model, ids, mask)
    pass_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    pass_()
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    _, trace = capture(pass_)
    s = summary(trace, "inference", batches=len(data), top=10)
    s.update({"model": name, "variant": variant, "proteins/s": proteins / secs,
              "kernel names": sorted({k["name"] for k in trace.kernels}),
              "peak GiB": torch.cuda.max_memory_allocated() / 2**30})
    print(f"{name} {variant}: {s['per_batch_ms']:.1f} CUDA ms/batch, GEMM {100 * s['gemm_fraction']:.0f}%, "
          f"{s['conversions']} dtype-conversion copies, {s['proteins/s']:.1f} proteins/s, peak {s['peak GiB']:.1f} GiB",
          flush=True)
    return s


def main(argv=None):
    args = parse(argv)
    import torch
    if not torch.cuda.is_available():
        sys.exit("python -m flashsci.profile needs a CUDA GPU (torch.profiler's CUDA kernels are what it tables)")
    from flashsci.bench.results import slug, write_results
    from flashsci.profile import report
    dtype = getattr(torch, args.dtype)
    results = []
    for name in args.models:
        built = build(torch, name)
        if built is None:
            print(f"python -m flashsci.profile: {name} skipped: it needs the esm package (pip install esm)", flush=True)
            continue
        model, call, kind, patch = built
        model = model.to(dtype)
        data, proteins = batches(torch, name, kind, args.batches, args.fasta)
        results.append(run(torch, name, "stock", model, call, data, proteins))
        patch(model)
        results.append(run(torch, name, "flashsci", model, call, data, proteins))
        del model
        torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    if args.out:
        rows = [(f"{s['model']} {s['variant']}", s) for s in results]
        md = [f"# Where the time goes — protein models, {props.name}, {args.dtype}", "",
              f"torch {torch.__version__}; random weights from the real configs; {args.batches} 16384-token batches of "
              "real UniProt proteins (length-sorted, cropped to 1022) per run; stock = transformers sdpa (ESM-C: the esm "
              "package's SDPA path), flashsci = patch(model). Kernel ms per batch by category (flashsci.profile."
              "categories), share of the total in brackets; dtype-conversion copies = aten::copy_ calls whose source "
              "and destination dtypes differ, over all batches.", ""]
        md += report.category_table(rows)
        md += ["", "| run | proteins/s | peak GiB |", "|---|---|---|"]
        md += [f"| {label} | {s['proteins/s']:.1f} | {s['peak GiB']:.1f} |" for label, s in rows]
        for label, s in rows:
            md += [""] + report.top_table(label, s)
        stem = f"profile_{slug(props.name)}_{args.dtype}"
        meta = {"gpu": props.name, "torch": torch.__version__, "dtype": args.dtype, "batches": args.batches,
                "date": time.strftime("%Y-%m-%d %H:%M:%S")}
        write_results(args.out, stem, meta, results, "\n".join(md) + "\n")
        import os
        report.plot(os.path.join(args.out, stem + ".png"), f"CUDA kernel time per batch — {props.name}", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
