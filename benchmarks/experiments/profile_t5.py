"""The Hopper kernel on ProtT5-XL heads (32 x 32 x 512 x 128, scale 1) for Nsight Compute: the plain kernel, the
protein-option kernel with no option doing anything (seqlens = full lengths) and with ProtT5's T5 bias, one launch
each after a warm-up round (so --launch-skip 3 --launch-count 3):
    ncu --clock-control none --launch-skip 3 --launch-count 3 --section SpeedOfLight --section WarpStateStats \
        -k regex:attention_fwd python benchmarks/profile_t5.py
With --section SourceCounters and -o t5, the warp-state samples per SASS instruction come out of
    ncu --import t5.ncu-rep --page source --csv --print-source sass"""
import torch

import flashsci

b, h, s, d = 32, 32, 512, 128
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
full = torch.full((b,), s, dtype=torch.int32, device="cuda")
table = torch.randn(h, 32, device="cuda")
variants = [("plain", {}), ("seqlens=full", {"seqlens": full}), ("t5", {"t5_bias": (table, 32, 128, True)})]
for _ in range(2):
    for name, kw in variants:
        flashsci.attention(q, k, v, scale=1.0, **kw)
        torch.cuda.synchronize()
print("profiled in order:", [name for name, _ in variants], flush=True)
