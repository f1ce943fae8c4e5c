"""Protein options on CUDA against torch: key_padding_mask, seqlens, additive bias, in-kernel T5 bias, fused
rotary and attention_varlen. Each result must be within 2x the error of torch's own low-precision
computation of the same thing (SDPA with the mask / bias materialised, HF-style rotary in the input dtype)
against a float64 reference; outputs are NaN-poisoned first; rows without a kept key must be zeros."""
import random

import numpy as np
import pytest

import flashsci
from test_attention_features_cpu import t5_buckets
from test_attention_gpu import hopper_kernel

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
F = torch.nn.functional
DTYPES = [torch.float16, torch.bfloat16]


def ref64(q, k, v, scale, keep=None, add=None):
    """float64 attention on (B, H, Sq, D); keep (bool) and add broadcast to (B, H, Sq, Sk); rows with no
    kept key are zeros, lse -inf. Returns (out, lse)."""
    q, k, v = (x.double() for x in (q, k, v))
    s = (q @ k.transpose(-1, -2)) * scale
    if add is not None:
        s = s + add.double()
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.nan_to_num(0.0, neginf=0.0)[..., None]).nan_to_num(0.0)
    return p @ v, lse


def torch_lowp(q, k, v, scale, keep=None, add=None):
    """torch's own result in the input dtype: SDPA with the mask and bias materialised as one additive mask."""
    mask = None
    if add is not None or keep is not None:
        mask = torch.zeros((), device=q.device, dtype=torch.float32)
        if add is not None:
            mask = mask + add.float()
        if keep is not None:
            mask = mask.masked_fill(~keep, float("-inf"))
        mask = mask.to(q.dtype).expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).nan_to_num(0.0)


def assert_close(ours, ref, theirs, what):
    assert torch.isfinite(ours).all(), f"{what}: NaN-poisoned or non-finite output left"
    err = (ours.double() - ref).abs().max().item()
    torch_err = (theirs.double() - ref).abs().max().item()
    assert err <= 2 * torch_err, f"{what}: err {err:.3e} > 2 x torch {torch_err:.3e}"


def rand(*shape, dtype=torch.float16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


def poisoned(x):
    return torch.full_like(x, float("nan"))


def causal_keep(sq, sk):
    return torch.ones(sq, sk, dtype=torch.bool, device="cuda").tril()


def esm_rotary(x, base=10000.0, positions=None):
    """HF ESM rotary (float32 angles, cos/sin cast to x's dtype, computed in x's dtype) on (..., S, D)."""
    d, s = x.shape[-1], x.shape[-2]
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    pos = torch.arange(s, device=x.device, dtype=torch.float32) if positions is None else positions.float()
    emb = torch.cat([torch.outer(pos, inv_freq)] * 2, -1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    rot = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + rot * sin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("h", [3, 40])
def test_key_padding_mask(h, d, causal, dtype):
    """The sm80 kernel (three heads at D = 64) and the sm90 one on Hopper, each skipping all-padding key tiles."""
    b, s = 4, 333
    hopper = hopper_kernel()
    plan = flashsci._flashsci._launch_plan(b, h, s, s, d, causal, key_padding_mask=True)
    assert plan["kernel"] == ("sm90" if hopper and (h == 40 or d == 128) else "sm80")
    q, k, v = (rand(b, h, s, d, dtype=dtype) for _ in range(3))
    kpm = torch.rand(b, s, device="cuda") < 0.7          # scattered padding
    kpm[1] = torch.arange(s, device="cuda") < 100         # a padded suffix: whole key tiles skipped
    kpm[2] = False                                        # no key at all: zeros
    kpm[3, :] = False
    kpm[3, 250] = True                                    # one key far from the causal rows before it
    keep = kpm[:, None, None, :] & (causal_keep(s, s) if causal else True)
    ref, ref_lse = ref64(q, k, v, d ** -0.5, keep)
    out = poisoned(q)
    _, lse = flashsci.attention(q, k, v, causal=causal, key_padding_mask=kpm, out=out, return_lse=True)
    assert_close(out, ref, torch_lowp(q, k, v, d ** -0.5, keep), "key_padding_mask")
    assert (out[2] == 0).all() and torch.isneginf(lse[2]).all()
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse[finite].double() - ref_lse[finite]).abs().max().item() < 1e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
def test_key_padding_mask_with_options_many_heads(d, dtype):
    """Enough heads for the sm90 kernel on Hopper: masks with a padded suffix, scattered padding, padding before the
    first kept key and a broadcast (1, Sk) mask, with Sq != Sk, causal, seqlens, the T5 bias and rotary."""
    b, h, sq, sk = 3, 48, 280, 300
    q, k, v = rand(b, h, sq, d, dtype=dtype), rand(b, h, sk, d, dtype=dtype), rand(b, h, sk, d, dtype=dtype)
    kpm = torch.rand(b, sk, device="cuda") < 0.6
    kpm[0] = torch.arange(sk, device="cuda") < 170
    kpm[2, :140] = False
    table = torch.randn(h, 32, device="cuda")
    sc = d ** -0.5
    for kw in [{}, {"causal": True}, {"t5_bias": (table, 32, 128, True)}, {"rotary": True, "causal": True},
               {"key_padding_mask": kpm[:1]}]:
        mask = kw.pop("key_padding_mask", kpm)
        keep = mask[:, None, None, :] & (causal_keep(sq, sk) if kw.get("causal") else True)
        add = t5_dense(table, sq, sk, 32, 128, True) if "t5_bias" in kw else None
        qr, kr, scale = (esm_rotary(q.double() * sc), esm_rotary(k.double()), 1.0) if kw.get("rotary") else (q, k, sc)
        ref, _ = ref64(qr, kr, v, scale, keep, add)
        if kw.get("rotary"):
            theirs = torch_lowp(esm_rotary(q * sc), esm_rotary(k), v, 1.0, keep, add)
        else:
            theirs = torch_lowp(q, k, v, sc, keep, add)
        out = poisoned(q)
        flashsci.attention(q, k, v, key_padding_mask=mask, out=out, **kw)
        assert_close(out, ref, theirs, f"kpm {list(kw)}, {mask.shape[0]} mask rows")
    s = 300
    q, k, v = (rand(b, h, s, d, dtype=dtype) for _ in range(3))
    lens = torch.tensor([s, 129, 0], dtype=torch.int32, device="cuda")
    valid = torch.arange(s, device="cuda")[None, :] < lens[:, None].long()
    keep = kpm[:, None, None, :] & valid[:, None, None, :] & valid[:, None, :, None]
    out = poisoned(q)
    flashsci.attention(q, k, v, key_padding_mask=kpm, seqlens=lens, out=out)
    assert_close(out, ref64(q, k, v, sc, keep)[0], torch_lowp(q, k, v, sc, keep), "kpm + seqlens")
    assert (out[1, :, 129:] == 0).all() and (out[2] == 0).all()


def test_key_padding_mask_long_padded_suffix_split_path():
    """One head, long keys (KV splits) and most key tiles padding: the compacted tile list is split."""
    q, k, v = rand(1, 1, 70, 64), rand(1, 1, 5000, 64), rand(1, 1, 5000, 64)
    kpm = torch.zeros(1, 5000, dtype=torch.bool, device="cuda")
    kpm[0, 4000:4700] = True
    kpm[0, 17] = True
    keep = kpm[:, None, None, :]
    out = poisoned(q)
    flashsci.attention(q, k, v, key_padding_mask=kpm, out=out)
    assert_close(out, ref64(q, k, v, 0.125, keep)[0], torch_lowp(q, k, v, 0.125, keep), "kpm split")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_key_padding_mask_padding_tiles(d, causal, dtype):
    """All-padding key tiles before, between and after kept keys, with enough heads for the sm90 kernel on Hopper,
    which visits only the tiles that keep a key (its list from sm90_kpm_prepare); the T5 bias on the visited
    tiles' true positions."""
    b, h, s = 6, 8, 1100
    plan = flashsci._flashsci._launch_plan(b, h, s, s, d, causal, key_padding_mask=True)
    assert plan["kernel"] == ("sm90" if hopper_kernel() else "sm80")
    q, k, v = (rand(b, h, s, d, dtype=dtype) for _ in range(3))
    pos = torch.arange(s, device="cuda")
    tile = pos // 128
    kpm = torch.stack([pos >= 700,                                                   # left padding
                       (pos < 50) | ((pos >= 600) & (pos < 650)) | (pos >= 1090),    # holes
                       tile % 2 == 1,                                                # every other tile
                       (tile % 3 == 0) & (torch.rand(s, device="cuda") < 0.5),       # scattered in every third
                       pos == 1099,                                                  # the last key alone
                       torch.rand(s, device="cuda") < 0.9])
    table = torch.randn(h, 32, device="cuda")
    for kw, add in [({}, None), ({"t5_bias": (table, 32, 128, True)}, t5_dense(table, s, s, 32, 128, True))]:
        keep = kpm[:, None, None, :] & (causal_keep(s, s) if causal else True)
        ref, ref_lse = ref64(q, k, v, d ** -0.5, keep, add)
        out = poisoned(q)
        _, lse = flashsci.attention(q, k, v, causal=causal, key_padding_mask=kpm, out=out, return_lse=True, **kw)
        assert_close(out, ref, torch_lowp(q, k, v, d ** -0.5, keep, add), f"padding tiles {list(kw)}")
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite)
        assert (lse[finite].double() - ref_lse[finite]).abs().max().item() < 1e-3
        assert (out[~finite] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_seqlens(layout, causal, dtype):
    b, h, s, d = 4, 4, 300, 64
    q, k, v = (rand(b, h, s, d, dtype=dtype) for _ in range(3))
    lens = torch.tensor([300, 129, 1, 0], dtype=torch.int32, device="cuda")
    idx = torch.arange(s, device="cuda")
    valid = idx[None, :] < lens[:, None].long()
    keep = valid[:, None, None, :] & valid[:, None, :, None] & (causal_keep(s, s) if causal else True)
    ref, _ = ref64(q, k, v, d ** -0.5, keep)
    args = (q, k, v) if layout == "bhsd" else tuple(x.transpose(1, 2) for x in (q, k, v))
    out = poisoned(args[0])
    flashsci.attention(*args, causal=causal, seqlens=lens, layout=layout, out=out)
    ours = out if layout == "bhsd" else out.transpose(1, 2)
    assert_close(ours, ref, torch_lowp(q, k, v, d ** -0.5, keep), "seqlens")
    assert (ours[1, :, 129:] == 0).all() and (ours[3] == 0).all()


@pytest.mark.parametrize("shape,bias_dtype", [((1, 3, 200, 260), torch.float32), ((2, 1, 1, 260), torch.float16),
                                              ((200, 260), torch.bfloat16), ((2, 3, 200, 1), torch.float32)], ids=str)
def test_bias_broadcast(shape, bias_dtype):
    q, k, v = rand(2, 3, 200, 64), rand(2, 3, 260, 64), rand(2, 3, 260, 64)
    bias = torch.randn(shape, device="cuda", dtype=bias_dtype) * 2
    out = poisoned(q)
    flashsci.attention(q, k, v, bias=bias, out=out, scale=0.2)
    assert_close(out, ref64(q, k, v, 0.2, add=bias)[0], torch_lowp(q, k, v, 0.2, add=bias), "bias")


def test_bias_strided_view_with_mask_and_causal():
    q, k, v = (rand(2, 2, 150, 128, dtype=torch.bfloat16) for _ in range(3))
    bias = torch.randn(2, 4, 300, 150, device="cuda")[:, ::2, ::2]
    kpm = torch.rand(2, 150, device="cuda") < 0.8
    keep = kpm[:, None, None, :] & causal_keep(150, 150)
    out = poisoned(q)
    flashsci.attention(q, k, v, bias=bias, key_padding_mask=kpm, causal=True, out=out)
    assert_close(out, ref64(q, k, v, 128 ** -0.5, keep, bias)[0], torch_lowp(q, k, v, 128 ** -0.5, keep, bias), "bias view")


def t5_dense(table, sq, sk, nb, md, bidir):
    """The materialised (1, H, Sq, Sk) T5 bias, buckets by HF's function when transformers is installed."""
    rel = torch.arange(sk)[None, :] - torch.arange(sq)[:, None]
    try:
        from transformers.models.t5.modeling_t5 import T5Attention
        buckets = T5Attention._relative_position_bucket(rel, bidirectional=bidir, num_buckets=nb, max_distance=md)
    except ImportError:
        buckets = torch.from_numpy(t5_buckets(rel.numpy(), nb, md, bidir))
    return table[:, buckets.to(table.device)][None]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("sq,sk", [(300, 300), (100, 517), (1030, 1030)])
def test_t5_bias_in_kernel(sq, sk, bidirectional, dtype):
    """ProtT5: D=128, scale 1, 32 buckets, max distance 128."""
    h, d = 4, 128
    q, k, v = rand(2, h, sq, d, dtype=dtype) * 0.1, rand(2, h, sk, d, dtype=dtype) * 0.1, rand(2, h, sk, d, dtype=dtype)
    table = torch.randn(h, 32, device="cuda") * 3
    dense = t5_dense(table, sq, sk, 32, 128, bidirectional)
    out = poisoned(q)
    flashsci.attention(q, k, v, scale=1.0, t5_bias=(table, 32, 128, bidirectional), out=out)
    assert_close(out, ref64(q, k, v, 1.0, add=dense)[0], torch_lowp(q, k, v, 1.0, add=dense), "t5")


def test_t5_bias_with_seqlens_causal_and_half_table():
    q, k, v = (rand(3, 2, 400, 64) for _ in range(3))
    table = (torch.randn(2, 16, device="cuda") * 2).half()
    lens = torch.tensor([400, 5, 260], dtype=torch.int32, device="cuda")
    valid = torch.arange(400, device="cuda")[None, :] < lens[:, None].long()
    keep = valid[:, None, None, :] & valid[:, None, :, None] & causal_keep(400, 400)
    dense = t5_dense(table.float(), 400, 400, 16, 50, False)
    out = poisoned(q)
    flashsci.attention(q, k, v, causal=True, seqlens=lens, t5_bias=(table, 16, 50, False), out=out)
    assert_close(out, ref64(q, k, v, 0.125, keep, dense)[0], torch_lowp(q, k, v, 0.125, keep, dense), "t5+seqlens")


@pytest.mark.parametrize("scale", [-0.3, 0.0, 1e-7, 0.05])
def test_t5_bias_any_scale(scale):
    """The T5 bias beside a negative, zero or tiny scale (at one not above zero the kernels scale before the row max).
    torch's error is taken on the same problem with a positive scale: q times the scale's sign (exact), scale |c|
    (1 for zero)."""
    h, d = 4, 128
    q, k, v = (rand(2, h, 300, d) for _ in range(3))
    table = torch.randn(h, 32, device="cuda") * 3
    dense = t5_dense(table, 300, 300, 32, 128, True)
    out = poisoned(q)
    flashsci.attention(q, k, v, scale=scale, t5_bias=(table, 32, 128, True), out=out)
    sign = -1.0 if scale < 0 else 1.0 if scale > 0 else 0.0
    theirs = torch_lowp(q * sign, k, v, abs(scale) or 1.0, add=dense)
    assert_close(out, ref64(q, k, v, scale, add=dense)[0], theirs, f"t5 at scale {scale}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("s", [300, 700])
def test_rotary(s, d, causal, dtype):
    """ESM2: q scaled by 1/sqrt(D) first, then rotated; k rotated; attention with scale 1. The sm80 kernel rotates in
    the kernel at S = 300 and through the pre-pass from 512 on; the sm90 one (D = 128 on Hopper) always by the pre-pass."""
    b, h = 2, 3
    plan = flashsci._flashsci._launch_plan(b, h, s, s, d, causal, rotary=True)
    assert plan["rotary"] == ("prepass" if s >= 512 or plan["kernel"] == "sm90" else "kernel")
    q, k, v = (rand(b, h, s, d, dtype=dtype) for _ in range(3))
    sc = d ** -0.5
    keep = causal_keep(s, s) if causal else None
    ref, _ = ref64(esm_rotary(q.double() * sc), esm_rotary(k.double()), v, 1.0, keep)
    theirs = torch_lowp(esm_rotary(q * sc), esm_rotary(k), v, 1.0, keep)
    out = poisoned(q)
    flashsci.attention(q, k, v, causal=causal, rotary=True, out=out)
    assert_close(out, ref, theirs, "rotary")


def test_rotary_long_positions_and_base_with_kpm():
    """Positions up to 8000 (angle range reduction) and a custom base, with padding."""
    q, k, v = (rand(1, 2, 8000, 64) for _ in range(3))
    kpm = torch.ones(1, 8000, dtype=torch.bool, device="cuda")
    kpm[0, 7000:] = False
    keep = kpm[:, None, None, :]
    ref, _ = ref64(esm_rotary(q.double() * 0.125, 5000.0), esm_rotary(k.double(), 5000.0), v, 1.0, keep)
    theirs = torch_lowp(esm_rotary(q * 0.125, 5000.0), esm_rotary(k, 5000.0), v, 1.0, keep)
    out = poisoned(q)
    flashsci.attention(q, k, v, rotary=5000.0, key_padding_mask=kpm, out=out)
    assert_close(out, ref, theirs, "rotary long")


def pack(lengths, h, d, dtype):
    cu = torch.tensor([0] + list(np.cumsum(lengths)), dtype=torch.int32, device="cuda")
    return cu, (rand(int(cu[-1]), h, d, dtype=dtype) for _ in range(3))


def varlen_reference(q, k, v, cu_q, cu_k, causal, scale, t5=None, rotary=False):
    """Per sequence: float64 reference and torch's own low-precision result, packed back."""
    ref, theirs = torch.zeros_like(q, dtype=torch.float64), torch.zeros_like(q)
    for i in range(len(cu_q) - 1):
        a, e, ka, ke = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        if e == a or ke == ka:   # no rows, or no keys: zeros
            continue
        qs, ks, vs = (x.transpose(0, 1)[None] for x in (q[a:e], k[ka:ke], v[ka:ke]))
        keep = causal_keep(e - a, ke - ka) if causal else None
        add = t5_dense(t5[0], e - a, ke - ka, *t5[1:]) if t5 else None
        if rotary:
            r, _ = ref64(esm_rotary(qs.double() * scale), esm_rotary(ks.double()), vs, 1.0, keep, add)
            t = torch_lowp(esm_rotary(qs * scale), esm_rotary(ks), vs, 1.0, keep, add)
        else:
            r, _ = ref64(qs, ks, vs, scale, keep, add)
            t = torch_lowp(qs, ks, vs, scale, keep, add)
        ref[a:e], theirs[a:e] = r[0].transpose(0, 1), t[0].transpose(0, 1)
    return ref, theirs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen(causal, dtype):
    lengths = [1, 80, 333, 1000, 2, 129, 4000]
    cu, (q, k, v) = pack(lengths, 4, 64, dtype)
    out = poisoned(q)
    _, lse = flashsci.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=causal, out=out, return_lse=True)
    ref, theirs = varlen_reference(q, k, v, cu, cu, causal, 0.125)
    assert_close(out, ref, theirs, "varlen")
    assert lse.shape == (4, q.shape[0]) and torch.isfinite(lse).all()


def test_varlen_cross_lengths_t5_rotary_split():
    """Sq != Sk per sequence, a sequence with no keys (zeros), one long pair (KV split), T5 and rotary together."""
    lq, lk = [5, 300, 64, 7], [9, 200, 0, 3000]
    cu_q, (q, _, _) = pack(lq, 2, 128, torch.bfloat16)
    cu_k, (_, k, v) = pack(lk, 2, 128, torch.bfloat16)
    table = torch.randn(2, 32, device="cuda")
    for kw, ref_kw in [({}, {}), ({"t5_bias": (table, 32, 128, True)}, {"t5": (table, 32, 128, True)}),
                       ({"rotary": True}, {"rotary": True})]:
        out = poisoned(q)
        flashsci.attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), out=out, **kw)
        ref, theirs = varlen_reference(q, k, v, cu_q, cu_k, False, 128 ** -0.5, **ref_kw)
        assert_close(out, ref, theirs, f"varlen {list(kw)}")
        assert (out[305:369] == 0).all()


@pytest.mark.parametrize("kernel", ["auto", "sm80"])
@pytest.mark.parametrize("d", [64, 128])
def test_grouped_kv_heads_with_options(d, kernel):
    """Grouped-query attention (K/V with fewer heads than q) with each protein option, through both kernels (the
    Hopper one, and the portable one forced): equal bit for bit to the same call on K/V repeated to q's heads, which
    the tests above check against torch."""
    hq, hkv, b, s = 8, 2, 3, 700
    q, k, v = rand(b, hq, s, d), rand(b, hkv, s, d), rand(b, hkv, s, d)
    kr, vr = (x.repeat_interleave(hq // hkv, dim=1) for x in (k, v))
    keep = torch.rand(b, s, device="cuda") < 0.7
    keep[:, 0] = True
    lens = torch.tensor([700, 1, 333], dtype=torch.int32, device="cuda")
    table = torch.randn(hq, 32, device="cuda")
    options = [dict(key_padding_mask=keep), dict(seqlens=lens), dict(t5_bias=(table, 32, 128, True), scale=1.0),
               dict(rotary=True), dict(bias=rand(1, hq, s, s)), dict(key_padding_mask=keep, rotary=True)]
    try:
        flashsci._flashsci._set_attention_kernel(kernel)
        for kw in options:
            for causal in (False, True):
                out = poisoned(q)
                flashsci.attention(q, k, v, causal=causal, out=out, **kw)
                assert torch.equal(out, flashsci.attention(q, kr, vr, causal=causal, **kw)), (list(kw), causal)
        # rotary in the sm80 kernel itself (below 512 keys), and packed sequences with T5 and rotary
        out = poisoned(q[:, :, :300])
        flashsci.attention(q[:, :, :300], k[:, :, :300], v[:, :, :300], rotary=True, out=out)
        assert torch.equal(out, flashsci.attention(q[:, :, :300], kr[:, :, :300], vr[:, :, :300], rotary=True))
        lengths = [1, 80, 333, 1000, 129]
        cu, (pq, pk, pv) = pack(lengths, hq, d, torch.float16)
        pk, pv = pk[:, :hkv], pv[:, :hkv]
        pkr, pvr = (x.repeat_interleave(hq // hkv, dim=1) for x in (pk, pv))
        for kw in ({}, dict(t5_bias=(table, 32, 128, True)), dict(rotary=True)):
            out = poisoned(pq)
            flashsci.attention_varlen(pq, pk, pv, cu, cu, 1000, 1000, causal=True, out=out, **kw)
            assert torch.equal(out, flashsci.attention_varlen(pq, pkr, pvr, cu, cu, 1000, 1000, causal=True, **kw)), kw
    finally:
        flashsci._flashsci._set_attention_kernel("auto")


def test_options_agree_with_cpu_path():
    q, k, v = (torch.randn(2, 3, 150, 64, dtype=torch.float16) for _ in range(3))
    kpm = torch.rand(2, 150) < 0.8
    table = torch.randn(3, 32)
    kw = dict(causal=True, key_padding_mask=kpm, t5_bias=(table, 32, 128, True), rotary=True)
    cpu = flashsci.attention(q, k, v, **kw).double()
    gkw = dict(kw, key_padding_mask=kpm.cuda(), t5_bias=(table.cuda(), 32, 128, True))
    gpu = flashsci.attention(q.cuda(), k.cuda(), v.cuda(), **gkw).double().cpu()
    keep = kpm[:, None, None, :] & torch.ones(150, 150, dtype=torch.bool).tril()
    add = t5_dense(table, 150, 150, 32, 128, True)
    ref, _ = ref64(esm_rotary(q.double() * 0.125), esm_rotary(k.double()), v, 1.0, keep, add)
    assert (gpu - cpu).abs().max().item() <= 2 * max((gpu - ref).abs().max().item(), (cpu - ref).abs().max().item())


@pytest.mark.parametrize("seed", range(60))
def test_fuzzed_options(seed):
    rng = random.Random(seed * 104729 + 3)
    d = rng.choice([32, 64, 96, 128, 256])
    dtype = rng.choice(DTYPES)
    b, h, s = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 600)
    causal = rng.random() < 0.4
    q, k, v = (rand(b, h, s, d, dtype=dtype) for _ in range(3))
    kw, keep, add = {}, torch.ones(b, 1, s, s, dtype=torch.bool, device="cuda"), None
    if causal:
        kw["causal"] = True
        keep = keep & causal_keep(s, s)
    if rng.random() < 0.5:
        kpm = torch.rand(b, s, device="cuda") < rng.random()
        kw["key_padding_mask"] = kpm
        keep = keep & kpm[:, None, None, :]
    if rng.random() < 0.4:
        lens = torch.tensor([rng.randint(0, s) for _ in range(b)], dtype=torch.int32, device="cuda")
        kw["seqlens"] = lens
        valid = torch.arange(s, device="cuda")[None, :] < lens[:, None].long()
        keep = keep & valid[:, None, None, :] & valid[:, None, :, None]
    if rng.random() < 0.4:
        table = torch.randn(h, 32, device="cuda")
        kw["t5_bias"] = (table, 32, 128, rng.random() < 0.5)
        add = t5_dense(table, s, s, 32, 128, kw["t5_bias"][3])
    if rng.random() < 0.3:
        bias = torch.randn(1, h, 1, s, device="cuda")
        kw["bias"] = bias
        add = bias if add is None else add + bias
    sc = d ** -0.5
    if rng.random() < 0.4:
        kw["rotary"] = True
        ref, _ = ref64(esm_rotary(q.double() * sc), esm_rotary(k.double()), v, 1.0, keep, add)
        theirs = torch_lowp(esm_rotary(q * sc), esm_rotary(k), v, 1.0, keep, add)
    else:
        ref, _ = ref64(q, k, v, sc, keep, add)
        theirs = torch_lowp(q, k, v, sc, keep, add)
    out = poisoned(q)
    flashsci.attention(q, k, v, out=out, **kw)
    assert_close(out, ref, theirs, f"seed {seed}: {b, h, s, d, dtype} {sorted(kw)}")


class TestGpuOptionErrors:
    def test_mask_on_other_device(self):
        q = rand(1, 2, 16, 64)
        with pytest.raises(ValueError, match="key_padding_mask is on cpu but q is on cuda:0"):
            flashsci.attention(q, q, q, key_padding_mask=torch.ones(1, 16, dtype=torch.bool))

    def test_t5_range_limit(self):
        q = rand(1, 1, 9000, 64)
        table = torch.randn(1, 32, device="cuda")
        with pytest.raises(ValueError, match="t5_bias on CUDA covers at most 16384 relative positions"):
            flashsci.attention(q, q, q, t5_bias=(table, 32, 10000, True))

    def test_cu_seqlens_on_cpu(self):
        q = rand(10, 2, 64)
        cu = torch.tensor([0, 10], dtype=torch.int32)
        with pytest.raises(ValueError, match="cu_seqlens_q is on cpu but q is on cuda:0"):
            flashsci.attention_varlen(q, q, q, cu, cu, 10, 10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_options(causal, dtype):
    """Enough heads for the sm90 kernel on Hopper (the sm80 one elsewhere): packed sequences with Sq != Sk, empty
    ones and last tiles that end inside a warpgroup's rows, with 128-key tiles and (at most 192 keys) 64-key ones;
    seqlens; the T5 bias, alone and with both."""
    for lq, lk in [([1, 130, 64, 300, 0, 257], [5, 200, 0, 300, 7, 257]), ([1, 130, 64, 170, 0, 129], [5, 150, 0, 170, 7, 65])]:
        cu_q, (q, _, _) = pack(lq, 40, 64, dtype)
        cu_k, (_, k, v) = pack(lk, 40, 64, dtype)
        out = poisoned(q)
        _, lse = flashsci.attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal, out=out, return_lse=True)
        ref, theirs = varlen_reference(q, k, v, cu_q, cu_k, causal, 0.125)
        assert_close(out, ref, theirs, f"hopper varlen, {max(lk)} keys")
        assert (out[131:195] == 0).all() and torch.isfinite(lse[:, :131]).all() and (lse[:, 131:195] == float("-inf")).all()

    lengths, table = [100, 513, 64], torch.randn(32, 32, device="cuda")
    cu, (q, k, v) = pack(lengths, 32, 128, dtype)
    out = poisoned(q)
    flashsci.attention_varlen(q, k, v, cu, cu, 513, 513, causal=causal, scale=1.0, t5_bias=(table, 32, 128, True), out=out)
    ref, theirs = varlen_reference(q, k, v, cu, cu, causal, 1.0, t5=(table, 32, 128, True))
    assert_close(out, ref, theirs, "hopper varlen + t5")

    for s in (300, 170):
        b, h = 4, 48
        q, k, v = (rand(b, h, s, 64, dtype=dtype) for _ in range(3))
        lens = torch.tensor([s, 129, 1, 0], dtype=torch.int32, device="cuda")
        valid = torch.arange(s, device="cuda")[None, :] < lens[:, None].long()
        keep = valid[:, None, None, :] & valid[:, None, :, None] & (causal_keep(s, s) if causal else True)
        table = (torch.randn(h, 16, device="cuda") * 2).to(dtype)
        dense = t5_dense(table.float(), s, s, 16, 50, False)
        for kw, add in [({}, None), ({"t5_bias": (table, 16, 50, False)}, dense)]:
            out = poisoned(q)
            flashsci.attention(q, k, v, causal=causal, seqlens=lens, out=out, **kw)
            assert_close(out, ref64(q, k, v, 0.125, keep, add)[0], torch_lowp(q, k, v, 0.125, keep, add),
                         f"hopper seqlens {list(kw)}, S = {s}")
            assert (out[1, :, 129:] == 0).all() and (out[3] == 0).all()
    q, k, v = rand(2, 32, 300, 128, dtype=dtype) * 0.1, rand(2, 32, 700, 128, dtype=dtype) * 0.1, rand(2, 32, 700, 128, dtype=dtype)
    table = torch.randn(32, 32, device="cuda") * 3
    dense = t5_dense(table, 300, 700, 32, 128, True)
    keep = causal_keep(300, 700) if causal else None
    out = poisoned(q)
    flashsci.attention(q, k, v, causal=causal, scale=1.0, t5_bias=(table, 32, 128, True), out=out)
    assert_close(out, ref64(q, k, v, 1.0, keep, dense)[0], torch_lowp(q, k, v, 1.0, keep, dense), "hopper t5")


@pytest.mark.parametrize("d", [64, 128])
def test_hopper_t5_tables_across_items(d):
    """Several work items per block of the sm90 kernel (on Hopper), each with another head's T5 table: the tables
    land in two shared-memory slots in turn, so a table overwritten while still in use shows as a wrong bias."""
    b, h, s = 4, 32, 576
    q, k, v = rand(b, h, s, d) * 0.1, rand(b, h, s, d), rand(b, h, s, d)
    table = torch.randn(h, 32, device="cuda") * 2
    dense = t5_dense(table, s, s, 32, 128, True)
    out = poisoned(q)
    flashsci.attention(q, k, v, scale=1.0, t5_bias=(table, 32, 128, True), out=out)
    assert_close(out, ref64(q, k, v, 1.0, None, dense)[0], torch_lowp(q, k, v, 1.0, None, dense), f"t5 across items, D = {d}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("kernel", ["auto", "sm80"])
def test_rotary_prepass(kernel, d, causal, dtype):
    """Rotary through the pre-pass of q and k into the workspace: always on the sm90 kernel (enough heads for it on
    Hopper), on the sm80 one from 512 queries and keys (forced here on Hopper too; its 300-query case rotates in the
    kernel). bshd strided views with Sq != Sk, seqlens with empty and length-1 rows, packed sequences with the T5
    bias, and a graph replay (the workspace allocated under capture)."""
    hopper = hopper_kernel()
    flashsci._flashsci._set_attention_kernel(kernel)
    try:
        plan = flashsci._flashsci._launch_plan(2, 40, 300, 700, d, causal, rotary=True)
        assert (plan["kernel"], plan["rotary"]) == (("sm90", "prepass") if hopper and kernel == "auto" else ("sm80", "kernel"))
        assert flashsci._flashsci._launch_plan(4, 48, 600, 600, d, causal, rotary=True)["rotary"] == "prepass"
        rotary_cases(d, causal, dtype)
    finally:
        flashsci._flashsci._set_attention_kernel("auto")


def rotary_cases(d, causal, dtype):
    """The cases of test_rotary_prepass, on whichever kernel is dispatched."""
    sc = d ** -0.5
    q = rand(2, 300, 40, 2 * d, dtype=dtype)[..., d:]
    k, v = (rand(2, 700, 40, d, dtype=dtype) for _ in range(2))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    keep = causal_keep(300, 700) if causal else None
    ref, _ = ref64(esm_rotary(qt.double() * sc), esm_rotary(kt.double()), vt, 1.0, keep)
    theirs = torch_lowp(esm_rotary(qt * sc), esm_rotary(kt), vt, 1.0, keep)
    out = poisoned(q)
    flashsci.attention(q, k, v, causal=causal, rotary=True, layout="bshd", out=out)
    assert_close(out.transpose(1, 2), ref, theirs, "rotary, bshd, 300 x 700")

    b, h, s = 4, 48, 600
    q, k, v = (rand(b, h, s, d, dtype=dtype) for _ in range(3))
    lens = torch.tensor([s, 129, 1, 0], dtype=torch.int32, device="cuda")
    valid = torch.arange(s, device="cuda")[None, :] < lens[:, None].long()
    keep = valid[:, None, None, :] & valid[:, None, :, None] & (causal_keep(s, s) if causal else True)
    out = poisoned(q)
    flashsci.attention(q, k, v, causal=causal, seqlens=lens, rotary=True, out=out)
    assert_close(out, ref64(esm_rotary(q.double() * sc), esm_rotary(k.double()), v, 1.0, keep)[0],
                 torch_lowp(esm_rotary(q * sc), esm_rotary(k), v, 1.0, keep), "rotary + seqlens")
    assert (out[1, :, 129:] == 0).all() and (out[3] == 0).all()

    lengths, table = [100, 600, 1, 64], torch.randn(32, 32, device="cuda")
    cu, (q, k, v) = pack(lengths, 32, d, dtype)
    q = q * sc   # ProtT5-style scale 1 on prescaled queries
    kw = dict(causal=causal, scale=1.0, t5_bias=(table, 32, 128, True), rotary=True)
    ref, theirs = varlen_reference(q, k, v, cu, cu, causal, 1.0, t5=(table, 32, 128, True), rotary=True)
    out = poisoned(q)
    flashsci.attention_varlen(q, k, v, cu, cu, 600, 600, out=out, **kw)
    assert_close(out, ref, theirs, "varlen + rotary + t5")

    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flashsci.attention_varlen(q, k, v, cu, cu, 600, 600, out=out, **kw)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        flashsci.attention_varlen(q, k, v, cu, cu, 600, 600, out=out, **kw)
    k.copy_(torch.randn_like(k))
    out.fill_(float("nan"))
    g.replay()
    ref, theirs = varlen_reference(q, k, v, cu, cu, causal, 1.0, t5=(table, 32, 128, True), rotary=True)
    assert_close(out, ref, theirs, "varlen + rotary + t5, graph replay")


@pytest.mark.parametrize("d", [8, 16, 24, 40, 48, 80, 104, 112, 136, 200, 248])
def test_head_dims_without_own_kernel(d):
    """Head dims that run at the next native one through zero-padded copies (on Hopper 80 and 112 on the D = 128
    kernel directly, zeros read past their columns): plain, causal with a key padding mask, rotary (over the true head
    dim), grouped K/V with T5, packed sequences; against torch like the native ones."""
    dtype = torch.bfloat16 if d % 16 else torch.float16
    b, h, s = 2, 4, 300
    q, k, v = (rand(b, h, s, d, dtype=dtype) for _ in range(3))
    sc = d ** -0.5
    out = poisoned(q)
    flashsci.attention(q, k, v, out=out)
    assert_close(out, ref64(q, k, v, sc)[0], torch_lowp(q, k, v, sc), f"d={d}")
    kpm = torch.rand(b, s, device="cuda") < 0.7
    keep = causal_keep(s, s) & kpm[:, None, None, :]
    out = poisoned(q)
    flashsci.attention(q, k, v, causal=True, key_padding_mask=kpm, out=out)
    assert_close(out, ref64(q, k, v, sc, keep)[0], torch_lowp(q, k, v, sc, keep), f"d={d} causal kpm")
    out = poisoned(q)
    flashsci.attention(q, k, v, rotary=True, out=out)
    ref = ref64(esm_rotary(q.double() * sc), esm_rotary(k.double()), v, 1.0)[0]
    assert_close(out, ref, torch_lowp(esm_rotary(q * sc), esm_rotary(k), v, 1.0), f"d={d} rotary")
    table = torch.randn(h, 32, device="cuda")
    kg, vg = k[:, :2], v[:, :2]
    out = poisoned(q)
    flashsci.attention(q, kg, vg, t5_bias=(table, 32, 128, True), out=out)
    add = t5_dense(table, s, s, 32, 128, True)
    kr, vr = kg.repeat_interleave(2, 1), vg.repeat_interleave(2, 1)
    assert_close(out, ref64(q, kr, vr, sc, None, add)[0], torch_lowp(q, kr, vr, sc, None, add), f"d={d} gqa t5")
    lengths = [1, 80, 0, 219]
    cu, (pq, pk, pv) = pack(lengths, h, d, dtype)
    out = poisoned(pq)
    flashsci.attention_varlen(pq, pk, pv, cu, cu, max(lengths), max(lengths), causal=True, rotary=True, out=out)
    ref, theirs = varlen_reference(pq, pk, pv, cu, cu, True, sc, rotary=True)
    assert_close(out, ref, theirs, f"d={d} varlen rotary")
    # rows wider than the head (views 8 columns in) and 3 heads (a partial group of the copies' heads)
    q, k, v = (rand(1, 3, 130, d + 8, dtype=dtype)[..., 8:] for _ in range(3))
    out = poisoned(q)
    flashsci.attention(q, k, v, rotary=True, causal=True, out=out)
    keep = causal_keep(130, 130)
    ref = ref64(esm_rotary(q.double() * sc), esm_rotary(k.double()), v, 1.0, keep)[0]
    assert_close(out, ref, torch_lowp(esm_rotary(q * sc), esm_rotary(k), v, 1.0, keep), f"d={d} unaligned rotary")
