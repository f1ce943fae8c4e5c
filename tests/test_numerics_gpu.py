"""NaN, Inf, empty work and extreme scales on CUDA, both attention kernels (the Hopper one where it takes the problem,
and the portable sm80 one forced), against the float64 reference with torch's math-SDPA semantics
(test_numerics_cpu.torch_math): NaN exactly where it has NaN, -inf where it has -inf, close elsewhere."""
import numpy as np
import pytest

import flashsci
from test_numerics_cpu import torch_math

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@pytest.fixture(params=["auto", "sm80"])
def kernel(request):
    flashsci._flashsci._set_attention_kernel(request.param)
    yield request.param
    flashsci._flashsci._set_attention_kernel("auto")


def check(q, k, v, dtype=torch.float16, **kw):
    """CUDA (out, lse) of float64 inputs cast to dtype against torch_math of the same cast inputs."""
    qt, kt, vt = (torch.tensor(x, device="cuda").to(dtype) for x in (q, k, v))
    ref_o, ref_l = torch_math(*(x.double().cpu().numpy() for x in (qt, kt, vt)), **kw)
    args = dict(kw)
    if "keep" in args:
        args["key_padding_mask"] = torch.tensor(args.pop("keep"), device="cuda")
    out = torch.full_like(qt, 7.0)
    _, lse = flashsci.attention(qt, kt, vt, out=out, return_lse=True, **args)
    for got, ref, name in ((out.double().cpu().numpy(), ref_o, "out"), (lse.double().cpu().numpy(), ref_l, "lse")):
        assert (np.isnan(got) == np.isnan(ref)).all(), f"{name}: NaN pattern differs ({np.isnan(got).sum()} vs {np.isnan(ref).sum()})"
        assert (np.isneginf(got) == np.isneginf(ref)).all(), f"{name}: -inf differs"
        fin = np.isfinite(ref)
        np.testing.assert_allclose(got[fin], ref[fin], rtol=2e-2, atol=2e-2, err_msg=name)


def qkv(shape, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for _ in range(3)]


SHAPES = [(1, 2, 300, 64), (2, 4, 1024, 64), (1, 4, 700, 128), (1, 1, 2048, 64)]   # small, Hopper-sized, D = 128, split


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_nan_rows_and_keys(shape, causal, kernel):
    q, k, v = qkv(shape, sum(shape))
    q[0, 0, 5, 3] = np.nan
    k[0, -1, shape[2] // 2, 0] = np.nan
    v[0, 0, 1, 1] = np.nan
    check(q, k, v, causal=causal)


@pytest.mark.parametrize("shape", SHAPES[:2])
def test_infinities_and_masked_rows(shape, kernel):
    q, k, v = qkv(shape, 3)
    q[0, 0, 2, :] = np.inf
    keep = np.ones((shape[0], shape[2]), bool)
    keep[-1, :] = False                   # a batch with no kept key: zeros, lse -inf
    check(q, k, v, keep=keep)


@pytest.mark.parametrize("scale", [0.0, -1.0, 1e-30, 1e4, -1e4])
def test_extreme_scales(scale, kernel):
    check(*qkv((1, 2, 256, 64), 5), scale=scale)


@pytest.mark.parametrize("shape_q,sk", [((0, 2, 64, 64), 64), ((2, 0, 64, 64), 64), ((2, 2, 0, 64), 64),
                                        ((2, 2, 64, 64), 0), ((1, 3, 1, 128), 0)])
def test_empty_work(shape_q, sk):
    q = torch.randn(shape_q, device="cuda", dtype=torch.float16)
    k = torch.randn(shape_q[0], shape_q[1], sk, shape_q[3], device="cuda", dtype=torch.float16)
    out = torch.full_like(q, float("nan"))
    _, lse = flashsci.attention(q, k, k, out=out, return_lse=True)
    torch.cuda.synchronize()
    assert out.shape == q.shape and lse.shape == q.shape[:3]
    if sk == 0:
        assert (out == 0).all() and torch.isneginf(lse).all()


def test_varlen_with_empty_sequences():
    lens_q, lens_k = [3, 0, 5, 1], [0, 0, 4, 2]
    cq = torch.tensor(np.cumsum([0] + lens_q), dtype=torch.int32, device="cuda")
    ck = torch.tensor(np.cumsum([0] + lens_k), dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lens_q), 2, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(sum(lens_k), 2, 64, device="cuda", dtype=torch.float16)
    out, lse = flashsci.attention_varlen(q, k, k, cq, ck, 5, 4, return_lse=True)
    ref, ref_lse = flashsci.attention_varlen(q.cpu().float(), k.cpu().float(), k.cpu().float(), cq.cpu(), ck.cpu(), 5, 4,
                                             return_lse=True)
    torch.testing.assert_close(out.float().cpu(), ref, atol=2e-3, rtol=2e-3)
    assert torch.isneginf(lse[:, :3]).all()                  # sequence 0 has queries but no keys
    empty = flashsci.attention_varlen(q, k[:0], k[:0], cq, torch.zeros_like(ck), 5, 0)
    assert (empty == 0).all()


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "silu"])
def test_activations_keep_nan(act):
    x = torch.tensor([[float("nan")] + [1.0] * 7, [-2.0] + [0.0] * 7], device="cuda", dtype=torch.float16)
    w = torch.eye(8, device="cuda", dtype=torch.float16)
    y = flashsci.linear(x, w, activation=act)
    assert torch.isnan(y[0, 0]) and torch.isfinite(y[1]).all()
