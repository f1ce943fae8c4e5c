/* Checks and outputs every entry point shares: sizes, byte spans, alignment, contiguity, devices, overlap, given
 * outputs, and new outputs in the caller's framework. Each check raises a TypeError/ValueError naming what was
 * expected. (Attention's own checks: attention_checks.c; option values: options.c.) */
#include "flashsci.h"

#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL flashsci_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

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

int fs_int_in(PyObject *x, long long lo, long long hi, long long *value)
{
    int overflow = 0;
    *value = PyLong_AsLongLongAndOverflow(x, &overflow);
    if (*value == -1 && PyErr_Occurred()) return -1;
    return overflow || *value < lo || *value > hi;
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

/* What a message about a result array's layout suggests (its caller's buffer cannot be copied into shape). */
static const char out_layout_hint[] = "pass an array with that layout, or none for a new one";

/* Pointer and row alignment: element size on the CPU, 16 bytes (vector loads) on CUDA; nothing for empty tensors.
 * hint: what the message on a misaligned row suggests. */
static int check_alignment(const fs_tensor *t, const char *name, int dims_are_rows, const char *hint)
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
                         "load 16-byte rows (%s)", name, (long long)t->strides[i], i, hint);
            return -1;
        }
    }
    return 0;
}

/* An input's pointer and row alignment (check_alignment; the message suggests a contiguous copy). */
int fs_check_alignment(const fs_tensor *t, const char *name, int dims_are_rows)
{
    return check_alignment(t, name, dims_are_rows, fs_contiguous_hint(t));
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
                     (long long)o->strides[ndim - 1], out_layout_hint);
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
    if (check_alignment(o, on, ndim - 1, out_layout_hint) < 0) return -1;
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

