"""Bad input gets a clear TypeError/ValueError naming what was expected and what came; never a crash."""
import numpy as np
import pytest

import flashsci
from numpy.lib.stride_tricks import as_strided


def qkv(shape=(2, 3, 20, 16), dtype=np.float32):
    rng = np.random.default_rng()
    return [rng.standard_normal(shape).astype(dtype) for _ in range(3)]


def test_mixed_dtypes():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"k has dtype float64 but q has float32"):
        flashsci.attention(q, k.astype(np.float64), v)


@pytest.mark.parametrize("dtype", [np.int32, np.complex64, np.bool_, np.uint8])
def test_unsupported_dtype(dtype):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"q: dtype .* is not supported \(expected float16, bfloat16, float32 or float64\)"):
        flashsci.attention(q.astype(dtype), k, v)


def test_non_native_byte_order():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="byte order"):
        flashsci.attention(q.astype(">f4"), k, v)


@pytest.mark.parametrize("shape", [(20, 16), (3, 20, 16), (1, 2, 3, 20, 16)])
def test_wrong_rank(shape):
    q = np.ones(shape, np.float32) + np.random.rand(*shape).astype(np.float32)
    with pytest.raises(ValueError, match=r"q must be 4-D \(B, H, S, D\) for layout 'bhsd', got \d-D shape"):
        flashsci.attention(q, q, q)


@pytest.mark.parametrize("which,shape,what", [
    ("k", (3, 3, 20, 16), "batch size 3 but q has 2"),
    ("v", (2, 4, 20, 16), "k has head count 3 but v has 4"),
    ("k", (2, 3, 20, 32), "head dim 32 but q has 16"),
])
def test_mismatched_b_h_d(which, shape, what):
    q, k, v = qkv()
    bad = np.random.default_rng().standard_normal(shape).astype(np.float32)
    args = {"k": (q, bad, v), "v": (q, k, bad)}[which]
    with pytest.raises(ValueError, match=what):
        flashsci.attention(*args)


def test_kv_length_mismatch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="k has sequence length 20 but v has 19"):
        flashsci.attention(q, k, v[:, :, :19])


def test_bshd_checks_use_the_layout():
    q, k, v = qkv((2, 20, 3, 16))            # (B, S, H, D)
    flashsci.attention(q, k, v, layout="bshd")
    with pytest.raises(ValueError, match=r"k and v have head count 2 but q has 3: the K/V head count must divide q's"):
        flashsci.attention(q, k[:, :, :2], v[:, :, :2], layout="bshd")


def test_non_contiguous_last_dim():
    q, k, v = qkv((2, 3, 20, 32))
    with pytest.raises(ValueError, match=r"q: the last \(head\) dimension must be contiguous \(stride 1\), got stride 2"):
        flashsci.attention(q[..., ::2], k[..., ::2], v[..., ::2])


def test_head_dim_zero():
    z = np.empty((2, 3, 20, 0), np.float32)
    with pytest.raises(ValueError, match="q has head dim 0; the head dim must be at least 1"):
        flashsci.attention(z, z, z)


def test_sizes_past_2_30():
    base = np.random.default_rng().standard_normal(16).astype(np.float32)
    huge = as_strided(base, shape=(1, 1, 2**30 + 1, 16), strides=(0, 0, 0, 4))
    with pytest.raises(ValueError, match=r"dimension 2 has size 1073741825; flashsci supports sizes up to 2\*\*30"):
        flashsci.attention(huge, huge, huge)


def test_span_past_int64():
    base = np.random.default_rng().standard_normal(16).astype(np.float32)
    wide = as_strided(base, shape=(3, 1, 2, 16), strides=(2**62, 0, 0, 4))
    with pytest.raises(ValueError, match="spans more than 2\\*\\*63 bytes"):
        flashsci.attention(wide, wide, wide)


def test_misaligned_pointer():
    n = 2 * 3 * 20 * 16
    buf = bytearray(4 * n + 1)
    q = np.frombuffer(buf, dtype=np.float32, count=n, offset=1).reshape(2, 3, 20, 16)
    _, k, v = qkv()
    with pytest.raises(ValueError, match="data pointer .* is not 4-byte aligned"):
        flashsci.attention(q, k, v)


def test_stride_not_multiple_of_itemsize():
    base = np.zeros(4000, np.uint8)
    q = as_strided(base.view(np.float32)[:1], shape=(1, 1, 4, 2), strides=(0, 0, 10, 4))
    with pytest.raises(ValueError, match="stride 10 bytes of dimension 2 is not a multiple of the float32 item size"):
        flashsci.attention(q, q, q)


@pytest.mark.parametrize("obj,name", [([[1.0]], "list"), (None, "NoneType"), (object(), "object"), ("abc", "str")])
def test_objects_without_array_protocol(obj, name):
    q, k, v = qkv()
    with pytest.raises(TypeError, match=rf"k: expected an array \(torch.Tensor, numpy.ndarray, or an object with __dlpack__ or __cuda_array_interface__\), got {name}"):
        flashsci.attention(q, obj, v)


def test_broken_dlpack_producer():
    class Liar:
        def __dlpack__(self, **kw):
            return "not a capsule"

        def __dlpack_device__(self):
            return (1, 0)

    q, k, v = qkv()
    with pytest.raises(TypeError, match="__dlpack__\\(\\) returned str, not an unused DLPack capsule"):
        flashsci.attention(Liar(), k, v)


def test_used_capsule_is_refused():
    q, k, v = qkv()
    cap = q.__dlpack__()

    class Reuse:
        def __dlpack__(self, **kw):
            return cap

        def __dlpack_device__(self):
            return (1, 0)

    flashsci.attention(Reuse(), k, v)               # first use consumes (renames) it
    with pytest.raises(TypeError, match="not an unused DLPack capsule"):
        flashsci.attention(Reuse(), k, v)


@pytest.mark.skipif(flashsci.CUDA_BUILT, reason="checks the CPU-only build's message")
def test_cuda_input_in_cpu_only_build():
    class FakeCuda:
        __cuda_array_interface__ = {"shape": (2, 3, 20, 16), "typestr": "<f4", "data": (1 << 20, False), "version": 3}

    q, k, v = qkv()
    with pytest.raises(RuntimeError, match="no CUDA support"):
        flashsci.attention(FakeCuda(), k, v)


def test_bad_cai_dict():
    class BadCAI:
        __cuda_array_interface__ = {"shape": (2, 3, 20, 16), "typestr": "<i4", "data": (1 << 20, False), "version": 3}

    with pytest.raises(TypeError, match="typestr '<i4' is not supported"):
        flashsci.attention(BadCAI(), BadCAI(), BadCAI())


class TestOut:
    def test_wrong_shape(self):
        q, k, v = qkv()
        with pytest.raises(ValueError, match=r"out has shape \(2, 3, 19, 16\) but the result has shape \(2, 3, 20, 16\)"):
            flashsci.attention(q, k, v, out=np.empty((2, 3, 19, 16), np.float32))

    def test_wrong_dtype(self):
        q, k, v = qkv()
        with pytest.raises(TypeError, match="out has dtype float64 but q has float32"):
            flashsci.attention(q, k, v, out=np.empty(q.shape, np.float64))

    def test_read_only(self):
        q, k, v = qkv()
        out = np.empty_like(q)
        out.flags.writeable = False
        with pytest.raises(ValueError, match="out is read-only"):
            flashsci.attention(q, k, v, out=out)

    def test_overlaps_input(self):
        q, k, v = qkv()
        with pytest.raises(ValueError, match="out overlaps v in memory"):
            flashsci.attention(q, k, v, out=v)

    def test_self_overlapping(self):
        q, k, v = qkv()
        base = np.empty(16, np.float32)
        out = as_strided(base, shape=q.shape, strides=(0, 0, 0, 4))
        with pytest.raises(ValueError, match="out has overlapping or negative strides"):
            flashsci.attention(q, k, v, out=out)

    def test_non_contiguous_last_dim(self):
        q, k, v = qkv()
        out = np.empty(q.shape[:3] + (32,), np.float32)[..., ::2]
        # a result array cannot be made contiguous by the caller's copy: the message asks for another array or none
        with pytest.raises(ValueError, match="out: the last dimension must be contiguous .*or none for a new one"):
            flashsci.attention(q, k, v, out=out)

    def test_not_an_array(self):
        q, k, v = qkv()
        with pytest.raises(TypeError, match="out: expected an array"):
            flashsci.attention(q, k, v, out=[1, 2])


def test_layout_string():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"layout must be 'bhsd' \(torch SDPA\) or 'bshd' \(FlashAttention\), got 'bsdh'"):
        flashsci.attention(q, k, v, layout="bsdh")
    with pytest.raises(TypeError, match="layout must be a str"):
        flashsci.attention(q, k, v, layout=3)


def test_arguments():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="takes 3 positional arguments"):
        flashsci.attention(q, k)
    with pytest.raises(TypeError, match="unexpected keyword argument 'is_causal'"):
        flashsci.attention(q, k, v, is_causal=True)
    with pytest.raises(TypeError, match="scale must be a float or None, got str"):
        flashsci.attention(q, k, v, scale="0.1")
    with pytest.raises(ValueError, match="scale must be finite"):
        flashsci.attention(q, k, v, scale=float("nan"))
    with pytest.raises(ValueError, match=r"scale must be finite, got 1000000\d+"):   # too large for a double
        flashsci.attention(q, k, v, scale=10**400)


def test_stream_arguments():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="stream: expected an int CUDA stream handle"):
        flashsci.attention(q, k, v, stream="s")
    with pytest.raises(ValueError, match=r"a CUDA stream handle is a pointer in \[0, 2\*\*63\), got -5"):
        flashsci.attention(q, k, v, stream=-5)
    with pytest.raises(ValueError, match=r"a CUDA stream handle is a pointer in \[0, 2\*\*63\), got 9223372036854775808"):
        flashsci.attention(q, k, v, stream=2**63)
    with pytest.raises(ValueError, match="stream= applies to CUDA inputs"):
        flashsci.attention(q, k, v, stream=0)


def test_cpu_head_dim_limit():
    q, k, v = qkv((1, 1, 4, 513))
    with pytest.raises(ValueError, match="CPU attention supports head dims up to 512, got 513"):
        flashsci.attention(q, k, v)


class TestTorch:
    def test_requires_grad(self):
        torch = pytest.importorskip("torch")
        q = torch.randn(1, 2, 8, 16, requires_grad=True)
        with pytest.raises(ValueError, match="q requires grad, but flashsci.attention records no autograd history: "
                           "use flashsci.torch_ops.attention"):
            flashsci.attention(q, q.detach(), q.detach())
        with torch.no_grad():   # a leaf keeps requires_grad under no_grad; nothing is recorded, so it is accepted
            assert torch.equal(flashsci.attention(q, q, q), flashsci.attention(q.detach(), q.detach(), q.detach()))

    def test_meta_device(self):
        torch = pytest.importorskip("torch")
        q = torch.empty(1, 2, 8, 16, device="meta")
        with pytest.raises(ValueError, match="q: device 'meta' is not supported"):
            flashsci.attention(q, q, q)

    def test_sparse(self):
        torch = pytest.importorskip("torch")
        q = torch.randn(1, 2, 8, 16).to_sparse()
        with pytest.raises(TypeError, match="expected a dense strided torch tensor"):
            flashsci.attention(q, q, q)

    def test_negative_bit(self):
        torch = pytest.importorskip("torch")
        q = torch.randn(1, 2, 8, 16, dtype=torch.complex64).conj().imag   # a lazy negation: memory holds -q
        k = torch.randn(1, 2, 8, 16)
        with pytest.raises(ValueError, match="q: the tensor has torch's negative bit set"):
            flashsci.attention(q, k, k)
        with pytest.raises(ValueError, match="out: the tensor has torch's negative bit set"):
            flashsci.attention(k, k, k, out=torch.empty(1, 2, 8, 16, dtype=torch.complex64).conj().imag)
        ref = torch.nn.functional.scaled_dot_product_attention(q.resolve_neg(), k, k)
        assert (flashsci.attention(q.resolve_neg().contiguous(), k, k) - ref).abs().max().item() < 1e-5

    def test_int_dtype(self):
        torch = pytest.importorskip("torch")
        q = torch.ones(1, 2, 8, 16, dtype=torch.int32)
        with pytest.raises(TypeError, match="q: dtype torch.int32 is not supported"):
            flashsci.attention(q, q, q)
