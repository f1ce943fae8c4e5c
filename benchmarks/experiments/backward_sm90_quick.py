"""Hopper attention backward, quick look: flashsci's backward against cuDNN's (SDPA) on a few shapes, TF/s and ratio
in pairs of turns; with --one N, a single flashsci backward of shape N of SHAPES (for ncu; --cudnn: SDPA's cuDNN
backward instead, --flash: SDPA's FlashAttention-2 backward); with --sm80, the portable kernel forced, against SDPA's
FlashAttention-2 backward; --shape B,H,S,D[,c] (repeatable) instead of SHAPES; --varlen FASTA: then the packed
batches of the recorded backward benchmark (ESM2-3B heads, the FASTA's length mix).
   python3 benchmarks/experiments/backward_sm90_quick.py [--one N [--cudnn|--flash]] [--sm80] [--shape 2,8,4096,64,c]
       [--varlen data/uniprot20k.fasta.gz]"""
import sys

import torch

import flashsci
from flashsci.bench.backward import backward_sets, bench_varlen, torch_backward
from flashsci.bench.proteins import read_lengths
from flashsci.bench.timing import event_turns_us, flops

SHAPES = [(16, 32, 1024, 64, False), (16, 32, 1024, 64, True), (4, 32, 4096, 64, False), (4, 32, 4096, 64, True),
          (16, 16, 1024, 128, False), (4, 16, 4096, 128, False), (4, 16, 4096, 128, True)]


def main():
    from torch.nn.attention import SDPBackend
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    sm80 = "--sm80" in sys.argv
    if sm80:
        flashsci._flashsci._set_attention_kernel("sm80")
    if "--one" in sys.argv:
        b, h, s, d, causal = SHAPES[int(sys.argv[sys.argv.index("--one") + 1])]
        peer = next((name for name in backends if "--" + name in sys.argv), None)
        if peer:
            sets = backward_sets(torch, b, h, s, d, torch.bfloat16, causal, {peer: backends[peer]}, 1)
            torch_backward(torch, peer)(*sets[0])
        else:
            q, k, v, dout = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            out, lse = flashsci.attention(q, k, v, causal=causal, return_lse=True)
            flashsci.attention_backward(dout, q, k, v, out, lse, causal=causal)
        torch.cuda.synchronize()
        return
    peer = "flash" if sm80 else "cudnn"
    print(torch.cuda.get_device_name(), "portable kernel forced" if sm80 else "")
    shapes = [tuple(int(x) for x in a.split(",")[:4]) + (a.endswith(",c"),)
              for i, a in enumerate(sys.argv) if sys.argv[i - 1] == "--shape"] or SHAPES
    for b, h, s, d, causal in shapes:
        sets = backward_sets(torch, b, h, s, d, torch.bfloat16, causal, {peer: backends[peer]})
        fs = lambda q, k, v, dout, out, lse, theirs: flashsci.attention_backward(dout, q, k, v, out, lse, causal=causal)
        det = lambda q, k, v, dout, out, lse, theirs: flashsci.attention_backward(dout, q, k, v, out, lse, causal=causal,
                                                                                  deterministic=True)
        t = event_turns_us(torch, {"fs": fs, peer: torch_backward(torch, peer)}, sets)
        td = event_turns_us(torch, {"fs": fs, "det": det}, sets)
        f = 2.5 * flops(b, h, s, s, d, causal)
        print(f"{b}x{h}x{s}x{d} causal={causal}: flashsci {t['fs']:.0f} us {f / t['fs'] / 1e6:.0f} TF/s, {peer} {t[peer]:.0f} us "
              f"{f / t[peer] / 1e6:.0f} TF/s -> {t[peer] / t['fs']:.3f}x; deterministic {td['det'] / td['fs']:.2f}x the "
              "time", flush=True)
        del sets
        torch.cuda.empty_cache()
    if "--varlen" in sys.argv:
        bench_varlen(torch, torch.bfloat16, read_lengths(sys.argv[sys.argv.index("--varlen") + 1])[1])


if __name__ == "__main__":
    main()
