/* Checks and outputs shared by the attention entry points: sizes, alignment, devices, overlap, and new
 * outputs in the caller's framework. Each check raises a TypeError/ValueError naming what was expected. */
#include "flashsci.h"

#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL flashsci_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <float.h>
#include <math.h>

#include "attention/cpu/attention_cpu.h"

const char *const fs_qkv_names[3] = {"q", "k", "v"};

/* Write 'cpu' or 'cuda:N' into buf. */
const char *fs_device_str(const fs_tensor *t, char *buf, size_t n)
{
    if (t->is_cuda) snprintf(buf, n, "cuda:%d", t->device);
    else snprintf(buf, n, "cpu");
    return buf;
}

/* Write a shape as '(a, b, c)' into buf. */
const char *fs_shape_str(const int64_t *shape, int ndim, char *buf, size_t n)
{
    size_t used = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < n) snprintf(buf + used, n - used, ndim == 1 ? ",)" : ")");
    return buf;
}

/* Byte range [lo, hi) that a tensor's elements span. */
void fs_byte_extent(const fs_tensor *t, uintptr_t *lo, uintptr_t *hi)
{
    int64_t neg = 0, pos = 0;
    if (fs_numel(t) == 0) { /* an empty tensor spans no byte */
        *lo = *hi = (uintptr_t)t->data;
        return;
    }
    for (int i = 0; i < t->ndim; i++) {
        const int64_t span = (t->shape[i] - 1) * t->strides[i];
        if (span < 0) neg += span; else pos += span;
    }
    const int64_t item = (int64_t)fs_dtype_itemsize(t->dtype);
    *lo = (uintptr_t)t->data + (uintptr_t)(neg * item);
    *hi = (uintptr_t)t->data + (uintptr_t)((pos + 1) * item);
}

int64_t fs_numel(const fs_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* Sizes must be at most FS_MAX_DIM per dimension (every tile count of the kernels then fits 32 bits) and the
 * addressed span must fit 64-bit byte offsets. Zero-size dimensions are allowed (empty work). */
int fs_check_sizes(const fs_tensor *t, const char *name)
{
    const int64_t item = (int64_t)fs_dtype_itemsize(t->dtype);
    int64_t span = 0;
    char buf[160];
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || t->shape[i] > FS_MAX_DIM) {
            PyErr_Format(PyExc_ValueError, "%s: dimension %d has size %lld; flashsci supports sizes up to 2**30", name, i,
                         (long long)t->shape[i]);
            return -1;
        }
    }
    if (fs_numel(t) == 0) return 0;
    for (int i = 0; i < t->ndim; i++) {
        const int64_t s = t->strides[i] < 0 ? -t->strides[i] : t->strides[i];
        if (t->strides[i] == INT64_MIN || s > (INT64_MAX / item - span) / t->shape[i]) {
            PyErr_Format(PyExc_ValueError, "%s: shape %s with strides spans more than 2**63 bytes", name,
                         fs_shape_str(t->shape, t->ndim, buf, sizeof buf));
            return -1;
        }
        span += (t->shape[i] - 1) * s;
    }
    return 0;
}

int fs_nbytes(int ndim, const int64_t *shape, fs_dtype dtype, size_t *bytes)
{
    size_t n = fs_dtype_itemsize(dtype);
    char buf[160];
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (shape[i] > 0 && n > (size_t)PY_SSIZE_T_MAX / (size_t)shape[i])) {
            PyErr_Format(PyExc_ValueError, "the result of shape %s needs more than 2**63 bytes",
                         fs_shape_str(shape, ndim, buf, sizeof buf));
            return -1;
        }
        n *= (size_t)shape[i];
    }
    *bytes = n;
    return 0;
}

const char *fs_contiguous_hint(const fs_tensor *t)
{
    return t->source == FS_SRC_TORCH ? "call .contiguous() first"
           : t->source == FS_SRC_NUMPY ? "pass np.ascontiguousarray(...) instead"
                                       : "pass a contiguous copy";
}

/* Pointer and row alignment: element size on the CPU, 16 bytes (vector loads) on CUDA; nothing for empty tensors. */
int fs_check_alignment(const fs_tensor *t, const char *name, int dims_are_rows)
{
    const uintptr_t item = fs_dtype_itemsize(t->dtype), need = t->is_cuda ? 16 : item;
    if (fs_numel(t) == 0) return 0;
    if ((uintptr_t)t->data % need) {
        if (t->is_cuda)
            PyErr_Format(PyExc_ValueError, "%s: data pointer %p is not 16-byte aligned (the CUDA kernels load 16-byte "
                         "vectors)", name, t->data);
        else
            PyErr_Format(PyExc_ValueError, "%s: data pointer %p is not %zu-byte aligned (%s needs %zu-byte alignment)",
                         name, t->data, (size_t)need, fs_dtype_name(t->dtype), (size_t)need);
        return -1;
    }
    for (int i = 0; t->is_cuda && i < dims_are_rows; i++) {
        if ((t->strides[i] * (int64_t)item) % 16 && t->shape[i] > 1) {
            PyErr_Format(PyExc_ValueError, "%s: stride %lld of dimension %d is not a multiple of 16 bytes; the CUDA kernels "
                         "load 16-byte rows (%s)", name, (long long)t->strides[i], i, fs_contiguous_hint(t));
            return -1;
        }
    }
    return 0;
}


/* Device and size checks shared by the optional arrays (masks, lengths, biases). */
int fs_check_aux(const fs_tensor *x, const char *name, const fs_tensor *q)
{
    char b1[32], b2[32];
    if (x->is_cuda != q->is_cuda || x->device != q->device) {
        PyErr_Format(PyExc_ValueError, "%s is on %s but %s is on %s", name, fs_device_str(x, b1, sizeof b1), q->name ? q->name : "q",
                     fs_device_str(q, b2, sizeof b2));
        return -1;
    }
    if (fs_check_sizes(x, name) < 0) return -1;
    return fs_check_alignment(x, name, 0);
}


/* Whether a tensor is C-contiguous (size-1 dimensions may have any stride). */
int fs_is_contiguous(const fs_tensor *t)
{
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect) return 0;
        expect *= t->shape[i];
    }
    return 1;
}

/* A new torch tensor: torch.empty_like(q) when shape and dtype are q's and q is contiguous (the cheapest
 * allocation, 1.3 us against 1.9 for new_empty), else q.new_empty(shape[, dtype=]). */
static PyObject *torch_new(fs_state *st, const fs_tensor *q, int ndim, const int64_t *shape, fs_dtype dtype)
{
    if (dtype == q->dtype && ndim == q->ndim && !memcmp(shape, q->shape, ndim * sizeof *shape) && fs_is_contiguous(q))
        return PyObject_CallOneArg(st->torch_empty_like, q->obj);
    PyObject *size = PyTuple_New(ndim), *obj = NULL, *kwnames = NULL;
    if (!size) return NULL;
    for (int i = 0; i < ndim; i++) PyTuple_SET_ITEM(size, i, PyLong_FromLongLong(shape[i]));
    PyObject *args[3] = {q->obj, size, st->torch_dtype[dtype]};
    if (dtype == q->dtype || (kwnames = PyTuple_Pack(1, st->s_dtype)))
        obj = PyObject_VectorcallMethod(st->s_new_empty, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames);
    Py_DECREF(size);
    Py_XDECREF(kwnames);
    return obj;
}

/* New uninitialised output in q's framework: torch tensor, NumPy array or flashsci.Array. */
PyObject *fs_new_output(fs_state *st, const fs_tensor *q, int ndim, const int64_t *shape, fs_dtype dtype,
                            uintptr_t stream, char **data)
{
    PyObject *obj = NULL;
    size_t bytes;
    if (fs_nbytes(ndim, shape, dtype, &bytes) < 0) return NULL;
    if (q->source == FS_SRC_TORCH) {
        if (!(obj = torch_new(st, q, ndim, shape, dtype))) return NULL;
        if (fs_torch_data_ptr(st, obj, data) < 0) Py_CLEAR(obj);
    } else if (q->source == FS_SRC_NUMPY) {
        npy_intp dims[FS_MAX_NDIM];
        for (int i = 0; i < ndim; i++) dims[i] = (npy_intp)shape[i];
        const int typenum = dtype == FS_F16 ? NPY_HALF : dtype == FS_F32 ? NPY_FLOAT : NPY_DOUBLE;
        if (!(obj = PyArray_SimpleNew(ndim, dims, typenum))) return NULL;
        *data = PyArray_BYTES((PyArrayObject *)obj);
    } else {
        if (!(obj = fs_array_new(st, ndim, shape, dtype, q->is_cuda, q->device, stream))) return NULL;
        *data = fs_array_data(obj);
    }
    return obj;
}


/* A result array: the caller's (given non-NULL: imported as name and checked by fs_check_out against the n inputs)
 * or a new contiguous one like q; described in *t as an imported array would be, a new reference in *obj. */
int fs_output_array(fs_state *st, PyObject *given, const char *name, const fs_tensor *q, int ndim, const int64_t *shape,
                    fs_dtype dtype, fs_tensor *const *inputs, const char *const *names, int n, uintptr_t stream,
                    fs_tensor *t, PyObject **obj)
{
    if (given) {
        if (fs_tensor_import(st, given, name, stream, FS_ROUTE_AUTO, FS_FLOATS, t) < 0 ||
            fs_check_out(t, inputs, names, n, shape, ndim, dtype) < 0)
            return -1;
        *obj = Py_NewRef(given);
        return 0;
    }
    char *data;
    if (!(*obj = fs_new_output(st, q, ndim, shape, dtype, stream, &data))) return -1;
    t->data = data;
    t->name = name;
    t->ndim = ndim;
    t->dtype = dtype;
    t->is_cuda = q->is_cuda;
    t->device = q->device;
    int64_t compact = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t->shape[d] = shape[d];
        t->strides[d] = compact;
        compact *= shape[d];
    }
    return 0;
}

/* out=: shape, dtype, device, writability, layout, alignment and no overlap with the n inputs t (named by
 * names; t[0] names the device and, for the dtype message, the input the result's dtype comes from). */
int fs_check_out(const fs_tensor *o, fs_tensor *const *t, const char *const *names, int n, const int64_t *shape,
                 int ndim, fs_dtype dtype)
{
    char b1[160], b2[160];
    const char *on = o->name ? o->name : "out";
    if (o->ndim != ndim || memcmp(o->shape, shape, ndim * sizeof *shape)) {
        PyErr_Format(PyExc_ValueError, "%s has shape %s but the result has shape %s", on, fs_shape_str(o->shape, o->ndim, b1, sizeof b1),
                     fs_shape_str(shape, ndim, b2, sizeof b2));
        return -1;
    }
    if (o->dtype != dtype) {
        if (dtype == t[0]->dtype)
            PyErr_Format(PyExc_TypeError, "%s has dtype %s but %s has %s", on, fs_dtype_name(o->dtype), names[0], fs_dtype_name(dtype));
        else
            PyErr_Format(PyExc_TypeError, "%s has dtype %s but out_dtype is %s", on, fs_dtype_name(o->dtype), fs_dtype_name(dtype));
        return -1;
    }
    if (o->is_cuda != t[0]->is_cuda || o->device != t[0]->device) {
        PyErr_Format(PyExc_ValueError, "%s is on %s but %s is on %s", on, fs_device_str(o, b1, sizeof b1), names[0],
                     fs_device_str(t[0], b2, sizeof b2));
        return -1;
    }
    if (o->readonly) {
        PyErr_Format(PyExc_ValueError, "%s is read-only", on);
        return -1;
    }
    if (fs_check_sizes(o, on) < 0) return -1;
    if (o->strides[ndim - 1] != 1 && o->shape[ndim - 1] != 1 && fs_numel(o) > 0) {
        PyErr_Format(PyExc_ValueError, "%s: the last dimension must be contiguous (stride 1), got stride %lld; %s", on,
                     (long long)o->strides[ndim - 1], fs_contiguous_hint(o));
        return -1;
    }
    if (fs_numel(o) == 0) return 0;
    /* no element may be written twice: sorted by stride, each dimension must step past the ones inside it */
    int order[FS_MAX_NDIM];
    for (int i = 0; i < ndim; i++) order[i] = i;
    for (int i = 1; i < ndim; i++)
        for (int j = i; j > 0 && o->strides[order[j]] < o->strides[order[j - 1]]; j--) {
            int tmp = order[j]; order[j] = order[j - 1]; order[j - 1] = tmp;
        }
    int64_t inner = 1;
    for (int i = 0; i < ndim; i++) {
        const int d = order[i];
        if (o->shape[d] == 1) continue;
        if (o->strides[d] < inner) {
            PyErr_Format(PyExc_ValueError, "%s has overlapping or negative strides %s; it must not alias itself", on,
                         fs_shape_str(o->strides, ndim, b1, sizeof b1));
            return -1;
        }
        inner = o->strides[d] * o->shape[d];
    }
    if (fs_check_alignment(o, on, ndim - 1) < 0) return -1;
    uintptr_t olo, ohi;
    fs_byte_extent(o, &olo, &ohi);
    for (int i = 0; i < n; i++) {
        uintptr_t lo, hi;
        fs_byte_extent(t[i], &lo, &hi);
        if (lo < ohi && olo < hi) {
            PyErr_Format(PyExc_ValueError, "%s overlaps %s in memory; flashsci cannot write a result over another argument", on, names[i]);
            return -1;
        }
    }
    return 0;
}

/* t5_bias=(table, num_buckets, max_distance, bidirectional). */
int fs_parse_t5(PyObject *t5, fs_t5_args *a)
{
    if (!PyTuple_Check(t5) || PyTuple_GET_SIZE(t5) != 4) {
        PyErr_Format(PyExc_TypeError, "t5_bias must be a tuple (table, num_buckets, max_distance, bidirectional), got %.100s",
                     Py_TYPE(t5)->tp_name);
        return -1;
    }
    a->table = PyTuple_GET_ITEM(t5, 0);
    for (int i = 1; i < 3; i++)
        if (!PyLong_Check(PyTuple_GET_ITEM(t5, i)) || PyBool_Check(PyTuple_GET_ITEM(t5, i))) {
            PyErr_Format(PyExc_TypeError, "t5_bias: %s must be an int, got %.100s", i == 1 ? "num_buckets" : "max_distance",
                         Py_TYPE(PyTuple_GET_ITEM(t5, i))->tp_name);
            return -1;
        }
    int over_nb = 0, over_md = 0;     /* an int past a C long is out of range below, whatever its sign */
    const long nb = PyLong_AsLongAndOverflow(PyTuple_GET_ITEM(t5, 1), &over_nb);
    const long md = PyLong_AsLongAndOverflow(PyTuple_GET_ITEM(t5, 2), &over_md);
    if (PyErr_Occurred()) return -1;
    if ((a->bidirectional = PyObject_IsTrue(PyTuple_GET_ITEM(t5, 3))) < 0) return -1;
    const long max_exact = (a->bidirectional ? nb / 2 : nb) / 2;
    if (over_nb || over_md || nb < 2 || nb > 1 << 16 || max_exact < 1 || md <= max_exact || md > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "t5_bias: need num_buckets in [%d, 65536] and max_distance in (num_buckets%s / 2, "
                     "2**31) (T5 uses 32, 128), got num_buckets=%R, max_distance=%R", a->bidirectional ? 4 : 2,
                     a->bidirectional ? " / 2" : "", PyTuple_GET_ITEM(t5, 1), PyTuple_GET_ITEM(t5, 2));
        return -1;
    }
    a->buckets = (int)nb;
    a->max_distance = (int)md;
    return 0;
}

/* T5 table: float (H, num_buckets). */
int fs_check_t5(const fs_tensor *x, const fs_tensor *q, const fs_t5_args *a, fs_attn_params *out)
{
    char b1[160];
    if (fs_check_aux(x, "t5_bias table", q) < 0) return -1;
    if (x->ndim != 2 || x->shape[0] != out->H || x->shape[1] != a->buckets) {
        PyErr_Format(PyExc_ValueError, "t5_bias table must have shape (H, num_buckets) = (%d, %d), got %s", out->H,
                     a->buckets, fs_shape_str(x->shape, x->ndim, b1, sizeof b1));
        return -1;
    }
    const int64_t lneg = out->Sq - 1 < a->max_distance ? out->Sq - 1 : a->max_distance;
    const int64_t lpos = out->Sk - 1 < a->max_distance ? out->Sk - 1 : a->max_distance;
    if (q->is_cuda && lneg + lpos + 1 > FS_CUDA_T5_MAX) {
        PyErr_Format(PyExc_ValueError, "t5_bias on CUDA covers at most %d relative positions, min(Sq - 1, max_distance) + "
                     "min(Sk - 1, max_distance) + 1; got %lld (Sq=%d, Sk=%d, max_distance=%d)", FS_CUDA_T5_MAX,
                     (long long)(lneg + lpos + 1), out->Sq, out->Sk, a->max_distance);
        return -1;
    }
    out->t5_table = x->data;
    out->t5_sh = x->strides[0];
    out->t5_sn = x->strides[1];
    out->t5_buckets = a->buckets;
    out->t5_max_distance = a->max_distance;
    out->t5_bidirectional = a->bidirectional;
    out->t5_dtype = x->dtype;
    return 0;
}

/* q, k, v of one entry point: rank, grad, one dtype and device, sizes, contiguous last dim, alignment, and a
 * head dim and dtype the device's kernels support. */
int fs_check_qkv(fs_tensor *const t[3], int ndim, const char *layout)
{
    const char *const *names = fs_qkv_names;
    char b1[160], b2[160];
    if (t[0]->ndim == ndim && t[0]->shape[ndim - 1] == 0) {
        PyErr_SetString(PyExc_ValueError, "q has head dim 0; the head dim must be at least 1");
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        if (t[i]->ndim != ndim) {
            PyErr_Format(PyExc_ValueError, "%s must be %d-D %s, got %d-D shape %s", names[i], ndim, layout, t[i]->ndim,
                         fs_shape_str(t[i]->shape, t[i]->ndim, b1, sizeof b1));
            return -1;
        }
        if (t[i]->requires_grad) {
            PyErr_Format(PyExc_ValueError, "%s requires grad, but flashsci.attention records no autograd history: use "
                         "flashsci.torch_ops.attention (differentiable), or call it under torch.no_grad(), or pass "
                         "%s.detach()", names[i], names[i]);
            return -1;
        }
        if (t[i]->dtype != t[0]->dtype) {
            PyErr_Format(PyExc_TypeError, "%s has dtype %s but q has %s: q, k and v must share one dtype", names[i],
                         fs_dtype_name(t[i]->dtype), fs_dtype_name(t[0]->dtype));
            return -1;
        }
        if (t[i]->is_cuda != t[0]->is_cuda || t[i]->device != t[0]->device) {
            PyErr_Format(PyExc_ValueError, "%s is on %s but q is on %s: q, k and v must be on one device", names[i],
                         fs_device_str(t[i], b1, sizeof b1), fs_device_str(t[0], b2, sizeof b2));
            return -1;
        }
        if (fs_check_sizes(t[i], names[i]) < 0) return -1;
        if (t[i]->strides[ndim - 1] != 1 && t[i]->shape[ndim - 1] != 1 && fs_numel(t[i]) > 0) {
            PyErr_Format(PyExc_ValueError, "%s: the last (head) dimension must be contiguous (stride 1), got stride %lld; "
                         "%s", names[i], (long long)t[i]->strides[ndim - 1], fs_contiguous_hint(t[i]));
            return -1;
        }
        if (fs_check_alignment(t[i], names[i], ndim - 1) < 0) return -1;
    }
    const int64_t D = t[0]->shape[ndim - 1];
    if (t[0]->is_cuda) {
        if (t[0]->dtype != FS_F16 && t[0]->dtype != FS_BF16) {
            PyErr_Format(PyExc_TypeError, "CUDA attention supports float16 and bfloat16, got %s", fs_dtype_name(t[0]->dtype));
            return -1;
        }
        if (D % 8 || D > 256) {
            PyErr_Format(PyExc_ValueError, "CUDA attention supports head dims that are multiples of 8 up to 256, got %lld",
                         (long long)D);
            return -1;
        }
    } else if (D > FS_CPU_MAX_D) {
        PyErr_Format(PyExc_ValueError, "CPU attention supports head dims up to %d, got %lld", FS_CPU_MAX_D, (long long)D);
        return -1;
    }
    return 0;
}

/* Head counts (dimension ih): k and v share one, Hkv, which divides q's, Hq (grouped-query attention, FlashAttention's
 * convention: q head h reads K/V head h / (Hq / Hkv)). */
int fs_check_kv_heads(fs_tensor *const t[3], int ih)
{
    const int64_t hq = t[0]->shape[ih], hk = t[1]->shape[ih], hv = t[2]->shape[ih];
    if (hk == 0 && hq != 0) {
        PyErr_Format(PyExc_ValueError, "k and v have no heads but q has %lld", (long long)hq);
        return -1;
    }
    if (hv != hk) {
        PyErr_Format(PyExc_ValueError, "k has head count %lld but v has %lld: k and v must have one head count", (long long)hk,
                     (long long)hv);
        return -1;
    }
    if (hk && hq % hk) {
        PyErr_Format(PyExc_ValueError, "k and v have head count %lld but q has %lld: the K/V head count must divide q's "
                     "(grouped-query attention: q head h reads K/V head h / (Hq / Hkv))", (long long)hk, (long long)hq);
        return -1;
    }
    return 0;
}

/* Query heads per K/V head, for the kernels. K and V broadcast over every head (head stride 0, e.g. torch's expand)
 * count as one head that all query heads share, which the Hopper kernel's TMA maps can address. */
int fs_kv_group(int64_t hq, int64_t hk, int64_t k_sh, int64_t v_sh)
{
    if (hk == 0) return 1;
    return hk == hq && k_sh == 0 && v_sh == 0 ? (int)hq : (int)(hq / hk);
}

int fs_check_scale(double scale, fs_dtype dtype)
{
    /* non-float64 inputs compute in float32, with the scores in log2 units on CUDA: scale log2(e) must be finite there */
    if (dtype != FS_F64 && fabs(scale) * 1.4426950408889634 > FLT_MAX) {
        char msg[256]; /* PyErr_Format has no float conversion */
        snprintf(msg, sizeof msg, "scale %g is not finite in float32, the precision %s inputs are computed in; |scale| "
                 "must be below %g", scale, fs_dtype_name(dtype), FLT_MAX / 1.4426950408889634);
        PyErr_SetString(PyExc_ValueError, msg);
        return -1;
    }
    return 0;
}

int fs_check_keys(int64_t keys, fs_dtype dtype, const char *what)
{
    if (dtype != FS_F64 && keys > FS_MAX_KEYS) {
        PyErr_Format(PyExc_ValueError, "%s = %lld: flashsci accumulates %s attention in float32, exact to rounding for "
                     "rows of at most 2**24 = %d keys; use float64 inputs on the CPU for longer rows", what,
                     (long long)keys, fs_dtype_name(dtype), FS_MAX_KEYS);
        return -1;
    }
    return 0;
}

/* obj as a double; an int too large for one reads as infinity (the callers then refuse it as not finite). */
static int as_double(PyObject *obj, double *x)
{
    *x = PyFloat_AsDouble(obj);
    if (*x != -1.0 || !PyErr_Occurred()) return 0;
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
    PyErr_Clear();
    *x = INFINITY;
    return 0;
}

/* scale=: None (1/sqrt(D)) or a finite real number. */
int fs_parse_scale(PyObject *obj, int *has_scale, double *scale)
{
    if (obj == Py_None) return 0;
    if (!PyNumber_Check(obj) || PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "scale must be a float or None, got %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (as_double(obj, scale) < 0) return -1;
    if (!isfinite(*scale)) {
        PyErr_Format(PyExc_ValueError, "scale must be finite, got %R", obj);
        return -1;
    }
    *has_scale = 1;
    return 0;
}

/* rotary=: None/False (off), True (base 10000, ESM), or a positive base. */
int fs_parse_rotary(PyObject *obj, int *on, float *base)
{
    *on = 0;
    if (obj == Py_None || obj == Py_False) return 0;
    if (obj == Py_True) {
        *on = 1;
        *base = 10000.0f;
        return 0;
    }
    if (!PyNumber_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "rotary must be None, True or a base (float), got %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    double b;
    if (as_double(obj, &b) < 0) return -1;
    if (!isfinite(b) || b <= 1.0) {
        PyErr_Format(PyExc_ValueError, "rotary base must be a finite number above 1, got %R", obj);
        return -1;
    }
    *on = 1;
    *base = (float)b;
    return 0;
}

/* max_seqlen_q=, max_seqlen_k=: an int in [0, 2**30]. */
int fs_parse_max_seqlen(PyObject *obj, const char *name, long long *value)
{
    if (!PyIndex_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %.100s", name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyObject *i = PyNumber_Index(obj);
    if (!i) return -1;
    int overflow = 0;
    *value = PyLong_AsLongLongAndOverflow(i, &overflow);
    Py_DECREF(i);
    if (*value == -1 && PyErr_Occurred()) return -1;
    if (overflow || *value < 0 || *value > FS_MAX_DIM) {
        PyErr_Format(PyExc_ValueError, "%s must be in [0, 2**30], got %R", name, obj);
        return -1;
    }
    return 0;
}

/* Rotary embeddings rotate the two halves of each head vector: the head dim must be even. */
int fs_check_rotary(int on, int64_t D)
{
    if (on && D % 2) {
        PyErr_Format(PyExc_ValueError, "rotary needs an even head dim, got %lld", (long long)D);
        return -1;
    }
    return 0;
}

/* (B, H, S, D) positions of a 4-D tensor's dimensions in the chosen layout. */
void fs_layout_dims(int bshd, int *ib, int *ih, int *is)
{
    *ib = 0;
    *ih = bshd ? 2 : 1;
    *is = bshd ? 1 : 2;
}

/* All q/k/v checks: rank, dtype, device, shapes (K/V heads may serve groups of query heads), strides, sizes,
 * alignment, head dim. */
int fs_check_padded_qkv(int bshd, fs_tensor *const t[3])
{
    static const char *names[3] = {"q", "k", "v"};
    const char *layout = bshd ? "(B, S, H, D) for layout 'bshd'" : "(B, H, S, D) for layout 'bhsd'";
    char b1[160], b2[160];
    int ib, ih, is;
    fs_layout_dims(bshd, &ib, &ih, &is);
    if (fs_check_qkv(t, 4, layout) < 0) return -1;
    static const char *what[2] = {"batch size", "head dim"};
    const int dims[2] = {ib, 3};
    for (int i = 1; i < 3; i++)
        for (int j = 0; j < 2; j++)
            if (t[i]->shape[dims[j]] != t[0]->shape[dims[j]]) {
                PyErr_Format(PyExc_ValueError, "%s has %s %lld but q has %lld (q %s, %s %s, layout '%s')", names[i], what[j],
                             (long long)t[i]->shape[dims[j]], (long long)t[0]->shape[dims[j]],
                             fs_shape_str(t[0]->shape, 4, b1, sizeof b1), names[i], fs_shape_str(t[i]->shape, 4, b2, sizeof b2),
                             bshd ? "bshd" : "bhsd");
                return -1;
            }
    if (fs_check_kv_heads(t, ih) < 0) return -1;
    if (t[1]->shape[is] != t[2]->shape[is]) {
        PyErr_Format(PyExc_ValueError, "k has sequence length %lld but v has %lld: they must match",
                     (long long)t[1]->shape[is], (long long)t[2]->shape[is]);
        return -1;
    }
    if ((int64_t)t[0]->shape[ib] * t[0]->shape[ih] > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "batch x heads = %lld; flashsci supports below 2**31",
                     (long long)(t[0]->shape[ib] * t[0]->shape[ih]));
        return -1;
    }
    return 0;
}

/* key_padding_mask: bool (B or 1, Sk). Fills the kernel's pointer and strides (stride 0 when broadcast). */
int fs_check_kpm(const fs_tensor *m, const fs_tensor *q, const fs_attn_params *p, fs_attn_params *out)
{
    char b1[160];
    if (fs_check_aux(m, "key_padding_mask", q) < 0) return -1;
    if (m->ndim != 2 || (m->shape[0] != p->B && m->shape[0] != 1) || m->shape[1] != p->Sk) {
        PyErr_Format(PyExc_ValueError, "key_padding_mask must have shape (B, Sk) = (%d, %d) (True = keep), got %s", p->B, p->Sk,
                     fs_shape_str(m->shape, m->ndim, b1, sizeof b1));
        return -1;
    }
    out->kpm = (const uint8_t *)m->data;
    out->kpm_sb = m->shape[0] == 1 ? 0 : m->strides[0];
    out->kpm_sk = m->strides[1];
    return 0;
}

/* seqlens: int32 (B,), contiguous, self-attention (Sq == Sk); values checked on the CPU. */
int fs_check_seqlens(const fs_tensor *l, const fs_tensor *q, const fs_attn_params *p, fs_attn_params *out)
{
    char b1[160];
    if (fs_check_aux(l, "seqlens", q) < 0) return -1;
    if (l->ndim != 1 || l->shape[0] != p->B) {
        PyErr_Format(PyExc_ValueError, "seqlens must have shape (B,) = (%d,), got %s", p->B, fs_shape_str(l->shape, l->ndim, b1, sizeof b1));
        return -1;
    }
    if (l->strides[0] != 1 && l->shape[0] != 1) {
        PyErr_Format(PyExc_ValueError, "seqlens must be contiguous, got stride %lld", (long long)l->strides[0]);
        return -1;
    }
    if (p->Sq != p->Sk) {
        PyErr_Format(PyExc_ValueError, "seqlens is for self-attention on a padded batch (Sq == Sk), got Sq=%d, Sk=%d; "
                     "use key_padding_mask or attention_varlen", p->Sq, p->Sk);
        return -1;
    }
    for (int b = 0; !l->is_cuda && b < p->B; b++) {
        const int32_t v = ((const int32_t *)l->data)[b];
        if (v < 0 || v > p->Sq) {
            PyErr_Format(PyExc_ValueError, "seqlens[%d] = %d is outside [0, S] = [0, %d]", b, (int)v, p->Sq);
            return -1;
        }
    }
    out->seqlens = (const int32_t *)l->data;
    return 0;
}

/* bias: float, broadcastable (numpy rules, right-aligned) to (B, H, Sq, Sk) in that order for both layouts. */
int fs_check_bias(const fs_tensor *x, const fs_tensor *q, const fs_attn_params *p, fs_attn_params *out)
{
    char b1[160];
    const int64_t full[4] = {p->B, p->H, p->Sq, p->Sk};
    int64_t st[4] = {0, 0, 0, 0};
    if (fs_check_aux(x, "bias", q) < 0) return -1;
    int ok = x->ndim >= 1 && x->ndim <= 4;
    for (int i = 0; ok && i < x->ndim; i++) {
        const int d = 4 - x->ndim + i;
        ok = x->shape[i] == full[d] || x->shape[i] == 1;
        st[d] = x->shape[i] == 1 ? 0 : x->strides[i];
    }
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "bias of shape %s does not broadcast to (B, H, Sq, Sk) = (%d, %d, %d, %d)",
                     fs_shape_str(x->shape, x->ndim, b1, sizeof b1), p->B, p->H, p->Sq, p->Sk);
        return -1;
    }
    out->bias = x->data;
    out->bias_sb = st[0]; out->bias_sh = st[1]; out->bias_sq = st[2]; out->bias_sk = st[3];
    out->bias_dtype = x->dtype;
    return 0;
}

/* cu_seqlens: int32 (B + 1,), contiguous; on the CPU also 0 first, non-decreasing, total last, and no
 * sequence longer than max_seqlen. */
int fs_check_cu_seqlens(const fs_tensor *c, const char *name, const fs_tensor *q, int64_t total, long long max_seqlen)
{
    char b1[160];
    if (fs_check_aux(c, name, q) < 0) return -1;
    if (c->ndim != 1 || c->shape[0] < 1) {
        PyErr_Format(PyExc_ValueError, "%s must have shape (B + 1,) with B >= 0, got %s", name,
                     fs_shape_str(c->shape, c->ndim, b1, sizeof b1));
        return -1;
    }
    if (c->strides[0] != 1 && c->shape[0] > 1) {
        PyErr_Format(PyExc_ValueError, "%s must be contiguous, got stride %lld", name, (long long)c->strides[0]);
        return -1;
    }
    const int32_t *v = (const int32_t *)c->data;
    for (int64_t b = 0; !c->is_cuda && b < c->shape[0]; b++) {
        if (b == 0 ? v[0] != 0 : v[b] < v[b - 1]) {
            PyErr_Format(PyExc_ValueError, "%s must start at 0 and never decrease, got %s[%lld] = %d", name, name,
                         (long long)b, (int)v[b]);
            return -1;
        }
        if (b > 0 && v[b] - v[b - 1] > max_seqlen) {
            PyErr_Format(PyExc_ValueError, "sequence %lld has %d tokens, more than max_seqlen %lld given for %s",
                         (long long)b - 1, (int)(v[b] - v[b - 1]), max_seqlen, name);
            return -1;
        }
    }
    if (!c->is_cuda && v[c->shape[0] - 1] != total) {
        PyErr_Format(PyExc_ValueError, "%s ends at %d but the packed tensor has %lld tokens", name,
                     (int)v[c->shape[0] - 1], (long long)total);
        return -1;
    }
    return 0;
}
