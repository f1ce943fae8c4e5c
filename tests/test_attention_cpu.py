"""C CPU attention against the float64 NumPy reference: random shapes, dtypes, layouts, causal, strides."""
import numpy as np
import pytest

import flashsci
from conftest import reference_attention

# Max abs error allowed against float64 for inputs ~N(0, 1): a few output roundings of each dtype
# (fp16 eps 9.8e-4, fp32 eps 1.2e-7), plus float32 accumulation over up to ~1000 keys.
BOUND = {"float16": 4e-3, "float32": 2e-5, "float64": 1e-11}


def make(rng, shape, dtype, layout):
    b, h, s, d = shape
    dims = (b, h, s, d) if layout == "bhsd" else (b, s, h, d)
    return rng.standard_normal(dims).astype(dtype)


def poisoned_like(x):
    out = np.empty_like(x)
    out[...] = np.nan
    return out


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("causal", [False, True])
def test_random_shapes_against_float64(dtype, layout, causal):
    rng = np.random.default_rng()
    for _ in range(6):
        b, h = rng.integers(1, 4, size=2)
        sq, sk = rng.integers(1, 200, size=2)
        d = int(rng.choice([1, 7, 16, 33, 64, 80, 128]))
        q = make(rng, (b, h, sq, d), dtype, layout)
        k = make(rng, (b, h, sk, d), dtype, layout)
        v = make(rng, (b, h, sk, d), dtype, layout)
        out = poisoned_like(q)
        res = flashsci.attention(q, k, v, causal=causal, layout=layout, out=out)
        assert res is out
        ref, _ = reference_attention(q, k, v, causal=causal, layout=layout)
        err = np.abs(out.astype(np.float64) - ref).max()
        assert np.isfinite(out).all(), (b, h, sq, sk, d)
        assert err <= BOUND[dtype], (dtype, layout, causal, (b, h, sq, sk, d), err)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_lse_and_scale(dtype):
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((2, 3, n, 48)).astype(dtype) for n in (37, 91, 91))
    out, lse = flashsci.attention(q, k, v, scale=0.3, causal=True, return_lse=True)
    ref, ref_lse = reference_attention(q, k, v, causal=True, scale=0.3)
    assert lse.dtype == (np.float64 if dtype == "float64" else np.float32)
    assert lse.shape == (2, 3, 37)
    assert np.abs(out - ref).max() <= BOUND[dtype]
    assert np.abs(lse - ref_lse).max() <= (1e-10 if dtype == "float64" else 1e-4)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_kv_heads(layout, causal):
    """Grouped-query attention: k and v with Hkv heads, q head h reading K/V head h // (H / Hkv) (FlashAttention's
    convention), against the float64 reference on K/V repeated to H heads; one K/V head (multi-query) and K/V
    broadcast over heads (stride 0) as well."""
    rng = np.random.default_rng()
    axis = 1 if layout == "bhsd" else 2
    for hq, hkv in [(8, 2), (6, 3), (5, 1)]:
        q = make(rng, (2, hq, 37, 24), "float32", layout)
        k, v = (make(rng, (2, hkv, 53, 24), "float32", layout) for _ in range(2))
        kr, vr = (np.repeat(x, hq // hkv, axis=axis) for x in (k, v))
        out, lse = flashsci.attention(q, k, v, causal=causal, layout=layout, return_lse=True)
        ref, ref_lse = reference_attention(q, kr, vr, causal=causal, layout=layout)
        assert np.abs(out - ref).max() <= BOUND["float32"] and np.abs(lse - ref_lse).max() < 1e-4
        assert np.array_equal(out, flashsci.attention(q, kr, vr, causal=causal, layout=layout))
    kb, vb = (np.broadcast_to(x, kr.shape) for x in (k, v))   # the last case's one head, stride 0 over heads
    assert kb.strides[axis] == 0 and np.array_equal(out, flashsci.attention(q, kb, vb, causal=causal, layout=layout))


def test_strided_views():
    rng = np.random.default_rng()
    base = rng.standard_normal((3, 6, 130, 96)).astype(np.float32)
    q = base[::2, 1::2, 5:70, :64]           # every non-last dim strided, last dim contiguous
    k = base[1:, :3, ::2, 8:72]
    v = base[:2, 2:5, 1::2, 32:96]
    assert not q.flags.c_contiguous
    out = flashsci.attention(q, k, v)
    ref, _ = reference_attention(q, k, v)
    assert np.abs(out - ref).max() <= BOUND["float32"]


def test_sq_larger_than_sk_causal_top_left():
    """torch's is_causal is top-left aligned: query i sees keys 0..i, so rows past Sk see every key."""
    rng = np.random.default_rng()
    q = rng.standard_normal((1, 2, 50, 32)).astype(np.float64)
    k = rng.standard_normal((1, 2, 20, 32)).astype(np.float64)
    v = rng.standard_normal((1, 2, 20, 32)).astype(np.float64)
    out = flashsci.attention(q, k, v, causal=True)
    ref, _ = reference_attention(q, k, v, causal=True)
    assert np.abs(out - ref).max() < 1e-12
    # row 0 sees only key 0: its output is v[..., 0, :] exactly
    assert np.allclose(out[:, :, 0], v[:, :, 0], atol=1e-14)


def test_large_threaded_problem_matches_reference():
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((2, 4, 333, 64)).astype(np.float32) for _ in range(3))
    out = flashsci.attention(q, k, v)
    ref, _ = reference_attention(q, k, v)
    assert np.abs(out - ref).max() <= BOUND["float32"]


def test_extreme_scores_stay_finite():
    """Online softmax must rescale: scores in the thousands overflow a naive exp. q and k hold integers, so float32
    forms the scores exactly and the bound tests the rescaling alone (with real q and k of that size the rounding of
    the scores, |s| 2^-24 ~ 0.01, moved near-tied weights past 1e-3 in 7 of 3000 draws)."""
    rng = np.random.default_rng()
    q = rng.integers(-60, 61, (1, 1, 40, 16)).astype(np.float32)
    k = rng.integers(-60, 61, (1, 1, 300, 16)).astype(np.float32)
    v = rng.standard_normal((1, 1, 300, 16)).astype(np.float32)
    out = flashsci.attention(q, k, v)
    ref, _ = reference_attention(q, k, v)
    assert np.isfinite(out).all()
    assert np.abs(out - ref).max() < 1e-3
