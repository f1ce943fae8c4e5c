/* flashsci._flashsci: the CPython module (multi-phase init, per-module state). Everything here is static
 * but PyInit__flashsci; the functions live in attention.c (attention), tensor.c (interop) and array.c. */
#include "flashsci.h"

#include <stdlib.h>
#include <unistd.h>

#define PY_ARRAY_UNIQUE_SYMBOL flashsci_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

fs_state *fs_get_state(PyObject *module) { return (fs_state *)PyModule_GetState(module); }

const char *fs_dtype_name(fs_dtype dt)
{
    static const char *names[FS_NUM_DTYPES] = {"float16", "bfloat16", "float32", "float64", "bool", "int32", "int64"};
    return (unsigned)dt < FS_NUM_DTYPES ? names[dt] : "unknown";
}

size_t fs_dtype_itemsize(fs_dtype dt)
{
    static const size_t sizes[FS_NUM_DTYPES] = {2, 2, 4, 8, 1, 4, 8};
    return sizes[dt];
}

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
    if (nargs == 1 && (device = (int)PyLong_AsLong(args[0])) == -1 && PyErr_Occurred()) return NULL;
    fs_gpu_props p;
    if (fs_gpu_props_get(device, &p) < 0) return NULL;
    return Py_BuildValue("{s:s,s:(ii),s:i,s:n}", "name", p.name, "capability", p.major, p.minor, "sm_count",
                         p.sm_count, "smem_per_block_optin", (Py_ssize_t)p.smem_optin);
}

/* _inspect(obj, route='auto'): what the interop layer reads from obj (tests, host-overhead benchmarks). */
static PyObject *inspect_tensor(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    fs_state *st = fs_get_state(module);
    fs_route route = FS_ROUTE_AUTO;
    if (nargs < 1 || nargs > 2) return PyErr_Format(PyExc_TypeError, "_inspect(obj, route='auto') takes 1 or 2 arguments");
    if (nargs == 2) {
        if (!PyUnicode_Check(args[1])) return PyErr_Format(PyExc_TypeError, "route must be a str");
        if (!PyUnicode_CompareWithASCIIString(args[1], "dlpack")) route = FS_ROUTE_DLPACK;
        else if (!PyUnicode_CompareWithASCIIString(args[1], "cai")) route = FS_ROUTE_CAI;
        else if (!PyUnicode_CompareWithASCIIString(args[1], "torch_attrs")) route = FS_ROUTE_TORCH_ATTRS;
        else if (PyUnicode_CompareWithASCIIString(args[1], "auto"))
            return PyErr_Format(PyExc_ValueError, "route must be 'auto', 'dlpack', 'cai' or 'torch_attrs', got %R", args[1]);
    }
    fs_tensor t;
    if (fs_tensor_import(st, args[0], "obj", 0, route, (1u << FS_NUM_DTYPES) - 1, &t) < 0) return NULL;
    PyObject *d = fs_tensor_describe(&t);
    fs_tensor_release(&t);
    return d;
}

/* _launch_plan(B, H, Sq, Sk, D, causal=False, device=0, rotary=False, key_padding_mask=False): how the CUDA kernel would
 * be launched (fp16, contiguous bhsd tensors; a mask only marked present, never read). */
static PyObject *launch_plan(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"B", "H", "Sq", "Sk", "D", "causal", "device", "rotary", "key_padding_mask", NULL};
    static const uint8_t mask_marker = 1;
    fs_attn_params p;
    int causal = 0, device = 0, rotary = 0, kpm = 0;
    (void)module;
    memset(&p, 0, sizeof p);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiiii|pipp:_launch_plan", kwlist, &p.B, &p.H, &p.Sq, &p.Sk, &p.D,
                                     &causal, &device, &rotary, &kpm))
        return NULL;
    if (p.B < 1 || p.H < 1 || p.Sq < 1 || p.Sk < 1 || (p.D != 32 && p.D != 64 && p.D != 96 && p.D != 128 && p.D != 256))
        return PyErr_Format(PyExc_ValueError, "_launch_plan: sizes must be >= 1 and D one of 32, 64, 96, 128, 256");
    p.kv_group = 1;
    p.causal = causal;
    p.rotary = rotary;
    p.rotary_base = 10000.0f;
    p.kpm = kpm ? &mask_marker : NULL;
    p.dtype = FS_F16;
    p.scale = 1.0;
    p.q_ss = p.o_ss = p.k_ss = p.v_ss = p.D;
    p.q_sh = p.o_sh = (int64_t)p.Sq * p.D;
    p.k_sh = p.v_sh = (int64_t)p.Sk * p.D;
    p.q_sb = p.o_sb = p.q_sh * p.H;
    p.k_sb = p.v_sb = p.k_sh * p.H;
    return fs_gpu_attention_plan(&p, device);
}

/* _gemm_plan(M, N, K, swiglu=False, device=0): how the CUDA linear kernel would be launched (fp16). */
static PyObject *gemm_plan(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"M", "N", "K", "swiglu", "device", NULL};
    fs_gemm_params p;
    int device = 0;
    (void)module;
    memset(&p, 0, sizeof p);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iii|pi:_gemm_plan", kwlist, &p.M, &p.N, &p.K, &p.swiglu, &device))
        return NULL;
    if (p.M < 1 || p.N < 8 || p.K < 8 || p.N % 8 || p.K % 8)
        return PyErr_Format(PyExc_ValueError, "_gemm_plan: M >= 1, N and K positive multiples of 8");
    p.dtype = p.out_dtype = FS_F16;
    p.ldx = p.ldw = p.ldw2 = p.K;
    p.ldy = p.N;
    return fs_gpu_gemm_plan(&p, device);
}

/* _set_gemm_kernel('auto' | 'sm80' | 'sm90:BN'): tests run the portable GEMM on Hopper devices too, and tests and
 * benchmarks run the Hopper GEMM with a given tile width (BN = 128, 160, 192 or 256). */
static PyObject *set_gemm_kernel(PyObject *module, PyObject *arg)
{
    static const char *usage = "_set_gemm_kernel takes 'auto', 'sm80' or 'sm90:BN' with BN one of 128, 160, 192, 256";
    int bn = 0, end = 0;
    (void)module;
    if (!PyUnicode_Check(arg)) return PyErr_Format(PyExc_TypeError, "%s", usage);
    const char *s = PyUnicode_AsUTF8(arg);
    if (!s) return NULL;
    if (!strcmp(s, "auto") || !strcmp(s, "sm80") ||
        (sscanf(s, "sm90:%d%n", &bn, &end) == 1 && !s[end] && (bn == 128 || bn == 160 || bn == 192 || bn == 256))) {
        fs_gemm_force_sm80 = !strcmp(s, "sm80");
        fs_gemm_force_bn = bn;
        Py_RETURN_NONE;
    }
    return PyErr_Format(PyExc_ValueError, "%s, got %R", usage, arg);
}

/* _set_attention_kernel('auto' | 'sm80'): tests run the portable attention kernel on Hopper devices too. */
static PyObject *set_attention_kernel(PyObject *module, PyObject *arg)
{
    static const char *usage = "_set_attention_kernel takes 'auto' or 'sm80'";
    (void)module;
    if (!PyUnicode_Check(arg)) return PyErr_Format(PyExc_TypeError, "%s", usage);
    const char *s = PyUnicode_AsUTF8(arg);
    if (!s) return NULL;
    if (strcmp(s, "auto") && strcmp(s, "sm80")) return PyErr_Format(PyExc_ValueError, "%s, got %R", usage, arg);
    fs_attention_force_sm80 = !strcmp(s, "sm80");
    Py_RETURN_NONE;
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
    {"attention", (PyCFunction)(void (*)(void))fs_attention, METH_FASTCALL | METH_KEYWORDS,
     "attention(q, k, v, /, *, causal=False, scale=None, layout='bhsd', out=None, return_lse=False, stream=None, "
     "key_padding_mask=None, seqlens=None, bias=None, t5_bias=None, rotary=None)"},
    {"attention_varlen", (PyCFunction)(void (*)(void))fs_attention_varlen, METH_VARARGS | METH_KEYWORDS,
     "attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, scale=None, "
     "out=None, return_lse=False, stream=None, t5_bias=None, rotary=None)"},
    {"linear", (PyCFunction)(void (*)(void))fs_linear, METH_VARARGS | METH_KEYWORDS,
     "linear(x, weight, bias=None, *, activation=None, out=None, out_dtype=None, stream=None): "
     "act(x @ weight.T + bias), activation in None, 'relu', 'gelu', 'gelu_tanh', 'silu'"},
    {"swiglu", (PyCFunction)(void (*)(void))fs_swiglu, METH_VARARGS | METH_KEYWORDS,
     "swiglu(x, w_gate, w_up=None, *, out=None, out_dtype=None, stream=None): silu(x @ w_gate.T) * (x @ w_up.T); "
     "with w_up None, w_gate is packed (2N, K): gate rows then up rows"},
    {"cuda_device_count", cuda_device_count, METH_NOARGS, "Number of visible CUDA devices (0 without a driver)."},
    {"device_info", (PyCFunction)(void (*)(void))device_info, METH_FASTCALL, "Properties of a CUDA device."},
    {"build_info", build_info, METH_NOARGS, "How this extension was built."},
    {"_inspect", (PyCFunction)(void (*)(void))inspect_tensor, METH_FASTCALL, "What flashsci reads from an array object."},
    {"_gemm_plan", (PyCFunction)(void (*)(void))gemm_plan, METH_VARARGS | METH_KEYWORDS, "How a CUDA linear problem is launched."},
    {"_set_attention_kernel", set_attention_kernel, METH_O, "Force the portable attention kernel ('sm80') or restore dispatch ('auto')."},
    {"_set_gemm_kernel", set_gemm_kernel, METH_O, "Force the portable GEMM kernel ('sm80'), a Hopper tile width ('sm90:BN') or restore dispatch ('auto')."},
    {"_launch_plan", (PyCFunction)(void (*)(void))launch_plan, METH_VARARGS | METH_KEYWORDS, "How a CUDA attention problem is launched."},
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
#define FS_STATE_OBJECTS(X)                                                                                \
    X(array_type) X(torch_tensor_type) X(torch_dtype[0]) X(torch_dtype[1]) X(torch_dtype[2]) X(torch_dtype[3]) \
    X(torch_dtype[4]) X(torch_dtype[5]) X(torch_dtype[6])                                                       \
    X(torch_current_stream) X(torch_empty_like) X(torch_c_api) X(s_dtype) X(s_shape) X(s_stride)              \
    X(s_data_ptr) X(s_is_cuda) X(s_is_cpu) X(s_get_device) X(s_new_empty) X(s_requires_grad) X(s_device)       \
    X(s_dlpack) X(s_dlpack_device) X(s_cai) X(s_stream) X(s_max_version) X(s_cuda_stream)                      \
    X(s_cuda_stream_proto) X(s_c_exchange_api) X(s_is_neg) X(kw_names)

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
