"""flashsci's kernels as torch custom operators (torch.library), differentiable, traced by torch.compile without graph
breaks and captured by CUDA graphs:

    import flashsci.torch_ops                      # registers torch.ops.flashsci.* (imports torch)
    o = flashsci.torch_ops.attention(q, k, v, causal=True)      # or torch.ops.flashsci.attention(...)
    o.sum().backward()                             # dq, dk, dv by flashsci.attention_backward
    y = torch.ops.flashsci.linear(x, w, b, "gelu")  # differentiable: dx, dw, db by flashsci.linear_backward

attention (likewise attention_qkvpacked and attention_varlen) is a composite of two ops: attention_fwd, which returns
(out, lse) and saves them for its backward (no S x S tensor is ever saved), and attention_bwd, the gradients (dq, dk,
dv, and the additive bias's and the T5 table's when they require grad; attention_qkvpacked_bwd one packed dqkv). lse
is not differentiable. Each op calls the C entry point on torch's current stream; its fake kernel gives shapes and
dtypes without running anything. Arguments that are tuples or "True or a float" in the Python API are flattened into
typed ones: t5_bias=(table, buckets, max_distance, bidirectional) becomes t5_table, t5_num_buckets, t5_max_distance,
t5_bidirectional, and rotary becomes rotary_base (None = off). linear and swiglu are composites too: linear_fwd /
swiglu_fwd return (y, h), h the pre-activation the forward keeps when autograd records (else empty), and linear_bwd /
swiglu_bwd the gradients. Eager calls on plain tensors skip the custom-op dispatch (_Eager: the same implementations,
setup and backward functions).
"""
from typing import Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import _flashsci

Tensor = torch.Tensor


def _t5(table, buckets, max_distance, bidirectional):
    """The C API's t5_bias tuple, or None when no table is given."""
    return None if table is None else (table, buckets, max_distance, bidirectional)


def _plain(x):
    """x detached (the C functions take tensors without autograd history), or None."""
    return None if x is None else x.detach()


_KINDS = {"Tensor": ((Tensor,), "a torch.Tensor"), "bool": ((bool, torch.SymBool), "a bool"),
          "int": ((int, torch.SymInt), "an int"), "float": ((int, float, torch.SymInt, torch.SymFloat), "a float"),
          "str": ((str,), "a str")}


def _check(where, **args):
    """TypeError naming the first argument of a wrong type, as torch's own functions raise it; args: name=(value,
    kind), kind as the op's schema writes it ("Tensor", "Tensor?", "bool", "float?", ...; bool is not an int here)."""
    for name, (value, kind) in args.items():
        types, words = _KINDS[kind.rstrip("?")]
        if value is None and kind.endswith("?"):
            continue
        if not isinstance(value, types) or (isinstance(value, bool) and kind.rstrip("?") != "bool"):
            raise TypeError(f"flashsci.torch_ops.{where}: {name} must be {words}{' or None' if kind.endswith('?') else ''}, "
                            f"got {type(value).__name__}")
        if type(value) is int and not -2**63 <= value < 2**63:     # what the op's schema (int64) can carry
            raise ValueError(f"flashsci.torch_ops.{where}: {name} must fit 64 bits, got {value}")


class _Eager(torch.autograd.Function):
    """A differentiable op in eager mode without torch's custom-operator dispatch: the op's own implementation,
    setup_context and backward (the functions torch.library registers), for about a third of the host time per call
    (the dispatch fills in the schema's defaults and redispatches; small models' training steps are bound by the host).
    The op comes last, so that ctx.needs_input_grad lines up with its inputs."""

    @staticmethod
    def forward(ctx, *args):
        op, inputs = args[-1], args[:-1]
        output = _IMPL[op][0](*inputs)
        ctx.eager = True
        ctx.set_materialize_grads(False)  # the second output (lse, the kept pre-activation) gets no zeros filled in
        _IMPL[op][1](ctx, inputs, output)
        ctx.backward_fn, ctx.n_args = _IMPL[op][2], len(args)
        return output

    @staticmethod
    @torch.autograd.function.once_differentiable  # the backward ops have no gradient of their own
    def backward(ctx, *grads):
        if grads[0] is None:  # no gradient reached the output (grads are not materialized): none for the inputs
            return (None,) * ctx.n_args
        return (*ctx.backward_fn(ctx, *grads), None)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _eager(args):
    """Whether a call runs eagerly on plain tensors (args[0], q or x, is always one): not traced (torch.compile, export,
    opcheck's fake and functional tensors, torch.func transforms, torch.fx proxies), which see the custom op."""
    return (type(args[0]) in _PLAIN and not torch.compiler.is_compiling() and _get_current_dispatch_mode() is None and
            not torch._C._are_functorch_transforms_active() and
            all(type(a) in _PLAIN for a in args if isinstance(a, torch.Tensor)))


def _call(op, args, record):
    """op(*args): in eager mode on plain tensors its implementation, through _Eager where autograd records the call
    (record: needs_grad of its differentiable inputs); the custom op otherwise."""
    if not _eager(args):
        return op(*args)
    return _Eager.apply(*args, op) if record else _IMPL[op][0](*args)


def _op(ctx, op):
    """The backward op for a backward function: its implementation where _Eager recorded the forward, else the custom
    op (torch.library's registered autograd, torch.compile's graphs)."""
    return _IMPL_BWD[op] if getattr(ctx, "eager", False) else op


def _row_contiguous(x):
    """x with a contiguous last dim (a gradient may come broadcast, stride 0)."""
    return x if x.stride(-1) == 1 or x.shape[-1] <= 1 else x.contiguous()


def _lse_shape(q, layout):
    """The logsumexp's shape for q of layout: (B, H, Sq)."""
    b, h, s = (q.shape[0], q.shape[2], q.shape[1]) if layout == "bshd" else q.shape[:3]
    return (b, h, s)


def _lse_dtype(q):
    return torch.float64 if q.dtype == torch.float64 else torch.float32


# ---------------------------------------------------------------------------------------------------------- padded

def _attention_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale: Optional[float] = None,
                   layout: str = "bhsd", key_padding_mask: Optional[Tensor] = None, seqlens: Optional[Tensor] = None,
                   bias: Optional[Tensor] = None, t5_table: Optional[Tensor] = None, t5_num_buckets: int = 32,
                   t5_max_distance: int = 128, t5_bidirectional: bool = True,
                   rotary_base: Optional[float] = None) -> tuple[Tensor, Tensor]:
    """flashsci.attention(..., return_lse=True) as a torch op: (out, lse)."""
    return _flashsci.attention(q.detach(), k.detach(), v.detach(), causal=causal, scale=scale, layout=layout,
                               key_padding_mask=key_padding_mask, seqlens=seqlens, bias=_plain(bias),
                               t5_bias=_t5(_plain(t5_table), t5_num_buckets, t5_max_distance, t5_bidirectional),
                               rotary=rotary_base, return_lse=True)


attention_fwd = torch.library.custom_op("flashsci::attention_fwd", _attention_fwd, mutates_args=())


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, causal=False, scale=None, layout="bhsd", key_padding_mask=None, seqlens=None, bias=None,
                        t5_table=None, t5_num_buckets=32, t5_max_distance=128, t5_bidirectional=True, rotary_base=None):
    """Shapes of flashsci::attention_fwd: out like q (contiguous), lse (B, H, Sq) float32 (float64 for float64)."""
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q, layout), dtype=_lse_dtype(q))


def _attention_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool = False,
                   scale: Optional[float] = None, layout: str = "bhsd", key_padding_mask: Optional[Tensor] = None,
                   seqlens: Optional[Tensor] = None, bias: Optional[Tensor] = None, t5_table: Optional[Tensor] = None,
                   t5_num_buckets: int = 32, t5_max_distance: int = 128, t5_bidirectional: bool = True,
                   rotary_base: Optional[float] = None, bias_grad: bool = False, t5_grad: bool = False,
                   deterministic: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """flashsci.attention_backward as a torch op: (dq, dk, dv, dbias, dtable), the last two empty unless asked for."""
    grads = _flashsci.attention_backward(
        _row_contiguous(dout.detach()), q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), causal=causal,
        scale=scale, layout=layout, key_padding_mask=key_padding_mask, seqlens=seqlens, bias=_plain(bias),
        t5_bias=_t5(_plain(t5_table), t5_num_buckets, t5_max_distance, t5_bidirectional), rotary=rotary_base,
        bias_grad=bias_grad, t5_grad=t5_grad, deterministic=deterministic)
    dq, dk, dv = grads[:3]
    rest = list(grads[3:])
    dbias = rest.pop(0) if bias_grad else q.new_empty(0)
    dtable = rest.pop(0) if t5_grad else q.new_empty(0, dtype=torch.float32)
    return dq, dk, dv, dbias, dtable


attention_bwd = torch.library.custom_op("flashsci::attention_bwd", _attention_bwd, mutates_args=())


@attention_bwd.register_fake
def _attention_bwd_fake(dout, q, k, v, out, lse, causal=False, scale=None, layout="bhsd", key_padding_mask=None,
                        seqlens=None, bias=None, t5_table=None, t5_num_buckets=32, t5_max_distance=128,
                        t5_bidirectional=True, rotary_base=None, bias_grad=False, t5_grad=False, deterministic=False):
    """Shapes of flashsci::attention_bwd."""
    dbias = bias.new_empty(bias.shape) if bias_grad else q.new_empty(0)
    dtable = (q.new_empty((t5_table.shape[0], t5_num_buckets), dtype=torch.float32) if t5_grad
              else q.new_empty(0, dtype=torch.float32))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias, dtable


_FWD_ARGS = ("causal", "scale", "layout", "key_padding_mask", "seqlens", "bias", "t5_table", "t5_num_buckets",
             "t5_max_distance", "t5_bidirectional", "rotary_base")


def _attention_setup(ctx, inputs, output):
    """Save what the backward needs: q, k, v, out, lse, the masks and biases, the options; lse is not differentiable."""
    q, k, v, *rest = inputs
    opts = dict(zip(_FWD_ARGS, rest))
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse, opts["key_padding_mask"], opts["seqlens"], opts["bias"], opts["t5_table"])
    ctx.opts = {n: opts[n] for n in _FWD_ARGS if n not in ("key_padding_mask", "seqlens", "bias", "t5_table")}
    ctx.bias_grad = opts["bias"] is not None and ctx.needs_input_grad[3 + _FWD_ARGS.index("bias")]
    ctx.t5_grad = opts["t5_table"] is not None and ctx.needs_input_grad[3 + _FWD_ARGS.index("t5_table")]


def _attention_backward(ctx, grad_out, grad_lse):
    """dq, dk, dv (and dbias, dtable where wanted) from flashsci::attention_bwd; None for the options."""
    q, k, v, out, lse, kpm, seqlens, bias, table = ctx.saved_tensors
    dq, dk, dv, dbias, dtable = _op(ctx, attention_bwd)(grad_out, q, k, v, out, lse, key_padding_mask=kpm,
                                                        seqlens=seqlens, bias=bias, t5_table=table,
                                                        bias_grad=ctx.bias_grad, t5_grad=ctx.t5_grad, **ctx.opts)
    grads = {n: None for n in _FWD_ARGS}
    grads["bias"] = dbias if ctx.bias_grad else None
    grads["t5_table"] = dtable.to(table.dtype) if ctx.t5_grad else None
    return (dq, dk, dv, *(grads[n] for n in _FWD_ARGS))


torch.library.register_autograd("flashsci::attention_fwd", _attention_backward, setup_context=_attention_setup)


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale: Optional[float] = None, layout: str = "bhsd",
              key_padding_mask: Optional[Tensor] = None, seqlens: Optional[Tensor] = None, bias: Optional[Tensor] = None,
              t5_table: Optional[Tensor] = None, t5_num_buckets: int = 32, t5_max_distance: int = 128,
              t5_bidirectional: bool = True, rotary_base: Optional[float] = None) -> Tensor:
    """flashsci.attention, differentiable in q, k, v, bias and the T5 table (see the README for the arguments)."""
    _check("attention", q=(q, "Tensor"), k=(k, "Tensor"), v=(v, "Tensor"), causal=(causal, "bool"), scale=(scale, "float?"),
           layout=(layout, "str"), key_padding_mask=(key_padding_mask, "Tensor?"), seqlens=(seqlens, "Tensor?"),
           bias=(bias, "Tensor?"), t5_table=(t5_table, "Tensor?"), t5_num_buckets=(t5_num_buckets, "int"),
           t5_max_distance=(t5_max_distance, "int"), t5_bidirectional=(t5_bidirectional, "bool"),
           rotary_base=(rotary_base, "float?"))
    return _call(attention_fwd, (q, k, v, causal, scale, layout, key_padding_mask, seqlens, bias, t5_table, t5_num_buckets,
                                 t5_max_distance, t5_bidirectional, rotary_base),
                 needs_grad(q, k, v, bias, t5_table))[0]


# ---------------------------------------------------------------------------------------------------------- qkv packed

def _unbind_qkv(qkv):
    """q, k, v as (B, S, H, D) views of qkv (B, S, 3, H, D): no copies."""
    return qkv.unbind(2)


def _attention_qkvpacked_fwd(qkv: Tensor, causal: bool = False, scale: Optional[float] = None,
                             key_padding_mask: Optional[Tensor] = None, seqlens: Optional[Tensor] = None,
                             rotary_base: Optional[float] = None) -> tuple[Tensor, Tensor]:
    """flashsci.attention on the views of a packed (B, S, 3, H, D) qkv, layout "bshd": (out, lse)."""
    q, k, v = _unbind_qkv(qkv.detach())
    return _flashsci.attention(q, k, v, causal=causal, scale=scale, layout="bshd", key_padding_mask=key_padding_mask,
                               seqlens=seqlens, rotary=rotary_base, return_lse=True)


attention_qkvpacked_fwd = torch.library.custom_op("flashsci::attention_qkvpacked_fwd", _attention_qkvpacked_fwd,
                                                  mutates_args=())


@attention_qkvpacked_fwd.register_fake
def _attention_qkvpacked_fwd_fake(qkv, causal=False, scale=None, key_padding_mask=None, seqlens=None, rotary_base=None):
    """Shapes of flashsci::attention_qkvpacked_fwd: out (B, S, H, D), lse (B, H, S)."""
    b, s, _, h, d = qkv.shape
    return qkv.new_empty((b, s, h, d)), qkv.new_empty((b, h, s), dtype=_lse_dtype(qkv))


def _attention_qkvpacked_bwd(dout: Tensor, qkv: Tensor, out: Tensor, lse: Tensor, causal: bool = False,
                             scale: Optional[float] = None, key_padding_mask: Optional[Tensor] = None,
                             seqlens: Optional[Tensor] = None, rotary_base: Optional[float] = None) -> Tensor:
    """flashsci.attention_backward writing dq, dk, dv into the views of one (B, S, 3, H, D) gradient: dqkv."""
    dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
    q, k, v = _unbind_qkv(qkv.detach())
    dq, dk, dv = _unbind_qkv(dqkv)
    _flashsci.attention_backward(_row_contiguous(dout.detach()), q, k, v, out.detach(), lse.detach(), causal=causal,
                                 scale=scale, layout="bshd", key_padding_mask=key_padding_mask, seqlens=seqlens,
                                 rotary=rotary_base, dq=dq, dk=dk, dv=dv)
    return dqkv


attention_qkvpacked_bwd = torch.library.custom_op("flashsci::attention_qkvpacked_bwd", _attention_qkvpacked_bwd,
                                                  mutates_args=())


@attention_qkvpacked_bwd.register_fake
def _attention_qkvpacked_bwd_fake(dout, qkv, out, lse, causal=False, scale=None, key_padding_mask=None, seqlens=None,
                                  rotary_base=None):
    """Shape of flashsci::attention_qkvpacked_bwd: dqkv like qkv."""
    return qkv.new_empty(qkv.shape)


_QKV_ARGS = ("causal", "scale", "key_padding_mask", "seqlens", "rotary_base")


def _qkvpacked_setup(ctx, inputs, output):
    """Save qkv, out, lse and the masks; lse is not differentiable."""
    qkv, *rest = inputs
    opts = dict(zip(_QKV_ARGS, rest))
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(qkv, out, lse, opts["key_padding_mask"], opts["seqlens"])
    ctx.opts = {n: opts[n] for n in ("causal", "scale", "rotary_base")}


def _qkvpacked_backward(ctx, grad_out, grad_lse):
    """dqkv from flashsci::attention_qkvpacked_bwd; None for the options."""
    qkv, out, lse, kpm, seqlens = ctx.saved_tensors
    dqkv = _op(ctx, attention_qkvpacked_bwd)(grad_out, qkv, out, lse, key_padding_mask=kpm, seqlens=seqlens, **ctx.opts)
    return (dqkv, *(None for _ in _QKV_ARGS))


torch.library.register_autograd("flashsci::attention_qkvpacked_fwd", _qkvpacked_backward, setup_context=_qkvpacked_setup)


def attention_qkvpacked(qkv: Tensor, causal: bool = False, scale: Optional[float] = None,
                        key_padding_mask: Optional[Tensor] = None, seqlens: Optional[Tensor] = None,
                        rotary_base: Optional[float] = None) -> Tensor:
    """flashsci.attention on q, k, v packed as qkv (B, S, 3, H, D) (one projection's output viewed so; FlashAttention's
    qkvpacked layout): out (B, S, H, D), differentiable in qkv, whose gradient the backward writes as one tensor (no
    stack of dq, dk, dv as autograd makes for separate views)."""
    _check("attention_qkvpacked", qkv=(qkv, "Tensor"), causal=(causal, "bool"), scale=(scale, "float?"),
           key_padding_mask=(key_padding_mask, "Tensor?"), seqlens=(seqlens, "Tensor?"), rotary_base=(rotary_base, "float?"))
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(f"flashsci.torch_ops.attention_qkvpacked: qkv must have shape (B, S, 3, H, D), got "
                         f"{tuple(qkv.shape)}")
    return _call(attention_qkvpacked_fwd, (qkv, causal, scale, key_padding_mask, seqlens, rotary_base), needs_grad(qkv))[0]


# ---------------------------------------------------------------------------------------------------------- packed

def _attention_varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                          max_seqlen_k: int, causal: bool = False, scale: Optional[float] = None,
                          t5_table: Optional[Tensor] = None, t5_num_buckets: int = 32, t5_max_distance: int = 128,
                          t5_bidirectional: bool = True, rotary_base: Optional[float] = None) -> tuple[Tensor, Tensor]:
    """flashsci.attention_varlen(..., return_lse=True) as a torch op: (out, lse) with lse (H, total_q)."""
    return _flashsci.attention_varlen(q.detach(), k.detach(), v.detach(), cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                      max_seqlen_k, causal=causal, scale=scale, rotary=rotary_base, return_lse=True,
                                      t5_bias=_t5(_plain(t5_table), t5_num_buckets, t5_max_distance, t5_bidirectional))


attention_varlen_fwd = torch.library.custom_op("flashsci::attention_varlen_fwd", _attention_varlen_fwd, mutates_args=())


@attention_varlen_fwd.register_fake
def _attention_varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                               scale=None, t5_table=None, t5_num_buckets=32, t5_max_distance=128, t5_bidirectional=True,
                               rotary_base=None):
    """Shapes of flashsci::attention_varlen_fwd: out like q, lse (H, total_q)."""
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=_lse_dtype(q))


def _attention_varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Tensor,
                          cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                          scale: Optional[float] = None, t5_table: Optional[Tensor] = None, t5_num_buckets: int = 32,
                          t5_max_distance: int = 128, t5_bidirectional: bool = True, rotary_base: Optional[float] = None,
                          t5_grad: bool = False, deterministic: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """flashsci.attention_varlen_backward as a torch op: (dq, dk, dv, dtable), dtable empty unless asked for."""
    grads = _flashsci.attention_varlen_backward(
        _row_contiguous(dout.detach()), q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), cu_seqlens_q,
        cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal, scale=scale, rotary=rotary_base, t5_grad=t5_grad,
        t5_bias=_t5(_plain(t5_table), t5_num_buckets, t5_max_distance, t5_bidirectional), deterministic=deterministic)
    dtable = grads[3] if t5_grad else q.new_empty(0, dtype=torch.float32)
    return grads[0], grads[1], grads[2], dtable


attention_varlen_bwd = torch.library.custom_op("flashsci::attention_varlen_bwd", _attention_varlen_bwd, mutates_args=())


@attention_varlen_bwd.register_fake
def _attention_varlen_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               causal=False, scale=None, t5_table=None, t5_num_buckets=32, t5_max_distance=128,
                               t5_bidirectional=True, rotary_base=None, t5_grad=False, deterministic=False):
    """Shapes of flashsci::attention_varlen_bwd."""
    dtable = (q.new_empty((t5_table.shape[0], t5_num_buckets), dtype=torch.float32) if t5_grad
              else q.new_empty(0, dtype=torch.float32))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dtable


_VARLEN_ARGS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "causal", "scale", "t5_table",
                "t5_num_buckets", "t5_max_distance", "t5_bidirectional", "rotary_base")


def _varlen_setup(ctx, inputs, output):
    """Save q, k, v, out, lse, the offsets and the T5 table; lse is not differentiable."""
    q, k, v, *rest = inputs
    opts = dict(zip(_VARLEN_ARGS, rest))
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse, opts["cu_seqlens_q"], opts["cu_seqlens_k"], opts["t5_table"])
    ctx.opts = {n: opts[n] for n in _VARLEN_ARGS if n not in ("cu_seqlens_q", "cu_seqlens_k", "t5_table")}
    ctx.t5_grad = opts["t5_table"] is not None and ctx.needs_input_grad[3 + _VARLEN_ARGS.index("t5_table")]


def _varlen_backward(ctx, grad_out, grad_lse):
    """dq, dk, dv (and the T5 table's gradient where wanted) from flashsci::attention_varlen_bwd."""
    q, k, v, out, lse, cq, ck, table = ctx.saved_tensors
    dq, dk, dv, dtable = _op(ctx, attention_varlen_bwd)(grad_out, q, k, v, out, lse, cq, ck, t5_table=table,
                                                        t5_grad=ctx.t5_grad, **ctx.opts)
    grads = {n: None for n in _VARLEN_ARGS}
    grads["t5_table"] = dtable.to(table.dtype) if ctx.t5_grad else None
    return (dq, dk, dv, *(grads[n] for n in _VARLEN_ARGS))


torch.library.register_autograd("flashsci::attention_varlen_fwd", _varlen_backward, setup_context=_varlen_setup)


def attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                     max_seqlen_k: int, causal: bool = False, scale: Optional[float] = None,
                     t5_table: Optional[Tensor] = None, t5_num_buckets: int = 32, t5_max_distance: int = 128,
                     t5_bidirectional: bool = True, rotary_base: Optional[float] = None) -> Tensor:
    """flashsci.attention_varlen on packed (total, H, D) sequences, differentiable in q, k, v and the T5 table."""
    _check("attention_varlen", q=(q, "Tensor"), k=(k, "Tensor"), v=(v, "Tensor"), cu_seqlens_q=(cu_seqlens_q, "Tensor"),
           cu_seqlens_k=(cu_seqlens_k, "Tensor"), max_seqlen_q=(max_seqlen_q, "int"), max_seqlen_k=(max_seqlen_k, "int"),
           causal=(causal, "bool"), scale=(scale, "float?"), t5_table=(t5_table, "Tensor?"),
           t5_num_buckets=(t5_num_buckets, "int"), t5_max_distance=(t5_max_distance, "int"),
           t5_bidirectional=(t5_bidirectional, "bool"), rotary_base=(rotary_base, "float?"))
    return _call(attention_varlen_fwd, (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                                        t5_table, t5_num_buckets, t5_max_distance, t5_bidirectional, rotary_base),
                 needs_grad(q, k, v, t5_table))[0]


# ---------------------------------------------------------------------------------------------------------- composites

torch.library.define("flashsci::attention", "(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None, "
                     "str layout='bhsd', Tensor? key_padding_mask=None, Tensor? seqlens=None, Tensor? bias=None, "
                     "Tensor? t5_table=None, int t5_num_buckets=32, int t5_max_distance=128, bool t5_bidirectional=True, "
                     "float? rotary_base=None) -> Tensor")
torch.library.impl("flashsci::attention", "CompositeImplicitAutograd", attention)
torch.library.define("flashsci::attention_varlen", "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
                     "int max_seqlen_q, int max_seqlen_k, bool causal=False, float? scale=None, Tensor? t5_table=None, "
                     "int t5_num_buckets=32, int t5_max_distance=128, bool t5_bidirectional=True, "
                     "float? rotary_base=None) -> Tensor")
torch.library.impl("flashsci::attention_varlen", "CompositeImplicitAutograd", attention_varlen)
torch.library.define("flashsci::attention_qkvpacked", "(Tensor qkv, bool causal=False, float? scale=None, "
                     "Tensor? key_padding_mask=None, Tensor? seqlens=None, float? rotary_base=None) -> Tensor")
torch.library.impl("flashsci::attention_qkvpacked", "CompositeImplicitAutograd", attention_qkvpacked)


# ---------------------------------------------------------------------------------------------------------- linear

def needs_grad(*tensors):
    """Whether autograd records a call on these tensors (None entries ignored): then a forward keeps what its backward
    needs, and the integrations take the differentiable ops."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _keeps_h(activation, keep_preactivation):
    """Whether linear_fwd returns the pre-activation: asked for, and an activation other than relu (whose derivative
    its output gives)."""
    return keep_preactivation and activation not in (None, "relu")


def _linear_fwd(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, activation: Optional[str] = None,
                keep_preactivation: bool = False) -> tuple[Tensor, Tensor]:
    """flashsci.linear as a torch op: (y, h), h = x @ weight.T + bias when kept for the backward (_keeps_h), else
    empty."""
    x, weight, bias = x.detach(), weight.detach(), _plain(bias)
    if not _keeps_h(activation, keep_preactivation) or weight.dim() != 2:   # (a weight not 2-D: the C function says so)
        return _flashsci.linear(x, weight, bias, activation=activation), x.new_empty(0)
    h = x.new_empty((*x.shape[:-1], weight.shape[0]))
    return _flashsci.linear(x, weight, bias, activation=activation, preactivation=h), h


linear_fwd = torch.library.custom_op("flashsci::linear_fwd", _linear_fwd, mutates_args=())


@linear_fwd.register_fake
def _linear_fwd_fake(x, weight, bias=None, activation=None, keep_preactivation=False):
    """Shapes of flashsci::linear_fwd: y [..., N]; h like y when kept, else empty."""
    y = x.new_empty((*x.shape[:-1], weight.shape[0]))
    return y, (torch.empty_like(y) if _keeps_h(activation, keep_preactivation) else x.new_empty(0))


def _linear_bwd(dy: Tensor, x: Tensor, weight: Tensor, h: Tensor, activation: Optional[str] = None,
                bias_dtype: Optional[torch.dtype] = None) -> tuple[Tensor, Tensor, Tensor]:
    """flashsci.linear_backward as a torch op: (dx, dweight, dbias), dbias in bias_dtype, empty without a bias."""
    dbias = None if bias_dtype is None else x.new_empty(weight.shape[0], dtype=bias_dtype)
    dx, dw, db = _flashsci.linear_backward(_row_contiguous(dy.detach()), x.detach(), weight.detach(),
                                           preactivation=None if activation is None else h.detach(),
                                           activation=activation, bias_grad=dbias is not None, dbias=dbias)
    return dx, dw, (x.new_empty(0) if db is None else db)


linear_bwd = torch.library.custom_op("flashsci::linear_bwd", _linear_bwd, mutates_args=())


@linear_bwd.register_fake
def _linear_bwd_fake(dy, x, weight, h, activation=None, bias_dtype=None):
    """Shapes of flashsci::linear_bwd: like x, like weight, (N,) in bias_dtype or empty."""
    db = x.new_empty(0) if bias_dtype is None else x.new_empty(weight.shape[0], dtype=bias_dtype)
    return torch.empty_like(x), torch.empty_like(weight), db


def _linear_setup(ctx, inputs, output):
    """Save x, weight and the pre-activation (relu: the output, positive where h is); the bias's dtype names its
    gradient's."""
    x, weight, bias, activation, _ = inputs
    ctx.save_for_backward(x, weight, output[0] if activation == "relu" else output[1])
    ctx.activation = activation
    ctx.bias_dtype = None if bias is None else bias.dtype


def _linear_backward(ctx, grad_y, grad_h):
    """Gradients of x, weight and bias; the kept pre-activation has none."""
    x, weight, h = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dw, db = _op(ctx, linear_bwd)(grad_y, x, weight, h, ctx.activation, ctx.bias_dtype if need[2] else None)
    return dx if need[0] else None, dw if need[1] else None, db if need[2] else None, None, None


torch.library.register_autograd("flashsci::linear_fwd", _linear_backward, setup_context=_linear_setup)


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, activation: Optional[str] = None) -> Tensor:
    """act(x @ weight.T + bias) by flashsci.linear, differentiable in x, weight and bias."""
    _check("linear", x=(x, "Tensor"), weight=(weight, "Tensor"), bias=(bias, "Tensor?"), activation=(activation, "str?"))
    grad = needs_grad(x, weight, bias)
    return _call(linear_fwd, (x, weight, bias, activation, grad), grad)[0]


def _swiglu_fwd(x: Tensor, w_gate: Tensor, w_up: Optional[Tensor] = None,
                keep_preactivation: bool = False) -> tuple[Tensor, Tensor]:
    """flashsci.swiglu as a torch op: (y, h), h = (x @ w_gate.T | x @ w_up.T) when kept for the backward."""
    x, w_gate, w_up = x.detach(), w_gate.detach(), _plain(w_up)
    if not keep_preactivation or w_gate.dim() != 2:   # (a weight not 2-D: the C function says so)
        return _flashsci.swiglu(x, w_gate, w_up), x.new_empty(0)
    h = x.new_empty((*x.shape[:-1], w_gate.shape[0] * (2 if w_up is not None else 1)))
    return _flashsci.swiglu(x, w_gate, w_up, preactivation=h), h


swiglu_fwd = torch.library.custom_op("flashsci::swiglu_fwd", _swiglu_fwd, mutates_args=())


@swiglu_fwd.register_fake
def _swiglu_fwd_fake(x, w_gate, w_up=None, keep_preactivation=False):
    """Shapes of flashsci::swiglu_fwd: y [..., N]; h [..., 2N] when kept, else empty."""
    n = w_gate.shape[0] if w_up is not None else w_gate.shape[0] // 2
    return x.new_empty((*x.shape[:-1], n)), (x.new_empty((*x.shape[:-1], 2 * n)) if keep_preactivation else x.new_empty(0))


def _swiglu_bwd(dy: Tensor, x: Tensor, w_gate: Tensor, w_up: Optional[Tensor], h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """flashsci.swiglu_backward as a torch op: (dx, dw_gate, dw_up), dw_up empty for a packed w_gate."""
    grads = _flashsci.swiglu_backward(_row_contiguous(dy.detach()), x.detach(), w_gate.detach(), _plain(w_up),
                                      preactivation=h.detach())
    return grads if len(grads) == 3 else (*grads, x.new_empty(0))


swiglu_bwd = torch.library.custom_op("flashsci::swiglu_bwd", _swiglu_bwd, mutates_args=())


@swiglu_bwd.register_fake
def _swiglu_bwd_fake(dy, x, w_gate, w_up, h):
    """Shapes of flashsci::swiglu_bwd: like x, like w_gate, like w_up or empty."""
    return torch.empty_like(x), torch.empty_like(w_gate), (x.new_empty(0) if w_up is None else torch.empty_like(w_up))


def _swiglu_setup(ctx, inputs, output):
    """Save x, the weights and the pre-activation."""
    x, w_gate, w_up, _ = inputs
    ctx.save_for_backward(x, w_gate, w_up, output[1])


def _swiglu_backward(ctx, grad_y, grad_h):
    """Gradients of x and the weights."""
    x, w_gate, w_up, h = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dwg, dwu = _op(ctx, swiglu_bwd)(grad_y, x, w_gate, w_up, h)
    return dx if need[0] else None, dwg if need[1] else None, dwu if need[2] else None, None


torch.library.register_autograd("flashsci::swiglu_fwd", _swiglu_backward, setup_context=_swiglu_setup)


def swiglu(x: Tensor, w_gate: Tensor, w_up: Optional[Tensor] = None) -> Tensor:
    """silu(x @ w_gate.T) * (x @ w_up.T) by flashsci.swiglu (or a packed [2N, K] w_gate), differentiable."""
    _check("swiglu", x=(x, "Tensor"), w_gate=(w_gate, "Tensor"), w_up=(w_up, "Tensor?"))
    grad = needs_grad(x, w_gate, w_up)
    return _call(swiglu_fwd, (x, w_gate, w_up, grad), grad)[0]


torch.library.define("flashsci::linear", "(Tensor x, Tensor weight, Tensor? bias=None, str? activation=None) -> Tensor")
torch.library.impl("flashsci::linear", "CompositeImplicitAutograd", linear)
torch.library.define("flashsci::swiglu", "(Tensor x, Tensor w_gate, Tensor? w_up=None) -> Tensor")
torch.library.impl("flashsci::swiglu", "CompositeImplicitAutograd", swiglu)


# each forward op: its implementation, setup_context and backward (_Eager); each backward op: its implementation (_op)
_IMPL = {attention_fwd: (_attention_fwd, _attention_setup, _attention_backward),
         attention_qkvpacked_fwd: (_attention_qkvpacked_fwd, _qkvpacked_setup, _qkvpacked_backward),
         attention_varlen_fwd: (_attention_varlen_fwd, _varlen_setup, _varlen_backward),
         linear_fwd: (_linear_fwd, _linear_setup, _linear_backward),
         swiglu_fwd: (_swiglu_fwd, _swiglu_setup, _swiglu_backward)}
_IMPL_BWD = {attention_bwd: _attention_bwd, attention_qkvpacked_bwd: _attention_qkvpacked_bwd,
             attention_varlen_bwd: _attention_varlen_bwd, linear_bwd: _linear_bwd, swiglu_bwd: _swiglu_bwd}
