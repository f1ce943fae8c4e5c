"""flashsci's kernels as torch custom operators (torch.library), so torch.compile traces them without graph
breaks and CUDA graphs capture them:

    import flashsci.torch_ops                      # registers torch.ops.flashsci.* (imports torch)
    y = torch.ops.flashsci.linear(x, w, b, "gelu")
    o = torch.ops.flashsci.attention(q, k, v, causal=True)

Each op calls the C entry point of the same name on torch's current stream; its fake (meta) kernel gives
the output's shape, dtype and strides without running anything. Forward only, like the kernels.
Arguments that are tuples or "True or a float" in the Python API are flattened here into typed ones:
t5_bias=(table, buckets, max_distance, bidirectional) becomes t5_table, t5_num_buckets, t5_max_distance,
t5_bidirectional, and rotary becomes rotary_base (None = off).
"""
from typing import Optional

import torch

from . import _flashsci

Tensor = torch.Tensor


def _t5(table, buckets, max_distance, bidirectional):
    """The C API's t5_bias tuple, or None when no table is given."""
    return None if table is None else (table, buckets, max_distance, bidirectional)


@torch.library.custom_op("flashsci::attention", mutates_args=())
def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale: Optional[float] = None,
              layout: str = "bhsd", key_padding_mask: Optional[Tensor] = None, bias: Optional[Tensor] = None,
              t5_table: Optional[Tensor] = None, t5_num_buckets: int = 32, t5_max_distance: int = 128,
              t5_bidirectional: bool = True, rotary_base: Optional[float] = None) -> Tensor:
    """flashsci.attention as a torch op (see the README for the arguments)."""
    return _flashsci.attention(q, k, v, causal=causal, scale=scale, layout=layout, key_padding_mask=key_padding_mask,
                               bias=bias, t5_bias=_t5(t5_table, t5_num_buckets, t5_max_distance, t5_bidirectional),
                               rotary=rotary_base)


@attention.register_fake
def _attention_fake(q, k, v, causal=False, scale=None, layout="bhsd", key_padding_mask=None, bias=None,
                    t5_table=None, t5_num_buckets=32, t5_max_distance=128, t5_bidirectional=True, rotary_base=None):
    """Output shape and dtype of flashsci::attention: q's, contiguous."""
    return q.new_empty(q.shape)


@torch.library.custom_op("flashsci::attention_varlen", mutates_args=())
def attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                     max_seqlen_k: int, causal: bool = False, scale: Optional[float] = None,
                     t5_table: Optional[Tensor] = None, t5_num_buckets: int = 32, t5_max_distance: int = 128,
                     t5_bidirectional: bool = True, rotary_base: Optional[float] = None) -> Tensor:
    """flashsci.attention_varlen as a torch op: packed (total, H, D) sequences."""
    return _flashsci.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                                      scale=scale, rotary=rotary_base,
                                      t5_bias=_t5(t5_table, t5_num_buckets, t5_max_distance, t5_bidirectional))


@attention_varlen.register_fake
def _attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                           scale=None, t5_table=None, t5_num_buckets=32, t5_max_distance=128, t5_bidirectional=True,
                           rotary_base=None):
    """Output shape and dtype of flashsci::attention_varlen: q's, contiguous."""
    return q.new_empty(q.shape)


@torch.library.custom_op("flashsci::linear", mutates_args=())
def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, activation: Optional[str] = None) -> Tensor:
    """flashsci.linear as a torch op: act(x @ weight.T + bias)."""
    return _flashsci.linear(x, weight, bias, activation=activation)


@linear.register_fake
def _linear_fake(x, weight, bias=None, activation=None):
    """Output shape of flashsci::linear: x's leading dims, then N; x's dtype."""
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("flashsci::swiglu", mutates_args=())
def swiglu(x: Tensor, w_gate: Tensor, w_up: Optional[Tensor] = None) -> Tensor:
    """flashsci.swiglu as a torch op: silu(x @ w_gate.T) * (x @ w_up.T), or a packed [2N, K] w_gate."""
    return _flashsci.swiglu(x, w_gate, w_up)


@swiglu.register_fake
def _swiglu_fake(x, w_gate, w_up=None):
    """Output shape of flashsci::swiglu: x's leading dims, then N."""
    n = w_gate.shape[0] if w_up is not None else w_gate.shape[0] // 2
    return x.new_empty((*x.shape[:-1], n))
