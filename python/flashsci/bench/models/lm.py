"""The transformer LM of the profiling study, in plain torch: pre-norm blocks with RMSNorm, rotary positions (base
10000, rotate-half), causal multi-head attention, a SwiGLU feed-forward of width d_ff = 4·d_model, vocabulary 10,000.
Five sizes (d_model, layers, heads); head dim 64, except 80 for the 2.7B model.

Attention, one of:
    naive     the study's baseline: scores = q kᵀ/√d materialised, causal mask, softmax, · v (torch ops)
    sdpa      torch's F.scaled_dot_product_attention(is_causal=True) after the rotary in torch
    flashsci  flashsci's causal attention with the rotary inside the kernel (flashsci.torch_ops.attention_qkvpacked on
              the projection's (B, S, 3, H, D) view, forward and backward: one packed gradient, no stack of three);
              the SwiGLU's first GEMM fused: flashsci.swiglu where autograd does not record, its differentiable torch
              op (flashsci.torch_ops.swiglu: the backward by flashsci.swiglu_backward) where it does
Each attention call runs inside record_function("attention") so profiles can separate its kernels.
"""
import torch
import torch.nn.functional as F
from torch import nn

import flashsci
import flashsci.torch_ops
from flashsci.bench.models.rotary import rotary

SIZES = {"small": (768, 12, 12), "medium": (1024, 24, 16), "large": (1280, 36, 20), "xl": (1600, 48, 25),
         "2.7B": (2560, 32, 32)}
VOCAB = 10000
ATTENTION = ("naive", "sdpa", "flashsci")


class Block(nn.Module):
    """x += Wo · attn(rot(q), rot(k), v) with q, k, v = RMS(x) Wqkvᵀ;  x += W2 · (silu(RMS(x) W1ᵀ) ⊙ RMS(x) W3ᵀ)."""

    def __init__(self, d, heads, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, 2 * 4 * d, bias=False)     # gate rows, then up rows
        self.down = nn.Linear(4 * d, d, bias=False)

    def attend(self, x):
        B, S, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(B, S, 3, self.heads, d // self.heads)
        with torch.profiler.record_function("attention"):
            if self.attention == "flashsci":
                o = flashsci.torch_ops.attention_qkvpacked(qkv, causal=True, rotary_base=10000.0)
            else:
                q, k, v = qkv.unbind(2)
                q, k, v = rotary(q).transpose(1, 2), rotary(k).transpose(1, 2), v.transpose(1, 2)
                if self.attention == "sdpa":
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                else:
                    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
                    s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
                    o = torch.softmax(s, dim=-1) @ v
                o = o.transpose(1, 2)
        return self.out(o.reshape(B, S, d))

    def feed_forward(self, x):
        h = self.norm2(x)
        if self.attention == "flashsci":
            if flashsci.torch_ops.needs_grad(h, self.up.weight):
                return self.down(flashsci.torch_ops.swiglu(h, self.up.weight))
            return self.down(flashsci.swiglu(h, self.up.weight))
        gate, up = self.up(h).chunk(2, -1)
        return self.down(F.silu(gate) * up)

    def forward(self, x):
        x = x + self.attend(x)
        return x + self.feed_forward(x)


class LM(nn.Module):
    """Embedding, blocks, final RMSNorm, LM head; forward(ids) -> logits, loss(ids) -> next-token cross entropy."""

    def __init__(self, size, attention):
        """size: a name in SIZES or (d_model, layers, heads)."""
        super().__init__()
        if attention not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
        d, layers, heads = SIZES[size] if isinstance(size, str) else size
        self.embed = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(Block(d, heads, attention) for _ in range(layers))
        self.norm = nn.RMSNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def loss(self, ids):
        logits = self(ids[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
