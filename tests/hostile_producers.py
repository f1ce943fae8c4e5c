"""Hostile array producers for the interop fuzz tests (tests/test_hostile.py runs this file in a child process, so a
crash fails the test instead of ending the test run):

    python tests/hostile_producers.py EXAMPLES SEED

DLPack capsules are built field by field with ctypes (NULL, negative, huge and mismatched fields, wrong capsule
names, deleters written in Python, versioned and legacy), __cuda_array_interface__ dicts are fuzzed the same way
(entries whose __index__ mutates the dict, missing keys, odd types), and NumPy strided views are drawn over one
buffer. Every call must return or raise TypeError, ValueError, BufferError, RuntimeError, OverflowError or
MemoryError with a message; a SystemError, an exception without a message, or a NumPy view whose result differs
from the float64 reference is a failure. Prints one summary line per category and exits 1 on any failure.
"""
import ctypes
import faulthandler
import sys

import numpy as np
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import flashsci

faulthandler.enable()

ALLOWED = (TypeError, ValueError, BufferError, RuntimeError, OverflowError, MemoryError)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


PyCapsule_New = ctypes.pythonapi.PyCapsule_New
PyCapsule_New.restype = ctypes.py_object
PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

BUFFER = np.random.default_rng(0).standard_normal(4096).astype(np.float32)   # every producer's data lives here
deleted = []


def _python_deleter(raises):
    """A deleter in Python (it runs Python code while flashsci may have an exception pending)."""
    def deleter(ptr):
        deleted.append(ptr)
        if raises:
            raise RuntimeError("deleter failed")
    return DELETER(deleter)


class Producer:
    """An object with __dlpack__ / __dlpack_device__ returning a capsule built from the drawn fields."""

    def __init__(self, f):
        self.f, self.keep = f, []

    def __dlpack_device__(self):
        return (self.f["device_type"], self.f["device_id"])

    def __dlpack__(self, stream=None, max_version=None, **kwargs):
        f = self.f
        ndim = f["ndim"]
        shape = (ctypes.c_int64 * max(ndim, 1))(*(f["shape"] + [1] * max(ndim, 1))[:max(ndim, 1)])
        strides = (ctypes.c_int64 * max(ndim, 1))(*(f["strides"] + [1] * max(ndim, 1))[:max(ndim, 1)])
        data = {"null": None, "buffer": BUFFER.ctypes.data, "odd": BUFFER.ctypes.data + 1}[f["data"]]
        t = DLTensor(data, DLDevice(f["device_type"], f["device_id"]), ndim, DLDataType(*f["dtype"]),
                     shape if f["shape_ptr"] else None, strides if f["strides_ptr"] else None, f["byte_offset"])
        deleter = _python_deleter(f["deleter_raises"]) if f["deleter"] else DELETER()
        if f["versioned"]:
            m = DLManagedTensorVersioned(DLPackVersion(f["major"], 0), None, deleter, f["flags"], t)
            name = b"dltensor_versioned"
        else:
            m = DLManagedTensor(t, None, deleter)
            name = b"dltensor"
        self.keep += [shape, strides, deleter, m]
        if f["name"] == "used":           # a capsule someone already consumed
            name = b"used_" + name
        elif f["name"]:
            name = f["name"]
        return PyCapsule_New(ctypes.addressof(m), name, None)


dlpack_fields = st.fixed_dictionaries({
    "device_type": st.sampled_from([1, 1, 1, 2, 3, 13, 99, -1]),
    "device_id": st.sampled_from([0, 0, 1, -5]),
    "ndim": st.sampled_from([-1, 0, 1, 2, 3, 4, 4, 4, 9, 1000]),
    "dtype": st.sampled_from([(2, 32, 1), (2, 32, 1), (2, 16, 1), (4, 16, 1), (2, 64, 1), (0, 32, 1), (2, 32, 4),
                              (2, 0, 1), (6, 8, 1), (5, 64, 1), (200, 32, 1)]),
    "shape": st.lists(st.sampled_from([0, 1, 2, 3, 8, 16, -1, -2**40, 2**31, 2**62, 2**63 - 1]), max_size=6),
    "strides": st.lists(st.sampled_from([0, 1, 2, 16, 64, -1, -16, 2**40, 2**62, -2**63]), max_size=6),
    "shape_ptr": st.booleans(), "strides_ptr": st.booleans(),
    "data": st.sampled_from(["buffer", "buffer", "null", "odd"]),
    "byte_offset": st.sampled_from([0, 0, 4, 1, 2**62, 2**64 - 4]),
    "versioned": st.booleans(), "major": st.sampled_from([1, 1, 0, 2]),
    "flags": st.sampled_from([0, 1, 2, 3]),
    "deleter": st.booleans(), "deleter_raises": st.booleans(),
    "name": st.sampled_from([None, None, None, "used", b"other"]),   # None: the name matching the struct
})


def _check_call(fn, failures, label):
    """Run fn; record a failure for a crash-free but wrong outcome (SystemError, message-less exception)."""
    try:
        fn()
    except ALLOWED as e:
        if not str(e):
            failures.append(f"{label}: {type(e).__name__} without a message")
    except SystemError as e:
        failures.append(f"{label}: SystemError {e}")
    except Exception as e:   # noqa: BLE001 - any other type is a finding too
        failures.append(f"{label}: unexpected {type(e).__name__}: {e}")


def fuzz_dlpack(examples, rng_seed, failures):
    """DLPack producers through _inspect, and as k of attention and x of linear beside arrays of a head dim / in_features
    (5) no drawn shape has: every field is parsed and checked, and no call reads memory a lying producer described."""
    q = np.ones((1, 1, 4, 5), np.float32)
    count = [0]

    @seed(rng_seed)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(dlpack_fields)
    def run(f):
        count[0] += 1
        _check_call(lambda: flashsci._flashsci._inspect(Producer(f)), failures, f"dlpack inspect {f}")
        _check_call(lambda: flashsci.attention(q, Producer(f), q), failures, f"dlpack as k {f}")
        _check_call(lambda: flashsci.linear(Producer(f), np.ones((8, 5), np.float32)), failures, f"dlpack as x {f}")
    run()
    return count[0]


class Index:
    """An int-like whose __index__ can mutate the dict it sits in (the parser must hold its own references)."""

    def __init__(self, value, target=None):
        self.value, self.target = value, target

    def __index__(self):
        if self.target is not None:
            self.target.clear()
            self.target["shape"] = (1,)
        return self.value


cai_fields = st.fixed_dictionaries({
    "shape": st.sampled_from(["tuple", "list", "mutating", "negative", "huge", "missing", "str"]),
    "typestr": st.sampled_from(["<f4", "<f2", "|b1", "<i4", ">f4", "f4", "<c8", 4, None]),
    "data": st.sampled_from(["ptr", "zero", "tuple1", "str", "missing", "negative"]),
    "strides": st.sampled_from([None, "ok", "short", "odd", "str"]),
    "stream": st.sampled_from([None, 0, 1, -1, "x", 2**70]),
    "mask": st.sampled_from([None, None, "x"]),
    "version": st.sampled_from([2, 3, 0, "x"]),
    "raises": st.sampled_from([None, None, None, RuntimeError, AttributeError]),
})


class CAIProducer:
    """An object whose __cuda_array_interface__ is the drawn dict (or raises)."""

    def __init__(self, f):
        self.f = f

    @property
    def __cuda_array_interface__(self):
        f = self.f
        if f["raises"] is not None:
            raise f["raises"]("the producer cannot describe its array")
        d = {}
        shapes = {"tuple": (1, 1, 4, 8), "list": [1, 1, 4, 8], "negative": (1, -1, 4, 8), "huge": (2**62, 1, 4, 8),
                  "str": "1,1,4,8"}
        if f["shape"] == "mutating":
            d["shape"] = (1, 1, Index(4, d), 8)
        elif f["shape"] != "missing":
            d["shape"] = shapes[f["shape"]]
        if f["typestr"] is not None:
            d["typestr"] = f["typestr"]
        datas = {"ptr": (BUFFER.ctypes.data, False), "zero": (0, False), "tuple1": (BUFFER.ctypes.data,),
                 "str": ("x", False), "negative": (-16, False)}
        if f["data"] != "missing":
            d["data"] = datas[f["data"]]
        strides = {"ok": (128, 128, 32, 4), "short": (4,), "odd": (128, 128, 32, 3), "str": "x"}
        if f["strides"] is not None:
            d["strides"] = strides[f["strides"]]
        d["stream"] = f["stream"]
        if f["mask"] is not None:
            d["mask"] = f["mask"]
        d["version"] = f["version"]
        return d


def fuzz_cai(examples, rng_seed, failures):
    """__cuda_array_interface__ producers through flashsci.attention and _inspect."""
    q = np.ones((1, 1, 4, 8), np.float32)
    count = [0]

    @seed(rng_seed)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(cai_fields)
    def run(f):
        count[0] += 1
        _check_call(lambda: flashsci._flashsci._inspect(CAIProducer(f)), failures, f"cai inspect {f}")
        _check_call(lambda: flashsci.attention(CAIProducer(f), q, q), failures, f"cai as q {f}")
        if f["raises"] is RuntimeError:   # the producer's own exception comes back, not "expected an array"
            try:
                flashsci.attention(CAIProducer(f), q, q)
            except RuntimeError as e:
                if "cannot describe" not in str(e):
                    failures.append(f"cai raising property: got {e!r}")
    run()
    return count[0]


def reference(q, k, v):
    """float64 softmax(q k^T / sqrt(D)) v."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


view_fields = st.fixed_dictionaries({
    "shape": st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 9), st.sampled_from([1, 2, 4, 8, 16])),
    "perm": st.permutations([0, 1, 2]),
    "flip": st.tuples(st.booleans(), st.booleans(), st.booleans()),
    "zero_stride": st.sampled_from([None, None, 0, 1, 2]),
    "offset": st.sampled_from([0, 0, 4, 1]),
    "dtype": st.sampled_from(["float32", "float32", "float64", "float16", ">f4"]),
    "readonly": st.booleans(),
    "last_stride": st.sampled_from([1, 1, 1, 2]),
})


def _view(f):
    """A NumPy view over one byte buffer: permuted, flipped, broadcast (zero stride) or misaligned as drawn."""
    b, h, s, d = f["shape"]
    dt = np.dtype(f["dtype"])
    base = np.random.default_rng(sum(f["shape"])).standard_normal((4, 4, 12, 32 * f["last_stride"])).astype(dt)
    if f["offset"]:   # the same values at an address offset bytes past an aligned one
        raw = np.zeros(base.nbytes + 16, np.uint8)
        raw[f["offset"]:f["offset"] + base.nbytes] = base.view(np.uint8).ravel()
        base = raw[f["offset"]:f["offset"] + base.nbytes].view(dt).reshape(base.shape)
    full = base[:b or 1, :h or 1, :s or 1, : d * f["last_stride"]: f["last_stride"]]
    full = full[:b, :h, :s]
    axes = list(f["perm"]) + [3]
    x = full.transpose(axes).transpose(np.argsort(axes))   # same shape, permuted strides
    for ax, fl in enumerate(f["flip"]):
        if fl:
            x = np.flip(x, ax)
    if f["zero_stride"] is not None and x.shape[f["zero_stride"]] > 0:
        ax = f["zero_stride"]
        x = np.broadcast_to(np.take(x, [0], axis=ax), x.shape)
    if f["readonly"] and x.flags.writeable:
        x = x.view()
        x.flags.writeable = False
    return x


def fuzz_numpy(examples, rng_seed, failures):
    """NumPy strided views as q (k, v contiguous): a successful call must match the float64 reference."""
    count = [0]

    @seed(rng_seed)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(view_fields)
    def run(f):
        count[0] += 1
        q = _view(f)
        k = np.random.default_rng(1).standard_normal(q.shape).astype(np.float32)
        try:
            out = flashsci.attention(q, k.astype(q.dtype.newbyteorder("=")), k.astype(q.dtype.newbyteorder("=")))
        except ALLOWED as e:
            if not str(e):
                failures.append(f"numpy {f}: {type(e).__name__} without a message")
            return
        except Exception as e:   # noqa: BLE001
            failures.append(f"numpy {f}: {type(e).__name__}: {e}")
            return
        if out.shape != q.shape:
            failures.append(f"numpy {f}: shape {out.shape} for q {q.shape}")
            return
        if q.size:
            ref = reference(q, k, k)
            tol = 5e-3 if q.dtype == np.float16 else 1e-5
            err = float(np.abs(out.astype(np.float64) - ref).max())
            if not err <= tol:
                failures.append(f"numpy {f}: max error {err} over {tol}")
    run()
    return count[0]


def main(argv):
    examples, rng_seed = int(argv[0]), int(argv[1])
    failures = []
    counts = {"dlpack": fuzz_dlpack(examples, rng_seed, failures), "cuda_array_interface": fuzz_cai(examples, rng_seed, failures),
              "numpy views": fuzz_numpy(examples, rng_seed, failures)}
    for name, n in counts.items():
        print(f"{name}: {n} cases, {sum(f.startswith(name.split()[0][:3]) for f in failures)} failures")
    for f in failures[:20]:
        print("FAIL", f)
    print(f"deleters run: {len(deleted)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
