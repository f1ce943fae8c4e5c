"""flashsci in HF transformers protein models, one call:

    from flashsci.integrations import patch
    model = EsmModel.from_pretrained(...).half().cuda().eval()
    patch(model)                 # same outputs, packed tokens, fused kernels; unpatch(model) undoes it

patch() finds every EsmModel (ESM2: EsmModel, EsmForMaskedLM, ...), every encoder T5Stack (ProtT5:
T5EncoderModel, T5Model's encoder) and every ESMC (ESM-C, from the esm package) inside model and gives it a forward that unpads the batch once, runs
each layer on packed tokens with flashsci kernels and pads once at the end, for inference and for training (the
attention backward is flashsci's; gradient checkpointing works). Calls it does not cover (hidden states of every
layer, attention maps, custom position ids, dropout on the attention probabilities) go to the stock forward,
whose attention is then flashsci's through transformers' attention-function registry
(attn_implementation="fsci") when the installed transformers has one and the model has no decoder
(T5Model / T5ForConditionalGeneration keep their stock attention; only their encoder stack is patched).
This module imports torch; `import flashsci` does not import it.
"""
import sys
import types

import torch

from .. import _flashsci, torch_ops
from . import esm, esmc, t5

# The registry name: transformers treats any name containing "flash" as a FlashAttention kernel to import.
NAME = "fsci"


def _registry_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, position_bias=None,
                        **kwargs):
    """transformers AttentionInterface function: (B, H, S, D) in, (B, S, H, D) out, as sdpa's; the padding mask
    comes as (B, Sk) from the mask function registered beside it, T5's position bias as an additive bias. Where
    autograd records, the differentiable torch op (flashsci.torch_ops.attention); attention dropout in training
    mode, attention maps and bottom-right causal alignment hand over to transformers' sdpa."""
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (query, key, value, position_bias))
    causal = bool(getattr(module, "is_causal", False))
    if (dropout > 0 and module.training) or kwargs.get("output_attentions") or \
            (causal and query.shape[2] != key.shape[2]):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        if attention_mask is not None and attention_mask.dim() == 2:
            attention_mask = attention_mask[:, None, None, :].bool()
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      position_bias=position_bias, **kwargs)
    mask = None if attention_mask is None else attention_mask.bool()
    if grad:
        out = torch_ops.attention(query, key, value, causal and query.shape[2] > 1, scaling, "bhsd", mask, None,
                                  position_bias)
    else:
        out = _flashsci.attention(query, key, value, scale=scaling, key_padding_mask=mask, bias=position_bias,
                                  causal=causal and query.shape[2] > 1)
    return out.transpose(1, 2), None


def register():
    """Register NAME in transformers' attention and mask registries; False where they do not exist."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError:
        return False
    AttentionInterface.register(NAME, _registry_attention)
    AttentionMaskInterface.register(NAME, flash_attention_mask)
    return True


def _targets(model):
    """(module, fast forward, prepare) for every EsmModel, encoder T5Stack and ESMC (the esm package's, when it is
    imported) in model."""
    from transformers.models.esm.modeling_esm import EsmModel
    from transformers.models.t5.modeling_t5 import T5Stack
    esmc_module = sys.modules.get("esm.models.esmc")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"flashsci.integrations takes a torch.nn.Module (an HF transformers ESM or T5 model, or ESMC), "
                        f"got {type(model).__name__}")
    found = []
    for m in model.modules():
        if esmc_module is not None and isinstance(m, esmc_module.ESMC):
            found.append((m, esmc.forward, esmc.prepare))
        elif isinstance(m, EsmModel):
            found.append((m, esm.forward, esm.prepare))
        elif isinstance(m, T5Stack) and not m.config.is_decoder:
            found.append((m, t5.forward, t5.prepare))
    return found


def patch(model, plain_linear="torch"):
    """Make model's ESM / T5-encoder parts run on flashsci; returns model. Patch after moving the model to its
    device and dtype (fp16/bf16 on CUDA; any float dtype on the CPU): .to() after patch() undoes the q/k/v fusion
    (still correct, one concatenation per layer per call).

    Attention, and every projection with an activation to fuse (ESM's GELU fc1, T5's ReLU wi, SwiGLU), always
    run on flashsci. plain_linear picks the GEMM for the projections with nothing to fuse (q/k/v, attention
    output, fc2 / wo): "torch" (F.linear, cuBLAS: the faster today, see benchmarks/results/e2e_*) or "flashsci"."""
    if plain_linear not in ("torch", "flashsci"):
        raise ValueError(f"plain_linear must be 'torch' or 'flashsci', got {plain_linear!r}")
    targets = _targets(model)
    if not targets:
        raise TypeError(f"flashsci.integrations.patch takes HF transformers ESM (EsmModel, EsmForMaskedLM, ...) or T5 "
                        f"encoder (T5EncoderModel, ...) models, or the esm package's ESMC, got {type(model).__name__}")
    dtype = next(model.parameters()).dtype
    if next(model.parameters()).is_cuda and dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"flashsci runs CUDA models in float16 or bfloat16, got a {dtype} model (call .half() first)")
    for module, _, prepare in targets:
        prepare(module)
    # the registry attention is for encoders: decoders need KV-cache (bottom-right) causal alignment
    has_decoder = any(getattr(getattr(m, "config", None), "is_decoder", False) for m in model.modules())
    if not has_decoder and register() and hasattr(model, "set_attn_implementation"):
        model._flashsci_attn = model.config._attn_implementation
        model.set_attn_implementation(NAME)
    for module, fast, _ in targets:
        module.__dict__["_flashsci_plain_linear"] = plain_linear
        if "forward" not in module.__dict__:
            stock = module.forward
            module.forward = types.MethodType(lambda self, *a, _f=fast, _s=stock, **k: _f(self, _s, *a, **k), module)
    return model


def unpatch(model):
    """Give model its stock forwards and attention back; returns model. The fused q/k/v weights stay views of one
    buffer (same values)."""
    for module, _, _ in _targets(model):
        module.__dict__.pop("forward", None)
        module.__dict__.pop("_flashsci_plain_linear", None)
    attn = model.__dict__.pop("_flashsci_attn", None)
    if attn is not None:
        model.set_attn_implementation(attn)
    return model


def is_patched(model):
    """Whether patch() has been applied to model (and not undone)."""
    return any("forward" in m.__dict__ for m, _, _ in _targets(model))
