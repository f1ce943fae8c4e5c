"""Quick packed-varlen timing while iterating on the option kernels (the recorded comparison is python -m
flashsci.bench --sets features): flashsci.attention_varlen against torch's varlen_attn on the features benchmark's
ESM2-3B batches (H = 40, D = 64; UniProt lengths, length-sorted and random order), CUDA-graph replay, median.
    python benchmarks/varlen_quick.py --fasta data/uniprot20k.fasta.gz [--dtype bfloat16]"""
import argparse
import itertools

import torch
from torch.nn.attention.varlen import varlen_attn

import flashsci
from flashsci.bench.timing import graph_kernel_times_us
from flashsci.bench.features import varlen_batches
from flashsci.bench.proteins import read_lengths


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fasta", required=True)
    ap.add_argument("--dtype", default="float16")
    args = ap.parse_args()
    dtype, h, d = getattr(torch, args.dtype), 40, 64
    _, lengths = read_lengths(args.fasta)
    print(f"{torch.cuda.get_device_name()}  {dtype}\n{'batch':>18} {'fs us':>8} {'torch':>8} {'x torch':>8} {'max diff':>9}")
    for order in ("sorted", "random"):
        for _, lens in varlen_batches(lengths, order):
            b, s, total = len(lens), max(lens), sum(lens)
            cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
            packed = tuple(torch.randn(total, h, d, device="cuda", dtype=dtype) for _ in range(3))
            fns = {"fs": lambda q, k, v: flashsci.attention_varlen(q, k, v, cu, cu, s, s),
                   "torch": lambda q, k, v: varlen_attn(q, k, v, cu, cu, s, s)}
            t = graph_kernel_times_us(torch, fns, [packed])
            diff = (fns["fs"](*packed).float() - fns["torch"](*packed).float()).abs().max().item()
            print(f"{order:>6} {b:4}x{s:<5} {t['fs']:8.1f} {t['torch']:8.1f} {t['torch'] / t['fs']:8.2f} {diff:9.1e}",
                  flush=True)
            del packed


if __name__ == "__main__":
    main()
