/* Tensor interop: read data pointer, dtype, shape, strides and device from NumPy arrays, torch tensors
 * (DLPack C exchange table where torch has one, else attributes; no capsule either way), any __dlpack__ producer
 * (versioned and legacy capsules) and any __cuda_array_interface__ v2/v3 producer, without copying. */
#include "flashsci.h"

#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL flashsci_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

/* The allowed dtypes as "float16, bfloat16, float32 or float64", for error messages. */
static const char *expected_list(unsigned allowed, char *buf, size_t n)
{
    int count = 0, seen = 0;
    for (int i = 0; i < FS_NUM_DTYPES; i++) count += (allowed >> i) & 1;
    buf[0] = 0;
    for (int i = 0; i < FS_NUM_DTYPES; i++) {
        if (!((allowed >> i) & 1)) continue;
        size_t used = strlen(buf);
        snprintf(buf + used, n - used, "%s%s", seen == 0 ? "" : seen == count - 1 ? " or " : ", ", fs_dtype_name((fs_dtype)i));
        seen++;
    }
    return buf;
}

/* Keep torch.Tensor's DLPack C exchange table (torch >= 2.10) when it is version 1.2 or later (or links to one) and
 * can read tensors and name the current stream; older torch keeps the attribute route. */
static void torch_c_api(fs_state *st, PyObject *tensor_type)
{
    PyObject *capsule = PyObject_GetAttr(tensor_type, st->s_c_exchange_api);
    const DLPackExchangeAPIHeader *h = capsule && PyCapsule_IsValid(capsule, "dlpack_exchange_api")
                                           ? PyCapsule_GetPointer(capsule, "dlpack_exchange_api") : NULL;
    while (h && !(h->version.major == FS_DLPACK_MAJOR && h->version.minor >= FS_DLPACK_EXCHANGE_MINOR)) h = h->prev_api;
    const DLPackExchangeAPI *api = (const DLPackExchangeAPI *)h;
    PyErr_Clear();
    if (api && api->dltensor_from_py_object_no_sync && api->current_work_stream) {
        Py_XSETREF(st->torch_c_api, capsule);
        st->torch_api = api;
        return;
    }
    Py_XDECREF(capsule);
}

/* Cache torch.Tensor, its dtypes, the raw-stream getter and the C exchange table once the user has imported torch. */
int fs_torch_refresh(fs_state *st)
{
    static const char *dtype_names[FS_NUM_DTYPES] = {"float16", "bfloat16", "float32", "float64", "bool", "int32", "int64"};
    if (st->torch_tensor_type) return 0;
    PyObject *modules = PyImport_GetModuleDict(); /* borrowed */
    PyObject *torch = PyDict_GetItemString(modules, "torch");
    if (!torch) return 0;
    PyObject *tensor = PyObject_GetAttrString(torch, "Tensor");
    if (!tensor || !PyType_Check(tensor)) goto partial; /* torch is still importing: try next call */
    for (int i = 0; i < FS_NUM_DTYPES; i++) {
        Py_XSETREF(st->torch_dtype[i], PyObject_GetAttrString(torch, dtype_names[i]));
        if (!st->torch_dtype[i]) goto partial;
    }
    Py_XSETREF(st->torch_empty_like, PyObject_GetAttrString(torch, "empty_like"));
    if (!st->torch_empty_like) goto partial;
    Py_XSETREF(st->torch_grad_enabled, PyObject_GetAttrString(torch, "is_grad_enabled"));
    if (!st->torch_grad_enabled) goto partial;
    PyObject *c = PyObject_GetAttrString(torch, "_C");
    if (c) {
        st->torch_current_stream = PyObject_GetAttrString(c, "_cuda_getCurrentRawStream");
        Py_DECREF(c);
    }
    PyErr_Clear(); /* CPU-only torch has no raw-stream getter */
    torch_c_api(st, tensor);
    st->torch_tensor_type = tensor;
    return 0;
partial:
    Py_XDECREF(tensor);
    PyErr_Clear();
    return 0;
}

/* Name of a DLPack dtype for error messages. */
static void dl_dtype_name(DLDataType dt, char *buf, size_t n)
{
    static const char *codes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
    const char *code = dt.code < 7 ? codes[dt.code] : "code";
    if (dt.lanes != 1) snprintf(buf, n, "%s%u x%u", code, dt.bits, dt.lanes);
    else snprintf(buf, n, "%s%u", code, dt.bits);
}

/* Convert byte strides to element strides, refusing strides that are not whole elements. */
static int strides_from_bytes(fs_tensor *t, const char *name, const int64_t *bytes)
{
    const int64_t item = (int64_t)fs_dtype_itemsize(t->dtype);
    for (int i = 0; i < t->ndim; i++) {
        if (bytes[i] % item) {
            PyErr_Format(PyExc_ValueError, "%s: stride %lld bytes of dimension %d is not a multiple of the %s item size (%lld bytes)",
                         name, (long long)bytes[i], i, fs_dtype_name(t->dtype), (long long)item);
            return -1;
        }
        t->strides[i] = bytes[i] / item;
    }
    return 0;
}

/* Check the number of dimensions fits FS_MAX_NDIM. */
static int check_ndim(const char *name, int64_t ndim)
{
    if (ndim < 0 || ndim > FS_MAX_NDIM) {
        PyErr_Format(PyExc_ValueError, "%s: %lld dimensions is more than flashsci handles (at most %d)", name,
                     (long long)ndim, FS_MAX_NDIM);
        return -1;
    }
    return 0;
}

/* NumPy route: read the array's fields directly. */
static int import_numpy(PyObject *obj, const char *name, unsigned allowed, fs_tensor *t)
{
    PyArrayObject *a = (PyArrayObject *)obj;
    const char kind = PyArray_DESCR(a)->kind;
    const npy_intp size = PyArray_ITEMSIZE(a);
    t->dtype = FS_NUM_DTYPES;
    if (kind == 'f') t->dtype = size == 2 ? FS_F16 : size == 4 ? FS_F32 : size == 8 ? FS_F64 : FS_NUM_DTYPES;
    else if (kind == 'b' && size == 1) t->dtype = FS_BOOL;
    else if (kind == 'i') t->dtype = size == 4 ? FS_I32 : size == 8 ? FS_I64 : FS_NUM_DTYPES;
    if (t->dtype == FS_NUM_DTYPES || !((allowed >> t->dtype) & 1)) {
        char buf[96];
        PyErr_Format(PyExc_TypeError, "%s: dtype %S is not supported (expected %s)", name, (PyObject *)PyArray_DESCR(a),
                     expected_list(allowed, buf, sizeof buf));
        return -1;
    }
    if (PyArray_ISBYTESWAPPED(a)) {
        PyErr_Format(PyExc_TypeError, "%s: dtype %S has non-native byte order", name, (PyObject *)PyArray_DESCR(a));
        return -1;
    }
    if (check_ndim(name, PyArray_NDIM(a)) < 0) return -1;
    t->source = FS_SRC_NUMPY;
    t->ndim = PyArray_NDIM(a);
    t->data = PyArray_BYTES(a);
    t->readonly = !PyArray_ISWRITEABLE(a);
    int64_t bytes[FS_MAX_NDIM];
    for (int i = 0; i < t->ndim; i++) {
        t->shape[i] = PyArray_DIM(a, i);
        bytes[i] = PyArray_STRIDE(a, i);
    }
    return strides_from_bytes(t, name, bytes);
}

/* Read a tuple of Python ints into out[] (sizes: none negative); returns its length or -1. */
static int read_int_tuple(PyObject *tup, const char *name, const char *what, int64_t *out, int sizes)
{
    if (!PyTuple_Check(tup)) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a tuple, got %.100s", name, what, Py_TYPE(tup)->tp_name);
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(tup);
    if (check_ndim(name, n) < 0) return -1;
    Py_INCREF(tup); /* an item's __index__ may run Python code */
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(tup, i));
        if (out[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(tup);
            return -1;
        }
        if (out[i] < 0 && sizes) {
            PyErr_Format(PyExc_ValueError, "%s: %s has a negative size %lld", name, what, (long long)out[i]);
            Py_DECREF(tup);
            return -1;
        }
    }
    Py_DECREF(tup);
    return (int)n;
}

/* Call obj.method() with no arguments. */
static PyObject *call_method0(PyObject *obj, PyObject *method)
{
    PyObject *args[1] = {obj};
    return PyObject_VectorcallMethod(method, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* requires_grad (while autograd records: under torch.no_grad() it does not matter), and the negative bit torch sets
 * on lazy negations (x.conj().imag, torch._neg_view): their memory holds the values' negatives, so they are refused,
 * as torch's own __dlpack__ refuses them. */
static int torch_flags(fs_state *st, PyObject *obj, const char *name, fs_tensor *t)
{
    PyObject *flag = PyObject_GetAttr(obj, st->s_requires_grad);
    if (!flag) return -1;
    t->requires_grad = flag == Py_True;
    Py_DECREF(flag);
    if (t->requires_grad && st->torch_grad_enabled) {
        if (!(flag = PyObject_CallNoArgs(st->torch_grad_enabled))) return -1;
        t->requires_grad = flag == Py_True;
        Py_DECREF(flag);
    }
    if (!(flag = call_method0(obj, st->s_is_neg))) return -1;
    const int neg = flag == Py_True;
    Py_DECREF(flag);
    if (neg) {
        PyErr_Format(PyExc_ValueError, "%s: the tensor has torch's negative bit set (a lazy negation such as "
                     "x.conj().imag, whose memory holds the negated values); call .resolve_neg() first", name);
        return -1;
    }
    return 0;
}

/* torch attribute route (torch without the C table, subclasses, and the precise errors): dtype, device, shape, stride()
 * and data_ptr() attributes, then torch_flags (no capsule). */
static int import_torch(fs_state *st, PyObject *obj, const char *name, unsigned allowed, fs_tensor *t)
{
    PyObject *dtype = NULL, *flag = NULL, *shape = NULL, *strides = NULL, *ptr = NULL;
    int rc = -1;
    if (!(dtype = PyObject_GetAttr(obj, st->s_dtype))) goto done;
    t->dtype = FS_NUM_DTYPES;
    for (int i = 0; i < FS_NUM_DTYPES; i++)
        if (dtype == st->torch_dtype[i]) t->dtype = (fs_dtype)i;
    if (t->dtype == FS_NUM_DTYPES || !((allowed >> t->dtype) & 1)) {
        char buf[96];
        PyErr_Format(PyExc_TypeError, "%s: dtype %S is not supported (expected %s)", name, dtype,
                     expected_list(allowed, buf, sizeof buf));
        goto done;
    }
    if (!(flag = PyObject_GetAttr(obj, st->s_is_cuda))) goto done;
    t->is_cuda = flag == Py_True;
    Py_CLEAR(flag);
    if (t->is_cuda) {
        if (!(flag = call_method0(obj, st->s_get_device))) goto done;
        t->device = (int)PyLong_AsLong(flag);
        if (t->device < 0 && PyErr_Occurred()) goto done;
    } else {
        if (!(flag = PyObject_GetAttr(obj, st->s_is_cpu))) goto done;
        if (flag != Py_True) {
            PyObject *dev = PyObject_GetAttr(obj, st->s_device);
            if (dev) PyErr_Format(PyExc_ValueError, "%s: device '%S' is not supported (expected cpu or cuda)", name, dev);
            Py_XDECREF(dev);
            goto done;
        }
    }
    Py_CLEAR(flag);
    if (torch_flags(st, obj, name, t) < 0) goto done;
    if (!(shape = PyObject_GetAttr(obj, st->s_shape))) goto done;
    if ((t->ndim = read_int_tuple(shape, name, "shape", t->shape, 1)) < 0) goto done;
    if (!(strides = call_method0(obj, st->s_stride)) || !(ptr = call_method0(obj, st->s_data_ptr))) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_Format(PyExc_TypeError, "%s: expected a dense strided torch tensor (%S)", name, value ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        goto done;
    }
    if (read_int_tuple(strides, name, "stride()", t->strides, 0) < 0) goto done;
    t->data = (char *)PyLong_AsVoidPtr(ptr);
    if (!t->data && PyErr_Occurred()) goto done;
    t->source = FS_SRC_TORCH;
    rc = 0;
done:
    Py_XDECREF(dtype);
    Py_XDECREF(flag);
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    Py_XDECREF(ptr);
    return rc;
}

/* flashsci's dtype for a DLPack dtype, FS_NUM_DTYPES when it has none. */
static fs_dtype dl_dtype(DLDataType dt)
{
    if (dt.lanes != 1) return FS_NUM_DTYPES;
    if (dt.code == kDLFloat) return dt.bits == 16 ? FS_F16 : dt.bits == 32 ? FS_F32 : dt.bits == 64 ? FS_F64 : FS_NUM_DTYPES;
    if (dt.code == kDLBfloat && dt.bits == 16) return FS_BF16;
    if (dt.code == kDLBool && dt.bits == 8) return FS_BOOL;
    if (dt.code == kDLInt) return dt.bits == 32 ? FS_I32 : dt.bits == 64 ? FS_I64 : FS_NUM_DTYPES;
    return FS_NUM_DTYPES;
}

/* Whether a DLTensor's fields can be read: a shape array where ndim > 0, no negative extent, and data where the
 * tensor holds an element (a producer may hand over NULL for empty tensors). */
static int dl_readable(const DLTensor *d)
{
    if (d->ndim > 0 && !d->shape) return 0;
    int64_t numel = 1;
    for (int i = 0; i < d->ndim; i++) {
        if (d->shape[i] < 0) return 0;
        numel = d->shape[i] == 0 ? 0 : numel;
    }
    return d->data || numel == 0;
}

/* Fill t from a DLTensor; 0, or -1 with no exception set when its device, dtype, rank or fields are not ones
 * flashsci takes. */
static int dl_fill(const DLTensor *d, unsigned allowed, fs_tensor *t)
{
    if (d->device.device_type != kDLCPU && d->device.device_type != kDLCUDA) return -1;
    t->is_cuda = d->device.device_type == kDLCUDA;
    t->device = t->is_cuda ? d->device.device_id : 0;
    t->dtype = dl_dtype(d->dtype);
    if (t->dtype == FS_NUM_DTYPES || !((allowed >> t->dtype) & 1) || d->ndim < 0 || d->ndim > FS_MAX_NDIM) return -1;
    if (!dl_readable(d)) return -1;
    t->ndim = d->ndim;
    int64_t compact = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->shape[i] = d->shape[i];
        t->strides[i] = d->strides ? d->strides[i] : compact;
        compact *= d->shape[i];
    }
    t->data = (char *)d->data + d->byte_offset;
    return 0;
}

/* Fill t from a DLTensor, naming the device, dtype or rank that does not fit. */
static int from_dltensor(const DLTensor *d, const char *name, unsigned allowed, fs_tensor *t)
{
    if (dl_fill(d, allowed, t) == 0) return 0;
    if (d->device.device_type != kDLCPU && d->device.device_type != kDLCUDA) {
        PyErr_Format(PyExc_ValueError, "%s: DLPack device type %d is not supported (expected CPU=1 or CUDA=2)", name,
                     (int)d->device.device_type);
        return -1;
    }
    if (t->dtype == FS_NUM_DTYPES || !((allowed >> t->dtype) & 1)) {
        char buf[48], list[96];
        dl_dtype_name(d->dtype, buf, sizeof buf);
        PyErr_Format(PyExc_TypeError, "%s: dtype %s is not supported (expected %s)", name, buf,
                     expected_list(allowed, list, sizeof list));
        return -1;
    }
    if (check_ndim(name, d->ndim) < 0) return -1;
    if (d->ndim > 0 && !d->shape) {
        PyErr_Format(PyExc_ValueError, "%s: the DLPack tensor has %d dimensions but a NULL shape", name, (int)d->ndim);
        return -1;
    }
    for (int i = 0; i < d->ndim; i++)
        if (d->shape[i] < 0) {
            PyErr_Format(PyExc_ValueError, "%s: the DLPack tensor's dimension %d has a negative size %lld", name, i,
                         (long long)d->shape[i]);
            return -1;
        }
    PyErr_Format(PyExc_ValueError, "%s: the DLPack tensor holds elements but its data pointer is NULL", name);
    return -1;
}

/* torch route with two Python calls (0.3 us per tensor where the attributes take 0.7, benchmarks/host_overhead.py):
 * the DLPack C exchange table fills a DLTensor, then torch_flags. Only for plain torch.Tensor objects (subclasses may
 * override attributes). Returns 1 with no exception set when the tensor is one the attribute route must look at (it
 * names what is wrong). */
static int import_torch_c(fs_state *st, PyObject *obj, const char *name, unsigned allowed, fs_tensor *t)
{
    DLTensor d;
    if (Py_TYPE(obj) != (PyTypeObject *)st->torch_tensor_type || !st->torch_api) return 1;
    if (st->torch_api->dltensor_from_py_object_no_sync(obj, &d) < 0) {
        PyErr_Clear(); /* sparse, meta, ...: the attribute route raises the precise error */
        return 1;
    }
    if (dl_fill(&d, allowed, t) < 0) return 1;
    if (torch_flags(st, obj, name, t) < 0) return -1;
    t->source = FS_SRC_TORCH;
    t->c_exchange = 1;
    return 0;
}

/* DLPack route: __dlpack_device__, then __dlpack__(stream=..., max_version=(1, 0)), legacy fallback. */
static int import_dlpack(fs_state *st, PyObject *obj, const char *name, uintptr_t stream, unsigned allowed, fs_tensor *t)
{
    PyObject *dev = NULL, *cap = NULL, *kwvals[2] = {NULL, NULL}, *kwnames = NULL;
    int rc = -1;
    if (!(dev = call_method0(obj, st->s_dlpack_device))) goto done;
    long dev_type;
    if (!PyTuple_Check(dev) || PyTuple_GET_SIZE(dev) != 2 ||
        ((dev_type = PyLong_AsLong(PyTuple_GET_ITEM(dev, 0))) == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: __dlpack_device__() must return (device_type, device_id), got %R", name, dev);
        goto done;
    }
    /* CUDA consumers name their stream: 1 is the legacy default stream (0 is not allowed by the spec) */
    kwvals[0] = dev_type == kDLCUDA ? PyLong_FromUnsignedLongLong(stream ? (unsigned long long)stream : 1ULL)
                                    : Py_NewRef(Py_None);
    kwvals[1] = Py_BuildValue("(ii)", FS_DLPACK_MAJOR, FS_DLPACK_MINOR);
    kwnames = PyTuple_Pack(2, st->s_stream, st->s_max_version);
    if (!kwvals[0] || !kwvals[1] || !kwnames) goto done;
    PyObject *args[3] = {obj, kwvals[0], kwvals[1]};
    cap = PyObject_VectorcallMethod(st->s_dlpack, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames);
    if (!cap && PyErr_ExceptionMatches(PyExc_TypeError)) { /* a pre-1.0 producer: no max_version */
        PyErr_Clear();
        Py_SETREF(kwnames, PyTuple_Pack(1, st->s_stream));
        if (!kwnames) goto done;
        cap = PyObject_VectorcallMethod(st->s_dlpack, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames);
    }
    if (!cap) goto done;
    const DLTensor *d;
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        t->dlv = (DLManagedTensorVersioned *)PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (PyCapsule_SetName(cap, "used_dltensor_versioned") < 0) { t->dlv = NULL; goto done; }
        if (t->dlv->version.major != FS_DLPACK_MAJOR) {
            PyErr_Format(PyExc_TypeError, "%s: DLPack version %u.%u is not supported (expected 1.x)", name,
                         t->dlv->version.major, t->dlv->version.minor);
            goto done;
        }
        t->readonly = (t->dlv->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
        d = &t->dlv->dl_tensor;
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        t->dl = (DLManagedTensor *)PyCapsule_GetPointer(cap, "dltensor");
        if (PyCapsule_SetName(cap, "used_dltensor") < 0) { t->dl = NULL; goto done; }
        d = &t->dl->dl_tensor;
    } else {
        PyErr_Format(PyExc_TypeError, "%s: __dlpack__() returned %.100s, not an unused DLPack capsule", name,
                     Py_TYPE(cap)->tp_name);
        goto done;
    }
    t->source = FS_SRC_DLPACK;
    rc = from_dltensor(d, name, allowed, t);
done:
    if (rc < 0) fs_tensor_release(t);
    Py_XDECREF(dev);
    Py_XDECREF(cap);
    Py_XDECREF(kwvals[0]);
    Py_XDECREF(kwvals[1]);
    Py_XDECREF(kwnames);
    return rc;
}

/* Map a __cuda_array_interface__ typestr to an allowed dtype. */
static int cai_dtype(PyObject *typestr, const char *name, unsigned allowed, fs_dtype *dt)
{
    static const char *codes[FS_NUM_DTYPES] = {"f2", NULL, "f4", "f8", "b1", "i4", "i8"};
    const char *s = PyUnicode_Check(typestr) ? PyUnicode_AsUTF8(typestr) : NULL;
    *dt = FS_NUM_DTYPES;
    for (int i = 0; s && strlen(s) == 3 && i < FS_NUM_DTYPES; i++)
        if (codes[i] && strchr("<=|", s[0]) && !strcmp(s + 1, codes[i])) *dt = (fs_dtype)i;
    if (*dt == FS_NUM_DTYPES || !((allowed >> *dt) & 1)) {
        char list[96];
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: __cuda_array_interface__ typestr %R is not supported (expected %s)", name,
                     typestr, expected_list(allowed, list, sizeof list));
        return -1;
    }
    return 0;
}

/* __cuda_array_interface__ route (v2/v3): shape, typestr, data, strides, mask and the v3 stream key. */
static int import_cai(fs_state *st, PyObject *obj, const char *name, unsigned allowed, fs_tensor *t)
{
    PyObject *d = PyObject_GetAttr(obj, st->s_cai), *shape = NULL, *typestr = NULL, *data = NULL, *strides = NULL,
             *mask = NULL, *stream = NULL;
    int rc = -1;
    if (!d) return -1;
    if (!PyDict_Check(d)) {
        PyErr_Format(PyExc_TypeError, "%s: __cuda_array_interface__ must be a dict, got %.100s", name, Py_TYPE(d)->tp_name);
        goto done;
    }
    /* new references: reading an entry can call back into Python (__index__), which may change the dict */
    shape = Py_XNewRef(PyDict_GetItemString(d, "shape"));
    typestr = Py_XNewRef(PyDict_GetItemString(d, "typestr"));
    data = Py_XNewRef(PyDict_GetItemString(d, "data"));
    strides = Py_XNewRef(PyDict_GetItemString(d, "strides"));
    mask = Py_XNewRef(PyDict_GetItemString(d, "mask"));
    stream = Py_XNewRef(PyDict_GetItemString(d, "stream"));
    if (!shape || !typestr || !data || !PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2) {
        PyErr_Format(PyExc_TypeError, "%s: __cuda_array_interface__ needs 'shape', 'typestr' and 'data' (ptr, readonly)", name);
        goto done;
    }
    if (mask && mask != Py_None) {
        PyErr_Format(PyExc_ValueError, "%s: masked arrays (__cuda_array_interface__ 'mask') are not supported", name);
        goto done;
    }
    if (cai_dtype(typestr, name, allowed, &t->dtype) < 0) goto done;
    if ((t->ndim = read_int_tuple(shape, name, "__cuda_array_interface__ shape", t->shape, 1)) < 0) goto done;
    t->data = (char *)PyLong_AsVoidPtr(PyTuple_GET_ITEM(data, 0));
    if (!t->data && PyErr_Occurred()) goto done;
    t->readonly = PyObject_IsTrue(PyTuple_GET_ITEM(data, 1)) == 1;
    int64_t bytes[FS_MAX_NDIM];
    if (strides && strides != Py_None) {
        if (read_int_tuple(strides, name, "__cuda_array_interface__ strides", bytes, 0) != t->ndim) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s: __cuda_array_interface__ strides and shape differ in length", name);
            goto done;
        }
        if (strides_from_bytes(t, name, bytes) < 0) goto done;
    } else {
        int64_t compact = 1;
        for (int i = t->ndim - 1; i >= 0; i--) { t->strides[i] = compact; compact *= t->shape[i]; }
    }
    if (stream && stream != Py_None) {
        t->stream = (uintptr_t)PyLong_AsUnsignedLongLong(stream);
        if (PyErr_Occurred()) goto done;
        if (t->stream == 0) {
            PyErr_Format(PyExc_ValueError, "%s: __cuda_array_interface__ stream 0 is disallowed by the protocol (use 1 for the legacy default stream)", name);
            goto done;
        }
        t->has_stream = 1;
    }
    t->is_cuda = 1;
    t->source = FS_SRC_CAI;
    if (!t->data) {
        for (int i = 0; i < t->ndim; i++)
            if (t->shape[i] == 0) goto empty;
        if (t->ndim >= 0) {
            PyErr_Format(PyExc_ValueError, "%s: __cuda_array_interface__ holds elements but its data pointer is 0", name);
            goto done;
        }
    } else if (fs_gpu_pointer_device(t->data, &t->device) < 0) {
        goto done;
    }
empty:
    rc = 0;
done:
    Py_DECREF(d);
    Py_XDECREF(shape);
    Py_XDECREF(typestr);
    Py_XDECREF(data);
    Py_XDECREF(strides);
    Py_XDECREF(mask);
    Py_XDECREF(stream);
    return rc;
}

/* Whether obj has attribute attr: 1 yes, 0 no (an AttributeError, cleared), -1 with the exception the lookup raised
 * (a property of the producer's that fails says why; hasattr would hide it). */
static int has_attr(PyObject *obj, PyObject *attr)
{
    PyObject *v = PyObject_GetAttr(obj, attr);
    if (v) {
        Py_DECREF(v);
        return 1;
    }
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
    PyErr_Clear();
    return 0;
}

int fs_tensor_import(fs_state *st, PyObject *obj, const char *name, uintptr_t stream, fs_route route,
                     unsigned allowed, fs_tensor *t)
{
    memset(t, 0, sizeof *t);
    t->obj = obj;
    t->name = name;
    if (route == FS_ROUTE_AUTO) {
        if (PyArray_Check(obj)) return import_numpy(obj, name, allowed, t);
        if (Py_TYPE(obj) == (PyTypeObject *)st->array_type) {
            int rc = import_dlpack(st, obj, name, stream, allowed, t);
            t->source = FS_SRC_ARRAY;
            return rc;
        }
    }
    if (route == FS_ROUTE_AUTO || route == FS_ROUTE_TORCH_ATTRS) {
        if (fs_torch_refresh(st) < 0) return -1;
        if (st->torch_tensor_type && PyObject_TypeCheck(obj, (PyTypeObject *)st->torch_tensor_type)) {
            const int rc = route == FS_ROUTE_AUTO ? import_torch_c(st, obj, name, allowed, t) : 1;
            return rc <= 0 ? rc : import_torch(st, obj, name, allowed, t);
        }
    }
    if (route == FS_ROUTE_TORCH_ATTRS) {
        PyErr_Format(PyExc_TypeError, "%s: the torch attribute route needs a torch.Tensor, got %.200s", name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    int has_dl = 0, has_cai = 0;
    if (route != FS_ROUTE_CAI && (has_dl = has_attr(obj, st->s_dlpack)) > 0) has_dl = has_attr(obj, st->s_dlpack_device);
    if (has_dl < 0) return -1;
    if (has_dl) return import_dlpack(st, obj, name, stream, allowed, t);
    if (route != FS_ROUTE_DLPACK && (has_cai = has_attr(obj, st->s_cai)) < 0) return -1;
    if (has_cai) return import_cai(st, obj, name, allowed, t);
    PyErr_Format(PyExc_TypeError,
                 "%s: expected an array (torch.Tensor, numpy.ndarray, or an object with __dlpack__ or "
                 "__cuda_array_interface__), got %.200s", name, Py_TYPE(obj)->tp_name);
    return -1;
}

/* The data pointer of a torch tensor flashsci allocated: through the C exchange table, else data_ptr(). */
int fs_torch_data_ptr(fs_state *st, PyObject *tensor, char **data)
{
    DLTensor d;
    if (st->torch_api && Py_TYPE(tensor) == (PyTypeObject *)st->torch_tensor_type) {
        if (st->torch_api->dltensor_from_py_object_no_sync(tensor, &d) < 0) return -1;
        *data = (char *)d.data + d.byte_offset;
        return 0;
    }
    PyObject *ptr = call_method0(tensor, st->s_data_ptr);
    if (!ptr) return -1;
    *data = PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    return !*data && PyErr_Occurred() ? -1 : 0;
}

void fs_tensor_release(fs_tensor *t)
{
    if (!t->dlv && !t->dl) return;
    /* a deleter may run Python code: the caller's pending exception waits, and one the deleter raises is reported as
     * unraisable rather than replacing it */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (t->dlv) {
        if (t->dlv->deleter) t->dlv->deleter(t->dlv);
        t->dlv = NULL;
    }
    if (t->dl) {
        if (t->dl->deleter) t->dl->deleter(t->dl);
        t->dl = NULL;
    }
    if (PyErr_Occurred()) PyErr_WriteUnraisable(t->obj);
    PyErr_Restore(type, value, tb);
}

int fs_torch_current_stream(fs_state *st, int device, uintptr_t *stream)
{
    *stream = 0;
    if (st->torch_api) {
        void *s = NULL;
        if (st->torch_api->current_work_stream(kDLCUDA, device, &s) < 0) return -1;
        *stream = (uintptr_t)s;
        return 0;
    }
    if (!st->torch_current_stream) return 0;
    PyObject *dev = PyLong_FromLong(device);
    if (!dev) return -1;
    PyObject *s = PyObject_CallOneArg(st->torch_current_stream, dev);
    Py_DECREF(dev);
    if (!s) return -1;
    *stream = (uintptr_t)PyLong_AsUnsignedLongLong(s);
    Py_DECREF(s);
    return PyErr_Occurred() ? -1 : 0;
}

int fs_parse_stream(fs_state *st, PyObject *obj, uintptr_t *stream)
{
    PyObject *handle = NULL;
    if (PyLong_Check(obj)) {
        handle = Py_NewRef(obj);
    } else if (PyObject_HasAttr(obj, st->s_cuda_stream_proto)) { /* __cuda_stream__() -> (version, handle) */
        PyObject *proto = PyObject_GetAttr(obj, st->s_cuda_stream_proto);
        PyObject *res = proto && PyCallable_Check(proto) ? PyObject_CallNoArgs(proto) : Py_XNewRef(proto);
        Py_XDECREF(proto);
        if (!res) return -1;
        if (PyTuple_Check(res) && PyTuple_GET_SIZE(res) == 2) handle = Py_NewRef(PyTuple_GET_ITEM(res, 1));
        Py_DECREF(res);
        if (!handle) {
            PyErr_SetString(PyExc_TypeError, "stream: __cuda_stream__ must give a (version, handle) tuple");
            return -1;
        }
    } else if (PyObject_HasAttr(obj, st->s_cuda_stream)) {      /* torch.cuda.Stream, numba streams */
        if (!(handle = PyObject_GetAttr(obj, st->s_cuda_stream))) return -1;
    } else {
        PyErr_Format(PyExc_TypeError, "stream: expected an int CUDA stream handle or an object with "
                     "__cuda_stream__ or cuda_stream, got %.200s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (!PyLong_Check(handle)) {
        PyErr_Format(PyExc_TypeError, "stream: the handle must be an int, got %.200s", Py_TYPE(handle)->tp_name);
        Py_DECREF(handle);
        return -1;
    }
    long long v;
    if (fs_int_in(handle, 0, LLONG_MAX, &v) > 0)
        PyErr_Format(PyExc_ValueError, "stream: a CUDA stream handle is a pointer in [0, 2**63), got %R", handle);
    Py_DECREF(handle);
    if (PyErr_Occurred()) return -1;
    *stream = (uintptr_t)v;
    return 0;
}

PyObject *fs_tensor_describe(const fs_tensor *t)
{
    static const char *sources[] = {"numpy", "torch", "dlpack", "cuda_array_interface", "flashsci.Array"};
    PyObject *shape = PyTuple_New(t->ndim), *strides = PyTuple_New(t->ndim);
    if (!shape || !strides) goto fail;
    for (int i = 0; i < t->ndim; i++) {
        PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(t->shape[i]));
        PyTuple_SET_ITEM(strides, i, PyLong_FromLongLong(t->strides[i]));
    }
    return Py_BuildValue("{s:K,s:N,s:N,s:s,s:s,s:i,s:O,s:s,s:O,s:N}", "data", (unsigned long long)(uintptr_t)t->data,
                         "shape", shape, "strides", strides, "dtype", fs_dtype_name(t->dtype), "device",
                         t->is_cuda ? "cuda" : "cpu", "device_id", t->device, "readonly",
                         t->readonly ? Py_True : Py_False, "source", sources[t->source], "c_exchange",
                         t->c_exchange ? Py_True : Py_False, "stream",
                         t->has_stream ? PyLong_FromUnsignedLongLong(t->stream) : Py_NewRef(Py_None));
fail:
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    return NULL;
}

/* Order stream after the streams that CUDA arrays among arrays[0..n) named as their producers (CUDA array
 * interface v3 'stream'); nothing for CPU arrays. */
int fs_wait_producers(fs_tensor *const *arrays, int n, uintptr_t stream)
{
    for (int i = 0; i < n; i++)
        if (arrays[i]->is_cuda && arrays[i]->has_stream &&
            fs_gpu_stream_wait(stream, arrays[i]->stream, arrays[i]->device) < 0)
            return -1;
    return 0;
}
