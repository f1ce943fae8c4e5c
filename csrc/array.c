/* flashsci.Array: the output type for inputs from frameworks other than torch and NumPy (CuPy, JAX, ...).
 * It owns host or CUDA memory and hands it to any consumer without a copy through __dlpack__ (versioned
 * and legacy capsules), __cuda_array_interface__ v3 on CUDA and __array_interface__ on the CPU. */
#include "flashsci.h"

#include <stdlib.h>

typedef struct {
    PyObject_HEAD
    void *data;
    int ndim;
    int64_t shape[FS_MAX_NDIM];
    int64_t strides[FS_MAX_NDIM]; /* elements, C-contiguous */
    fs_dtype dtype;
    int is_cuda, device;
    uintptr_t stream;             /* the stream that produced the data; frees are ordered on it */
} fs_array;

/* Number of bytes held by the array (the caller checked it fits: fs_nbytes). */
static size_t array_nbytes(const fs_array *a)
{
    size_t n = fs_dtype_itemsize(a->dtype);
    for (int i = 0; i < a->ndim; i++) n *= (size_t)a->shape[i];
    return n;
}

PyObject *fs_array_new(fs_state *st, int ndim, const int64_t *shape, fs_dtype dtype, int is_cuda, int device,
                       uintptr_t stream)
{
    PyTypeObject *type = (PyTypeObject *)st->array_type;
    fs_array *a = (fs_array *)type->tp_alloc(type, 0);
    if (!a) return NULL;
    a->ndim = ndim;
    a->dtype = dtype;
    a->is_cuda = is_cuda;
    a->device = device;
    a->stream = stream;
    int64_t compact = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        a->shape[i] = shape[i];
        a->strides[i] = compact;
        compact *= shape[i];
    }
    const size_t bytes = array_nbytes(a);
    a->data = is_cuda ? fs_gpu_malloc_async(bytes, stream, device) : aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!a->data) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        Py_DECREF(a);
        return NULL;
    }
    return (PyObject *)a;
}

void *fs_array_data(PyObject *array) { return ((fs_array *)array)->data; }

/* Free the memory (stream-ordered on CUDA) and the object. */
static void array_dealloc(PyObject *self)
{
    fs_array *a = (fs_array *)self;
    PyTypeObject *type = Py_TYPE(self);
    if (a->data) {
        if (a->is_cuda) fs_gpu_free_async(a->data, a->stream, a->device);
        else free(a->data);
    }
    type->tp_free(self);
    Py_DECREF(type);
}

/* DLPack deleter for versioned capsules: drop the reference the capsule held on the array. */
static void array_deleter_versioned(DLManagedTensorVersioned *m)
{
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF((PyObject *)m->manager_ctx);
    PyGILState_Release(g);
    PyMem_RawFree(m);
}

/* DLPack deleter for legacy capsules. */
static void array_deleter_legacy(DLManagedTensor *m)
{
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF((PyObject *)m->manager_ctx);
    PyGILState_Release(g);
    PyMem_RawFree(m);
}

/* Capsule destructor: a capsule nobody consumed still owns its tensor. */
static void array_capsule_destructor(PyObject *cap)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        m->deleter(m);
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        m->deleter(m);
    }
    PyErr_Restore(type, value, tb);
}

/* Fill a DLTensor view of the array. */
static void array_dltensor(fs_array *a, DLTensor *d)
{
    static const DLDataType types[FS_NUM_DTYPES] = {{kDLFloat, 16, 1}, {kDLBfloat, 16, 1}, {kDLFloat, 32, 1}, {kDLFloat, 64, 1},
                                                    {kDLBool, 8, 1},   {kDLInt, 32, 1},    {kDLInt, 64, 1}};
    d->data = a->data;
    d->device.device_type = a->is_cuda ? kDLCUDA : kDLCPU;
    d->device.device_id = a->is_cuda ? a->device : 0;
    d->ndim = a->ndim;
    d->dtype = types[a->dtype];
    d->shape = a->shape;
    d->strides = a->strides;
    d->byte_offset = 0;
}

/* A (int, int) tuple argument of __dlpack__ into *a, *b; TypeError naming it otherwise. */
static int int_pair(PyObject *obj, const char *what, int *a, int *b)
{
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 2) {
        PyErr_Format(PyExc_TypeError, "flashsci.Array.__dlpack__: %s must be a tuple of two ints, got %.100s", what,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    int *const out[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        PyObject *x = PyTuple_GET_ITEM(obj, i);
        if (!PyLong_Check(x)) {
            PyErr_Format(PyExc_TypeError, "flashsci.Array.__dlpack__: %s must be a tuple of two ints, got %R", what, obj);
            return -1;
        }
        long long v;
        const int outside = fs_int_in(x, INT_MIN, INT_MAX, &v);
        if (outside < 0) return -1;
        if (outside) {
            PyErr_Format(PyExc_ValueError, "flashsci.Array.__dlpack__: %s %R is out of range", what, obj);
            return -1;
        }
        *out[i] = (int)v;
    }
    return 0;
}

/* __dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None): export without a copy. */
static PyObject *array_dlpack(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    fs_array *a = (fs_array *)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:__dlpack__", kwlist, &stream, &max_version, &dl_device, &copy))
        return NULL;
    if (copy != Py_None && !PyBool_Check(copy)) {
        PyErr_Format(PyExc_TypeError, "flashsci.Array.__dlpack__: copy must be None or a bool, got %.100s", Py_TYPE(copy)->tp_name);
        return NULL;
    }
    if (copy == Py_True) {
        PyErr_SetString(PyExc_BufferError, "flashsci.Array.__dlpack__: copy=True is not supported (the export is zero-copy)");
        return NULL;
    }
    if (dl_device != Py_None) {
        int type, id;
        if (int_pair(dl_device, "dl_device", &type, &id) < 0) return NULL;
        if (type != (a->is_cuda ? kDLCUDA : kDLCPU) || (a->is_cuda && id != a->device)) {
            PyErr_SetString(PyExc_BufferError, "flashsci.Array.__dlpack__: dl_device differs from the array's device");
            return NULL;
        }
    }
    if (a->is_cuda && stream != Py_None) { /* make the consumer's stream wait for the producing one (-1: no wait) */
        if (!PyLong_Check(stream)) {
            PyErr_Format(PyExc_TypeError, "flashsci.Array.__dlpack__: stream must be None or an int, got %.100s",
                         Py_TYPE(stream)->tp_name);
            return NULL;
        }
        long long s;
        const int outside = fs_int_in(stream, -1, LLONG_MAX, &s);
        if (outside < 0) return NULL;
        if (outside) {
            PyErr_Format(PyExc_ValueError, "flashsci.Array.__dlpack__: stream must be None, -1 or a CUDA stream handle "
                         "(an int in [0, 2**63)), got %R", stream);
            return NULL;
        }
        if (s != -1 && fs_gpu_stream_wait((uintptr_t)s, a->stream, a->device) < 0) return NULL;
    }
    int versioned = 0;
    if (max_version != Py_None) {
        int major, minor;
        if (int_pair(max_version, "max_version", &major, &minor) < 0) return NULL;
        versioned = major >= 1;
    }
    if (versioned) {
        DLManagedTensorVersioned *m = PyMem_RawCalloc(1, sizeof *m);
        if (!m) return PyErr_NoMemory();
        m->version.major = FS_DLPACK_MAJOR;
        m->version.minor = FS_DLPACK_MINOR;
        m->manager_ctx = Py_NewRef(self);
        m->deleter = array_deleter_versioned;
        array_dltensor(a, &m->dl_tensor);
        PyObject *cap = PyCapsule_New(m, "dltensor_versioned", array_capsule_destructor);
        if (!cap) m->deleter(m);
        return cap;
    }
    DLManagedTensor *m = PyMem_RawCalloc(1, sizeof *m);
    if (!m) return PyErr_NoMemory();
    m->manager_ctx = Py_NewRef(self);
    m->deleter = array_deleter_legacy;
    array_dltensor(a, &m->dl_tensor);
    PyObject *cap = PyCapsule_New(m, "dltensor", array_capsule_destructor);
    if (!cap) m->deleter(m);
    return cap;
}

/* __dlpack_device__(): (device_type, device_id). */
static PyObject *array_dlpack_device(PyObject *self, PyObject *unused)
{
    (void)unused;
    fs_array *a = (fs_array *)self;
    return Py_BuildValue("(ii)", a->is_cuda ? kDLCUDA : kDLCPU, a->is_cuda ? a->device : 0);
}

/* Shape as a tuple of ints. */
static PyObject *array_shape(PyObject *self, void *closure)
{
    (void)closure;
    fs_array *a = (fs_array *)self;
    PyObject *t = PyTuple_New(a->ndim);
    for (int i = 0; t && i < a->ndim; i++) PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(a->shape[i]));
    return t;
}

/* dtype name: 'float16', 'bfloat16', 'float32' or 'float64'. */
static PyObject *array_dtype(PyObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(fs_dtype_name(((fs_array *)self)->dtype));
}

/* Device as 'cpu' or 'cuda:N'. */
static PyObject *array_device(PyObject *self, void *closure)
{
    (void)closure;
    fs_array *a = (fs_array *)self;
    return a->is_cuda ? PyUnicode_FromFormat("cuda:%d", a->device) : PyUnicode_FromString("cpu");
}

/* NumPy-style typestr, or NULL with AttributeError for bfloat16 (no standard typestr). */
static const char *array_typestr(fs_array *a, const char *proto)
{
    static const char *typestr[FS_NUM_DTYPES] = {"<f2", NULL, "<f4", "<f8", "|b1", "<i4", "<i8"};
    if (!typestr[a->dtype])
        PyErr_Format(PyExc_AttributeError, "bfloat16 has no %s typestr; use __dlpack__", proto);
    return typestr[a->dtype];
}

/* __cuda_array_interface__ v3 for CUDA arrays (AttributeError on the CPU). */
static PyObject *array_cai(PyObject *self, void *closure)
{
    (void)closure;
    fs_array *a = (fs_array *)self;
    if (!a->is_cuda) {
        PyErr_SetString(PyExc_AttributeError, "a CPU flashsci.Array has no __cuda_array_interface__");
        return NULL;
    }
    const char *ts = array_typestr(a, "__cuda_array_interface__");
    if (!ts) return NULL;
    return Py_BuildValue("{s:N,s:s,s:(KO),s:i,s:O,s:K}", "shape", array_shape(self, NULL), "typestr", ts, "data",
                         (unsigned long long)(uintptr_t)a->data, Py_False, "version", 3, "strides", Py_None,
                         "stream", (unsigned long long)(a->stream ? a->stream : 1));
}

/* __array_interface__ v3 for CPU arrays (AttributeError on CUDA). */
static PyObject *array_ai(PyObject *self, void *closure)
{
    (void)closure;
    fs_array *a = (fs_array *)self;
    if (a->is_cuda) {
        PyErr_SetString(PyExc_AttributeError, "a CUDA flashsci.Array has no __array_interface__");
        return NULL;
    }
    const char *ts = array_typestr(a, "__array_interface__");
    if (!ts) return NULL;
    return Py_BuildValue("{s:N,s:s,s:(KO),s:i,s:O}", "shape", array_shape(self, NULL), "typestr", ts, "data",
                         (unsigned long long)(uintptr_t)a->data, Py_False, "version", 3, "strides", Py_None);
}

/* repr: flashsci.Array(shape=..., dtype=..., device=...). */
static PyObject *array_repr(PyObject *self)
{
    fs_array *a = (fs_array *)self;
    PyObject *shape = array_shape(self, NULL), *dev = array_device(self, NULL), *r = NULL;
    if (shape && dev) r = PyUnicode_FromFormat("flashsci.Array(shape=%R, dtype=%s, device='%U')", shape, fs_dtype_name(a->dtype), dev);
    Py_XDECREF(shape);
    Py_XDECREF(dev);
    return r;
}

static PyMethodDef array_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))array_dlpack, METH_VARARGS | METH_KEYWORDS, "Export as a DLPack capsule (zero-copy)."},
    {"__dlpack_device__", array_dlpack_device, METH_NOARGS, "DLPack (device_type, device_id)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef array_getset[] = {
    {"shape", array_shape, NULL, "Shape as a tuple.", NULL},
    {"dtype", array_dtype, NULL, "Element type name.", NULL},
    {"device", array_device, NULL, "'cpu' or 'cuda:N'.", NULL},
    {"__cuda_array_interface__", array_cai, NULL, "CUDA array interface v3.", NULL},
    {"__array_interface__", array_ai, NULL, "NumPy array interface v3.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot array_slots[] = {
    {Py_tp_dealloc, array_dealloc},
    {Py_tp_repr, array_repr},
    {Py_tp_methods, array_methods},
    {Py_tp_getset, array_getset},
    {Py_tp_doc, "Array owned by flashsci, returned for inputs from frameworks other than torch and NumPy; "
                "import it zero-copy with the framework's from_dlpack."},
    {0, NULL},
};

static PyType_Spec array_spec = {
    .name = "flashsci.Array",
    .basicsize = sizeof(fs_array),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = array_slots,
};

int fs_array_add_type(PyObject *module, fs_state *st)
{
    st->array_type = PyType_FromModuleAndSpec(module, &array_spec, NULL);
    if (!st->array_type) return -1;
    return PyModule_AddObjectRef(module, "Array", st->array_type);
}
