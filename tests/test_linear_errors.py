"""Bad input to linear / swiglu gets a clear TypeError/ValueError naming what was expected and what came."""
import numpy as np
import pytest

import flashsci
from numpy.lib.stride_tricks import as_strided


def xw(m=6, n=8, k=16, dtype=np.float32):
    rng = np.random.default_rng()
    return rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((n, k)).astype(dtype)


def test_in_features_mismatch():
    x, w = xw()
    with pytest.raises(ValueError, match=r"weight has in_features 12 but x has 16 features"):
        flashsci.linear(x, w[:, :12])


def test_weight_rank():
    x, w = xw()
    with pytest.raises(ValueError, match=r"weight must be 2-D \(out_features, in_features\).*got 1-D"):
        flashsci.linear(x, w[0])


def test_mixed_dtypes():
    x, w = xw()
    with pytest.raises(TypeError, match="weight has dtype float64 but x has float32"):
        flashsci.linear(x, w.astype(np.float64))


@pytest.mark.parametrize("dtype", [np.int32, np.complex64, np.bool_])
def test_unsupported_dtype(dtype):
    x, w = xw()
    with pytest.raises(TypeError, match=r"x: dtype .* is not supported"):
        flashsci.linear(x.astype(dtype), w)


def test_bias_shape_and_layout():
    x, w = xw()
    with pytest.raises(ValueError, match=r"bias must have shape \(out_features,\) = \(8,\), got \(7,\)"):
        flashsci.linear(x, w, np.ones(7, np.float32))
    with pytest.raises(ValueError, match="bias must be contiguous, got stride 2"):
        flashsci.linear(x, w, np.ones(16, np.float32)[::2])


def test_activation_names():
    x, w = xw()
    with pytest.raises(ValueError, match=r"activation must be None, 'relu', 'gelu', 'gelu_tanh' or 'silu', got 'swish'"):
        flashsci.linear(x, w, activation="swish")
    with pytest.raises(TypeError, match="activation must be None or a str, got int"):
        flashsci.linear(x, w, activation=1)


def test_out_dtype():
    x, w = xw()
    with pytest.raises(ValueError, match="out_dtype must be float16, bfloat16, float32 or float64, got 'int8'"):
        flashsci.linear(x, w, out_dtype="int8")
    with pytest.raises(TypeError, match="out_dtype must be None, a dtype name"):
        flashsci.linear(x, w, out_dtype=object())
    with pytest.raises(TypeError, match="bfloat16 has no NumPy array type"):
        flashsci.linear(x, w, out_dtype="bfloat16")


def test_rows_that_do_not_collapse():
    rng = np.random.default_rng()
    x = rng.standard_normal((4, 6, 16)).astype(np.float32).transpose(1, 0, 2)
    _, w = xw()
    with pytest.raises(ValueError, match="leading dimensions do not collapse into one row stride"):
        flashsci.linear(x, w)


def test_overlapping_rows():
    x, w = xw()
    rows = as_strided(x, shape=(6, 16), strides=(8 * 4, 4))
    with pytest.raises(ValueError, match="row stride 8 is below its row length 16"):
        flashsci.linear(rows, w)


def test_last_dim_strided():
    x, w = xw(k=32)
    with pytest.raises(ValueError, match=r"x: the last dimension must be contiguous \(stride 1\), got stride 2"):
        flashsci.linear(x[:, ::2], w[:, :16])


def test_zero_size_and_zero_dim():
    x, w = xw()
    assert flashsci.linear(x[:0], w).shape == (0, w.shape[0])     # no rows: an empty result, as torch gives
    with pytest.raises(ValueError, match="at least 1 dimension"):
        flashsci.linear(np.array(1.0, np.float32), w)


def test_out_checks():
    x, w = xw()
    with pytest.raises(ValueError, match=r"out has shape \(6, 7\) but the result has shape \(6, 8\)"):
        flashsci.linear(x, w, out=np.empty((6, 7), np.float32))
    with pytest.raises(TypeError, match="out has dtype float64 but x has float32"):
        flashsci.linear(x, w, out=np.empty((6, 8), np.float64))
    with pytest.raises(TypeError, match="out has dtype float32 but out_dtype is float64"):
        flashsci.linear(x, w, out=np.empty((6, 8), np.float32), out_dtype=np.float64)
    buf = np.zeros(6 * 16 + 64, np.float32)
    xs = buf[:96].reshape(6, 16)
    xs[:] = x
    with pytest.raises(ValueError, match="out overlaps x in memory"):
        flashsci.linear(xs, w, out=buf[40:88].reshape(6, 8))


def test_swiglu_checks():
    x, w = xw()
    with pytest.raises(ValueError, match=r"packed weight needs w_gate of shape \(2 N, K\).*odd row count 7"):
        flashsci.swiglu(x, w[:7])
    with pytest.raises(ValueError, match="w_up has 4 rows but w_gate has 8"):
        flashsci.swiglu(x, w, w[:4])
    with pytest.raises(TypeError, match="unexpected keyword argument 'bias'|'bias' is an invalid keyword"):
        flashsci.swiglu(x, w, bias=np.ones(8, np.float32))


def test_foreign_objects():
    _, w = xw()
    with pytest.raises(TypeError, match="x: "):
        flashsci.linear([[1.0] * 16], w)
    with pytest.raises(TypeError, match="weight: "):
        flashsci.linear(np.ones((2, 16), np.float32), "w")


def test_arguments():
    x, w = xw()
    with pytest.raises(TypeError):
        flashsci.linear(x)
    with pytest.raises(TypeError):
        flashsci.linear(x, w, None, "relu")   # activation is keyword-only
    with pytest.raises(ValueError, match="stream= applies to CUDA inputs"):
        flashsci.linear(x, w, stream=0)
