"""Fused rotary embeddings (ESM convention) on the CPU path: against a NumPy version of HF's ESM rotary
applied to q * scale (ESM2's order) and k, for both layouts, causal, and varlen (positions restart per
sequence); against HF's own EsmRotaryEmbedding where transformers and torch are installed."""
import numpy as np
import pytest

import flashsci
from test_attention_features_cpu import BOUND, reference


def esm_rotary(x, base=10000.0):
    """HF EsmRotaryEmbedding on (..., S, D): float32 angles, cat(freqs, freqs), x cos + rotate_half(x) sin."""
    d, s = x.shape[-1], x.shape[-2]
    inv_freq = (np.float32(1.0) / (np.float32(base) ** (np.arange(0, d, 2).astype(np.float32) / np.float32(d)))).astype(np.float32)
    freqs = np.outer(np.arange(s).astype(np.float32), inv_freq).astype(np.float32)
    emb = np.concatenate([freqs, freqs], -1)
    cos, sin = np.cos(emb).astype(np.float64), np.sin(emb).astype(np.float64)
    x = np.asarray(x, np.float64)
    rot = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + rot * sin


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_rotary_padded(dtype, causal, layout):
    rng = np.random.default_rng()
    b, h, s, d = 2, 3, 150, 64
    q, k, v = (rng.standard_normal((b, h, s, d)).astype(dtype) for _ in range(3))
    scale = d ** -0.5
    ref, _ = reference(esm_rotary(q.astype(np.float64) * scale), esm_rotary(k), v, causal=causal, scale=1.0)
    args = (q, k, v) if layout == "bhsd" else tuple(x.transpose(0, 2, 1, 3).copy() for x in (q, k, v))
    out = flashsci.attention(*args, rotary=True, causal=causal, layout=layout)
    if layout == "bshd":
        out = out.transpose(0, 2, 1, 3)
    assert np.abs(out - ref).max() <= BOUND[dtype]


def test_rotary_custom_base_and_mask():
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((2, 2, 80, 32)).astype(np.float32) for _ in range(3))
    kpm = rng.random((2, 80)) > 0.3
    ref, _ = reference(esm_rotary(q * 0.2, base=500.0), esm_rotary(k, base=500.0), v, scale=1.0, kpm=kpm)
    out = flashsci.attention(q, k, v, scale=0.2, rotary=500.0, key_padding_mask=kpm)
    assert np.abs(out - ref).max() <= BOUND["float32"]


def test_rotary_past_the_angle_table():
    """Above 16M angles (positions x head dim) a call computes each row's angles itself instead of one table: the
    same result. Base 2^64 at D = 128 makes every inv_freq 2^-i exactly, so the float32 angles are exact and the
    reference does not depend on how its float32 power rounds (with base 10000, 20 of 128 frequencies differ by an ulp
    between NumPy's power and C's powf, and at position 66,000 that turns an angle by up to 0.008)."""
    rng = np.random.default_rng()
    base = 2.0 ** 64
    q = rng.standard_normal((1, 1, 4, 128)).astype(np.float32)
    k, v = (rng.standard_normal((1, 1, 132000, 128)).astype(np.float32) for _ in range(2))
    ref, _ = reference(esm_rotary(q * 128 ** -0.5, base=base), esm_rotary(k, base=base), v, scale=1.0)
    out = flashsci.attention(q, k, v, rotary=base)
    assert np.abs(out - ref).max() <= BOUND["float32"]


def test_rotary_varlen_positions_restart():
    rng = np.random.default_rng()
    lens = [13, 1, 90, 40]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    q, k, v = (rng.standard_normal((int(cu[-1]), 2, 32)).astype(np.float32) for _ in range(3))
    out = flashsci.attention_varlen(q, k, v, cu, cu, 90, 90, rotary=True, causal=True)
    for bi in range(4):
        seq = lambda x: x[cu[bi]:cu[bi + 1]].transpose(1, 0, 2)[None]
        ref, _ = reference(esm_rotary(seq(q) * 32 ** -0.5), esm_rotary(seq(k)), seq(v), causal=True, scale=1.0)
        assert np.abs(out[cu[bi]:cu[bi + 1]].transpose(1, 0, 2) - ref[0]).max() <= BOUND["float32"]


def test_rotary_matches_hf_esm():
    torch = pytest.importorskip("torch")
    esm = pytest.importorskip("transformers.models.esm.modeling_esm")
    rng = np.random.default_rng()
    q, k = (rng.standard_normal((1, 4, 200, 64)).astype(np.float32) for _ in range(2))
    tq, tk = torch.from_numpy(q), torch.from_numpy(k)
    if hasattr(esm, "RotaryEmbedding"):  # transformers 4.x: the module rotates q and k itself
        hq, hk = esm.RotaryEmbedding(64)(tq, tk)
    else:  # transformers 5.x: cos/sin from the config-built module, then apply_rotary_pos_emb
        from transformers import EsmConfig
        config = EsmConfig(hidden_size=256, num_attention_heads=4, position_embedding_type="rotary")
        cos, sin = esm.EsmRotaryEmbedding(config)(tq, torch.arange(200)[None])
        hq, hk = esm.apply_rotary_pos_emb(tq, tk, cos, sin)
    assert np.abs(hq.numpy() - esm_rotary(q)).max() < 1e-4
    assert np.abs(hk.numpy() - esm_rotary(k)).max() < 1e-4


def test_rotary_errors():
    q = np.random.default_rng().standard_normal((1, 2, 8, 15)).astype(np.float32)
    with pytest.raises(ValueError, match="rotary needs an even head dim, got 15"):
        flashsci.attention(q, q, q, rotary=True)
    q = q[..., :14].copy()
    with pytest.raises(TypeError, match="rotary must be None, True or a base"):
        flashsci.attention(q, q, q, rotary="esm")
    with pytest.raises(ValueError, match="rotary base must be a finite number above 1"):
        flashsci.attention(q, q, q, rotary=0.5)
    with pytest.raises(ValueError, match="rotary base must be a finite number above 1"):
        flashsci.attention(q, q, q, rotary=10**400)   # too large for a double
