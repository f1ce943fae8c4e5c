/* flashsci.linear(x, weight, bias=None, *, activation, out, out_dtype, preactivation, stream) and
 * flashsci.swiglu(x, w_gate, w_up=None, *, out, out_dtype, preactivation, stream): argument parsing, the checks
 * that turn bad input into clear errors, output allocation in the caller's framework, and dispatch to the C
 * CPU kernel or the CUDA kernels. The checks and runners are shared with the backward (linear_backward.c). */
#include "flashsci.h"

#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL flashsci_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

/* out_dtype=: None (x's dtype), a name ('float16', 'bfloat16', 'float32', 'float64'), a NumPy dtype or
 * type, or a torch dtype. */
static int parse_out_dtype(fs_state *st, PyObject *obj, fs_dtype in, fs_dtype *dt)
{
    static const char *names[4] = {"float16", "bfloat16", "float32", "float64"};
    *dt = in;
    if (obj == Py_None) return 0;
    if (fs_torch_refresh(st) < 0) return -1;
    for (int i = 0; i < 4; i++)
        if (st->torch_dtype[i] && obj == st->torch_dtype[i]) {
            *dt = (fs_dtype)i;
            return 0;
        }
    PyObject *name = NULL;
    if (PyUnicode_Check(obj)) {
        name = Py_NewRef(obj);
    } else {
        PyArray_Descr *descr = NULL;
        if (PyArray_DescrConverter2(obj, &descr) && descr) {
            name = PyObject_GetAttrString((PyObject *)descr, "name");
            Py_DECREF(descr);
        }
        if (!name) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "out_dtype must be None, a dtype name, a NumPy dtype or a torch dtype, got %R", obj);
            return -1;
        }
    }
    for (int i = 0; i < 4; i++)
        if (!PyUnicode_CompareWithASCIIString(name, names[i])) {
            Py_DECREF(name);
            *dt = (fs_dtype)i;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "out_dtype must be float16, bfloat16, float32 or float64, got %R", obj);
    Py_DECREF(name);
    return -1;
}

/* View the leading dimensions of a [..., cols] tensor as rows: *rows is their product, *ld the row stride
 * (elements). They must collapse to one stride, rows must not overlap, and the last dimension must be
 * contiguous. */
int fs_as_rows(const fs_tensor *t, const char *name, int64_t *rows, int64_t *ld)
{
    char b1[160], b2[160];
    const int last = t->ndim - 1;
    const int64_t cols = t->shape[last];
    if (t->strides[last] != 1 && cols > 1 && fs_numel(t) > 0) {
        PyErr_Format(PyExc_ValueError, "%s: the last dimension must be contiguous (stride 1), got stride %lld; %s", name,
                     (long long)t->strides[last], fs_contiguous_hint(t));
        return -1;
    }
    int64_t n = 1, stride = -1, next = -1; /* next: the stride the next outer dimension must have */
    for (int i = last - 1; i >= 0; i--)
        if (t->shape[i] == 0) { /* no rows: an empty result, whatever the strides */
            *rows = 0;
            *ld = cols;
            return 0;
        }
    for (int i = last - 1; i >= 0; i--) {
        if (t->shape[i] == 1) continue;
        if (stride < 0) stride = t->strides[i];
        else if (t->strides[i] != next) {
            PyErr_Format(PyExc_ValueError, "%s of shape %s and strides %s: its leading dimensions do not collapse into "
                         "one row stride; %s", name, fs_shape_str(t->shape, t->ndim, b1, sizeof b1),
                         fs_shape_str(t->strides, t->ndim, b2, sizeof b2), fs_contiguous_hint(t));
            return -1;
        }
        n *= t->shape[i];
        next = t->strides[i] * t->shape[i];
        if (n > FS_MAX_DIM) {
            PyErr_Format(PyExc_ValueError, "%s has more than 2**30 rows; flashsci supports up to 2**30", name);
            return -1;
        }
    }
    if (n > 1 && stride < cols) {
        PyErr_Format(PyExc_ValueError, "%s: row stride %lld is below its row length %lld (rows overlap or are negative)",
                     name, (long long)stride, (long long)cols);
        return -1;
    }
    *rows = n;
    *ld = n > 1 ? stride : cols;
    return 0;
}

/* t has x's dtype and is on x's device. */
int fs_check_like_x(const fs_tensor *t, const char *name, const fs_tensor *x)
{
    char b1[32], b2[32];
    if (t->dtype != x->dtype) {
        PyErr_Format(PyExc_TypeError, "%s has dtype %s but x has %s: they must match", name, fs_dtype_name(t->dtype),
                     fs_dtype_name(x->dtype));
        return -1;
    }
    if (t->is_cuda != x->is_cuda || t->device != x->device) {
        PyErr_Format(PyExc_ValueError, "%s is on %s but x is on %s", name, fs_device_str(t, b1, sizeof b1),
                     fs_device_str(x, b2, sizeof b2));
        return -1;
    }
    return 0;
}

/* A weight: 2-D [rows, K] of x's dtype and device, contiguous rows (alignment is checked later). */
int fs_check_weight(const fs_tensor *w, const char *name, const fs_tensor *x, int64_t K)
{
    char b1[160];
    if (w->ndim != 2) {
        PyErr_Format(PyExc_ValueError, "%s must be 2-D (out_features, in_features) as nn.Linear stores it, got %d-D shape %s",
                     name, w->ndim, fs_shape_str(w->shape, w->ndim, b1, sizeof b1));
        return -1;
    }
    if (fs_check_like_x(w, name, x) < 0 || fs_check_sizes(w, name) < 0) return -1;
    if (w->shape[1] != K) {
        PyErr_Format(PyExc_ValueError, "%s has in_features %lld but x has %lld features (x [..., K] against %s [N, K])", name,
                     (long long)w->shape[1], (long long)K, name);
        return -1;
    }
    int64_t rows, ld;
    return fs_as_rows(w, name, &rows, &ld);
}

/* Device-specific limits: CUDA takes fp16/bf16 with N and K multiples of 8 (16-byte rows). */
int fs_check_linear_device(const fs_tensor *x, fs_dtype out_dtype, int64_t N, int64_t K)
{
    if (!x->is_cuda) return 0;
    if (x->dtype != FS_F16 && x->dtype != FS_BF16) {
        PyErr_Format(PyExc_TypeError, "CUDA linear supports float16 and bfloat16 inputs, got %s", fs_dtype_name(x->dtype));
        return -1;
    }
    if (out_dtype == FS_F64) {
        PyErr_SetString(PyExc_TypeError, "CUDA linear writes float16, bfloat16 or float32, got out_dtype float64");
        return -1;
    }
    if (N % 8 || K % 8 || K == 0) {
        PyErr_Format(PyExc_ValueError, "CUDA linear needs out_features and in_features to be multiples of 8 (16-byte "
                     "rows) and in_features at least 8, got N=%lld, K=%lld", (long long)N, (long long)K);
        return -1;
    }
    return 0;
}

/* bias: 1-D [N], float, contiguous, on x's device. */
static int check_bias(const fs_tensor *b, const fs_tensor *x, int64_t N)
{
    char b1[160];
    if (fs_check_aux(b, "bias", x) < 0) return -1;
    if (b->ndim != 1 || b->shape[0] != N) {
        PyErr_Format(PyExc_ValueError, "bias must have shape (out_features,) = (%lld,), got %s", (long long)N,
                     fs_shape_str(b->shape, b->ndim, b1, sizeof b1));
        return -1;
    }
    if (b->strides[0] != 1 && N != 1) {
        PyErr_Format(PyExc_ValueError, "bias must be contiguous, got stride %lld", (long long)b->strides[0]);
        return -1;
    }
    if (x->is_cuda && b->dtype == FS_F64) {
        PyErr_SetString(PyExc_TypeError, "CUDA linear takes a float16, bfloat16 or float32 bias, got float64");
        return -1;
    }
    return 0;
}

/* Run checked parameters: the CUDA kernels on stream (after the streams the arrays named; n = 0: already
 * waited for), else the CPU kernel with the GIL released. */
int fs_run_gemm(fs_state *st, const fs_gemm_params *p, fs_tensor *const *arrays, int n, uintptr_t stream)
{
    if (p->M == 0 || p->N == 0) return 0; /* an empty result */
    if (arrays[0]->is_cuda)
        return fs_wait_producers(arrays, n, stream) < 0 ? -1 : fs_gpu_gemm(p, arrays[0]->device, stream, &st->choice);
    return fs_cpu_run_gemm(p, st->num_threads);
}

/* Run an elementwise pass (gemm/activation.h) on arrays[0]'s device, as fs_run_gemm. */
int fs_run_activation(fs_state *st, const fs_act_params *a, fs_tensor *const *arrays, int n, uintptr_t stream)
{
    if (arrays[0]->is_cuda)
        return fs_wait_producers(arrays, n, stream) < 0 ? -1 : fs_gpu_activation(a, arrays[0]->device, stream);
    return fs_cpu_run_activation(a, st->num_threads);
}

/* The forward that keeps the pre-activation for the backward: pre = x W^T + bias (SwiGLU: x Wg^T | x Wu^T, two
 * products into the halves of pre's rows), then y = act(pre) (silu(g) u) by the elementwise pass, on every device;
 * where the Hopper GEMM's activation warps run, its launch keeps pre itself in one step. */
static int run_with_preactivation(fs_state *st, const fs_gemm_params *p, void *pre, int64_t ldpre, fs_tensor *const *arrays,
                                  int n, uintptr_t stream)
{
    fs_gemm_params q = *p;
    q.pre = pre;
    q.ldpre = ldpre;
    if (p->M == 0 || p->N == 0) return 0; /* an empty result */
    if (arrays[0]->is_cuda) { /* one launch where the kernel keeps pre, else nothing launched and the two steps */
        if (fs_wait_producers(arrays, n, stream) < 0) return -1;
        const int kept = fs_gpu_gemm_keeping_pre(&q, arrays[0]->device, stream, &st->choice);
        if (kept != 0) return kept < 0 ? -1 : 0;
        n = 0; /* waited for */
    }
    fs_gemm_params prod[2];
    const int count = fs_gemm_pre_products(&q, prod);
    for (int i = 0; i < count; i++)
        if (fs_run_gemm(st, &prod[i], arrays, i ? 0 : n, stream) < 0) return -1;
    const fs_act_params a = fs_gemm_pre_pass(&q);
    return fs_run_activation(st, &a, arrays, 0, stream);
}

/* A torch tensor that requires grad while autograd records: refused, as the plain function records nothing. */
static int refuse_grad(const fs_tensor *t, const char *name, const char *fname)
{
    if (!t->requires_grad) return 0;
    PyErr_Format(PyExc_ValueError, "%s requires grad, but flashsci.%s does not record autograd: use "
                 "flashsci.torch_ops.%s (differentiable), call it under torch.no_grad(), or pass %s.detach()", name, fname,
                 fname, name);
    return -1;
}

/* The shared body of linear() and swiglu(): w2_arg NULL for linear; packed SwiGLU when swiglu and w2_arg
 * is None. */
static PyObject *gemm_call(PyObject *module, const char *fname, PyObject *x_arg, PyObject *w_arg, PyObject *w2_arg,
                           PyObject *bias_arg, fs_activation act, int swiglu, PyObject *out_arg, PyObject *dtype_arg,
                           PyObject *pre_arg, PyObject *stream_arg)
{
    fs_state *st = fs_get_state(module);
    fs_tensor tx, tw, tw2, tb, to, tp;
    fs_tensor *const all[6] = {&tx, &tw, &tw2, &tb, &to, &tp};
    PyObject *out = NULL, *result = NULL;
    uintptr_t stream = 0;
    int64_t ldpre = 0;
    for (int i = 0; i < 6; i++) memset(all[i], 0, sizeof *all[i]);
    const char *wname = swiglu ? "w_gate" : "weight";
    const int packed = swiglu && w2_arg == Py_None;

    if (stream_arg != Py_None && fs_parse_stream(st, stream_arg, &stream) < 0) return NULL;
    if (fs_tensor_import(st, x_arg, "x", stream, FS_ROUTE_AUTO, FS_FLOATS, &tx) < 0) goto done;
    if (stream_arg == Py_None && tx.is_cuda && tx.source == FS_SRC_TORCH && fs_torch_current_stream(st, tx.device, &stream) < 0)
        goto done;
    if (stream_arg != Py_None && !tx.is_cuda) {
        PyErr_Format(PyExc_ValueError, "stream= applies to CUDA inputs, but x is on the CPU");
        goto done;
    }
    if (tx.ndim < 1) {
        PyErr_Format(PyExc_ValueError, "x must have at least 1 dimension [..., in_features], got a 0-D array");
        goto done;
    }
    if (refuse_grad(&tx, "x", fname) < 0 || fs_check_sizes(&tx, "x") < 0) goto done;
    int64_t M, ldx;
    const int64_t K = tx.shape[tx.ndim - 1];
    if (fs_as_rows(&tx, "x", &M, &ldx) < 0) goto done;

    if (fs_tensor_import(st, w_arg, wname, stream, FS_ROUTE_AUTO, FS_FLOATS, &tw) < 0 || refuse_grad(&tw, wname, fname) < 0 ||
        fs_check_weight(&tw, wname, &tx, K) < 0)
        goto done;
    int64_t N = tw.shape[0];
    if (packed) {
        if (N % 2) {
            PyErr_Format(PyExc_ValueError, "swiglu with one packed weight needs w_gate of shape (2 N, K) (gate rows, then up "
                         "rows), got an odd row count %lld", (long long)N);
            goto done;
        }
        N /= 2;
    } else if (swiglu) {
        if (fs_tensor_import(st, w2_arg, "w_up", stream, FS_ROUTE_AUTO, FS_FLOATS, &tw2) < 0 || refuse_grad(&tw2, "w_up", fname) < 0 ||
            fs_check_weight(&tw2, "w_up", &tx, K) < 0)
            goto done;
        if (tw2.shape[0] != N) {
            PyErr_Format(PyExc_ValueError, "w_up has %lld rows but w_gate has %lld: they must match", (long long)tw2.shape[0],
                         (long long)N);
            goto done;
        }
    }
    fs_dtype out_dtype;
    if (parse_out_dtype(st, dtype_arg, tx.dtype, &out_dtype) < 0 || fs_check_linear_device(&tx, out_dtype, N, K) < 0) goto done;
    if (fs_check_alignment(&tx, "x", tx.ndim - 1) < 0 || fs_check_alignment(&tw, wname, 1) < 0 ||
        (tw2.data && fs_check_alignment(&tw2, "w_up", 1) < 0))
        goto done;
    if (bias_arg != Py_None && (fs_tensor_import(st, bias_arg, "bias", stream, FS_ROUTE_AUTO, FS_FLOATS, &tb) < 0 ||
                                refuse_grad(&tb, "bias", fname) < 0 || check_bias(&tb, &tx, N) < 0))
        goto done;

    int64_t oshape[FS_MAX_NDIM];
    memcpy(oshape, tx.shape, sizeof(int64_t) * tx.ndim);
    oshape[tx.ndim - 1] = N;
    int64_t ldy;
    fs_tensor *inputs[4] = {&tx, &tw};
    const char *in_names[4] = {"x", wname};
    int n_in = 2;
    if (tw2.data) { inputs[n_in] = &tw2; in_names[n_in++] = "w_up"; }
    if (tb.data) { inputs[n_in] = &tb; in_names[n_in++] = "bias"; }
    if (pre_arg != Py_None) {
        /* the pre-activation, [..., N] (SwiGLU [..., 2N]: gate, then up) in x's dtype, for the backward */
        int64_t pshape[FS_MAX_NDIM], rows;
        memcpy(pshape, oshape, sizeof(int64_t) * tx.ndim);
        pshape[tx.ndim - 1] = swiglu ? 2 * N : N;
        if (out_dtype != tx.dtype) {
            PyErr_Format(PyExc_ValueError, "preactivation= needs the output in x's dtype %s, got out_dtype %s",
                         fs_dtype_name(tx.dtype), fs_dtype_name(out_dtype));
            goto done;
        }
        if (fs_tensor_import(st, pre_arg, "preactivation", stream, FS_ROUTE_AUTO, FS_FLOATS, &tp) < 0 ||
            fs_check_out(&tp, inputs, in_names, n_in, pshape, tx.ndim, tx.dtype) < 0 ||
            fs_as_rows(&tp, "preactivation", &rows, &ldpre) < 0)
            goto done;
    }
    if (out_arg != Py_None) {
        int64_t rows;
        if (fs_tensor_import(st, out_arg, "out", stream, FS_ROUTE_AUTO, FS_FLOATS, &to) < 0 ||
            fs_check_out(&to, inputs, in_names, n_in, oshape, tx.ndim, out_dtype) < 0 || fs_as_rows(&to, "out", &rows, &ldy) < 0)
            goto done;
        out = Py_NewRef(out_arg);
    } else {
        if (out_dtype == FS_BF16 && tx.source == FS_SRC_NUMPY) {
            PyErr_SetString(PyExc_TypeError, "out_dtype bfloat16 has no NumPy array type; pass out= or use another out_dtype");
            goto done;
        }
        if (!(out = fs_new_output(st, &tx, tx.ndim, oshape, out_dtype, stream, &to.data))) goto done;
        ldy = N;
    }

    fs_gemm_params p;
    memset(&p, 0, sizeof p);
    p.x = tx.data;
    p.w = tw.data;
    p.ldx = ldx;
    p.ldw = tw.strides[0];
    if (swiglu) {
        p.w2 = packed ? (const void *)(tw.data + N * tw.strides[0] * (int64_t)fs_dtype_itemsize(tw.dtype)) : (const void *)tw2.data;
        p.ldw2 = packed ? tw.strides[0] : tw2.strides[0];
    }
    p.bias = tb.data;
    p.bias_dtype = tb.dtype;
    p.y = to.data;
    p.ldy = ldy;
    p.M = (int)M;
    p.N = (int)N;
    p.K = (int)K;
    p.dtype = tx.dtype;
    p.out_dtype = out_dtype;
    p.act = act;
    p.swiglu = (unsigned char)swiglu;
    fs_tensor *const arrays[6] = {&tx, &tw, &tw2, &tb, &to, &tp};
    if ((tp.data ? run_with_preactivation(st, &p, tp.data, ldpre, arrays, 6, stream) : fs_run_gemm(st, &p, arrays, 6, stream)) < 0)
        goto done;
    result = Py_NewRef(out);
done:
    for (int i = 0; i < 6; i++) fs_tensor_release(all[i]);
    Py_XDECREF(out);
    return result;
}

PyObject *fs_linear(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"x", "weight", "bias", "activation", "out", "out_dtype", "preactivation", "stream", NULL};
    PyObject *x, *w, *bias = Py_None, *act_arg = Py_None, *out = Py_None, *dtype = Py_None, *pre = Py_None, *stream = Py_None;
    fs_activation act;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O$OOOOO:linear", kwlist, &x, &w, &bias, &act_arg, &out, &dtype, &pre,
                                     &stream))
        return NULL;
    if (fs_parse_activation(act_arg, &act) < 0) return NULL;
    return gemm_call(module, "linear", x, w, NULL, bias, act, 0, out, dtype, pre, stream);
}

PyObject *fs_swiglu(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"x", "w_gate", "w_up", "out", "out_dtype", "preactivation", "stream", NULL};
    PyObject *x, *wg, *wu = Py_None, *out = Py_None, *dtype = Py_None, *pre = Py_None, *stream = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O$OOOO:swiglu", kwlist, &x, &wg, &wu, &out, &dtype, &pre, &stream))
        return NULL;
    return gemm_call(module, "swiglu", x, wg, wu, Py_None, FS_ACT_NONE, 1, out, dtype, pre, stream);
}
