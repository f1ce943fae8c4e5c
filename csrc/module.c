/* flashsci._flashsci: the CPython module (multi-phase init, per-module state) and its small functions. Everything
 * here is static but PyInit__flashsci; the entry points live in attention.c, varlen.c and linear.c, the interop in
 * tensor.c and array.c, the test hooks in introspect.c. */
#include "flashsci.h"

#include "docstrings.h"

#include <stdlib.h>
#include <unistd.h>

#define PY_ARRAY_UNIQUE_SYMBOL flashsci_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

/* cuda_device_count(): CUDA devices visible, 0 without a driver or in a CPU-only build. */
static PyObject *cuda_device_count(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromLong(fs_gpu_device_count());
}

/* device_info(device=0): name, compute capability and multiprocessor count of a CUDA device. */
static PyObject *device_info(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    int device = 0;
    if (nargs > 1) return PyErr_Format(PyExc_TypeError, "device_info() takes at most 1 argument (%zd given)", nargs);
    if (nargs == 1) {
        if (!PyIndex_Check(args[0]) || PyBool_Check(args[0]))   /* ints, and NumPy's */
            return PyErr_Format(PyExc_TypeError, "device_info: device must be an int, got %.100s", Py_TYPE(args[0])->tp_name);
        PyObject *index = PyNumber_Index(args[0]);
        if (!index) return NULL;
        long long d;
        if (fs_int_in(index, INT_MIN, INT_MAX, &d) > 0)
            PyErr_Format(PyExc_ValueError, "flashsci: CUDA device %R is out of range", index);
        Py_DECREF(index);
        if (PyErr_Occurred()) return NULL;
        device = (int)d;
    }
    fs_gpu_props p;
    if (fs_gpu_props_get(device, &p) < 0) return NULL;
    return Py_BuildValue("{s:s,s:(ii),s:i,s:n}", "name", p.name, "capability", p.major, p.minor, "sm_count",
                         p.sm_count, "smem_per_block_optin", (Py_ssize_t)p.smem_optin);
}

/* build_info(): how this extension was built. */
static PyObject *build_info(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return Py_BuildValue("{s:O,s:s,s:i}", "cuda", fs_gpu_built() ? Py_True : Py_False, "cuda_architectures",
#ifdef FLASHSCI_CUDA_ARCHS
                         FLASHSCI_CUDA_ARCHS,
#else
                         "",
#endif
                         "num_threads", fs_get_state(module)->num_threads);
}

static PyMethodDef module_methods[] = {
    {"attention", (PyCFunction)(void (*)(void))fs_attention, METH_FASTCALL | METH_KEYWORDS, attention_doc},
    {"attention_varlen", (PyCFunction)(void (*)(void))fs_attention_varlen, METH_VARARGS | METH_KEYWORDS,
     attention_varlen_doc},
    {"attention_backward", (PyCFunction)(void (*)(void))fs_attention_backward, METH_VARARGS | METH_KEYWORDS,
     attention_backward_doc},
    {"attention_varlen_backward", (PyCFunction)(void (*)(void))fs_attention_varlen_backward, METH_VARARGS | METH_KEYWORDS,
     attention_varlen_backward_doc},
    {"linear", (PyCFunction)(void (*)(void))fs_linear, METH_VARARGS | METH_KEYWORDS, linear_doc},
    {"swiglu", (PyCFunction)(void (*)(void))fs_swiglu, METH_VARARGS | METH_KEYWORDS, swiglu_doc},
    {"linear_backward", (PyCFunction)(void (*)(void))fs_linear_backward, METH_VARARGS | METH_KEYWORDS, linear_backward_doc},
    {"swiglu_backward", (PyCFunction)(void (*)(void))fs_swiglu_backward, METH_VARARGS | METH_KEYWORDS, swiglu_backward_doc},
    {"cuda_device_count", cuda_device_count, METH_NOARGS, cuda_device_count_doc},
    {"device_info", (PyCFunction)(void (*)(void))device_info, METH_FASTCALL, device_info_doc},
    {"build_info", build_info, METH_NOARGS, build_info_doc},
    {"_inspect", (PyCFunction)(void (*)(void))fs_hook_inspect, METH_FASTCALL, "What flashsci reads from an array object."},
    {"_gemm_plan", (PyCFunction)(void (*)(void))fs_hook_gemm_plan, METH_VARARGS | METH_KEYWORDS,
     "How a CUDA linear problem is launched."},
    {"_set_attention_kernel", fs_hook_set_attention_kernel, METH_O,
     "Force the portable attention kernel ('sm80') or restore dispatch ('auto')."},
    {"_set_gemm_kernel", fs_hook_set_gemm_kernel, METH_O,
     "Force the portable GEMM kernel ('sm80'), a Hopper tile width ('sm90:BN') or restore dispatch ('auto')."},
    {"_launch_plan", (PyCFunction)(void (*)(void))fs_hook_launch_plan, METH_VARARGS | METH_KEYWORDS,
     "How a CUDA attention problem is launched."},
    {NULL, NULL, 0, NULL},
};

/* Intern a name into *slot; returns -1 on failure. */
static int intern(PyObject **slot, const char *s)
{
    *slot = PyUnicode_InternFromString(s);
    return *slot ? 0 : -1;
}

/* Threads for CPU kernels: FLASHSCI_NUM_THREADS, else the online processors. */
static int default_threads(void)
{
    const char *env = getenv("FLASHSCI_NUM_THREADS");
    long n = env ? strtol(env, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}

/* Py_mod_exec: NumPy's C API, interned names, the Array type. */
static int module_exec(PyObject *module)
{
    fs_state *st = fs_get_state(module);
    import_array1(-1);
    if (intern(&st->s_dtype, "dtype") || intern(&st->s_shape, "shape") || intern(&st->s_stride, "stride") ||
        intern(&st->s_data_ptr, "data_ptr") || intern(&st->s_is_cuda, "is_cuda") || intern(&st->s_is_cpu, "is_cpu") ||
        intern(&st->s_get_device, "get_device") || intern(&st->s_new_empty, "new_empty") ||
        intern(&st->s_requires_grad, "requires_grad") || intern(&st->s_device, "device") ||
        intern(&st->s_dlpack, "__dlpack__") || intern(&st->s_dlpack_device, "__dlpack_device__") ||
        intern(&st->s_cai, "__cuda_array_interface__") || intern(&st->s_stream, "stream") ||
        intern(&st->s_max_version, "max_version") || intern(&st->s_cuda_stream, "cuda_stream") ||
        intern(&st->s_cuda_stream_proto, "__cuda_stream__") ||
        intern(&st->s_c_exchange_api, "__dlpack_c_exchange_api__") || intern(&st->s_is_neg, "is_neg"))
        return -1;
    st->kw_names = Py_BuildValue("(sssssssssss)", "causal", "scale", "layout", "out", "return_lse", "stream",
                                 "key_padding_mask", "seqlens", "bias", "t5_bias", "rotary");
    if (!st->kw_names) return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(st->kw_names); i++) PyUnicode_InternInPlace(&PyTuple_GET_ITEM(st->kw_names, i));
    st->num_threads = default_threads();
    if (fs_array_add_type(module, st) < 0) return -1;
    return PyModule_AddIntConstant(module, "CUDA_BUILT", fs_gpu_built());
}

/* Visit or clear every object the state holds. */
#define FS_STATE_OBJECTS(X)                                                                                    \
    X(array_type) X(torch_tensor_type) X(torch_dtype[0]) X(torch_dtype[1]) X(torch_dtype[2]) X(torch_dtype[3]) \
    X(torch_dtype[4]) X(torch_dtype[5]) X(torch_dtype[6]) X(torch_current_stream) X(torch_empty_like)          \
    X(torch_grad_enabled) X(torch_c_api) X(s_dtype) X(s_shape) X(s_stride) X(s_data_ptr) X(s_is_cuda)          \
    X(s_is_cpu) X(s_get_device) X(s_new_empty) X(s_requires_grad) X(s_device) X(s_dlpack) X(s_dlpack_device)   \
    X(s_cai) X(s_stream) X(s_max_version) X(s_cuda_stream) X(s_cuda_stream_proto) X(s_c_exchange_api)          \
    X(s_is_neg) X(kw_names)

/* GC traverse of the module state. */
static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    fs_state *st = fs_get_state(module);
    if (!st) return 0;
#define VISIT(f) Py_VISIT(st->f);
    FS_STATE_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

/* GC clear of the module state. */
static int module_clear(PyObject *module)
{
    fs_state *st = fs_get_state(module);
    if (!st) return 0;
#define CLEAR(f) Py_CLEAR(st->f);
    FS_STATE_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

/* Free the module state. */
static void module_free(void *module) { module_clear((PyObject *)module); }

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "flashsci._flashsci",
    .m_doc = "flashsci host module: attention and fused linear layers on CPU and CUDA with zero-copy tensor interop.",
    .m_size = sizeof(fs_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__flashsci(void) { return PyModuleDef_Init(&module_def); }
