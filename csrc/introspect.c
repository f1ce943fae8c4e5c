/* The hooks tests and benchmarks use, outside the public API: what the interop layer reads from an object
 * (_inspect), how a problem would be launched (_launch_plan, _gemm_plan) and which kernel runs it
 * (_set_attention_kernel, _set_gemm_kernel: the choice lives in the module state). */
#include "flashsci.h"

#include <stdio.h>
#include <string.h>

/* _inspect(obj, route='auto'): what the interop layer reads from obj (tests, host-overhead benchmarks). */
PyObject *fs_hook_inspect(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
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
PyObject *fs_hook_launch_plan(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"B", "H", "Sq", "Sk", "D", "causal", "device", "rotary", "key_padding_mask", NULL};
    static const uint8_t mask_marker = 1;
    int B, H, Sq, Sk, D, device = 0, kpm = 0;
    fs_attn_options opt = {0, 1, 1.0, 0, 10000.0f};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiiii|pipp:_launch_plan", kwlist, &B, &H, &Sq, &Sk, &D, &opt.causal,
                                     &device, &opt.rotary, &kpm))
        return NULL;
    if (B < 1 || H < 1 || Sq < 1 || Sk < 1 || D < 8 || D > 256 || D % 8)
        return PyErr_Format(PyExc_ValueError, "_launch_plan: sizes must be >= 1 and D a multiple of 8 up to 256");
    const fs_operand q = {NULL, (int64_t)H * Sq * D, (int64_t)Sq * D, D}, kv = {NULL, (int64_t)H * Sk * D, (int64_t)Sk * D, D};
    fs_attn_params p;
    fs_attn_params_build(&p, &opt, B, H, H, Sq, Sk, D, FS_F16, q, kv, kv, q);
    p.kpm = kpm ? &mask_marker : NULL;
    return fs_gpu_attention_plan(&p, device, &fs_get_state(module)->choice);
}

/* _gemm_plan(M, N, K, swiglu=False, transposed=0, device=0): how the CUDA GEMM would be launched (fp16): the forward
 * product, or with transposed 1 or 2 the backward's dX = dH W (W^T given) or dW = dH^T X (both given transposed). */
PyObject *fs_hook_gemm_plan(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"M", "N", "K", "swiglu", "transposed", "device", NULL};
    fs_gemm_params p;
    int device = 0, transposed = 0;
    memset(&p, 0, sizeof p);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iii|pii:_gemm_plan", kwlist, &p.M, &p.N, &p.K, &p.swiglu, &transposed,
                                     &device))
        return NULL;
    if (p.M < 1 || p.N < 8 || p.K < 8 || p.N % 8 || p.K % 8)
        return PyErr_Format(PyExc_ValueError, "_gemm_plan: M >= 1, N and K positive multiples of 8");
    if (transposed < 0 || transposed > 2 || (transposed && p.swiglu))
        return PyErr_Format(PyExc_ValueError, "_gemm_plan: transposed is 0 (x W^T), 1 (W^T given) or 2 (x^T and W^T "
                            "given), without swiglu");
    p.trans_w = transposed >= 1;
    p.trans_x = transposed == 2;
    p.dtype = p.out_dtype = FS_F16;
    p.ldx = p.ldw = p.ldw2 = p.K;
    p.ldy = p.N;
    return fs_gpu_gemm_plan(&p, device, &fs_get_state(module)->choice);
}

/* _set_gemm_kernel('auto' | 'sm80' | 'sm90:BN'): tests run the portable GEMM on Hopper devices too, and tests and
 * benchmarks run the Hopper GEMM with a given tile width (BN = 128, 160, 192 or 256). */
PyObject *fs_hook_set_gemm_kernel(PyObject *module, PyObject *arg)
{
    static const char *usage = "_set_gemm_kernel takes 'auto', 'sm80' or 'sm90:BN' with BN one of 128, 160, 192, 256";
    fs_state *st = fs_get_state(module);
    int bn = 0, end = 0;
    if (!PyUnicode_Check(arg)) return PyErr_Format(PyExc_TypeError, "%s", usage);
    const char *s = PyUnicode_AsUTF8(arg);
    if (!s) return NULL;
    if (!strcmp(s, "auto") || !strcmp(s, "sm80") ||
        (sscanf(s, "sm90:%d%n", &bn, &end) == 1 && !s[end] && (bn == 128 || bn == 160 || bn == 192 || bn == 256))) {
        st->choice.gemm_sm80 = !strcmp(s, "sm80");
        st->choice.gemm_bn = bn;
        Py_RETURN_NONE;
    }
    return PyErr_Format(PyExc_ValueError, "%s, got %R", usage, arg);
}

/* _set_attention_kernel('auto' | 'sm80'): tests run the portable attention kernel on Hopper devices too. */
PyObject *fs_hook_set_attention_kernel(PyObject *module, PyObject *arg)
{
    static const char *usage = "_set_attention_kernel takes 'auto' or 'sm80'";
    if (!PyUnicode_Check(arg)) return PyErr_Format(PyExc_TypeError, "%s", usage);
    const char *s = PyUnicode_AsUTF8(arg);
    if (!s) return NULL;
    if (strcmp(s, "auto") && strcmp(s, "sm80")) return PyErr_Format(PyExc_ValueError, "%s, got %R", usage, arg);
    fs_get_state(module)->choice.attention_sm80 = !strcmp(s, "sm80");
    Py_RETURN_NONE;
}
