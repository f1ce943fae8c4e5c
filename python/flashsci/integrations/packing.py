"""Shared pieces of the patched forwards: unpad a batch once, pad it back once, fuse sibling projections
into one GEMM, and pick between direct C calls and torch ops (the latter while torch.compile traces)."""
import torch

from .. import _flashsci
from .. import torch_ops
from ..torch_ops import needs_grad


class Packed:
    """A padded (B, S, ...) batch as FlashAttention's varlen layout: rows of the valid tokens of every sequence,
    one after the other, with int32 cu_seqlens (B + 1,) and the longest length."""

    def __init__(self, x, attention_mask):
        """Gather x's valid tokens; attention_mask (B, S) is 1/True for tokens, None for an unpadded batch."""
        B, S = x.shape[:2]
        self.shape = x.shape
        if attention_mask is None:
            self.index = None
            lengths = torch.full((B,), S, dtype=torch.int32, device=x.device)
            self.max_seqlen = S
            self.x = x.reshape(B * S, *x.shape[2:])
        else:
            if attention_mask.shape != (B, S):
                raise ValueError(f"attention_mask must have shape {(B, S)}, got {tuple(attention_mask.shape)}")
            keep = attention_mask.bool()
            lengths = keep.sum(1, dtype=torch.int32)
            self.index = keep.reshape(-1).nonzero().squeeze(1)
            self.max_seqlen = int(lengths.max()) if B else 0
            self.x = x.reshape(B * S, *x.shape[2:]).index_select(0, self.index)
        self.cu_seqlens = torch.zeros(B + 1, dtype=torch.int32, device=x.device)
        torch.cumsum(lengths, 0, out=self.cu_seqlens[1:])

    def unpack(self, y):
        """The rows y (total, ...) back in the padded (B, S, ...) shape; padded positions are zeros."""
        B, S = self.shape[:2]
        if self.index is None:
            return y.reshape(B, S, *y.shape[1:])
        out = y.new_zeros((B * S, *y.shape[1:]))
        out.index_copy_(0, self.index, y)
        return out.reshape(B, S, *y.shape[1:])


def is_plain(m):
    """Whether m is a bare nn.Linear (its weight is all it computes); adapters (PEFT's LoRA layers) are not."""
    return type(m) is torch.nn.Linear


def base_linear(m):
    """The nn.Linear under an adapter (PEFT layers' get_base_layer()), or m itself."""
    return m.get_base_layer() if hasattr(m, "get_base_layer") else m


def fuse_rows(linears):
    """Make the weights (and biases) of sibling nn.Linear layers (the base layers, under adapters) views of one packed
    [sum N, K] buffer, so one GEMM computes all of them; the parameters keep their names, shapes and values."""
    linears = [base_linear(m) for m in linears]
    for name in ("weight", "bias"):
        params = [getattr(m, name) for m in linears]
        if params[0] is None or adjacent(params) is not None:
            continue
        packed = torch.cat([p.detach() for p in params])
        offset = 0
        for m, p in zip(linears, params):
            view = packed[offset:offset + p.shape[0]]
            setattr(m, name, torch.nn.Parameter(view, requires_grad=p.requires_grad))
            offset += p.shape[0]


def adjacent(tensors):
    """The one tensor whose rows are the given contiguous tensors back to back in memory (a view, no copy), or
    None when they are not laid out that way (e.g. after a .to() that re-allocated them)."""
    first = tensors[0]
    rows = 0
    for t in tensors:
        if (not t.is_contiguous() or t.dtype != first.dtype or t.device != first.device or t.shape[1:] != first.shape[1:]
                or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
                or t.storage_offset() != first.storage_offset() + rows * first[0].numel()):
            return None
        rows += t.shape[0]
    return first.detach().as_strided((rows, *first.shape[1:]), first.stride())


def packed_linear(linears):
    """(weight, bias) of sibling layers as one [sum N, K] weight: the fused view, or a concatenation (always where
    autograd records: the fused view is not a parameter, the concatenation passes the gradients to them)."""
    if needs_grad(*(m.weight for m in linears)):
        w = torch.cat([m.weight for m in linears])
        return w, None if linears[0].bias is None else torch.cat([m.bias for m in linears])
    w = adjacent([m.weight for m in linears])
    if w is None:
        w = torch.cat([m.weight for m in linears])
    if linears[0].bias is None:
        return w, None
    b = adjacent([m.bias for m in linears])
    return w, (b if b is not None else torch.cat([m.bias for m in linears]))


# flashsci.linear's activations as torch functions, for adapters and for CPU tensors
TORCH_ACTIVATIONS = {None: lambda x: x, "relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
                     "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh")}


def flashsci_gemm(x):
    """Whether the projections run flashsci's GEMMs: CUDA fp16 / bf16. On the CPU torch's (oneDNN / MKL) are several
    times faster than flashsci's reference C GEMM, forward and backward, so patched CPU models keep them."""
    return x.is_cuda and x.dtype in (torch.float16, torch.bfloat16)


def linear(x, weight, bias=None, activation=None):
    """act(x W^T + b): on the GPU flashsci.linear, through flashsci.torch_ops.linear while torch.compile traces or
    autograd records (its backward by flashsci.linear_backward), else the C call; on the CPU F.linear and the
    activation in torch."""
    if not flashsci_gemm(x):
        return TORCH_ACTIVATIONS[activation](torch.nn.functional.linear(x, weight, bias))
    if torch.compiler.is_compiling() or needs_grad(x, weight, bias):
        return torch_ops.linear(x, weight, bias, activation)
    return _flashsci.linear(x, weight, bias, activation=activation)


def project(mods, x, plain):
    """x through sibling projections as one (total, sum N) result: one GEMM, plain(x, w, b), on their fused weights
    when all are bare nn.Linear; else each module's own forward (adapters such as LoRA add their low-rank terms)."""
    if all(is_plain(m) for m in mods):
        w, b = packed_linear(mods)
        return plain(x, w, b)
    return torch.cat([m(x) for m in mods], -1)


def dense(m, x, plain, activation=None):
    """act(m(x)): for a bare nn.Linear, plain(x, W, b) or flashsci.linear with the activation fused; for an adapter,
    its own forward and the activation in torch."""
    if not is_plain(m):
        return TORCH_ACTIVATIONS[activation](m(x))
    if activation is None:
        return plain(x, m.weight, m.bias)
    return linear(x, m.weight, m.bias, activation)


def gated(m_gate, m_up, x):
    """silu(x W_gateᵀ) ⊙ (x W_upᵀ) (SwiGLU); m_up None: m_gate's weight holds the gate rows then the up rows. One
    flashsci.swiglu for bare nn.Linear layers; the modules' own forwards under adapters."""
    if is_plain(m_gate) and (m_up is None or is_plain(m_up)):
        return swiglu(x, m_gate.weight, None if m_up is None else m_up.weight)
    gate, up = m_gate(x).chunk(2, -1) if m_up is None else (m_gate(x), m_up(x))
    return torch.nn.functional.silu(gate) * up


def stock_needed(model, kwargs, position_ids, encoder_hidden_states, attention_dropout=0.0):
    """Whether this call asks for something only the stock forward gives: per-layer outputs, attention maps,
    custom positions, cross-attention, or dropout on the attention probabilities (training mode with a nonzero
    rate: the kernels have none)."""
    cfg = model.config
    wants = any(kwargs[k] if kwargs.get(k) is not None else getattr(cfg, k, False)
                for k in ("output_hidden_states", "output_attentions"))
    dropout = model.training and attention_dropout > 0
    return bool(wants or dropout or cfg.is_decoder or position_ids is not None or encoder_hidden_states is not None)


def checkpointed(module, layer):
    """Whether layer runs under gradient checkpointing (model.gradient_checkpointing_enable(), training mode): the
    flag on the layer (transformers 5) or on its stack (4.x)."""
    return layer.training and torch.is_grad_enabled() and bool(
        getattr(layer, "gradient_checkpointing", False) or getattr(module, "gradient_checkpointing", False))


def run_layer(module, layer, fn, *args):
    """fn(layer, *args), through torch.utils.checkpoint where the layer is checkpointed (activations recomputed in
    the backward instead of kept)."""
    if checkpointed(module, layer):
        return torch.utils.checkpoint.checkpoint(fn, layer, *args, use_reentrant=False)
    return fn(layer, *args)


def returned(module, out, kwargs):
    """out (a ModelOutput) as the call asked: itself, or a tuple for return_dict=False (None: the config's)."""
    return_dict = kwargs.get("return_dict")
    if return_dict is None:
        return_dict = getattr(module.config, "use_return_dict", getattr(module.config, "return_dict", True))
    return out if return_dict else out.to_tuple()


def plain_gemm(module):
    """The GEMM patch() chose for module's projections without an activation to fuse: torch's F.linear (cuBLAS;
    plain_linear="torch") or flashsci.linear (plain_linear="flashsci")."""
    return linear if module.__dict__.get("_flashsci_plain_linear") == "flashsci" else torch.nn.functional.linear


def swiglu(x, w_gate, w_up=None):
    """flashsci.swiglu, as linear() picks its entry point (torch's GEMMs on the CPU)."""
    if not flashsci_gemm(x):
        gate, up = (x @ w_gate.t()).chunk(2, -1) if w_up is None else (x @ w_gate.t(), x @ w_up.t())
        return torch.nn.functional.silu(gate) * up
    if torch.compiler.is_compiling() or needs_grad(x, w_gate, w_up):
        return torch_ops.swiglu(x, w_gate, w_up)
    return _flashsci.swiglu(x, w_gate, w_up)


def attention_packed(qkv, packed, scale=None, rotary_base=None, t5=None):
    """Self-attention over a Packed batch from one fused projection qkv (total, 3, H, D); returns (total, H, D).
    t5 = (table (H, buckets), buckets, max_distance, bidirectional) or None."""
    q, k, v = qkv.unbind(1)
    cu, n = packed.cu_seqlens, packed.max_seqlen
    if torch.compiler.is_compiling() or needs_grad(qkv, None if t5 is None else t5[0]):   # the differentiable op
        table, buckets, dist, bidir = t5 if t5 is not None else (None, 32, 128, True)
        return torch_ops.attention_varlen(q, k, v, cu, cu, n, n, False, scale, table, buckets, dist, bidir, rotary_base)
    return _flashsci.attention_varlen(q, k, v, cu, cu, n, n, scale=scale, rotary=rotary_base, t5_bias=t5)
