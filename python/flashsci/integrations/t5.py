"""ProtT5 / T5 encoders (HF transformers T5Stack, as in T5EncoderModel) with flashsci: unpadded once, every
block on packed tokens (fused q/k/v GEMM, the relative-position bias computed inside the varlen attention
kernel from the (H, buckets) table, the activation fused into wi), padded once at the end. Training runs the same
path with flashsci's attention backward (the T5 table gets its gradient) where the dropout rate is 0; T5 applies its
rate to the attention probabilities too, so training with dropout takes the stock forward."""
import torch.nn.functional as F

from .packing import (Packed, attention_packed, dense, fuse_rows, gated, plain_gemm, project, returned, run_layer,
                      stock_needed)

# T5's dense_act_fn names → flashsci.linear activations (T5's "gelu" is the erf form, "gelu_new" the tanh one).
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "silu": "silu", "swish": "silu"}


def prepare(stack):
    """Check that stack (an encoder T5Stack) is one the fast path computes exactly; fuse q/k/v weights."""
    act = stack.config.dense_act_fn
    if act not in ACTIVATIONS:
        raise ValueError(f"flashsci patches T5 with activations {sorted(ACTIVATIONS)}, got {act!r}")
    for block in stack.block:
        sa = block.layer[0].SelfAttention
        fuse_rows([sa.q, sa.k, sa.v])


def rms_norm(norm, x):
    """T5LayerNorm: x / rms(x) · weight, the mean square taken in float32."""
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)


def feed_forward(ff, h, act, plain):
    """T5DenseActDense wo · act(wi · h), or the gated T5DenseGatedActDense wo · (act(wi_0 · h) ⊙ wi_1 · h)."""
    if hasattr(ff, "wi"):
        g = dense(ff.wi, h, plain, act)
    elif act == "silu":
        g = gated(ff.wi_0, ff.wi_1, h)
    else:
        g = dense(ff.wi_0, h, plain, act) * dense(ff.wi_1, h, plain)
    return dense(ff.wo, g, plain)


def block_forward(block, x, packed, t5, act, plain):
    """One encoder T5Block on packed rows x (total, d_model), no attention scaling, plain(x, w, b) the GEMM for
    projections without an activation:  x += Wo · attn(q, k, v; + T5 bias) with q, k, v = RMS(x) · Wqkvᵀ;
    x += FF(RMS(x))."""
    sa_layer, ff_layer = block.layer[0], block.layer[-1]
    sa = sa_layer.SelfAttention
    T = x.shape[0]
    h = rms_norm(sa_layer.layer_norm, x)
    qkv = project([sa.q, sa.k, sa.v], h, plain).view(T, 3, sa.n_heads, sa.key_value_proj_dim)
    a = attention_packed(qkv, packed, scale=1.0, t5=t5)
    x = dense(sa.o, a.view(T, sa.inner_dim), plain).add_(x)
    return feed_forward(ff_layer.DenseReluDense, rms_norm(ff_layer.layer_norm, x), act, plain).add_(x)


def forward(stack, stock_forward, input_ids=None, attention_mask=None, encoder_hidden_states=None,
            encoder_attention_mask=None, inputs_embeds=None, past_key_values=None, use_cache=None, **kwargs):
    """T5Stack.forward (encoder) on packed tokens; falls back to stock_forward for what it does not cover."""
    if stock_needed(stack, kwargs, None, encoder_hidden_states, stack.config.dropout_rate) or use_cache:
        return stock_forward(input_ids=input_ids, attention_mask=attention_mask,
                             encoder_hidden_states=encoder_hidden_states, encoder_attention_mask=encoder_attention_mask,
                             inputs_embeds=inputs_embeds, past_key_values=past_key_values, use_cache=use_cache, **kwargs)
    from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
    emb = stack.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
    packed = Packed(emb, attention_mask)
    sa0 = stack.block[0].layer[0].SelfAttention
    t5 = (sa0.relative_attention_bias.weight.t(), sa0.relative_attention_num_buckets,
          sa0.relative_attention_max_distance, True)
    act = ACTIVATIONS[stack.config.dense_act_fn]
    x, plain = packed.x, plain_gemm(stack)
    for block in stack.block:
        x = run_layer(stack, block, block_forward, x, packed, t5, act, plain)
    out = BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=packed.unpack(rms_norm(stack.final_layer_norm, x)))
    return returned(stack, out, kwargs)
