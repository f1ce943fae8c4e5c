"""The rotate-half rotary embedding the benchmark models apply in torch (ESM-C's and the LM grid's stock path)."""
import torch


def rotary(x, base=10000.0):
    """Rotate-half rotary on (B, S, H, D): positions 0..S-1, inv_freq = 1/base^(2i/D), cos/sin in float32, applied in
    x's dtype."""
    S, D = x.shape[1], x.shape[3]
    inv_freq = 1.0 / base ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D)
    freqs = torch.outer(torch.arange(S, device=x.device, dtype=torch.float32), inv_freq)
    cos = torch.cat([freqs.cos()] * 2, -1).to(x.dtype)[None, :, None]
    sin = torch.cat([freqs.sin()] * 2, -1).to(x.dtype)[None, :, None]
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin
