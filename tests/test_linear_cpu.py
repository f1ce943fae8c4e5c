"""CPU linear / swiglu (kernels/gemm_cpu.c) against a float64 NumPy reference: every activation, SwiGLU
packed and separate, tails in M, N and K, strided rows, out= and out_dtype=; fresh random data each test."""
import math

import numpy as np
import pytest

import flashsci

ERF = np.vectorize(math.erf)
ACTS = [None, "relu", "gelu", "gelu_tanh", "silu"]


def activate(v, act):
    """torch's definitions in float64."""
    if act == "relu":
        return np.maximum(v, 0.0)
    if act == "gelu":
        return 0.5 * v * (1.0 + ERF(v / math.sqrt(2.0)))
    if act == "gelu_tanh":
        return 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))
    if act == "silu":
        return v / (1.0 + np.exp(-v))
    return v


def reference_linear(x, w, b=None, act=None):
    y = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    if b is not None:
        y = y + np.asarray(b, np.float64)
    return activate(y, act)


def reference_swiglu(x, wg, wu):
    return activate(reference_linear(x, wg), "silu") * reference_linear(x, wu)


def tol(dtype, ref, roundings=2):
    """Rounding of the output dtype at the reference's magnitude (the CPU accumulates in float64)."""
    eps = {np.float16: 2.0 ** -10, np.float32: 2.0 ** -23, np.float64: 2.0 ** -52}[dtype]
    return roundings * eps * max(1.0, float(np.abs(ref).max())) + 1e-12


def rand(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("mnk", [(1, 8, 8), (37, 24, 40), (130, 72, 264), (5, 1, 3)], ids=str)
def test_linear(mnk, dtype, act):
    m, n, k = mnk
    rng = np.random.default_rng()
    x, w, b = rand(rng, (m, k), dtype), rand(rng, (n, k), dtype) / math.sqrt(k), rand(rng, (n,), dtype)
    y = flashsci.linear(x, w, b, activation=act)
    ref = reference_linear(x, w, b, act)
    assert y.shape == (m, n) and y.dtype == dtype
    assert np.abs(y - ref).max() <= tol(dtype, ref)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_swiglu(dtype, packed):
    rng = np.random.default_rng()
    m, n, k = 45, 48, 72
    x, wg, wu = rand(rng, (3, m, k), dtype), rand(rng, (n, k), dtype), rand(rng, (n, k), dtype)
    y = flashsci.swiglu(x, np.concatenate([wg, wu])) if packed else flashsci.swiglu(x, wg, wu)
    ref = reference_swiglu(x, wg, wu)
    assert y.shape == (3, m, n)
    assert np.abs(y - ref).max() <= tol(dtype, ref)


def test_leading_dims_and_strided_rows():
    rng = np.random.default_rng()
    big = rand(rng, (2, 7, 96), np.float32)
    x = big[..., 16:80]                       # rows 96 apart, 64 features: strided rows, leading dims kept
    w, b = rand(rng, (40, 64), np.float32), rand(rng, (40,), np.float32)
    y = flashsci.linear(x, w, b, activation="relu")
    assert y.shape == (2, 7, 40)
    ref = reference_linear(x, w, b, "relu")
    assert np.abs(y - ref).max() <= tol(np.float32, ref)
    x1 = rand(rng, (64,), np.float32)         # one row without leading dims
    assert np.abs(flashsci.linear(x1, w) - reference_linear(x1, w)).max() < 1e-4


def test_weight_rows_strided():
    rng = np.random.default_rng()
    wbig = rand(rng, (24, 100), np.float32)
    w = wbig[:, :64]                           # nn.Linear weight viewed out of a wider buffer
    x = rand(rng, (9, 64), np.float32)
    assert np.abs(flashsci.linear(x, w) - reference_linear(x, w)).max() < 1e-4


def test_out_and_out_dtype():
    rng = np.random.default_rng()
    x, w = rand(rng, (33, 48), np.float16), rand(rng, (16, 48), np.float16)
    ref = reference_linear(x, w, None, "silu")
    y = flashsci.linear(x, w, activation="silu", out_dtype=np.float32)
    assert y.dtype == np.float32 and np.abs(y - ref).max() <= tol(np.float32, ref) + 1e-5
    out = np.full((33, 16), np.nan, np.float32)
    assert flashsci.linear(x, w, activation="silu", out=out, out_dtype="float32") is out
    assert np.array_equal(out, y)
    wide = np.full((33, 40), np.nan, np.float16)
    view = wide[:, 8:24]                       # out with strided rows: the columns around stay untouched
    flashsci.linear(x, w, out=view)
    assert np.abs(view - reference_linear(x, w)).max() <= tol(np.float16, ref)
    assert np.isnan(wide[:, :8]).all() and np.isnan(wide[:, 24:]).all()


def test_bias_dtype_may_differ():
    rng = np.random.default_rng()
    x, w, b = rand(rng, (10, 16), np.float16), rand(rng, (8, 16), np.float16), rand(rng, (8,), np.float32)
    ref = reference_linear(x, w, b)
    assert np.abs(flashsci.linear(x, w, b) - ref).max() <= tol(np.float16, ref)
