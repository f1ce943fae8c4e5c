"""The rotate-half rotary embedding the benchmark models apply in torch (ESM-C's and the LM grid's stock path)."""
import functools

import torch


@functools.lru_cache(maxsize=16)
def _cos_sin(S, D, base, device, dtype):
    """cos and sin of positions 0..S-1 times inv_freq = 1/base^(2i/D) (float32, then x's dtype), (1, S, 1, D) each:
    computed once per shape, as a model computes them once per forward and shares them across its layers."""
    inv_freq = 1.0 / base ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D)
    freqs = torch.outer(torch.arange(S, device=device, dtype=torch.float32), inv_freq)
    return (torch.cat([freqs.cos()] * 2, -1).to(dtype)[None, :, None],
            torch.cat([freqs.sin()] * 2, -1).to(dtype)[None, :, None])


def rotary(x, base=10000.0):
    """Rotate-half rotary on (B, S, H, D): positions 0..S-1, cos/sin in float32, applied in x's dtype."""
    cos, sin = _cos_sin(x.shape[1], x.shape[3], float(base), x.device, x.dtype)
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin
