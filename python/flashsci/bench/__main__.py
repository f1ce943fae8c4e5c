"""Benchmark flashsci against torch on the GPU, or against NumPy on the CPU.

    python -m flashsci.bench                      # GPU + torch: seed, protein and sweep configs vs torch SDPA
                                                  # no CUDA GPU: the CPU sets (attention, linear) vs NumPy
    python -m flashsci.bench --sets seed --out benchmarks/results
    python -m flashsci.bench --sets features      # protein options vs torch on real UniProt lengths
    python -m flashsci.bench --sets gqa           # grouped-query attention vs SDPA enable_gqa
    python -m flashsci.bench --sets linear        # fused linear / SwiGLU vs torch GEMMs
    python -m flashsci.bench --sets linear_train  # their forward + backward vs torch autograd
    python -m flashsci.bench --sets backward      # attention backward vs SDPA's FlashAttention-2 and cuDNN backward
    python -m flashsci.bench --sets backward_portable   # the same with flashsci's portable (sm80) kernels forced
    python -m flashsci.bench --e2e                # HF ESM2 / ProtT5 stock vs patched, proteins/s
    python -m flashsci.bench --train              # masked-LM fine-tuning steps (ESM2, ProtT5, ESM-C, LoRA), stock vs patched
    python -m flashsci.bench --lm-grid            # the profiling study's LM grid: naive / SDPA / flashsci attention
    python -m flashsci.bench --train-curve        # 200-step masked-LM loss curves, stock vs patched, three seeds
    python -m flashsci.bench --embed              # flashsci-embed against the same job on the stock model
    python -m flashsci.bench --embed --embed-models "" --embed-gpus 1,2,4 --embed-resume   # scaling, kill-and-resume
    python -m flashsci.bench --cpu --sets attention,linear --dtype float32

With --out, each set writes <set>_<device>_<dtype>.json (metadata and rows), .md (the table) and .png (a plot; needs
matplotlib: pip install 'flashsci[plot]'). A set or dtype that does not apply to the device is an error.
"""
import argparse
import sys

import flashsci
from flashsci.bench import attention, cpu

GPU_SETS = attention.SETS + ("features", "gqa", "linear", "linear_train", "backward", "backward_portable")
GPU_DTYPES = ("float16", "bfloat16")


def gpu_ready():
    """Whether a CUDA device, torch and torch's CUDA are all there (says why not on stderr where the GPU is)."""
    if flashsci.cuda_device_count() == 0:
        return False
    try:
        import torch
    except ImportError:
        print("a CUDA device is present but torch is not installed: the GPU benchmark compares with torch",
              file=sys.stderr)
        return False
    return torch.cuda.is_available()


def parse(argv):
    """The parsed arguments."""
    ap = argparse.ArgumentParser(prog="python -m flashsci.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default=None,
                    help=f"comma-separated; GPU: {', '.join(GPU_SETS)} (default seed,protein,sweep); "
                         f"CPU: {', '.join(cpu.SETS)} (default both)")
    ap.add_argument("--dtype", default=None,
                    help=f"GPU: {' or '.join(GPU_DTYPES)} (default float16); CPU: {', '.join(cpu.DTYPES)} (default both)")
    ap.add_argument("--fasta", default=None, help="uniprot20k.fasta.gz for the features and e2e sets' length mix")
    ap.add_argument("--head-dim", type=int, default=None, help="only attention configs with this head dim")
    ap.add_argument("--out", default=None, help="folder for the JSON, markdown and PNG results")
    ap.add_argument("--cpu", action="store_true", help="run the CPU sets even when a GPU is present")
    ap.add_argument("--e2e", action="store_true", help="only the end-to-end model benchmark")
    ap.add_argument("--train", action="store_true", help="only the fine-tuning step benchmark")
    ap.add_argument("--train-curve", action="store_true", help="only the 200-step loss curves, stock vs patched")
    ap.add_argument("--lm-grid", action="store_true", help="only the transformer-LM grid (sizes x context x attention)")
    ap.add_argument("--lm-sizes", default=None, help="--lm-grid: comma-separated subset of small,medium,large,xl,2.7B")
    ap.add_argument("--lm-contexts", default=None, help="--lm-grid: comma-separated contexts (default 128..4096)")
    ap.add_argument("--embed", action="store_true", help="only the flashsci-embed benchmark")
    ap.add_argument("--embed-models", default="ESM2-650M,ESM2-3B,ProtT5-XL,ESM-C-600M",
                    help="--embed: models for the one-GPU comparison (empty: none)")
    ap.add_argument("--embed-gpus", default=None, help="--embed: GPU counts for the scaling run, e.g. 1,2,4")
    ap.add_argument("--embed-resume", action="store_true", help="--embed: the kill-and-resume check")
    ap.add_argument("--train-models", default="", help="--train: comma-separated subset of "
                    "ESM2-650M,ESM2-3B,ProtT5-XL,ESM-C-600M,ESM2-650M LoRA r8 (default all)")
    ap.add_argument("--e2e-proteins", type=int, default=2000, help="proteins in the e2e sample")
    ap.add_argument("--e2e-models", default=None, help="comma-separated subset of ESM2-650M,ESM2-3B,ProtT5-XL")
    ap.add_argument("--e2e-layers", type=int, default=None, help="override the layer count (quick checks)")
    return ap.parse_args(argv)


def choose(given, allowed, default, what, where):
    """The comma-separated names in given (or default), each one of allowed; exits with a message otherwise."""
    names = default if given is None else [x for x in given.split(",") if x]
    bad = [x for x in names if x not in allowed]
    if bad or not names:
        sys.exit(f"python -m flashsci.bench: {what} {', '.join(bad) or '(none)'} not available {where}; "
                 f"choose from {', '.join(allowed)}")
    return names


def main(argv=None):
    """Run the chosen benchmark; returns its rows."""
    args = parse(argv)
    on_gpu = not args.cpu and gpu_ready()
    if args.embed:
        if not on_gpu:
            sys.exit("python -m flashsci.bench: the embedding benchmark needs a CUDA GPU, torch and transformers")
        from flashsci.bench.embedding import run_embed_bench
        return run_embed_bench(args.out, args.fasta, [m for m in args.embed_models.split(",") if m],
                               [int(g) for g in args.embed_gpus.split(",")] if args.embed_gpus else None,
                               args.embed_resume)
    if args.lm_grid:
        if not on_gpu:
            sys.exit("python -m flashsci.bench: the LM grid needs a CUDA GPU and torch")
        from flashsci.bench.lm_grid import run_lm_grid
        return run_lm_grid(args.out, args.lm_sizes.split(",") if args.lm_sizes else None,
                           [int(c) for c in args.lm_contexts.split(",")] if args.lm_contexts else None)
    if args.train_curve:
        if not on_gpu:
            sys.exit("python -m flashsci.bench: the loss-curve benchmark needs a CUDA GPU, torch and transformers")
        from flashsci.bench.curve import run_curve
        return run_curve(args.out, args.fasta)
    if args.train:
        if not on_gpu:
            sys.exit("python -m flashsci.bench: the fine-tuning benchmark needs a CUDA GPU, torch and transformers")
        from flashsci.bench.train import run_train
        return run_train(args.out, args.fasta, models=[m for m in args.train_models.split(",") if m] or None)
    if args.e2e:
        if not on_gpu:
            sys.exit("python -m flashsci.bench: the end-to-end benchmark needs a CUDA GPU, torch and transformers")
        from flashsci.bench.e2e import run_e2e
        dtype = choose(args.dtype, GPU_DTYPES, ["float16"], "dtype", "on the GPU")
        return run_e2e(dtype[0], args.out, args.fasta, args.e2e_proteins,
                       args.e2e_models.split(",") if args.e2e_models else None, layers=args.e2e_layers)
    if not on_gpu:
        where = "on the CPU" + ("" if args.cpu else " (no CUDA GPU with torch here)")
        sets = choose(args.sets, cpu.SETS, list(cpu.SETS), "set", where)
        dtypes = choose(args.dtype, cpu.DTYPES, list(cpu.DTYPES), "dtype", where)
        return cpu.run_cpu(sets, dtypes, args.out)
    sets = choose(args.sets, GPU_SETS, list(attention.SETS), "set", "on the GPU")
    dtype = choose(args.dtype, GPU_DTYPES, ["float16"], "dtype", "on the GPU")
    if len(dtype) != 1:
        sys.exit("python -m flashsci.bench: one --dtype per GPU run")
    rows = []
    if set(sets) & set(attention.SETS):
        rows += attention.run_gpu(set(sets), dtype[0], args.out, args.head_dim)
    if "gqa" in sets:
        from flashsci.bench.gqa import run_gqa
        rows += run_gqa(dtype[0], args.out)
    if "linear" in sets:
        from flashsci.bench.linear import run_linear
        rows += run_linear(dtype[0], args.out)
    if "linear_train" in sets:
        from flashsci.bench.linear_train import run_linear_train
        rows += run_linear_train(dtype[0], args.out)
    if "backward" in sets:
        from flashsci.bench.backward import run_backward
        rows += run_backward(dtype[0], args.out, args.fasta)
    if "backward_portable" in sets:
        from flashsci.bench.backward import run_backward
        rows += run_backward(dtype[0], args.out, args.fasta, portable=True)
    if "features" in sets:
        from flashsci.bench.features import run_features
        rows += run_features(dtype[0], args.out, args.fasta)
    return rows


if __name__ == "__main__":
    main()
