/* Checks and outputs shared by the attention entry points: sizes, alignment, devices, overlap, and new
 * outputs in the caller's framework. Each check raises a TypeError/ValueError naming what was expected. */
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
    for (int i = 0; i < t->ndim; i++) {
        const int64_t span = (t->shape[i] - 1) * t->strides[i];
        if (span < 0) neg += span; else pos += span;
    }
    const int64_t item = (int64_t)fs_dtype_itemsize(t->dtype);
    *lo = (uintptr_t)t->data + (uintptr_t)(neg * item);
    *hi = (uintptr_t)t->data + (uintptr_t)((pos + 1) * item);
}

/* Sizes must fit 32-bit counts and the addressed span must fit 64-bit byte offsets. */
int fs_check_sizes(const fs_tensor *t, const char *name)
{
    const int64_t item = (int64_t)fs_dtype_itemsize(t->dtype);
    int64_t span = 0;
    for (int i = 0; i < t->ndim; i++) {
        char buf[160];
        if (t->shape[i] == 0) {
            PyErr_Format(PyExc_ValueError, "%s has a zero-size dimension (shape %s); every dimension must be at least 1",
                         name, fs_shape_str(t->shape, t->ndim, buf, sizeof buf));
            return -1;
        }
        if (t->shape[i] < 0 || t->shape[i] > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "%s: dimension %d has size %lld; flashsci supports sizes below 2**31", name, i,
                         (long long)t->shape[i]);
            return -1;
        }
        const int64_t s = t->strides[i] < 0 ? -t->strides[i] : t->strides[i];
        if (s > (INT64_MAX / item - span) / t->shape[i]) {
            PyErr_Format(PyExc_ValueError, "%s: shape %s with strides spans more than 2**63 bytes", name,
                         fs_shape_str(t->shape, t->ndim, buf, sizeof buf));
            return -1;
        }
        span += (t->shape[i] - 1) * s;
    }
    return 0;
}

/* Pointer and row alignment: element size on the CPU, 16 bytes (vector loads) on CUDA. */
int fs_check_alignment(const fs_tensor *t, const char *name, int dims_are_rows)
{
    const uintptr_t item = fs_dtype_itemsize(t->dtype), need = t->is_cuda ? 16 : item;
    if ((uintptr_t)t->data % need) {
        PyErr_Format(PyExc_ValueError, "%s: data pointer %p is not %zu-byte aligned (%s needs %zu-byte alignment)", name,
                     t->data, (size_t)need, t->is_cuda ? "the CUDA kernels' 16-byte loads" : fs_dtype_name(t->dtype), (size_t)need);
        return -1;
    }
    for (int i = 0; t->is_cuda && i < dims_are_rows; i++) {
        if ((t->strides[i] * (int64_t)item) % 16 && t->shape[i] > 1) {
            PyErr_Format(PyExc_ValueError, "%s: stride %lld of dimension %d is not a multiple of 16 bytes; the CUDA kernels "
                         "load 16-byte rows (make the tensor contiguous)", name, (long long)t->strides[i], i);
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
        PyErr_Format(PyExc_ValueError, "%s is on %s but q is on %s", name, fs_device_str(x, b1, sizeof b1), fs_device_str(q, b2, sizeof b2));
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
    if (q->source == FS_SRC_TORCH) {
        if (!(obj = torch_new(st, q, ndim, shape, dtype))) return NULL;
        PyObject *ptr = PyObject_VectorcallMethod(st->s_data_ptr, &obj, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (!ptr || (!(*data = PyLong_AsVoidPtr(ptr)) && PyErr_Occurred())) {
            Py_XDECREF(ptr);
            Py_DECREF(obj);
            return NULL;
        }
        Py_DECREF(ptr);
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

