"""CPU attention backward: every option against a float64 reference that materialises the scores, and float64
central finite differences of the loss sum(out * dout) on small shapes (an independent check of the reference)."""
import numpy as np
import pytest

import flashsci
from test_attention_features_cpu import t5_buckets
from test_attention_rotary_cpu import esm_rotary

RNG = np.random.default_rng()


def rot_inverse(x, base=10000.0):
    """The transpose of esm_rotary: rotation by the negative angle."""
    d = x.shape[-1]
    inv_freq = (1.0 / (np.float32(base) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))).astype(np.float32)
    ang = np.outer(np.arange(x.shape[-2], dtype=np.float32), inv_freq).astype(np.float32)
    c, s = np.cos(np.concatenate([ang, ang], -1)).astype(np.float64), np.sin(np.concatenate([ang, ang], -1)).astype(np.float64)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * c + np.concatenate([x2, -x1], -1) * s


def reference(q, k, v, dout, causal=False, scale=None, keep=None, lens=None, bias=None, t5=None, rotary=False):
    """(out, lse, dq, dk, dv, dbias, dtable) in float64 with the S x S scores materialised; k, v may have fewer heads."""
    q, k, v, dout = (np.asarray(x, np.float64) for x in (q, k, v, dout))
    b, h, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    group = h // hk
    ke, ve = np.repeat(k, group, 1), np.repeat(v, group, 1)
    scale = 1 / np.sqrt(d) if scale is None else scale
    qs = q * scale
    if rotary:
        qs, ke = esm_rotary(qs), esm_rotary(ke)
    s = qs @ ke.swapaxes(-1, -2)
    if bias is not None:
        s = s + bias
    if t5 is not None:
        table, nb, md, bid = t5
        buckets = t5_buckets(np.arange(sk)[None, :] - np.arange(sq)[:, None], nb, md, bid)
        s = s + np.asarray(table, np.float64)[:, buckets][None]
    mask = np.ones((b, 1, sq, sk), bool)
    if causal:
        mask &= np.tril(np.ones((sq, sk), bool))
    if keep is not None:
        mask &= keep[:, None, None, :]
    if lens is not None:
        for i, n in enumerate(lens):
            mask[i, :, n:, :] = False
            mask[i, :, :, n:] = False
    s = np.where(mask, s, -np.inf)
    m = s.max(-1, keepdims=True)
    empty = ~mask.any(-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        p = np.where(empty, 0.0, np.exp(s - np.where(empty, 0, m)))
    l = p.sum(-1, keepdims=True)
    p = np.where(empty, 0.0, p / np.where(empty, 1, l))
    out = p @ ve
    lse = np.where(empty, -np.inf, m + np.log(np.where(empty, 1, l)))[..., 0]
    dv = (p.swapaxes(-1, -2) @ dout).reshape(b, hk, group, sk, d).sum(2)
    dp = dout @ ve.swapaxes(-1, -2)
    ds = p * (dp - (dout * out).sum(-1, keepdims=True))
    dqs = ds @ ke
    dks = ds.swapaxes(-1, -2) @ qs
    if rotary:
        dqs, dks = rot_inverse(dqs), rot_inverse(dks)
    dq = dqs * scale
    dk = dks.reshape(b, hk, group, sk, d).sum(2)
    dbias = None
    if bias is not None:
        dbias = ds
        shape = np.shape(bias)
        lead = dbias.ndim - len(shape)
        dbias = dbias.sum(tuple(range(lead)))
        dbias = dbias.sum(tuple(i for i, n in enumerate(shape) if n == 1), keepdims=True)
    dtable = None
    if t5 is not None:
        dtable = np.zeros((h, t5[1]))
        for n in range(t5[1]):
            dtable[:, n] = (ds * (buckets == n)).sum((0, 2, 3))
    return out, lse, dq, dk, dv, dbias, dtable


def run(q, k, v, dout, dtype, layout="bhsd", **kw):
    """flashsci forward and backward in dtype; returns float64 (out, lse, dq, dk, dv, dbias?, dtable?)."""
    tr = (lambda x: x.transpose(0, 2, 1, 3)) if layout == "bshd" else (lambda x: x)
    cast = [tr(np.asarray(x, np.float64)).astype(dtype) for x in (q, k, v, dout)]
    fwd = {n: kw[n] for n in ("causal", "scale", "key_padding_mask", "seqlens", "bias", "t5_bias", "rotary") if n in kw}
    out, lse = flashsci.attention(*cast[:3], layout=layout, return_lse=True, **fwd)
    grads = flashsci.attention_backward(cast[3], *cast[:3], out, lse, layout=layout, **kw)
    return [tr(out).astype(np.float64), lse] + [tr(g).astype(np.float64) if i < 3 else np.asarray(g, np.float64)
                                                 for i, g in enumerate(grads)]


def assert_close(got, ref, tol, what):
    assert not np.isnan(got).any(), f"{what}: NaN"
    err = np.abs(got - ref).max() / max(1.0, np.abs(ref).max())
    assert err < tol, f"{what}: relative max error {err:.2e} over {tol:.0e}"


TOL = {np.float64: 1e-10, np.float32: 2e-5, np.float16: 3e-2}


def check(b=2, h=4, hk=None, sq=37, sk=53, d=16, dtype=np.float64, layout="bhsd", keep=None, lens=None, bias=None,
          t5=None, rotary=False, causal=False, scale=None):
    hk = hk or h
    q = RNG.standard_normal((b, h, sq, d))
    k, v = (RNG.standard_normal((b, hk, sk, d)) for _ in range(2))
    dout = RNG.standard_normal((b, h, sq, d))
    ref = reference(q, k, v, dout, causal=causal, scale=scale, keep=keep, lens=lens, bias=bias, t5=t5, rotary=rotary)
    kw = dict(causal=causal, scale=scale, rotary=rotary or None)
    if keep is not None:
        kw["key_padding_mask"] = keep
    if lens is not None:
        kw["seqlens"] = np.asarray(lens, np.int32)
    if bias is not None:
        kw.update(bias=bias.astype(dtype), bias_grad=True)
    if t5 is not None:
        kw.update(t5_bias=t5, t5_grad=True)
    got = run(q, k, v, dout, dtype, layout, **kw)
    names = ["out", "lse", "dq", "dk", "dv"] + (["dbias"] if bias is not None else []) + (["dtable"] if t5 is not None else [])
    refs = list(ref[:5]) + ([ref[5]] if bias is not None else []) + ([ref[6]] if t5 is not None else [])
    for g, r, n in zip(got, refs, names):
        if n == "lse":
            fin = np.isfinite(r)
            assert (np.isneginf(g) == np.isneginf(r)).all()
            g, r = g[fin], r[fin]
        tol = max(TOL[dtype] * 4, 1e-6) if n == "dtable" else TOL[dtype]   # the table gradient is float32
        if rotary:   # the angles' float32 cos / sin differ by an ulp between libm and NumPy
            tol = max(tol, 1e-6)
        assert_close(g, r, tol, f"{dtype.__name__} {n}")
    return got


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_plain(dtype, causal):
    check(dtype=dtype, causal=causal)
    check(dtype=dtype, causal=causal, sq=70, sk=40)          # Sq > Sk: rows past Sk see every key


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_layouts_and_grouped_heads(layout):
    check(layout=layout, h=6, hk=2, causal=True)
    check(layout=layout, h=4, hk=1, d=24)


def test_scale_and_strided_inputs():
    check(scale=-0.7)
    q = RNG.standard_normal((2, 3, 30, 40))[..., ::2]           # strided rows, contiguous last dim after copy
    q = np.ascontiguousarray(q)[:, :, ::2]
    k = v = dout = q
    ref = reference(q, k, v, dout)
    got = run(q, k, v, dout, np.float64)
    for g, r in zip(got[2:], ref[2:5]):
        assert_close(g, r, 1e-10, "strided")


def test_key_padding_with_fully_padded_rows():
    keep = RNG.random((2, 53)) < 0.6
    keep[1] = False                                          # batch 1 keeps no key: zero gradients, never NaN
    got = check(keep=keep, causal=True)
    assert (got[2][1] == 0).all() and (got[3][1] == 0).all() and (got[4][1] == 0).all()


def test_seqlens():
    check(sq=40, sk=40, lens=[40, 17], causal=True)


@pytest.mark.parametrize("shape", [(2, 4, 37, 53), (1, 4, 37, 53), (4, 1, 53), (37, 53), (2, 1, 1, 53), (1, 1, 37, 1)])
def test_bias_gradient_reduced_to_the_bias_shape(shape):
    bias = RNG.standard_normal(shape)
    got = check(bias=bias)
    assert got[5].shape == shape


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_table_gradient(bidirectional):
    table = RNG.standard_normal((4, 32))
    check(t5=(table, 32, 20, bidirectional), sq=60, sk=60, causal=not bidirectional)


def test_rotary():
    check(rotary=True, d=16, causal=True, sq=45, sk=45)
    check(rotary=True, d=32, h=4, hk=2, dtype=np.float32)


def test_everything_at_once():
    keep = RNG.random((2, 53)) < 0.8
    check(h=4, hk=2, keep=keep, bias=RNG.standard_normal((4, 37, 53)), t5=(RNG.standard_normal((4, 16)), 16, 30, True),
          causal=True, layout="bshd")


def test_finite_differences():
    """The gradients against central differences of sum(attention(...) * dout), float64, options on."""
    b, h, hk, s, d = 1, 2, 1, 6, 4
    q, k, v = RNG.standard_normal((b, h, s, d)), RNG.standard_normal((b, hk, s, d)), RNG.standard_normal((b, hk, s, d))
    dout = RNG.standard_normal((b, h, s, d))
    bias = RNG.standard_normal((h, s, s))
    table = RNG.standard_normal((h, 8))
    keep = np.array([[True, True, False, True, True, True]])
    kw = dict(causal=True, key_padding_mask=keep, bias=bias, t5_bias=(table, 8, 4, True), rotary=True, scale=0.7)

    def loss(q, k, v, bias, table):
        kw2 = dict(kw, bias=bias, t5_bias=(table, 8, 4, True))
        return float((flashsci.attention(q, k, v, **kw2) * dout).sum())
    out, lse = flashsci.attention(q, k, v, return_lse=True, **kw)
    grads = flashsci.attention_backward(dout, q, k, v, out, lse, bias_grad=True, t5_grad=True, **kw)
    args = [q, k, v, bias, table]
    eps = 1e-6
    for which, (x, g) in enumerate(zip(args, grads)):
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            plus, minus = [a.copy() for a in args], [a.copy() for a in args]
            plus[which][idx] += eps
            minus[which][idx] -= eps
            num[idx] = (loss(*plus) - loss(*minus)) / (2 * eps)
        np.testing.assert_allclose(np.asarray(g, np.float64), num, atol=1e-6, rtol=1e-5,
                                   err_msg=["dq", "dk", "dv", "dbias", "dtable"][which])


class TestVarlen:
    def pack(self, lens, h, d):
        return RNG.standard_normal((sum(lens), h, d))

    @pytest.mark.parametrize("causal", [False, True])
    def test_matches_the_reference_per_sequence(self, causal):
        lens_q, lens_k, h, hk, d = [5, 1, 0, 17], [9, 3, 4, 17], 4, 2, 16
        q, dout = self.pack(lens_q, h, d), self.pack(lens_q, h, d)
        k, v = self.pack(lens_k, hk, d), self.pack(lens_k, hk, d)
        cq, ck = (np.concatenate([[0], np.cumsum(x)]).astype(np.int32) for x in (lens_q, lens_k))
        table = RNG.standard_normal((h, 16))
        kw = dict(causal=causal, t5_bias=(table, 16, 12, True), rotary=True)
        out, lse = flashsci.attention_varlen(q, k, v, cq, ck, 17, 17, return_lse=True, **kw)
        dq, dk, dv, dtable = flashsci.attention_varlen_backward(dout, q, k, v, out, lse, cq, ck, 17, 17, t5_grad=True, **kw)
        dtable_ref = np.zeros_like(dtable)
        for i in range(len(lens_q)):
            sl_q, sl_k = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
            per = [x[s].transpose(1, 0, 2)[None] for x, s in ((q, sl_q), (k, sl_k), (v, sl_k), (dout, sl_q))]
            if lens_k[i] == 0 or lens_q[i] == 0:
                continue
            ref = reference(*per, causal=causal, t5=(table, 16, 12, True), rotary=True)
            for g, r, s in ((dq, ref[2], sl_q), (dk, ref[3], sl_k), (dv, ref[4], sl_k)):
                assert_close(g[s].transpose(1, 0, 2)[None], r, 1e-6, f"sequence {i}")   # rotary: float32 angles
            dtable_ref += ref[6]
        assert_close(dtable, dtable_ref, 1e-6, "dtable")

    def test_sequences_without_keys_get_zero_gradients(self):
        lens_q, lens_k = [3, 4], [0, 5]
        q, dout, k = self.pack(lens_q, 2, 8), self.pack(lens_q, 2, 8), self.pack(lens_k, 2, 8)
        cq, ck = (np.concatenate([[0], np.cumsum(x)]).astype(np.int32) for x in (lens_q, lens_k))
        out, lse = flashsci.attention_varlen(q, k, k, cq, ck, 4, 5, return_lse=True)
        dq, dk, dv = flashsci.attention_varlen_backward(dout, q, k, k, out, lse, cq, ck, 4, 5)
        assert (dq[:3] == 0).all() and np.isfinite(dq).all() and np.isfinite(dk).all()

    def test_max_seqlen_arguments(self):
        q = self.pack([3, 4], 2, 8)
        cu = np.array([0, 3, 7], np.int32)
        out, lse = flashsci.attention_varlen(q, q, q, cu, cu, 4, 4, return_lse=True)
        with pytest.raises(ValueError, match=r"max_seqlen_k must be in \[0, 2\*\*30\], got -9223372036854775809"):
            flashsci.attention_varlen_backward(out, q, q, q, out, lse, cu, cu, 4, -2**63 - 1)
        with pytest.raises(TypeError, match="max_seqlen_q must be an int, got str"):
            flashsci.attention_varlen_backward(out, q, q, q, out, lse, cu, cu, "4", 4)


class TestErrors:
    q = RNG.standard_normal((1, 2, 8, 16))

    def fwd(self):
        return flashsci.attention(self.q, self.q, self.q, return_lse=True)

    def test_lse_shape_and_dtype(self):
        out, lse = self.fwd()
        with pytest.raises(ValueError, match=r"lse has shape \(1, 2\) but the forward's logsumexp has shape \(1, 2, 8\)"):
            flashsci.attention_backward(out, self.q, self.q, self.q, out, lse[..., 0])
        with pytest.raises(TypeError, match="lse has dtype float32; the forward returns float64"):
            flashsci.attention_backward(out, self.q, self.q, self.q, out, lse.astype(np.float32))

    def test_dout_shape(self):
        out, lse = self.fwd()
        with pytest.raises(ValueError, match="dout has shape"):
            flashsci.attention_backward(out[:, :1], self.q, self.q, self.q, out, lse)

    def test_gradient_flags_need_their_inputs(self):
        out, lse = self.fwd()
        with pytest.raises(ValueError, match="bias_grad=True needs bias"):
            flashsci.attention_backward(out, self.q, self.q, self.q, out, lse, bias_grad=True)
        with pytest.raises(ValueError, match="t5_grad=True needs t5_bias"):
            flashsci.attention_backward(out, self.q, self.q, self.q, out, lse, t5_grad=True)

    def test_given_gradient_buffers(self):
        out, lse = self.fwd()
        dq = np.full_like(self.q, np.nan)
        got = flashsci.attention_backward(out, self.q, self.q, self.q, out, lse, dq=dq)
        assert got[0] is dq and np.isfinite(dq).all()
        with pytest.raises(ValueError, match="overlaps"):
            flashsci.attention_backward(out, self.q, self.q, self.q, out, lse, dq=self.q)
