"""Shared test helpers: the float64 NumPy reference, the GEMM kernel fixture and GPU skipping."""
import numpy as np
import pytest

import flashsci


def reference_attention(q, k, v, causal=False, scale=None, layout="bhsd"):
    """softmax(scale q k^T [+ top-left causal mask]) v in float64; returns (out, lse) in q's layout."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if layout == "bshd":
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    d = q.shape[-1]
    s = (q @ k.swapaxes(-1, -2)) * (1.0 / np.sqrt(d) if scale is None else scale)
    if causal:
        sq, sk = s.shape[-2:]
        s = np.where(np.tril(np.ones((sq, sk), dtype=bool)), s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    out = (p / l) @ v
    lse = (m + np.log(l))[..., 0]
    if layout == "bshd":
        out = out.transpose(0, 2, 1, 3)
    return out, lse


@pytest.fixture(params=["auto", "sm80"])
def gemm_kernel(request):
    """Each GEMM test on the dispatcher's kernel (Hopper's on an sm_90) and on the portable one forced."""
    flashsci._flashsci._set_gemm_kernel(request.param)
    yield request.param
    flashsci._flashsci._set_gemm_kernel("auto")


def pytest_collection_modifyitems(config, items):
    if flashsci.cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason="no CUDA device (or a CPU-only build of flashsci)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
