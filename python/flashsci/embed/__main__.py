"""flashsci-embed: embed every protein of a FASTA file with a patched ESM2 or ProtT5 model into shards.

    flashsci-embed MODEL input.fasta[.gz] -o OUTDIR [--pool mean|per-residue|both] [--max-tokens N]
                   [--dtype bf16|fp16|fp32] [--long chunk|truncate|error] [--device cuda|cpu] [--shard-size N]
    torchrun --nproc-per-node 4 -m flashsci.embed MODEL input.fasta -o OUTDIR      # one process per GPU

Started again with the same arguments, a run skips the shards it finished (checked by checksum) and writes the rest.
Bad records are handled by rule and listed in OUTDIR/bad_records.tsv: an empty sequence is left out (not in the
index); letters outside the model's alphabet become X; a record longer than the model's window follows
--long; an id seen again within its shard is embedded again (both rows in the index).
"""
import argparse
import os
import sys
import time

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def parse(argv):
    ap = argparse.ArgumentParser(prog="flashsci-embed", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="HF hub name or local directory of an ESM2 or T5-encoder (ProtT5) model")
    ap.add_argument("fasta", help="input FASTA, plain or .gz")
    ap.add_argument("-o", "--out", required=True, help="output directory (created; reused to resume)")
    ap.add_argument("--pool", choices=("mean", "per-residue", "both"), default="mean")
    ap.add_argument("--max-tokens", type=int, default=16384, help="padded tokens per batch (default 16384)")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default=None, help="default bf16 on CUDA, fp32 on the CPU")
    ap.add_argument("--long", choices=("chunk", "truncate", "error"), default="chunk",
                    help="sequences longer than the model's window: overlapping windows averaged (default), cut, or refused")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default cuda when a GPU is there")
    ap.add_argument("--shard-size", type=int, default=1000, help="records per shard (default 1000)")
    ap.add_argument("--revision", default=None, help="model revision on the hub")
    ap.add_argument("--no-patch", action="store_true",
                    help="run the stock transformers model (sdpa, padded batches): the baseline for comparisons")
    args = ap.parse_args(argv)
    if args.max_tokens < 1 or args.shard_size < 1:
        ap.error("--max-tokens and --shard-size must be at least 1")
    return args


def distributed(torch, device_kind):
    """(rank, world, device): from torchrun's environment (NCCL on CUDA, gloo on the CPU), else a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, torch.device(device_kind)
    import torch.distributed as dist
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if device_kind == "cuda" else "gloo")
    return dist.get_rank(), world, torch.device(device_kind, local) if device_kind == "cuda" else torch.device("cpu")


class Progress:
    """tqdm when installed, else a line per shard on stderr; proteins/s and residues/s either way."""

    def __init__(self, total, rank):
        self.t0, self.n, self.res = time.perf_counter(), 0, 0
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="prot", position=rank, disable=None)
        except ImportError:
            self.bar = None

    def update(self, proteins, residues):
        self.n += proteins
        self.res += residues
        dt = max(time.perf_counter() - self.t0, 1e-9)
        if self.bar is not None:
            self.bar.update(proteins)
            self.bar.set_postfix_str(f"{self.res / dt:.0f} res/s")
        else:
            print(f"{self.n} proteins, {self.n / dt:.1f} prot/s, {self.res / dt:.0f} res/s", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def summary(torch, device, rank, progress, setup):
    """One line on stderr: what this rank embedded, how fast (the embedding loop alone), set-up time, peak memory."""
    import resource
    host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20   # kB on Linux
    dt = max(time.perf_counter() - progress.t0, 1e-9)
    peak = f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB" if device.type == "cuda" else "n/a (CPU)"
    print(f"flashsci-embed: rank {rank}: {progress.n} proteins, {progress.res} residues in {dt:.2f} s "
          f"({progress.n / dt:.1f} proteins/s, {progress.res / dt:.0f} residues/s) after {setup:.2f} s set-up; "
          f"peak GPU memory {peak}, peak host memory {host:.2f} GiB", file=sys.stderr, flush=True)


def main(argv=None):
    args = parse(argv)
    import torch

    import flashsci
    from flashsci.embed import compute, fasta, models, plan, store
    kind = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        sys.exit("flashsci-embed: --device cuda but torch sees no CUDA device")
    if kind == "cuda" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)   # the host side is small copies; as under torchrun, no thread pool to wake per op
    dtype = getattr(torch, DTYPES[args.dtype or ("bf16" if kind == "cuda" else "fp32")])
    t_start = time.perf_counter()
    rank, world, device = distributed(torch, kind)
    os.makedirs(args.out, exist_ok=True)
    model, tokenize, fam, revision = models.load(args.model, device, dtype, args.revision, patched=not args.no_patch)
    sizes, counts = plan.shard_sizes(args.fasta, args.shard_size)
    mine = plan.deal(sizes, world)[rank]
    todo = [k for k in mine if store.done(args.out, k) is None]
    options = {"pool": args.pool, "max_tokens": args.max_tokens, "dtype": str(dtype).replace("torch.", ""),
               "long": args.long, "shard_size": args.shard_size, "patched": not args.no_patch}
    meta = {"model": args.model, "revision": revision, "flashsci": flashsci.__version__, "options": options}
    progress = Progress(sum(counts[k] for k in todo), rank)
    for k, rows in plan.shard_records(args.fasta, args.shard_size, set(todo)):
        seqs, kept, bad, seen = [], [], [], set()
        for rid, seq in rows:
            if not seq:
                bad.append((rid, "empty sequence: left out"))
                continue
            if args.long == "error" and fam.window and len(seq) > fam.window:
                sys.exit(f"flashsci-embed: {rid} has {len(seq)} residues, more than the model's {fam.window} "
                         "(--long chunk or truncate embeds it)")
            clean, note = fasta.clean(seq, fam.alphabet)
            if note:
                bad.append((rid, note))
            if rid in seen:
                bad.append((rid, "duplicate id in its shard: embedded again"))
            seen.add(rid)
            seqs.append(clean)
            kept.append(rid)
        per_res, means, chunked = compute.embed_shard(model, tokenize, fam, seqs, args.max_tokens, args.long,
                                                      args.pool != "mean", args.pool != "per-residue")
        tensors, hidden = {}, model.config.hidden_size
        if means is not None:
            tensors["mean"] = torch.stack(means) if means else torch.zeros(0, hidden)
        if per_res is not None:
            tensors["residues"] = torch.cat(per_res).to(dtype) if per_res else torch.zeros(0, hidden, dtype=dtype)
            lengths = torch.tensor([0] + [r.shape[0] for r in per_res], dtype=torch.int64)
            tensors["offsets"] = torch.cumsum(lengths, 0)
        lengths = [len(s) for s in seqs]
        store.write_shard(args.out, k, tensors, list(zip(kept, lengths, chunked)), bad, meta)
        progress.update(len(seqs), sum(lengths))
    progress.close()
    summary(torch, device, rank, progress, progress.t0 - t_start)
    if world > 1:
        torch.distributed.barrier()
    if rank == 0:
        store.finish(args.out, len(sizes), meta)
    if world > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
