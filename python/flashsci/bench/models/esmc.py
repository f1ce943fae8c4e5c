"""An ESM-C-shaped encoder for the end-to-end benchmark (the `esm` package is not installable here): ESM-C
600M's dims (d_model 1152, 18 heads, 36 layers, SwiGLU hidden 3072), pre-LayerNorm blocks with a fused
bias-free qkv projection, LayerNorm on the full q and k (ESM-C's q_ln / k_ln), rotary embeddings
(rotate_half, base 10000), SDPA, and a SwiGLU FFN (packed [2N, K] weight, gate rows first).

`forward` runs it the stock way (padded batch, torch SDPA with a key padding mask); with `use_flashsci` set
it runs the same weights on packed tokens as flashsci.integrations.patch runs ESM2: attention_varlen with
the rotary inside the kernel, flashsci.swiglu for the FFN's first GEMM, and for the plain projections
F.linear (use_flashsci="torch") or flashsci.linear ("flashsci").
"""
import math
from types import SimpleNamespace

import torch.nn.functional as F
from torch import nn

from flashsci.bench.models.rotary import rotary
from flashsci.integrations.packing import Packed, attention_packed, linear, swiglu

ESMC_600M = dict(vocab=64, d_model=1152, heads=18, layers=36, hidden=3072)


class Block(nn.Module):
    """One ESM-C block: x += out(attn(rot(q_ln(q)), rot(k_ln(k)), v)); x += down(swiglu(up(LN(x))))."""

    def __init__(self, d, heads, hidden):
        super().__init__()
        self.heads = heads
        self.ln_qkv = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.q_ln = nn.LayerNorm(d, bias=False)
        self.k_ln = nn.LayerNorm(d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.ln_ffn = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x, mask):
        """Stock: padded x (B, S, d), key padding mask (B, 1, 1, S) bool."""
        B, S, d = x.shape
        q, k, v = self.qkv(self.ln_qkv(x)).chunk(3, -1)
        q, k = self.q_ln(q), self.k_ln(k)
        q, k, v = (t.reshape(B, S, self.heads, -1) for t in (q, k, v))
        q, k = rotary(q), rotary(k)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        x = x + self.out(a.transpose(1, 2).reshape(B, S, d))
        g, u = self.up(self.ln_ffn(x)).chunk(2, -1)
        return x + self.down(F.silu(g) * u)

    def forward_packed(self, x, packed, plain):
        """flashsci: packed rows x (total, d); plain(x, w, b) the GEMM for projections without an activation."""
        T, d = x.shape
        qkv = plain(self.ln_qkv(x), self.qkv.weight, None).view(T, 3, d)
        qkv[:, 0] = self.q_ln(qkv[:, 0])
        qkv[:, 1] = self.k_ln(qkv[:, 1])
        a = attention_packed(qkv.view(T, 3, self.heads, d // self.heads), packed, rotary_base=10000.0)
        x = plain(a.view(T, d), self.out.weight, None).add_(x)
        return plain(swiglu(self.ln_ffn(x), self.up.weight), self.down.weight, None).add_(x)


class EsmCLike(nn.Module):
    """Embedding, blocks, final LayerNorm; forward(input_ids, attention_mask) -> .last_hidden_state, as HF's."""

    def __init__(self, vocab, d_model, heads, layers, hidden):
        super().__init__()
        self.config = SimpleNamespace(pad_token_id=1)
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model, bias=False)
        self.use_flashsci = False       # False: stock; else the plain_linear of patch(): "torch" or "flashsci"
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02 if "embed" in name else 1 / math.sqrt(p.shape[1]))

    def forward(self, input_ids, attention_mask):
        x = self.embed(input_ids)
        if self.use_flashsci:
            packed = Packed(x, attention_mask)
            y, plain = packed.x, linear if self.use_flashsci == "flashsci" else F.linear
            for blk in self.blocks:
                y = blk.forward_packed(y, packed, plain)
            return SimpleNamespace(last_hidden_state=packed.unpack(self.norm(y)))
        mask = attention_mask.bool()[:, None, None, :]
        for blk in self.blocks:
            x = blk(x, mask)
        return SimpleNamespace(last_hidden_state=self.norm(x))
