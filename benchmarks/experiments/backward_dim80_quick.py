"""Attention backward at head dim 80 (the 2.7B LM's), quick look: flashsci against SDPA's FlashAttention-2 and cuDNN
backwards, TF/s and ratios in pairs of turns, D = 128 beside it for scale.
   python3 benchmarks/experiments/backward_dim80_quick.py"""
import torch

import flashsci
from flashsci.bench.backward import backward_sets, torch_backward
from flashsci.bench.timing import event_turns_us, flops

SHAPES = [(4, 32, 2048, 80, True), (4, 32, 1024, 80, True), (8, 32, 512, 80, True), (4, 32, 4096, 80, True),
          (4, 32, 2048, 80, False), (4, 32, 2048, 128, True)]


def main():
    from torch.nn.attention import SDPBackend
    print(torch.cuda.get_device_name())
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    for b, h, s, d, causal in SHAPES:
        sets = backward_sets(torch, b, h, s, d, torch.bfloat16, causal, backends)
        fs = lambda q, k, v, dout, out, lse, theirs: flashsci.attention_backward(dout, q, k, v, out, lse, causal=causal)
        f = 2.5 * flops(b, h, s, s, d, causal)
        line = f"{b}x{h}x{s}x{d} causal={causal}:"
        for name in backends:
            t = event_turns_us(torch, {"fs": fs, name: torch_backward(torch, name)}, sets)
            line += f" flashsci {t['fs']:.0f} us ({f / t['fs'] / 1e6:.0f} TF/s) vs {name} {t[name]:.0f} -> {t[name] / t['fs']:.3f}x;"
        print(line, flush=True)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
