"""Zero-copy interop: NumPy, DLPack producers (versioned and legacy capsules), flashsci.Array outputs,
torch and JAX CPU arrays where installed, refcounts and leaks."""
import gc
import sys

import numpy as np
import pytest

import flashsci
from conftest import reference_attention
from flashsci import _flashsci


class DLPackOnly:
    """A foreign array that speaks only DLPack (as JAX or CuPy do), wrapping a NumPy array."""

    def __init__(self, a, legacy=False):
        self.a, self.legacy, self.calls = a, legacy, []

    def __dlpack__(self, stream=None, max_version=None, **kw):
        self.calls[:] = [(stream, max_version)]
        if self.legacy:
            if max_version is not None:
                raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
            return self.a.__dlpack__()
        return self.a.__dlpack__(max_version=max_version)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def qkv(shape=(2, 3, 45, 32), dtype=np.float32):
    rng = np.random.default_rng()
    return [rng.standard_normal(shape).astype(dtype) for _ in range(3)]


def test_numpy_in_numpy_out():
    q, k, v = qkv()
    out = flashsci.attention(q, k, v)
    assert type(out) is np.ndarray and out.dtype == np.float32 and out.shape == q.shape


@pytest.mark.parametrize("legacy", [False, True])
def test_dlpack_producer_gives_array_output(legacy):
    q, k, v = qkv()
    wq, wk, wv = (DLPackOnly(x, legacy) for x in (q, k, v))
    out = flashsci.attention(wq, wk, wv)
    assert isinstance(out, flashsci.Array)
    assert out.shape == q.shape and out.dtype == "float32" and out.device == "cpu"
    ref, _ = reference_attention(q, k, v)
    got = np.from_dlpack(out)                       # zero-copy import by a consumer
    assert np.abs(got - ref).max() < 2e-5
    assert np.shares_memory(got, np.asarray(out))   # __array_interface__ points at the same memory
    assert wq.calls[-1][0] is None                   # CPU: no stream is named
    if not legacy:
        assert wq.calls[-1][1] == (1, 0)


def test_inspect_reads_dlpack_fields():
    base = np.random.default_rng().standard_normal((4, 5, 6, 8)).astype(np.float16)
    view = base[1:, ::2, 3:, :]
    info = _flashsci._inspect(DLPackOnly(view), "dlpack")
    assert info["shape"] == view.shape
    assert info["strides"] == tuple(s // 2 for s in view.strides)
    assert info["data"] == view.ctypes.data
    assert info["dtype"] == "float16" and info["device"] == "cpu" and info["source"] == "dlpack"
    assert _flashsci._inspect(view)["source"] == "numpy"


def test_dlpack_capsules_are_released():
    """Consumed capsules are renamed and their deleters called: the producer's array is freed."""
    q, k, v = qkv()
    before = sys.getrefcount(q)
    wq = DLPackOnly(q)
    for _ in range(200):
        flashsci.attention(wq, k, v)
    del wq
    gc.collect()
    assert sys.getrefcount(q) == before


def test_array_dlpack_export_and_unconsumed_capsule():
    q, k, v = qkv()
    out = flashsci.attention(DLPackOnly(q), DLPackOnly(k), DLPackOnly(v))
    base = sys.getrefcount(out)
    caps = [out.__dlpack__(), out.__dlpack__(max_version=(1, 0))]
    assert sys.getrefcount(out) == base + 2        # each capsule keeps the array alive
    del caps                                        # never consumed: the destructors call the deleters
    assert sys.getrefcount(out) == base
    assert out.__dlpack_device__() == (1, 0)
    with pytest.raises(AttributeError):
        out.__cuda_array_interface__
    with pytest.raises(BufferError):
        out.__dlpack__(copy=True)
    assert "flashsci.Array" in repr(out)
    with pytest.raises(TypeError):
        flashsci.Array()


def test_array_input_round_trip():
    """A flashsci.Array can be fed back in (it is a DLPack producer)."""
    q, k, v = qkv()
    o1 = flashsci.attention(DLPackOnly(q), DLPackOnly(k), DLPackOnly(v))
    o2 = flashsci.attention(o1, o1, o1)
    ref, _ = reference_attention(np.asarray(o1), np.asarray(o1), np.asarray(o1))
    assert np.abs(np.from_dlpack(o2) - ref).max() < 2e-5


def _rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_no_leak_over_many_calls():
    q, k, v = qkv((1, 2, 16, 16))
    out = np.empty_like(q)
    wrapped = [DLPackOnly(x) for x in (q, k, v)]
    refs = [sys.getrefcount(x) for x in (q, k, v, out)]
    for _ in range(3000):
        flashsci.attention(q, k, v)
        flashsci.attention(*wrapped)
        flashsci.attention(q, k, v, out=out, return_lse=True)
    gc.collect()
    start = _rss_kib()
    for _ in range(30000):
        flashsci.attention(q, k, v)
        flashsci.attention(*wrapped)
        flashsci.attention(q, k, v, out=out, return_lse=True)
    gc.collect()
    assert _rss_kib() - start < 2048, "resident memory grew by over 2 MiB in 90k calls"
    assert [sys.getrefcount(x) for x in (q, k, v, out)] == refs


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_backward_calls_do_not_leak():
    """The backwards and the linear layers' gradients, and their error paths (out of range, wrong shape, overlap),
    keep resident memory and every argument's reference count flat."""
    rng = np.random.default_rng()
    q, k, v = qkv((1, 2, 16, 16))
    o, lse = flashsci.attention(q, k, v, return_lse=True)
    cu, p = np.array([0, 7, 16], np.int32), q[0].transpose(1, 0, 2).copy()
    po, plse = flashsci.attention_varlen(p, p, p, cu, cu, 9, 9, return_lse=True)
    x, w = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((32, 16)).astype(np.float32)
    h, hs = np.empty((8, 32), np.float32), np.empty((8, 32), np.float32)
    y, ys = flashsci.linear(x, w, activation="gelu", preactivation=h), flashsci.swiglu(x, w, preactivation=hs)
    bad = (lambda: flashsci.attention_backward(o, q, k, v, o, lse[..., :3]),
           lambda: flashsci.attention_varlen_backward(po, p, p, p, po, plse, cu, cu, 2**63, 9),
           lambda: flashsci.linear_backward(y, x, w, preactivation=h[:3], activation="gelu"),
           lambda: flashsci.swiglu_backward(ys, x, w[:5], preactivation=hs),
           lambda: flashsci.attention_backward(o, q, k, v, o, lse, dq=q))

    def calls(n):
        for _ in range(n):
            flashsci.attention_backward(o, q, k, v, o, lse)
            flashsci.attention_varlen_backward(po, p, p, p, po, plse, cu, cu, 9, 9)
            flashsci.linear_backward(y, x, w, preactivation=h, activation="gelu", bias_grad=True)
            flashsci.swiglu_backward(ys, x, w, preactivation=hs)
            for call in bad:
                with pytest.raises((TypeError, ValueError)):
                    call()
    arrays = (q, k, v, o, lse, cu, p, po, plse, x, w, h, hs, y, ys)
    refs = [sys.getrefcount(a) for a in arrays]
    calls(1000)
    gc.collect()
    start = _rss_kib()
    calls(10000)
    gc.collect()
    assert _rss_kib() - start < 2048, "resident memory grew by over 2 MiB in 10k rounds of backward calls"
    assert [sys.getrefcount(a) for a in arrays] == refs


def test_errors_do_not_leak_capsules():
    q, k, v = qkv()
    before = sys.getrefcount(q)
    bad = np.random.default_rng().standard_normal((2, 3, 45, 16)).astype(np.float32)
    w = DLPackOnly(q)
    for _ in range(100):
        with pytest.raises(ValueError):
            flashsci.attention(w, k, bad)
    del w
    gc.collect()
    assert sys.getrefcount(q) == before


def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.randn(2, 3, 50, 64, dtype=torch.float32) for _ in range(3))
    out = flashsci.attention(q, k, v, causal=True)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert (out.double() - ref).abs().max().item() < 2e-5
    o, lse = flashsci.attention(q, k, v, return_lse=True)
    assert isinstance(lse, torch.Tensor) and lse.dtype == torch.float32 and lse.shape == (2, 3, 50)
    for dt in (torch.float16, torch.bfloat16):
        o = flashsci.attention(q.to(dt), k.to(dt), v.to(dt))
        assert o.dtype == dt
        full = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
        assert (o.double() - full).abs().max() < 2e-2


def test_torch_c_exchange_route_reads_what_attributes_read():
    torch = pytest.importorskip("torch")
    has_api = type(getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)).__name__ == "PyCapsule"
    base = torch.randn(4, 6, 10, 16)
    tensors = [base, base[1:, ::2, 3:], base.transpose(1, 2), base[:, :1].expand(4, 6, 10, 16), base.to(torch.bfloat16),
               base.half()[..., ::2], base > 0, base.to(torch.int64)[0], torch.empty(0, 3), base[0, 0, 0, 0]]
    for t in tensors:
        fast, attrs = _flashsci._inspect(t), _flashsci._inspect(t, "torch_attrs")
        assert fast.pop("c_exchange") is has_api and attrs.pop("c_exchange") is False
        assert fast == attrs
        assert fast["data"] == t.data_ptr() and fast["shape"] == tuple(t.shape) and fast["strides"] == t.stride()


def test_torch_subclasses_take_the_attribute_route():
    torch = pytest.importorskip("torch")

    class Sub(torch.Tensor):
        pass

    q, k, v = (torch.randn(1, 2, 9, 16).as_subclass(Sub) for _ in range(3))
    assert _flashsci._inspect(q)["c_exchange"] is False
    ref = torch.nn.functional.scaled_dot_product_attention(*(x.as_subclass(torch.Tensor).double() for x in (q, k, v)))
    assert (flashsci.attention(q, k, v).double() - ref).abs().max().item() < 2e-5


def test_torch_calls_keep_refcounts():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.randn(1, 2, 9, 16) for _ in range(3))
    before = [sys.getrefcount(x) for x in (q, k, v)]
    for _ in range(200):
        flashsci.attention(q, k, v)
        with pytest.raises(TypeError):
            flashsci.attention(q, k, v.to(torch.int32))
    gc.collect()
    assert [sys.getrefcount(x) for x in (q, k, v)] == before


def test_jax_cpu_arrays():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    q, k, v = qkv((1, 2, 33, 32))
    out = flashsci.attention(*(jax.device_put(x, jax.devices("cpu")[0]) for x in (q, k, v)))
    assert isinstance(out, flashsci.Array)
    got = jnp.from_dlpack(out)
    ref, _ = reference_attention(q, k, v)
    assert np.abs(np.asarray(got) - ref).max() < 2e-5
