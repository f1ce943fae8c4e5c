"""What the packed path costs over the dense one on the same work: B sequences of one length L, packed through
flashsci.attention_varlen_backward (the feature kernel) against the same batch as (B, H, L, D) through
flashsci.attention_backward (the plain kernels), CUDA events in turns, ESM2-3B heads (H = 40, D = 64), bf16; with
--sm80 the portable kernels forced. L = 128 ... 2048, B * L = 16k tokens, causal and not.
    python benchmarks/experiments/varlen_equal_quick.py [--sm80]"""
import sys

import torch

import flashsci
from flashsci.bench.timing import event_turns_us


def main():
    if "--sm80" in sys.argv:
        flashsci._flashsci._set_attention_kernel("sm80")
    h, d = 40, 64
    print(torch.cuda.get_device_name(), "portable kernels forced" if "--sm80" in sys.argv else "")
    for length in (128, 256, 512, 1024, 2048):
        b = 16384 // length
        cu = torch.arange(0, b * length + 1, length, dtype=torch.int32, device="cuda")
        for causal in (False, True):
            q, k, v, dout = (torch.randn(b * length, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            out, lse = flashsci.attention_varlen(q, k, v, cu, cu, length, length, causal=causal, return_lse=True)
            dense = [x.view(b, length, h, d) for x in (q, k, v, dout, out)]
            dlse = lse.view(h, b, length).transpose(0, 1).contiguous()   # (B, H, L), as the dense forward returns it
            fns = {
                "packed": lambda: flashsci.attention_varlen_backward(dout, q, k, v, out, lse, cu, cu, length, length,
                                                                     causal=causal),
                "dense": lambda: flashsci.attention_backward(dense[3], *dense[:3], dense[4], dlse, causal=causal,
                                                             layout="bshd"),
            }
            t = event_turns_us(torch, fns, [()])
            print(f"{b}x{length} causal={causal}: packed {t['packed']:.1f} us, dense {t['dense']:.1f} us -> packed "
                  f"{t['packed'] / t['dense']:.3f}x the dense time", flush=True)


if __name__ == "__main__":
    main()
