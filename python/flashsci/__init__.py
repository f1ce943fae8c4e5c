"""flashsci: fused attention kernels in C/CUDA behind a thin CPython module.

    import flashsci
    o = flashsci.attention(q, k, v)          # torch, CuPy, JAX, NumPy: zero-copy
    y = flashsci.linear(x, w, b, activation="gelu")   # act(x @ w.T + b) in one kernel

See README.md for the full API.
"""
from ._flashsci import (Array, attention, attention_backward, attention_varlen, attention_varlen_backward, build_info,
                        cuda_device_count, device_info, linear, linear_backward, swiglu, swiglu_backward,
                        CUDA_BUILT)

__all__ = ["Array", "attention", "attention_backward", "attention_varlen", "attention_varlen_backward", "build_info",
           "cuda_device_count", "device_info", "linear", "linear_backward", "swiglu", "swiglu_backward", "CUDA_BUILT"]
__version__ = "0.1.0"
