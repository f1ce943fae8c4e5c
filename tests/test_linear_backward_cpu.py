"""CPU linear_backward / swiglu_backward (kernels/gemm/cpu: the transposed products and the elementwise passes)
against float64 NumPy gradients: every activation, SwiGLU packed and separate, tails, strided rows, given outputs, no
rows; the forward's preactivation=; fresh random data each test."""
import math

import numpy as np
import pytest

import flashsci
from test_linear_cpu import ACTS, activate, rand, tol

ERF = np.vectorize(math.erf)


def activate_grad(h, act):
    """d act / dh in float64, as torch differentiates each activation."""
    if act == "relu":
        return (h > 0).astype(np.float64)
    if act == "gelu":
        return 0.5 * (1.0 + ERF(h / math.sqrt(2.0))) + h * np.exp(-0.5 * h * h) / math.sqrt(2.0 * math.pi)
    if act == "gelu_tanh":
        k, c = math.sqrt(2.0 / math.pi), 0.044715
        t = np.tanh(k * (h + c * h ** 3))
        return 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * k * (1.0 + 3.0 * c * h * h)
    if act == "silu":
        s = 1.0 / (1.0 + np.exp(-h))
        return s * (1.0 + h * (1.0 - s))
    return np.ones_like(h)


def reference_linear_grads(dy, x, w, h, act):
    """(dx, dw, db) in float64 for y = act(x w^T + b), h the pre-activation."""
    dy, x, w, h = (np.asarray(a, np.float64) for a in (dy, x, w, h))
    dh = dy * activate_grad(h, act)
    dh2, x2 = dh.reshape(-1, dh.shape[-1]), x.reshape(-1, x.shape[-1])
    return dh @ w, dh2.T @ x2, dh2.sum(0)


def reference_swiglu_grads(dy, x, wg, wu):
    """(dx, dwg, dwu) in float64 for y = silu(x wg^T) (x wu^T)."""
    dy, x, wg, wu = (np.asarray(a, np.float64) for a in (dy, x, wg, wu))
    g, u = x @ wg.T, x @ wu.T
    dg, du = dy * u * activate_grad(g, "silu"), dy * activate(g, "silu")
    x2, dg2, du2 = (a.reshape(-1, a.shape[-1]) for a in (x, dg, du))
    return dg @ wg + du @ wu, dg2.T @ x2, du2.T @ x2


def close(got, ref, dtype, scale_from):
    """Within a few roundings of dtype at the reference's magnitude (inputs rounded, float64 sums)."""
    bound = tol(dtype, scale_from, roundings=8)
    err = float(np.abs(np.asarray(got, np.float64) - ref).max()) if np.size(ref) else 0.0
    assert err <= bound, (err, bound)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("mnk", [(1, 8, 8), (37, 24, 40), (130, 72, 264), (5, 1, 3)], ids=str)
def test_linear_backward(mnk, dtype, act):
    m, n, k = mnk
    rng = np.random.default_rng()
    x, w, b = rand(rng, (m, k), dtype), rand(rng, (n, k), dtype) / math.sqrt(k), rand(rng, (n,), dtype)
    h = np.full((m, n), np.nan, dtype)  # poisoned: the forward must fill it
    y = flashsci.linear(x, w, b, activation=act, preactivation=h)
    ref_h = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T + b
    close(h, ref_h, dtype, ref_h)
    close(y, activate(np.asarray(h, np.float64), act), dtype, ref_h)
    dy = rand(rng, (m, n), dtype)
    dx, dw, db = flashsci.linear_backward(dy, x, w, preactivation=h, activation=act, bias_grad=True)
    rdx, rdw, rdb = reference_linear_grads(dy, x, w, h, act)
    assert dx.shape == x.shape and dw.shape == w.shape and db.shape == (n,)
    assert dx.dtype == dw.dtype == db.dtype == dtype
    # each gradient is a sum of products: bound by the sum of magnitudes
    dh = np.abs(np.asarray(dy, np.float64) * activate_grad(np.asarray(h, np.float64), act))
    close(dx, rdx, dtype, dh @ np.abs(np.asarray(w, np.float64)))
    close(dw, rdw, dtype, dh.T @ np.abs(np.asarray(x, np.float64)))
    close(db, rdb, dtype, dh.sum(0))


def test_linear_backward_without_bias_or_activation():
    rng = np.random.default_rng()
    x, w, dy = rand(rng, (3, 6, 16), np.float64), rand(rng, (24, 16), np.float64), rand(rng, (3, 6, 24), np.float64)
    dx, dw, db = flashsci.linear_backward(dy, x, w)
    assert db is None
    np.testing.assert_allclose(dx, dy @ w, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dw, dy.reshape(-1, 24).T @ x.reshape(-1, 16), rtol=1e-12, atol=1e-12)


def test_linear_backward_strided_and_given_outputs():
    rng = np.random.default_rng()
    big_x, big_dy, big_h = rand(rng, (20, 48), np.float64), rand(rng, (20, 40), np.float64), rand(rng, (20, 40), np.float64)
    x, dy, h = big_x[::2, :32], big_dy[::2, :24], big_h[::2, :24]  # rows 96 / 80 elements apart
    w = rand(rng, (24, 32), np.float64)
    dx, dw, db = np.full((10, 32), np.nan), np.full((24, 32), np.nan), np.full(24, np.nan, np.float32)
    r = flashsci.linear_backward(dy, x, w, preactivation=h, activation="silu", bias_grad=True, dx=dx, dweight=dw, dbias=db)
    assert r[0] is dx and r[1] is dw and r[2] is db
    rdx, rdw, rdb = reference_linear_grads(dy, x, w, h, "silu")
    np.testing.assert_allclose(dx, rdx, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dw, rdw, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(db, rdb, rtol=1e-5, atol=1e-5)  # float32 dbias


def test_linear_backward_no_rows():
    x, w, dy, h = np.empty((0, 16)), np.ones((8, 16)), np.empty((0, 8)), np.empty((0, 8))
    dx, dw, db = flashsci.linear_backward(dy, x, w, preactivation=h, activation="gelu", bias_grad=True)
    assert dx.shape == (0, 16) and not dw.any() and not db.any()


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("mnk", [(1, 8, 8), (37, 24, 40), (70, 300, 72)], ids=str)
def test_swiglu_backward(mnk, dtype, packed):
    m, n, k = mnk
    rng = np.random.default_rng()
    x = rand(rng, (m, k), dtype)
    wg, wu = rand(rng, (n, k), dtype) / math.sqrt(k), rand(rng, (n, k), dtype) / math.sqrt(k)
    h = np.full((m, 2 * n), np.nan, dtype)
    args = (np.concatenate([wg, wu]),) if packed else (wg, wu)
    y = flashsci.swiglu(x, *args, preactivation=h)
    x64 = np.asarray(x, np.float64)
    ref_h = np.concatenate([x64 @ np.asarray(wg, np.float64).T, x64 @ np.asarray(wu, np.float64).T], axis=1)
    close(h, ref_h, dtype, ref_h)
    h64 = np.asarray(h, np.float64)
    close(y, activate(h64[:, :n], "silu") * h64[:, n:], dtype, ref_h * ref_h)
    dy = rand(rng, (m, n), dtype)
    grads = flashsci.swiglu_backward(dy, x, *args, preactivation=h)
    # the reference from the pre-activation the forward kept (the kernels' input), in float64
    g, u, d = h64[:, :n], h64[:, n:], np.asarray(dy, np.float64)
    dg, du = d * u * activate_grad(g, "silu"), d * activate(g, "silu")
    wg64, wu64 = np.asarray(wg, np.float64), np.asarray(wu, np.float64)
    rdx, rdwg, rdwu = dg @ wg64 + du @ wu64, dg.T @ x64, du.T @ x64
    mag = np.abs(dg) @ np.abs(wg64) + np.abs(du) @ np.abs(wu64)
    close(grads[0], rdx, dtype, mag)
    if packed:
        assert len(grads) == 2 and grads[1].shape == (2 * n, k)
        close(grads[1], np.concatenate([rdwg, rdwu]), dtype, np.concatenate([np.abs(dg), np.abs(du)], 1).T @ np.abs(x64))
    else:
        assert len(grads) == 3 and grads[1].shape == grads[2].shape == (n, k)
        close(grads[1], rdwg, dtype, np.abs(dg).T @ np.abs(x64))
        close(grads[2], rdwu, dtype, np.abs(du).T @ np.abs(x64))


def test_swiglu_backward_matches_reference_from_inputs():
    rng = np.random.default_rng()
    x, wg, wu = rand(rng, (2, 9, 40), np.float64), rand(rng, (24, 40), np.float64), rand(rng, (24, 40), np.float64)
    h = np.empty((2, 9, 48))
    y = flashsci.swiglu(x, wg, wu, preactivation=h)
    dy = rand(rng, y.shape, np.float64)
    for got, ref in zip(flashsci.swiglu_backward(dy, x, wg, wu, preactivation=h), reference_swiglu_grads(dy, x, wg, wu)):
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)


def test_backward_errors():
    x, w, dy, h = np.ones((4, 16)), np.ones((8, 16)), np.ones((4, 8)), np.ones((4, 8))
    with pytest.raises(ValueError, match="preactivation= is required with an activation"):
        flashsci.linear_backward(dy, x, w, activation="gelu")
    with pytest.raises(ValueError, match=r"dy has shape \(4, 7\) but must be \(4, 8\)"):
        flashsci.linear_backward(np.ones((4, 7)), x, w)
    with pytest.raises(TypeError, match="dy has dtype float32 but x has float64"):
        flashsci.linear_backward(dy.astype(np.float32), x, w)
    with pytest.raises(ValueError, match="preactivation has shape"):
        flashsci.linear_backward(dy, x, w, preactivation=np.ones((4, 9)), activation="relu")
    with pytest.raises(ValueError, match="bias_grad is False"):
        flashsci.linear_backward(dy, x, w, dbias=np.ones(8))
    with pytest.raises(ValueError, match="activation must be None"):
        flashsci.linear_backward(dy, x, w, preactivation=h, activation="tanh")
    with pytest.raises(ValueError, match=r"dweight has shape \(8, 15\) but the result has shape \(8, 16\)"):
        flashsci.linear_backward(dy, x, w, dweight=np.ones((8, 15)))
    with pytest.raises(TypeError, match="dx has dtype float32 but x has float64"):
        flashsci.linear_backward(dy, x, w, dx=np.ones((4, 16), np.float32))
    with pytest.raises(ValueError, match=r"preactivation= is required \(the gate and up projections\)"):
        flashsci.swiglu_backward(np.ones((4, 4)), x, w)
    with pytest.raises(ValueError, match="dw_up= given but the weight is packed"):
        flashsci.swiglu_backward(np.ones((4, 4)), x, w, preactivation=h, dw_up=np.ones((4, 16)))
    with pytest.raises(ValueError, match="preactivation= needs the output in x's dtype"):
        flashsci.linear(x, w, out_dtype="float32", preactivation=h)


def test_relu_backward_from_the_output():
    """relu's derivative from y instead of h: the same gradients (y > 0 exactly where h > 0)."""
    rng = np.random.default_rng()
    x, w, b = rand(rng, (33, 40), np.float64), rand(rng, (24, 40), np.float64), rand(rng, (24,), np.float64)
    h = np.empty((33, 24))
    y = flashsci.linear(x, w, b, activation="relu", preactivation=h)
    dy = rand(rng, y.shape, np.float64)
    for a, c in zip(flashsci.linear_backward(dy, x, w, preactivation=h, activation="relu", bias_grad=True),
                    flashsci.linear_backward(dy, x, w, preactivation=y, activation="relu", bias_grad=True)):
        np.testing.assert_array_equal(a, c)


def test_given_gradients_must_not_overlap():
    x, w, dy = np.ones((4, 16)), np.ones((16, 16)), np.ones((4, 16))
    buf = np.zeros((16, 16))
    with pytest.raises(ValueError, match="overlaps x"):
        flashsci.linear_backward(dy, x, w, dx=x)
    with pytest.raises(ValueError, match="overlaps dx"):
        flashsci.linear_backward(dy, x, w, dx=buf[:4], dweight=buf)


@pytest.mark.parametrize("fn", ["linear", "swiglu", "linear_backward", "swiglu_backward"])
def test_docstring_examples(fn):
    """The examples in the functions' docstrings run and print what they show."""
    import doctest
    f = getattr(flashsci, fn)
    runner = doctest.DocTestRunner()
    runner.run(doctest.DocTestParser().get_doctest(f.__doc__, {}, fn, None, 0))
    assert runner.summarize(verbose=False).attempted > 0 and runner.summarize(verbose=False).failed == 0


def test_no_output_features():
    dx, dw, db = flashsci.linear_backward(np.ones((4, 0)), np.ones((4, 8)), np.ones((0, 8)), bias_grad=True,
                                          dx=np.full((4, 8), np.nan))
    assert not dx.any() and dw.shape == (0, 8) and db.shape == (0,)
