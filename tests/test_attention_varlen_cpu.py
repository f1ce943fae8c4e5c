"""attention_varlen on the CPU: packed [total, H, D] tensors with cu_seqlens against the float64 reference
per sequence, against padded attention with seqlens, and its bad-input errors."""
import numpy as np
import pytest

import flashsci
from test_attention_features_cpu import BOUND, reference


def pack(rng, lens, h, d, dtype):
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    return cu, rng.standard_normal((int(cu[-1]), h, d)).astype(dtype)


def per_sequence(x, cu, b):
    return x[cu[b]:cu[b + 1]].transpose(1, 0, 2)[None]     # (1, H, S_b, D)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("causal", [False, True])
def test_against_reference_per_sequence(dtype, causal):
    rng = np.random.default_rng()
    for _ in range(3):
        n = int(rng.integers(1, 6))
        lq = rng.integers(1, 120, size=n)
        lk = lq if rng.random() < 0.5 else rng.integers(1, 120, size=n)   # self- or cross-attention
        cq, q = pack(rng, lq, 3, 40, dtype)
        ck, k = pack(rng, lk, 3, 40, dtype)
        v = rng.standard_normal(k.shape).astype(dtype)
        table = rng.standard_normal((3, 32)).astype(np.float32)
        t5 = (table, 32, 128, True) if rng.random() < 0.5 else None
        out = np.full_like(q, np.nan)
        _, lse = flashsci.attention_varlen(q, k, v, cq, ck, int(lq.max()), int(lk.max()), causal=causal, out=out,
                                           return_lse=True, t5_bias=t5)
        assert np.isfinite(out).all(), "every packed row belongs to a sequence and must be written"
        assert lse.shape == (3, q.shape[0])
        for b in range(n):
            ref, ref_lse = reference(per_sequence(q, cq, b), per_sequence(k, ck, b), per_sequence(v, ck, b),
                                     causal=causal, t5=t5)
            got = out[cq[b]:cq[b + 1]].transpose(1, 0, 2)
            assert np.abs(got - ref[0]).max() <= BOUND[dtype]
            assert np.abs(lse[:, cq[b]:cq[b + 1]] - ref_lse[0]).max() < 1e-4


def test_matches_padded_attention_with_seqlens():
    rng = np.random.default_rng()
    lens = np.array([7, 1, 64, 30], dtype=np.int32)
    cu, q = pack(rng, lens, 2, 32, "float32")
    _, k = pack(rng, lens, 2, 32, "float32")
    _, v = pack(rng, lens, 2, 32, "float32")
    packed = flashsci.attention_varlen(q, k, v, cu, cu, 64, 64, causal=True)
    pad = lambda x: np.stack([np.pad(x[cu[b]:cu[b + 1]], ((0, 64 - lens[b]), (0, 0), (0, 0))) for b in range(4)])
    padded = flashsci.attention(pad(q), pad(k), pad(v), layout="bshd", seqlens=lens, causal=True)
    for b in range(4):
        assert np.abs(packed[cu[b]:cu[b + 1]] - padded[b, :lens[b]]).max() < 1e-6


def test_grouped_kv_heads():
    """Packed K/V with fewer heads than q (grouped-query attention), with T5 and rotary: equal to the call on K/V
    repeated to q's heads."""
    rng = np.random.default_rng()
    lens = np.array([7, 1, 64, 30], dtype=np.int32)
    cu, q = pack(rng, lens, 6, 32, "float32")
    _, k = pack(rng, lens, 2, 32, "float32")
    _, v = pack(rng, lens, 2, 32, "float32")
    kr, vr = (np.repeat(x, 3, axis=1) for x in (k, v))
    t5 = (rng.standard_normal((6, 32)).astype(np.float32), 32, 128, True)
    for kw in ({}, {"t5_bias": t5}, {"rotary": True}):
        out = flashsci.attention_varlen(q, k, v, cu, cu, 64, 64, causal=True, **kw)
        assert np.array_equal(out, flashsci.attention_varlen(q, kr, vr, cu, cu, 64, 64, causal=True, **kw)), kw


class TestVarlenErrors:
    def setup_method(self):
        rng = np.random.default_rng()
        self.cu = np.array([0, 5, 12], np.int32)
        self.q, self.k, self.v = (rng.standard_normal((12, 2, 16)).astype(np.float32) for _ in range(3))

    def call(self, cq=None, ck=None, mq=7, mk=7, **kw):
        cq = self.cu if cq is None else cq
        return flashsci.attention_varlen(self.q, self.k, self.v, cq, self.cu if ck is None else ck, mq, mk, **kw)

    def test_rank(self):
        with pytest.raises(ValueError, match=r"q must be 3-D \(total_tokens, H, D\), got 4-D"):
            flashsci.attention_varlen(self.q[None], self.k, self.v, self.cu, self.cu, 7, 7)

    def test_cu_dtype(self):
        with pytest.raises(TypeError, match=r"cu_seqlens_q: dtype int64 is not supported \(expected int32\)"):
            self.call(cq=self.cu.astype(np.int64))

    def test_cu_not_monotone(self):
        with pytest.raises(ValueError, match="cu_seqlens_k must start at 0 and never decrease"):
            self.call(ck=np.array([0, 5, 3, 12], np.int32))

    def test_cu_total(self):
        with pytest.raises(ValueError, match="cu_seqlens_q ends at 11 but the packed tensor has 12 tokens"):
            self.call(cq=np.array([0, 5, 11], np.int32))

    def test_max_seqlen_too_small(self):
        with pytest.raises(ValueError, match="sequence 1 has 7 tokens, more than max_seqlen 6 given for cu_seqlens_q"):
            self.call(mq=6)

    def test_max_seqlen_range(self):
        with pytest.raises(ValueError, match=r"max_seqlen_q must be in \[0, 2\*\*30\], got -1"):
            self.call(mq=-1)
        with pytest.raises(ValueError, match=r"max_seqlen_k must be in \[0, 2\*\*30\], got 2147483648"):
            self.call(mk=2**31)
        with pytest.raises(ValueError, match=r"max_seqlen_q must be in \[0, 2\*\*30\], got 9223372036854775808"):
            self.call(mq=2**63)   # past a C long long: a ValueError too, not an OverflowError
        with pytest.raises(TypeError, match="max_seqlen_k must be an int, got float"):
            self.call(mk=6.0)
        assert self.call(mq=np.int64(7)) is not None   # NumPy integers are ints

    def test_entries_mismatch(self):
        with pytest.raises(ValueError, match="cu_seqlens_q has 3 entries but cu_seqlens_k has 4"):
            self.call(ck=np.array([0, 5, 12, 12], np.int32))

    def test_kv_tokens(self):
        with pytest.raises(ValueError, match="k has 12 tokens but v has 11"):
            flashsci.attention_varlen(self.q, self.k, self.v[:11], self.cu, self.cu, 7, 7)

    def test_heads(self):
        with pytest.raises(ValueError, match="the head dims must match"):
            flashsci.attention_varlen(self.q, self.k[..., :8], self.v, self.cu, self.cu, 7, 7)
        with pytest.raises(ValueError, match="k has head count 1 but v has 2"):
            flashsci.attention_varlen(self.q, self.k[:, :1], self.v, self.cu, self.cu, 7, 7)
