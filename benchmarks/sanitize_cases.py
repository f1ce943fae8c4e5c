"""A representative set of attention launches for compute-sanitizer (memcheck, racecheck):
every head dim, both dtypes, tails, causal, bshd strides, the split-KV + combine path, lse."""
import torch

import flashsci

CASES = [  # (B, H, Sq, Sk, D, causal, layout)
    (1, 2, 77, 130, 32, False, "bhsd"), (2, 1, 64, 64, 64, True, "bhsd"), (1, 3, 100, 37, 96, True, "bshd"),
    (1, 2, 129, 200, 128, False, "bshd"), (1, 1, 50, 70, 256, True, "bhsd"),
    (1, 1, 40, 900, 64, False, "bhsd"), (1, 1, 33, 700, 128, True, "bhsd"),   # split-KV + combine
]
for dtype in (torch.float16, torch.bfloat16):
    for b, h, sq, sk, d, causal, layout in CASES:
        shape = lambda s: (b, h, s, d) if layout == "bhsd" else (b, s, h, d)
        q = torch.randn(shape(sq), device="cuda", dtype=dtype)
        k, v = (torch.randn(shape(sk), device="cuda", dtype=dtype) for _ in range(2))
        out, lse = flashsci.attention(q, k, v, causal=causal, layout=layout, return_lse=True)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()
print("sanitize cases done")
