"""Hostile and extreme inputs: malformed producers, sizes at the limits, empty work, errors that keep their message,
Ctrl-C. No call may crash, return garbage or lose its exception."""
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import flashsci

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hostile_producers as hp  # noqa: E402

FUZZ_EXAMPLES = int(os.environ.get("FLASHSCI_FUZZ_EXAMPLES", "300"))


def test_fuzz_producers_in_a_child_process():
    """Hypothesis-drawn DLPack capsules, __cuda_array_interface__ dicts and NumPy views (FLASHSCI_FUZZ_EXAMPLES of
    each, default 300): 0 crashes, 0 SystemErrors, 0 wrong results."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, os.path.join(HERE, "hostile_producers.py"), str(FUZZ_EXAMPLES), "20261126"],
                       capture_output=True, text=True, env=env, timeout=600)
    summary = [line for line in r.stdout.splitlines() if "cases" in line or line.startswith("FAIL")]
    assert r.returncode == 0, f"exit {r.returncode}\n" + "\n".join(summary) + "\n" + r.stderr[-3000:]
    assert sum(int(line.split(":")[1].split()[0]) for line in summary if "cases" in line) >= 3 * FUZZ_EXAMPLES * 0.9


def _producer(**changes):
    """A DLPack producer describing BUFFER[:32] as a (1, 1, 4, 8) float32 CPU tensor, with fields changed."""
    f = dict(device_type=1, device_id=0, ndim=4, dtype=(2, 32, 1), shape=[1, 1, 4, 8], strides=[32, 32, 8, 1],
             shape_ptr=True, strides_ptr=True, data="buffer", byte_offset=0, versioned=True, major=1, flags=0,
             deleter=True, deleter_raises=False, name=None)
    f.update(changes)
    return hp.Producer(f)


class TestDLPack:
    q = np.ones((1, 1, 4, 8), np.float32)

    def test_a_valid_producer_works(self):
        out = flashsci.attention(self.q, _producer(), _producer())
        assert out.shape == (1, 1, 4, 8)

    def test_null_data_with_elements(self):
        with pytest.raises(ValueError, match="holds elements but its data pointer is NULL"):
            flashsci.attention(self.q, _producer(data="null"), self.q)

    def test_null_data_of_an_empty_tensor_is_fine(self):
        info = flashsci._flashsci._inspect(_producer(data="null", shape=[1, 1, 0, 8]))
        assert info["shape"] == (1, 1, 0, 8)

    def test_null_shape(self):
        with pytest.raises(ValueError, match="has 4 dimensions but a NULL shape"):
            flashsci.attention(self.q, _producer(shape_ptr=False), self.q)

    def test_negative_size(self):
        with pytest.raises(ValueError, match="dimension 2 has a negative size -3"):
            flashsci.attention(self.q, _producer(shape=[1, 1, -3, 8]), self.q)

    @pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
    @pytest.mark.parametrize("raises", [False, True])
    def test_deleter_in_python_keeps_the_error(self, raises):
        """A deleter that runs Python code (and one that raises) while flashsci has an error pending: the error
        flashsci raised is the one the caller sees."""
        with pytest.raises(TypeError, match="dtype int32 is not supported"):
            flashsci.attention(self.q, _producer(dtype=(0, 32, 1), deleter=True, deleter_raises=raises), self.q)

    def test_used_capsule(self):
        with pytest.raises(TypeError, match="not an unused DLPack capsule"):
            flashsci.attention(self.q, _producer(name="used"), self.q)


class TestArrayExport:
    def array(self):
        class Wrap:   # any DLPack producer gets a flashsci.Array back
            def __init__(self, a):
                self.a = a

            def __dlpack__(self, **kw):
                return self.a.__dlpack__()

            def __dlpack_device__(self):
                return self.a.__dlpack_device__()
        q = np.ones((1, 1, 4, 8), np.float32)
        return flashsci.attention(Wrap(q), Wrap(q), Wrap(q))

    @pytest.mark.parametrize("kw", [{"max_version": "ab"}, {"max_version": (1,)}, {"max_version": ("a", "b")},
                                    {"dl_device": "x"}, {"dl_device": (1, "0")}])
    def test_bad_arguments_are_type_errors(self, kw):
        a = self.array()
        assert isinstance(a, flashsci.Array)
        with pytest.raises(TypeError, match="must be a tuple of two ints"):
            a.__dlpack__(**kw)

    def test_bad_values(self):
        a = self.array()
        with pytest.raises(ValueError, match=r"max_version \(9223372036854775808, 0\) is out of range"):
            a.__dlpack__(max_version=(2**63, 0))
        with pytest.raises(TypeError, match="copy must be None or a bool, got str"):
            a.__dlpack__(copy="no")
        assert a.__dlpack__(copy=False) is not None


class TestCudaArrayInterface:
    def test_a_raising_property_keeps_its_exception(self):
        f = dict(shape="tuple", typestr="<f4", data="ptr", strides=None, stream=None, mask=None, version=3,
                 raises=RuntimeError)
        with pytest.raises(RuntimeError, match="cannot describe its array"):
            flashsci.attention(hp.CAIProducer(f), np.ones((1, 1, 4, 8), np.float32), np.ones((1, 1, 4, 8), np.float32))

    def test_index_that_mutates_the_dict(self):
        f = dict(shape="mutating", typestr="<f4", data="ptr", strides=None, stream=1, mask=None, version=3, raises=None)
        try:
            flashsci._flashsci._inspect(hp.CAIProducer(f))
        except (RuntimeError, ValueError) as e:   # no GPU: no driver to ask; a GPU: the pointer is host memory
            assert "CUDA" in str(e)


class TestLimits:
    def test_sizes_near_2_31_are_refused(self):
        base = np.ones(8, np.float32)
        big = as_strided(base, shape=(1, 1, 2**31 - 1, 8), strides=(0, 0, 0, 4))
        k = np.ones((1, 1, 4, 8), np.float32)
        with pytest.raises(ValueError, match=r"supports sizes up to 2\*\*30"):
            flashsci.attention(big, k, k)
        x = as_strided(base, shape=(2**31 - 1, 8), strides=(0, 4))
        with pytest.raises(ValueError, match=r"up to 2\*\*30"):
            flashsci.linear(x, np.ones((8, 8), np.float32))
        q = np.ones((4, 1, 8), np.float32)
        cu = np.array([0, 4], np.int32)
        with pytest.raises(ValueError, match=r"\[0, 2\*\*30\]"):
            flashsci.attention_varlen(q, q, q, cu, cu, 2**31 - 1, 4)

    def test_output_bytes_past_2_63(self):
        """A producer may describe more memory than it has: the output's size is checked before anything is read or
        allocated (2**30 x 2**30 float64 is 2**63 bytes)."""
        big = dict(ndim=2, dtype=(2, 64, 1), shape=[2**30, 8], strides=[8, 1])
        with pytest.raises(ValueError, match=r"needs more than 2\*\*63 bytes"):
            flashsci.linear(_producer(**big), _producer(**big))

    def test_keys_past_2_24_are_refused_and_2_24_is_exact(self):
        one = np.ones(1, np.float32)
        q = np.ones((1, 1, 1, 1), np.float32)
        k = as_strided(np.zeros(1, np.float32), shape=(1, 1, 2**24 + 1, 1), strides=(0, 0, 0, 4))
        with pytest.raises(ValueError, match=r"at most 2\*\*24"):
            flashsci.attention(q, k, k)
        k = as_strided(np.zeros(1, np.float32), shape=(1, 1, 2**24, 1), strides=(0, 0, 0, 4))
        v = as_strided(one, shape=(1, 1, 2**24, 1), strides=(0, 0, 0, 4))
        out, lse = flashsci.attention(q, k, v, return_lse=True)      # uniform attention over 2**24 keys
        assert out[0, 0, 0, 0] == 1.0
        assert abs(lse[0, 0, 0] - 24 * np.log(2)) < 1e-5
        k64 = as_strided(np.zeros(1), shape=(1, 1, 2**24 + 1, 1), strides=(0, 0, 0, 8))
        v64 = as_strided(np.ones(1), shape=(1, 1, 2**24 + 1, 1), strides=(0, 0, 0, 8))
        out = flashsci.attention(q.astype(np.float64), k64, v64)
        assert out[0, 0, 0, 0] == 1.0                                 # float64 accumulates longer rows exactly

    def test_scale_not_finite_in_float32(self):
        q = np.random.default_rng().standard_normal((1, 2, 4, 8)).astype(np.float32)
        with pytest.raises(ValueError, match="not finite in float32"):
            flashsci.attention(q, q, q, scale=1e300)
        assert np.isfinite(flashsci.attention(q.astype(np.float64), q.astype(np.float64), q.astype(np.float64),
                                              scale=1e-300)).all()


class TestEmptyWork:
    rng = np.random.default_rng()

    @pytest.mark.parametrize("shape", [(0, 3, 5, 8), (2, 0, 5, 8), (2, 3, 0, 8)])
    def test_no_query_rows_give_an_empty_result(self, shape):
        q = self.rng.standard_normal(shape).astype(np.float32)
        k = self.rng.standard_normal((shape[0], shape[1], 5, 8)).astype(np.float32)
        out, lse = flashsci.attention(q, k, k, return_lse=True)
        assert out.shape == shape and lse.shape == shape[:3]

    def test_no_keys_give_zeros_and_lse_minus_inf(self):
        q = self.rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
        k = np.empty((2, 3, 0, 8), np.float32)
        out, lse = flashsci.attention(q, k, k, return_lse=True)
        assert (out == 0).all() and np.isneginf(lse).all()

    def test_varlen_without_sequences_or_tokens(self):
        q = np.empty((0, 2, 8), np.float32)
        assert flashsci.attention_varlen(q, q, q, np.zeros(1, np.int32), np.zeros(1, np.int32), 0, 0).shape == (0, 2, 8)
        cu = np.array([0, 0, 0], np.int32)
        assert flashsci.attention_varlen(q, q, q, cu, cu, 0, 0).shape == (0, 2, 8)
        qk = self.rng.standard_normal((3, 2, 8)).astype(np.float32)
        out, lse = flashsci.attention_varlen(qk, q, q, np.array([0, 3], np.int32), np.array([0, 0], np.int32), 3, 0,
                                             return_lse=True)
        assert (out == 0).all() and np.isneginf(lse).all()

    def test_linear_without_rows_or_columns(self):
        x, w = np.ones((0, 8), np.float32), np.ones((16, 8), np.float32)
        assert flashsci.linear(x, w).shape == (0, 16)
        assert flashsci.linear(np.ones((4, 8), np.float32), np.ones((0, 8), np.float32)).shape == (4, 0)
        y = flashsci.linear(np.ones((4, 0), np.float32), np.ones((3, 0), np.float32), np.arange(3, dtype=np.float32),
                            activation="relu")
        np.testing.assert_array_equal(y, np.tile(np.arange(3, dtype=np.float32), (4, 1)))


def test_ctrl_c_stops_a_long_cpu_call():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    q = np.random.default_rng().standard_normal((2, 8, 4096, 64))
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    t0 = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            flashsci.attention(q, q, q)                             # about 10 s on 2 cores
    finally:
        timer.cancel()
    assert time.perf_counter() - t0 < 3.0
    assert flashsci.attention(q[:, :1, :64], q[:, :1, :64], q[:, :1, :64]).shape == (2, 1, 64, 64)


def test_wording_follows_the_framework():
    q = np.ones((2, 3, 4, 16), np.float32)
    with pytest.raises(ValueError, match=r"np\.ascontiguousarray"):
        flashsci.attention(q[..., ::2], q[..., ::2], q[..., ::2])
    with pytest.raises(ValueError, match=r"np\.ascontiguousarray"):
        flashsci.linear(np.ones((4, 16), np.float32)[:, ::2], np.ones((8, 8), np.float32))


@pytest.mark.skipif(not flashsci.CUDA_BUILT or flashsci.cuda_device_count() > 0,
                    reason="needs a CUDA build on a machine without a CUDA driver or GPU")
def test_no_driver_message():
    with pytest.raises(RuntimeError, match="no CUDA driver or GPU was found"):
        flashsci.device_info(0)


def test_device_index_arguments():
    """A device index that is not an int, or does not fit one, is refused before any CUDA call (2**32 once read as
    device 0)."""
    with pytest.raises(TypeError, match="device_info: device must be an int, got str"):
        flashsci.device_info("0")
    with pytest.raises(TypeError, match="device must be an int, got bool"):
        flashsci.device_info(True)
    for bad in (2**32, 2**64, -2**63 - 1, np.int64(2**40)):
        with pytest.raises(ValueError, match=f"CUDA device {bad} is out of range"):
            flashsci.device_info(bad)
