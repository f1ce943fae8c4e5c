"""ESM2 (HF transformers EsmModel) with flashsci: the batch is unpadded once after the embeddings, every layer
runs on packed tokens (fused q/k/v GEMM, rotary applied inside the varlen attention kernel, GELU fused into
fc1), and the result is padded once at the end. Training runs the same path with flashsci's attention backward
(hidden dropout as the stock layers apply it, gradient checkpointing per layer); dropout on the attention
probabilities (attention_probs_dropout_prob > 0 in training mode) takes the stock forward."""
import torch

from .packing import Packed, attention_packed, dense, fuse_rows, plain_gemm, project, returned, run_layer, stock_needed


def prepare(model):
    """Check that model (an EsmModel) is one the fast path computes exactly; fuse each layer's q/k/v weights."""
    cfg = model.config
    kind = getattr(cfg, "position_embedding_type", "absolute")
    if kind not in ("rotary", "absolute"):
        raise ValueError(f"flashsci patches ESM models with rotary or absolute positions, got {kind!r}")
    if kind == "rotary":
        inv_freq = model.rotary_embeddings.inv_freq.float().cpu()
        d = inv_freq.numel() * 2
        base = float(getattr(cfg, "rope_theta", 10000.0))
        expect = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        if not torch.allclose(inv_freq, expect, rtol=4e-3, atol=0):   # also after .to(fp16/bf16) rounded the buffer
            raise ValueError(f"the model's rotary inv_freq is not 1/{base:g}^(2i/{d}); flashsci computes that in the kernel")
    for layer in model.encoder.layer:
        sa = layer.attention.self
        fuse_rows([sa.query, sa.key, sa.value])


def layer_forward(layer, x, packed, rotary_base, plain):
    """One EsmLayer on packed rows x (total, hidden), plain(x, w, b) the GEMM for projections without an activation:
    x += Wo · attn(rotary(q/√d), rotary(k), v) + bo with q, k, v = LN(x) · Wqkvᵀ + bqkv;  x += W2 · gelu(W1 · LN(x) + b1) + b2."""
    att, sa = layer.attention, layer.attention.self
    T, hidden = x.shape
    qkv = project([sa.query, sa.key, sa.value], att.LayerNorm(x), plain)
    a = attention_packed(qkv.view(T, 3, sa.num_attention_heads, sa.attention_head_size), packed, rotary_base=rotary_base)
    x = att.output.dropout(dense(att.output.dense, a.view(T, hidden), plain)).add_(x)
    f = dense(layer.intermediate.dense, layer.LayerNorm(x), plain, "gelu")
    return layer.output.dropout(dense(layer.output.dense, f, plain)).add_(x)


def forward(model, stock_forward, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None,
            encoder_hidden_states=None, encoder_attention_mask=None, **kwargs):
    """EsmModel.forward on packed tokens; falls back to stock_forward for what it does not cover."""
    if stock_needed(model, kwargs, position_ids, encoder_hidden_states, model.config.attention_probs_dropout_prob):
        return stock_forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             inputs_embeds=inputs_embeds, encoder_hidden_states=encoder_hidden_states,
                             encoder_attention_mask=encoder_attention_mask, **kwargs)
    from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
    emb = model.embeddings(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds)
    packed = Packed(emb, attention_mask)
    cfg = model.config
    rotary = float(getattr(cfg, "rope_theta", 10000.0)) if cfg.position_embedding_type == "rotary" else None
    x, plain = packed.x, plain_gemm(model)
    for layer in model.encoder.layer:
        x = run_layer(model.encoder, layer, layer_forward, x, packed, rotary, plain)
    if model.encoder.emb_layer_norm_after is not None:
        x = model.encoder.emb_layer_norm_after(x)
    seq = packed.unpack(x)
    out = BaseModelOutputWithPoolingAndCrossAttentions(
        last_hidden_state=seq, pooler_output=model.pooler(seq) if model.pooler is not None else None)
    return returned(model, out, kwargs)
