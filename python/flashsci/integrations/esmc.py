"""ESM-C (the `esm` package's ESMC) with flashsci: the batch is unpadded once after the embedding, every block runs on
packed tokens (one qkv GEMM, LayerNorm on the full q and k, the rotary applied inside the varlen attention kernel,
SwiGLU fused into the FFN's first GEMM) and the outputs are padded once. Training runs the same path with flashsci's
attention backward. ESMCOutput as the stock forward gives it: sequence_logits, embeddings (after the final norm) and
the hidden states of every block; padded positions hold zeros (the stock forward leaves values there that nothing
should read). A sequence_id of integers (several sequences in one row) takes the stock forward."""
import torch

from .packing import Packed, attention_packed, dense, gated, plain_gemm

ROTARY_TYPES = ("RotaryEmbedding", "TritonRotaryEmbedding")


def prepare(model):
    """Check that model (an ESMC) is one the fast path computes exactly: plain attention blocks, rotate-half rotary
    without XPos scaling or position scaling, SwiGLU or GELU FFNs."""
    bases = set()
    for i, block in enumerate(model.transformer.blocks):
        if getattr(block, "use_geom_attn", False) or not getattr(block, "use_plain_attn", True):
            raise ValueError(f"flashsci patches ESM-C blocks of plain attention; block {i} has geometric attention")
        rot = block.attn.rotary
        if (type(rot).__name__ not in ROTARY_TYPES or rot.interleaved or rot.scale_base is not None
                or rot.scaling_factor != 1.0):
            raise ValueError(f"flashsci computes rotate-half rotary without scaling in the kernel; block {i} has "
                             f"{type(rot).__name__}(interleaved={rot.interleaved}, scale_base={rot.scale_base}, "
                             f"scaling_factor={rot.scaling_factor})")
        if type(block.ffn[2]).__name__ not in ("SwiGLU", "GELU") or len(block.ffn) != 4:
            raise ValueError(f"flashsci patches ESM-C FFNs of LayerNorm, Linear, SwiGLU or GELU, Linear; block {i} has "
                             f"{[type(m).__name__ for m in block.ffn]}")
        bases.add(float(rot.base))
    if len(bases) > 1:
        raise ValueError(f"flashsci patches ESM-C models whose blocks share one rotary base, got {sorted(bases)}")
    model.__dict__["_flashsci_rotary_base"] = bases.pop() if bases else 10000.0


def block_forward(block, x, packed, base, plain):
    """One UnifiedTransformerBlock on packed rows x (total, d), s its residue scaling factor:
    q, k, v = LN(x) · Wqkvᵀ;  x += Wo · attn(rot(q_ln(q)), rot(k_ln(k)), v) / s;  x += W2 · swiglu(W1 · LN(x)) / s."""
    attn, s = block.attn, block.scaling_factor
    T, d = x.shape
    q, k, v = dense(attn.layernorm_qkv[1], attn.layernorm_qkv[0](x), plain).chunk(3, -1)
    qkv = torch.stack([attn.q_ln(q).to(q.dtype), attn.k_ln(k).to(q.dtype), v], 1)
    a = attention_packed(qkv.view(T, 3, attn.n_heads, attn.d_head), packed, rotary_base=base)
    r = dense(attn.out_proj, a.view(T, d), plain)
    x = (r.div_(s) if s != 1 else r).add_(x)
    ln, up, act, down = block.ffn
    h = ln(x)
    f = gated(up, None, h) if type(act).__name__ == "SwiGLU" else dense(up, h, plain, "gelu")
    r = dense(down, f, plain)
    return (r.div_(s) if s != 1 else r).add_(x)


def run(model, sequence_tokens, mask, keep_hidden):
    """(Packed batch, rows after the final norm, [rows after each block] or None) of the packed forward."""
    packed = Packed(model.embed(sequence_tokens), mask)
    x, plain, base, hidden = packed.x, plain_gemm(model), model.__dict__["_flashsci_rotary_base"], []
    for block in model.transformer.blocks:
        x = block_forward(block, x, packed, base, plain)
        if keep_hidden:
            hidden.append(x)
    return packed, model.transformer.norm(x), (hidden if keep_hidden else None)


def embeddings(model, sequence_tokens, mask):
    """The final-norm embeddings (B, L, d) of a patched ESMC for a bool mask, without the logits and hidden states
    its forward also returns."""
    packed, x, _ = run(model, sequence_tokens, mask, False)
    return packed.unpack(x)


def forward(model, stock_forward, sequence_tokens=None, sequence_id=None):
    """ESMC.forward on packed tokens; falls back to stock_forward for integer sequence ids."""
    if sequence_tokens is None or (sequence_id is not None and sequence_id.dtype != torch.bool):
        return stock_forward(sequence_tokens=sequence_tokens, sequence_id=sequence_id)
    from esm.models.esmc import ESMCOutput
    if sequence_id is None:
        sequence_id = sequence_tokens != model.tokenizer.pad_token_id
    packed, x, hidden = run(model, sequence_tokens, sequence_id, True)
    emb = packed.unpack(x)
    return ESMCOutput(sequence_logits=model.sequence_head(emb), embeddings=emb,
                      hidden_states=torch.stack([packed.unpack(h) for h in hidden]))
