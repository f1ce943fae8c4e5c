"""Quick key-padding timing while iterating on the option kernels (the recorded comparison is python -m
flashsci.bench --sets features): flashsci.attention with a key_padding_mask on the features benchmark's ESM2-3B
batches (H = 40, D = 64; UniProt lengths, length-sorted and random order) padded to (B, S) on the right and on the
left, against SDPA with the same mask; CUDA-graph replay, median.
    python benchmarks/kpm_quick.py --fasta data/uniprot20k.fasta.gz [--dtype bfloat16] [--head-dim 128]"""
import argparse

import torch

import flashsci
from flashsci.bench.timing import graph_kernel_times_us
from flashsci.bench.features import varlen_batches
from flashsci.bench.proteins import read_lengths


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fasta", required=True)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--head-dim", type=int, default=64)
    args = ap.parse_args()
    dtype, d = getattr(torch, args.dtype), args.head_dim
    h = 2560 // d
    _, lengths = read_lengths(args.fasta)
    print(f"{torch.cuda.get_device_name()}  {dtype}  H = {h}, D = {d}\n"
          f"{'batch':>18} {'right us':>9} {'left us':>9} {'SDPA+mask':>10} {'max diff':>9}")
    for order in ("sorted", "random"):
        for _, lens in varlen_batches(lengths, order):
            b, s = len(lens), max(lens)
            padded = tuple(torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
            pos, n = torch.arange(s, device="cuda")[None, :], torch.tensor(lens, device="cuda")[:, None]
            right, left = pos < n, pos >= s - n
            fns = {"right": lambda q, k, v: flashsci.attention(q, k, v, key_padding_mask=right),
                   "left": lambda q, k, v: flashsci.attention(q, k, v, key_padding_mask=left),
                   "sdpa": lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
                       q, k, v, attn_mask=left[:, None, None, :])}
            t = graph_kernel_times_us(torch, fns, [padded])
            diff = (fns["left"](*padded).float() - fns["sdpa"](*padded).float()).abs().max().item()
            print(f"{order:>6} {b:4}x{s:<5} {t['right']:9.1f} {t['left']:9.1f} {t['sdpa']:10.1f} {diff:9.1e}", flush=True)
            del padded


if __name__ == "__main__":
    main()
