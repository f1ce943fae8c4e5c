"""Kernel categories of the profiling tables, assigned by rules over CUDA kernel names (and the trace's own memcpy /
memset events). The first rule whose pattern occurs in the lower-cased name wins; a name no rule matches is "other".

    attention      fused attention kernels: flashsci's (attention_*, backward_pre/post/t5_sum, rotary_qk, head_copy,
                   sm90_t5_expand, sm90_kpm_prepare), FlashAttention (flash_*), xFormers / PyTorch memory-efficient
                   (fmha), cuDNN's fused SDPA (sdpa) and its backward's dot(dO, O) and dQ conversion kernels,
                   anything named attention / attn
    gemm           matrix products: cuBLAS (gemm, gemv, nvjet, xmma, splitKreduce), CUTLASS (cutlass), flashsci's
                   gemm_sm80 / gemm_sm90 (linear, SwiGLU)
    softmax        softmax kernels (the unfused attention's softmax among them)
    normalisation  LayerNorm, RMSNorm, batch and group norms
    memory         copies and dtype conversions: memcpy / memset, copy kernels (torch's direct_copy_kernel also
                   converts dtypes), concatenation, indexing / gather / scatter (embedding lookups), fills of constants
    element-wise   element-wise and reduction kernels (activations, residual adds, masks, losses, the optimizer's
                   multi-tensor kernels; flashsci's activation_kernel and convert_bias_grad, the linear layers' passes)
    other          everything else
"""

CATEGORIES = ("gemm", "attention", "softmax", "normalisation", "memory", "element-wise", "other")

RULES = (
    ("attention", ("attention", "attn", "backward_pre", "backward_post", "backward_t5_sum", "rotary_qk", "head_copy",
                   "sm90_t5_expand", "sm90_kpm_prepare", "flash_", "fmha", "sdpa", "compute_dot_do_o",
                   "convert_dq_to_16bits")),
    ("gemm", ("gemm", "gemv", "nvjet", "xmma", "cutlass", "splitkreduce", "cublas", "matmul")),
    ("softmax", ("softmax",)),
    ("normalisation", ("layer_norm", "layernorm", "rms_norm", "rmsnorm", "batch_norm", "batchnorm", "group_norm",
                       "rowwisemoments")),
    ("memory", ("memcpy", "memset", "copy", "catarray", "index_elementwise", "indexselect", "index_select", "gather",
                "scatter", "fillfunctor", "embedding")),
    ("element-wise", ("elementwise", "reduce", "multi_tensor_apply", "vectorized", "unrolled", "activation_kernel",
                      "convert_bias_grad")),
)


def category(name):
    """The category of a kernel (or memcpy / memset event) named name."""
    low = name.lower()
    for cat, patterns in RULES:
        if any(p in low for p in patterns):
            return cat
    return "other"
