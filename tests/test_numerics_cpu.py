"""NaN, Inf and extreme scales on the CPU against a float64 reference with torch's math-SDPA semantics: a NaN score
makes its row NaN (output and lse), +inf scores give NaN rows, masked keys never reach the scores, a row whose scores
are all -inf (no kept key) is zeros with lse -inf, and 0 * NaN from a NaN value is NaN. Activations keep NaN."""
import numpy as np
import pytest

import flashsci

RNG = np.random.default_rng()


def torch_math(q, k, v, causal=False, scale=None, keep=None):
    """(out, lse) in float64 as torch's math SDPA computes them (masked_fill then a softmax that gives 0 for fully
    masked rows), lse = max + log(sum exp(s - max)) (NaN wherever the softmax is NaN)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        s = q @ k.swapaxes(-1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
        sq, sk = s.shape[-2:]
        mask = np.ones((sq, sk), bool) if not causal else np.tril(np.ones((sq, sk), bool))
        mask = np.broadcast_to(mask, s.shape)
        if keep is not None:
            mask = mask & keep[:, None, None, :]
        s = np.where(mask, s, -np.inf)
        m = np.max(s, -1, keepdims=True)                       # NaN propagates through np.max
        all_masked = np.all(s == -np.inf, -1, keepdims=True)
        p = np.exp(s - np.where(all_masked, 0, m))
        l = p.sum(-1, keepdims=True)
        p = np.where(all_masked, 0, p / l)
        out = p @ v                                            # 0 * NaN = NaN, as torch's matmul
        lse = np.where(all_masked, -np.inf, m + np.log(l))[..., 0]
    return out, lse


def check(q, k, v, **kw):
    """flashsci's (out, lse) in float32 and float64 against torch_math: NaN exactly where the reference has NaN,
    -inf where it has -inf, close elsewhere."""
    ref_o, ref_l = torch_math(q, k, v, **kw)
    for dt, tol in ((np.float64, 1e-12), (np.float32, 2e-5)):
        args = dict(kw)
        if "keep" in args:
            args["key_padding_mask"] = args.pop("keep")
        out, lse = flashsci.attention(*(x.astype(dt) for x in (q, k, v)), return_lse=True, **args)
        for got, ref, name in ((out, ref_o, "out"), (lse, ref_l, "lse")):
            got = got.astype(np.float64)
            assert (np.isnan(got) == np.isnan(ref)).all(), f"{dt.__name__} {name}: NaN where the reference has none or not"
            assert (np.isneginf(got) == np.isneginf(ref)).all(), f"{dt.__name__} {name}: -inf differs"
            fin = np.isfinite(ref)
            np.testing.assert_allclose(got[fin], ref[fin], rtol=tol, atol=tol, err_msg=f"{dt.__name__} {name}")


def qkv(shape=(2, 2, 37, 16)):
    return [RNG.standard_normal(shape) for _ in range(3)]


@pytest.mark.parametrize("causal", [False, True])
def test_nan_in_q_makes_its_row_nan(causal):
    q, k, v = qkv()
    q[0, 1, 5, 3] = np.nan
    check(q, k, v, causal=causal)


@pytest.mark.parametrize("causal", [False, True])
def test_nan_in_k_reaches_every_row_that_sees_it(causal):
    q, k, v = qkv()
    k[1, 0, 20, 0] = np.nan
    check(q, k, v, causal=causal)


def test_masked_nan_key_is_never_seen():
    q, k, v = qkv()
    k[0, :, 7, :] = np.nan
    keep = np.ones((2, 37), bool)
    keep[0, 7] = False
    check(q, k, v, keep=keep)


def test_nan_in_v():
    q, k, v = qkv()
    v[0, 0, 11, 2] = np.nan
    check(q, k, v)
    check(q, k, v, causal=True)


@pytest.mark.parametrize("value", [np.inf, -np.inf])
def test_infinities(value):
    q, k, v = qkv()
    q[1, 1, 2, :] = value          # scores of +-inf by the sign of k's sum: NaN rows (inf - inf)
    k[0, 0, 4, 1] = value
    check(q, k, v)


def test_all_scores_minus_inf_is_a_fully_masked_row():
    q, k, v = qkv((1, 1, 4, 8))
    k = np.abs(k) + 0.1
    q[0, 0, 2, :] = -np.inf        # every score of row 2 is -inf: zeros, lse -inf (torch's math SDPA gives zeros)
    check(q, k, v)


@pytest.mark.parametrize("scale", [0.0, -1.0, 1e-30, 1e-6, 1e6, -1e6, 1e30])
def test_extreme_scales(scale):
    q, k, v = qkv((1, 2, 33, 8))
    check(q, k, v, scale=scale)


def test_fully_masked_rows_are_zeros_never_nan():
    q, k, v = qkv()
    keep = np.zeros((2, 37), bool)
    keep[1, :3] = True
    check(q, k, v, keep=keep)


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "silu"])
def test_activations_keep_nan(act):
    x = np.array([[np.nan], [-2.0], [3.0], [np.inf], [-np.inf]], np.float32)
    y = flashsci.linear(x, np.ones((1, 1), np.float32), activation=act)[:, 0]
    assert np.isnan(y[0]) and np.isfinite(y[1]) and np.isfinite(y[2])
    assert y[3] == np.inf


def test_every_float16_widens_exactly():
    """All 65,536 float16 bit patterns (subnormals, infinities, NaNs) through the CPU kernel's widening and narrowing:
    attention over a single key returns v itself (-0 comes back as +0, the sum's start)."""
    v = np.arange(65536, dtype=np.uint16).view(np.float16).reshape(1, 8192, 1, 8)
    q = np.zeros_like(v)
    out = flashsci.attention(q, q, v).reshape(-1)
    ref = v.reshape(-1)
    same = (out.view(np.uint16) == ref.view(np.uint16)) | (np.isnan(out) & np.isnan(ref))
    assert np.flatnonzero(~same).tolist() == [0x8000]
