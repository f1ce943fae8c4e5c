"""The packed (varlen) attention backward on the recorded benchmark's UniProt batches (ESM2-3B heads, H = 40, D = 64,
bf16): one backward kernel by kernel under torch.profiler beside torch's varlen_attn backward, then whole backward
calls by CUDA events with the batch's sequences packed in three orders (as drawn, longest first, shortest first), in
turns: how much of the time is the passes around the main kernel, and how much the order of the blocks (the tail of
the last wave) costs. --sm80: the portable kernels forced.
    python benchmarks/experiments/varlen_backward_passes.py --fasta data/uniprot20k.fasta.gz [--sm80] [--batches 4]"""
import argparse
import itertools
import random

import torch
from torch.nn.attention.varlen import varlen_attn

import flashsci
from flashsci.bench.proteins import read_lengths, token_batches
from flashsci.bench.timing import event_turns_us
from flashsci.profile.report import launch_listing
from flashsci.profile.trace import capture


def packed(lens, h, d):
    """The backward's arguments for fresh data packed in the order of lens."""
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
    s = max(lens)
    q, k, v, dout = (torch.randn(sum(lens), h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = flashsci.attention_varlen(q, k, v, cu, cu, s, s, return_lse=True)
    return dout, q, k, v, out, lse, cu, cu, s, s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fasta", required=True)
    ap.add_argument("--sm80", action="store_true")
    ap.add_argument("--batches", type=int, default=4)
    args = ap.parse_args()
    if args.sm80:
        flashsci._flashsci._set_attention_kernel("sm80")
    h, d = 40, 64
    capped = [min(n, 4096) for n in read_lengths(args.fasta)[1]]
    random.Random(0).shuffle(capped)   # the recorded benchmark's batches
    print(torch.cuda.get_device_name(), "portable kernels forced" if args.sm80 else "")
    for i, lens in enumerate(token_batches(capped)[: args.batches]):
        bwd_args = packed(lens, h, d)
        leaves = tuple(x.detach().requires_grad_() for x in bwd_args[1:4])
        o = varlen_attn(*leaves, *bwd_args[6:])
        ours = lambda: flashsci.attention_varlen_backward(*bwd_args)
        theirs = lambda: torch.autograd.grad(o, leaves, bwd_args[0], retain_graph=True)
        for name, fn in (("flashsci", ours), ("varlen_attn", theirs)):
            fn()
            _, t = capture(fn)
            print(f"batch {i} ({len(lens)}x{max(lens)}, {sum(lens)} tokens) {name}: kernels of one backward")
            print("\n".join(launch_listing(t, 110)))
        orders = {"drawn": lens, "longest first": sorted(lens, reverse=True), "shortest first": sorted(lens)}
        sets = {name: packed(order, h, d) for name, order in orders.items()}
        fns = {name: (lambda a=a: flashsci.attention_varlen_backward(*a)) for name, a in sets.items()}
        t = event_turns_us(torch, fns, [()])
        print(f"batch {i} whole backward: " + ", ".join(f"{name} {us:.1f} us" for name, us in t.items()), flush=True)


if __name__ == "__main__":
    main()
