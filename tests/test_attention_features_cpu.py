"""Protein attention options on the CPU path against a float64 reference: key_padding_mask, seqlens,
additive bias (broadcast), in-kernel T5 relative-position bias; and their bad-input errors."""
import math

import numpy as np
import pytest

import flashsci


def t5_buckets(rel, num_buckets, max_distance, bidirectional):
    """HF transformers' T5Attention._relative_position_bucket in NumPy, float32 like torch."""
    rel = np.asarray(rel, dtype=np.int64)
    out = np.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        out += (rel > 0).astype(np.int64) * num_buckets
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    max_exact = num_buckets // 2
    with np.errstate(divide="ignore"):
        large = max_exact + (np.log(np.maximum(rel, 1).astype(np.float32) / np.float32(max_exact))
                             / np.float32(math.log(max_distance / max_exact))
                             * np.float32(num_buckets - max_exact)).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return out + np.where(rel < max_exact, rel, large)


def reference(q, k, v, causal=False, scale=None, kpm=None, seqlens=None, bias=None, t5=None):
    """float64 (B, H, S, D) attention with the options; rows without a valid key are zeros."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, h, sq, d = q.shape
    sk = k.shape[2]
    s = (q @ k.swapaxes(-1, -2)) * (1 / math.sqrt(d) if scale is None else scale)
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    if t5 is not None:
        table, nb, md, bidir = t5
        rel = np.arange(sk)[None, :] - np.arange(sq)[:, None]
        s = s + np.asarray(table, np.float64)[:, t5_buckets(rel, nb, md, bidir)][None]
    keep = np.ones((b, 1, sq, sk), bool)
    if causal:
        keep &= np.tril(np.ones((sq, sk), bool))
    if kpm is not None:
        keep &= np.asarray(kpm)[:, None, None, :]
    if seqlens is not None:
        idx = np.arange(sk)
        keep &= (idx[None, :] < np.asarray(seqlens)[:, None])[:, None, None, :]
        keep &= (np.arange(sq)[None, :] < np.asarray(seqlens)[:, None])[:, None, :, None]
    s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    out = np.where(l > 0, (p / np.where(l > 0, l, 1)) @ v, 0)
    lse = np.where(l[..., 0] > 0, m[..., 0] + np.log(np.where(l[..., 0] > 0, l[..., 0], 1)), -np.inf)
    return out, lse


BOUND = {"float16": 4e-3, "float32": 2e-5, "float64": 1e-11}


def qkv(rng, b, h, sq, sk, d, dtype="float32"):
    return (rng.standard_normal((b, h, sq, d)).astype(dtype), rng.standard_normal((b, h, sk, d)).astype(dtype),
            rng.standard_normal((b, h, sk, d)).astype(dtype))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_mask(dtype, causal):
    rng = np.random.default_rng()
    for _ in range(4):
        b, h, sq, sk = 3, 2, int(rng.integers(1, 150)), int(rng.integers(1, 150))
        q, k, v = qkv(rng, b, h, sq, sk, 40, dtype)
        kpm = rng.random((b, sk)) > 0.4
        kpm[0] = False                     # a fully padded sequence: zeros, never NaN
        out = np.full_like(q, np.nan)
        _, lse = flashsci.attention(q, k, v, key_padding_mask=kpm, causal=causal, out=out, return_lse=True)
        ref, ref_lse = reference(q, k, v, causal=causal, kpm=kpm)
        assert np.isfinite(out).all()
        assert np.abs(out - ref).max() <= BOUND[dtype]
        assert (out[0] == 0).all() and np.isneginf(lse[0]).all()
        fin = np.isfinite(ref_lse)
        assert np.array_equal(fin, np.isfinite(lse))
        assert not fin.any() or np.abs(lse[fin] - ref_lse[fin]).max() < 1e-4   # causal + mask can leave no key at all


@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_mask_padding_blocks(causal):
    """Blocks of keys (64) that are all padding, before, between and after kept keys, are skipped."""
    rng = np.random.default_rng()
    pos = np.arange(300)
    kpm = np.stack([pos >= 200, (pos < 10) | ((pos >= 150) & (pos < 160)) | (pos >= 290), (pos // 64) % 2 == 1, pos == 299])
    q, k, v = qkv(rng, 4, 2, 300, 300, 32)
    out = np.full_like(q, np.nan)
    _, lse = flashsci.attention(q, k, v, key_padding_mask=kpm, causal=causal, out=out, return_lse=True)
    ref, ref_lse = reference(q, k, v, causal=causal, kpm=kpm)
    assert np.abs(out - ref).max() <= BOUND["float32"]
    fin = np.isfinite(ref_lse)
    assert np.array_equal(fin, np.isfinite(lse)) and np.abs(lse[fin] - ref_lse[fin]).max() < 1e-4
    assert (out[~fin] == 0).all()


def test_key_padding_mask_broadcast_batch():
    rng = np.random.default_rng()
    q, k, v = qkv(rng, 2, 2, 30, 40, 16)
    kpm = rng.random((1, 40)) > 0.5
    ref, _ = reference(q, k, v, kpm=np.broadcast_to(kpm, (2, 40)))
    assert np.abs(flashsci.attention(q, k, v, key_padding_mask=kpm) - ref).max() <= BOUND["float32"]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_seqlens(causal, layout):
    rng = np.random.default_rng()
    s = 97
    q, k, v = qkv(rng, 4, 3, s, s, 32)
    lens = np.array([0, 1, 50, s], dtype=np.int32)
    args = (q, k, v) if layout == "bhsd" else tuple(x.transpose(0, 2, 1, 3).copy() for x in (q, k, v))
    out = flashsci.attention(*args, seqlens=lens, causal=causal, layout=layout)
    if layout == "bshd":
        out = out.transpose(0, 2, 1, 3)
    ref, _ = reference(q, k, v, causal=causal, seqlens=lens)
    assert np.abs(out - ref).max() <= BOUND["float32"]
    for bi, n in enumerate(lens):
        assert (out[bi, :, n:] == 0).all(), "rows past the length must be zeros"


@pytest.mark.parametrize("shape", [(60, 70), (1, 3, 1, 70), (2, 1, 60, 70), (2, 3, 60, 70), (70,)])
@pytest.mark.parametrize("bias_dtype", ["float16", "float32"])
def test_bias_broadcast(shape, bias_dtype):
    rng = np.random.default_rng()
    q, k, v = qkv(rng, 2, 3, 60, 70, 32)
    bias = (rng.standard_normal(shape) * 2).astype(bias_dtype)
    out = flashsci.attention(q, k, v, bias=bias, causal=True)
    ref, _ = reference(q, k, v, causal=True, bias=bias.astype(np.float64))
    assert np.abs(out - ref).max() <= BOUND["float32"]


def test_bias_strided_view():
    rng = np.random.default_rng()
    q, k, v = qkv(rng, 1, 2, 40, 40, 16)
    bias = rng.standard_normal((2, 40, 40)).astype(np.float32).transpose(0, 2, 1)   # non-contiguous
    ref, _ = reference(q, k, v, bias=bias)
    assert np.abs(flashsci.attention(q, k, v, bias=bias) - ref).max() <= BOUND["float32"]


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_t5_bias_in_kernel(bidirectional, dtype):
    """ProtT5 settings: scale 1.0, 32 buckets, max distance 128; S past 128 exercises the last bucket."""
    rng = np.random.default_rng()
    q, k, v = qkv(rng, 2, 4, 300, 300, 64, dtype)
    q = (q * 0.2).astype(dtype)
    table = rng.standard_normal((4, 32)).astype(np.float32)
    kpm = rng.random((2, 300)) > 0.2
    t5 = (table, 32, 128, bidirectional)
    out = flashsci.attention(q, k, v, scale=1.0, t5_bias=t5, key_padding_mask=kpm)
    ref, _ = reference(q, k, v, scale=1.0, t5=t5, kpm=kpm)
    assert np.abs(out - ref).max() <= BOUND[dtype]


def test_t5_buckets_match_hf_function():
    """The kernel's buckets, seen through a one-hot table, against HF's own function when installed."""
    torch = pytest.importorskip("torch")
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    s = 400
    rel = torch.arange(s)[None, :] - torch.arange(s)[:, None]
    for bidir in (True, False):
        hf = t5.T5Attention._relative_position_bucket(rel, bidirectional=bidir, num_buckets=32, max_distance=128).numpy()
        assert np.array_equal(hf, t5_buckets(rel.numpy(), 32, 128, bidir))


def test_t5_bucket_one_hot_probe():
    """Read the kernel's bucket for every relative position: a one-hot table and q = 0 make row i attend
    uniformly within each bucket, and v = key index recovers which keys share bucket(j - i)."""
    s, nb = 200, 32
    q = np.zeros((1, nb, s, 8))
    k = np.zeros((1, nb, s, 8))
    v = np.zeros((1, nb, s, 8))
    v[..., 0] = np.arange(s)
    table = np.full((nb, nb), -1e9)
    np.fill_diagonal(table, 0.0)           # head h keeps exactly the keys whose bucket is h
    out = flashsci.attention(q, k, v, scale=1.0, t5_bias=(table, nb, 128, True))
    rel = np.arange(s)[None, :] - np.arange(s)[:, None]
    buckets = t5_buckets(rel, nb, 128, True)
    for h in range(nb):
        sel = buckets == h
        want = np.where(sel.any(1), (sel * np.arange(s)).sum(1) / np.maximum(sel.sum(1), 1), np.nan)
        got = out[0, h, :, 0]
        has = sel.any(1)
        assert np.allclose(got[has], want[has], atol=1e-6), h


class TestFeatureErrors:
    def setup_method(self):
        rng = np.random.default_rng()
        self.q, self.k, self.v = qkv(rng, 2, 3, 20, 20, 16)

    def call(self, **kw):
        return flashsci.attention(self.q, self.k, self.v, **kw)

    def test_mask_dtype(self):
        with pytest.raises(TypeError, match=r"key_padding_mask: dtype float32 is not supported \(expected bool\)"):
            self.call(key_padding_mask=np.ones((2, 20), np.float32))

    def test_mask_shape(self):
        with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, Sk\) = \(2, 20\) \(True = keep\), got \(2, 19\)"):
            self.call(key_padding_mask=np.ones((2, 19), bool))

    def test_seqlens_dtype(self):
        with pytest.raises(TypeError, match=r"seqlens: dtype int64 is not supported \(expected int32\)"):
            self.call(seqlens=np.array([3, 4], np.int64))

    def test_seqlens_value(self):
        with pytest.raises(ValueError, match=r"seqlens\[1\] = 21 is outside \[0, S\] = \[0, 20\]"):
            self.call(seqlens=np.array([3, 21], np.int32))

    def test_seqlens_needs_self_attention(self):
        with pytest.raises(ValueError, match="seqlens is for self-attention on a padded batch"):
            flashsci.attention(self.q, self.k[:, :, :10], self.v[:, :, :10], seqlens=np.array([3, 4], np.int32))

    def test_bias_shape(self):
        with pytest.raises(ValueError, match=r"bias of shape \(3, 20, 7\) does not broadcast to \(B, H, Sq, Sk\) = \(2, 3, 20, 20\)"):
            self.call(bias=np.ones((3, 20, 7), np.float32))

    def test_bias_dtype(self):
        with pytest.raises(TypeError, match=r"bias: dtype int32 is not supported"):
            self.call(bias=np.ones((20, 20), np.int32))

    def test_t5_not_a_tuple(self):
        with pytest.raises(TypeError, match=r"t5_bias must be a tuple \(table, num_buckets, max_distance, bidirectional\)"):
            self.call(t5_bias=np.ones((3, 32), np.float32))

    def test_t5_numbers(self):
        with pytest.raises(ValueError, match=r"t5_bias: need num_buckets in \[4, 65536\] and max_distance in "
                                             r"\(num_buckets / 2 / 2, 2\*\*31\) .*got num_buckets=32, max_distance=8"):
            self.call(t5_bias=(np.ones((3, 32), np.float32), 32, 8, True))
        with pytest.raises(ValueError, match="got num_buckets=32, max_distance=18446744073709551616"):   # past a C long
            self.call(t5_bias=(np.ones((3, 32), np.float32), 32, 2**64, True))
        with pytest.raises(ValueError, match=r"num_buckets in \[2, 65536\].*got num_buckets=-18446744073709551616"):
            self.call(t5_bias=(np.ones((3, 32), np.float32), -2**64, 128, False))
        with pytest.raises(TypeError, match="t5_bias: num_buckets must be an int"):
            self.call(t5_bias=(np.ones((3, 32), np.float32), 32.0, 128, True))

    def test_t5_table_shape(self):
        with pytest.raises(ValueError, match=r"t5_bias table must have shape \(H, num_buckets\) = \(3, 32\), got \(4, 32\)"):
            self.call(t5_bias=(np.ones((4, 32), np.float32), 32, 128, True))
