/* flashsci.linear_backward(dy, x, weight, *, preactivation, activation, bias_grad, dx, dweight, dbias, stream) and
 * flashsci.swiglu_backward(dy, x, w_gate, w_up=None, *, preactivation, dx, dw_gate, dw_up, stream): the gradients
 * of linear() and swiglu() as two products and an elementwise pass, all on the caller's stream:
 *   dh = dy act'(h) (SwiGLU: dg = dy u silu'(g), du = dy silu(g)), db = column sums of dh   (gemm/activation.h)
 *   dx = dh W   (W read transposed: no copy)                                                 (gemm/params.h)
 *   dW = dh^T x (both read transposed)
 * h is the pre-activation the forward kept (linear(..., preactivation=)). Checks as in linear.c. */
#include "flashsci.h"

enum { T_DY, T_X, T_W, T_W2, T_PRE, T_DX, T_DW, T_DW2, T_DB, T_COUNT };

/* The arrays of one call and what the checks derive from them. */
typedef struct {
    fs_tensor t[T_COUNT];
    PyObject *obj[T_COUNT]; /* the gradients returned (new references) */
    int64_t M, N, K, ld[T_COUNT];
    uintptr_t stream;
} grad_call;

/* dy or the pre-activation: x's dtype and device, x's leading dims, then cols; its row stride into *ld. */
static int check_rows_like_x(const fs_tensor *t, const char *name, const fs_tensor *x, int64_t cols, int64_t *ld)
{
    char b1[160], b2[160];
    int64_t shape[FS_MAX_NDIM], rows;
    memcpy(shape, x->shape, sizeof(int64_t) * x->ndim);
    shape[x->ndim - 1] = cols;
    if (fs_check_like_x(t, name, x) < 0) return -1;
    if (t->ndim != x->ndim || memcmp(t->shape, shape, sizeof(int64_t) * x->ndim)) {
        PyErr_Format(PyExc_ValueError, "%s has shape %s but must be %s (x's leading dims, then %lld)", name,
                     fs_shape_str(t->shape, t->ndim, b1, sizeof b1), fs_shape_str(shape, x->ndim, b2, sizeof b2), (long long)cols);
        return -1;
    }
    return fs_check_sizes(t, name) < 0 || fs_as_rows(t, name, &rows, ld) < 0 || fs_check_alignment(t, name, t->ndim - 1) < 0
               ? -1 : 0;
}

/* A gradient into slot i: the caller's array (checked like out=; with f32_ok, float32 is accepted too) or a new
 * contiguous one of shape and dtype; its row stride into c->ld[i]. */
static int gradient(fs_state *st, grad_call *c, int i, PyObject *given, const char *name, int ndim, const int64_t *shape,
                    fs_dtype dtype, int f32_ok)
{
    fs_tensor *t = &c->t[i];
    int64_t rows;
    if (given == Py_None) {
        if (fs_output_array(st, NULL, name, &c->t[T_X], ndim, shape, dtype, NULL, NULL, 0, c->stream, t, &c->obj[i]) < 0)
            return -1;
        return fs_as_rows(t, name, &rows, &c->ld[i]);
    }
    /* no overlap with an input or with a gradient already placed */
    static const char *const slot_names[T_COUNT] = {"dy", "x", "weight", "w_up", "preactivation", "dx", "dweight", "dw_up",
                                                    "dbias"};
    fs_tensor *inputs[T_COUNT] = {&c->t[T_X]};
    const char *names[T_COUNT] = {"x"};
    int n = 1;
    for (int j = 0; j < T_COUNT; j++)
        if (j != T_X && j != i && c->t[j].data) {
            inputs[n] = &c->t[j];
            names[n++] = slot_names[j];
        }
    if (fs_tensor_import(st, given, name, c->stream, FS_ROUTE_AUTO, FS_FLOATS, t) < 0) return -1;
    if (f32_ok && t->dtype == FS_F32) dtype = FS_F32;
    if (fs_check_out(t, inputs, names, n, shape, ndim, dtype) < 0 || fs_as_rows(t, name, &rows, &c->ld[i]) < 0) return -1;
    c->obj[i] = Py_NewRef(given);
    return 0;
}

/* dy, x and the weights imported and checked (w2_arg NULL: linear; None: packed SwiGLU); c->M, N, K set. */
static int import_inputs(fs_state *st, grad_call *c, PyObject *dy_arg, PyObject *x_arg, PyObject *w_arg, PyObject *w2_arg,
                         PyObject *stream_arg, int swiglu)
{
    fs_tensor *x = &c->t[T_X], *w = &c->t[T_W];
    const char *wname = swiglu ? "w_gate" : "weight";
    if (stream_arg != Py_None && fs_parse_stream(st, stream_arg, &c->stream) < 0) return -1;
    if (fs_tensor_import(st, x_arg, "x", c->stream, FS_ROUTE_AUTO, FS_FLOATS, x) < 0) return -1;
    if (stream_arg == Py_None && x->is_cuda && x->source == FS_SRC_TORCH && fs_torch_current_stream(st, x->device, &c->stream) < 0)
        return -1;
    if (stream_arg != Py_None && !x->is_cuda) {
        PyErr_SetString(PyExc_ValueError, "stream= applies to CUDA inputs, but x is on the CPU");
        return -1;
    }
    if (x->ndim < 1) {
        PyErr_SetString(PyExc_ValueError, "x must have at least 1 dimension [..., in_features], got a 0-D array");
        return -1;
    }
    c->K = x->shape[x->ndim - 1];
    if (fs_check_sizes(x, "x") < 0 || fs_as_rows(x, "x", &c->M, &c->ld[T_X]) < 0 || fs_check_alignment(x, "x", x->ndim - 1) < 0)
        return -1;
    if (fs_tensor_import(st, w_arg, wname, c->stream, FS_ROUTE_AUTO, FS_FLOATS, w) < 0 || fs_check_weight(w, wname, x, c->K) < 0 ||
        fs_check_alignment(w, wname, 1) < 0)
        return -1;
    c->N = w->shape[0];
    if (swiglu && w2_arg == Py_None) {
        if (c->N % 2) {
            PyErr_Format(PyExc_ValueError, "swiglu_backward with one packed weight needs w_gate of shape (2 N, K) (gate rows, "
                         "then up rows), got an odd row count %lld", (long long)c->N);
            return -1;
        }
        c->N /= 2;
    } else if (swiglu) {
        fs_tensor *w2 = &c->t[T_W2];
        if (fs_tensor_import(st, w2_arg, "w_up", c->stream, FS_ROUTE_AUTO, FS_FLOATS, w2) < 0 ||
            fs_check_weight(w2, "w_up", x, c->K) < 0 || fs_check_alignment(w2, "w_up", 1) < 0)
            return -1;
        if (w2->shape[0] != c->N) {
            PyErr_Format(PyExc_ValueError, "w_up has %lld rows but w_gate has %lld: they must match", (long long)w2->shape[0],
                         (long long)c->N);
            return -1;
        }
    }
    if (fs_check_linear_device(x, x->dtype, c->N, c->K) < 0) return -1;
    return fs_tensor_import(st, dy_arg, "dy", c->stream, FS_ROUTE_AUTO, FS_FLOATS, &c->t[T_DY]) < 0 ||
           check_rows_like_x(&c->t[T_DY], "dy", x, c->N, &c->ld[T_DY]) < 0 ? -1 : 0;
}

/* The pre-activation (cols per row) or, when pre_arg is None and required, a ValueError naming why. */
static int import_preactivation(fs_state *st, grad_call *c, PyObject *pre_arg, int64_t cols, const char *why)
{
    if (pre_arg == Py_None) {
        if (!why) return 0;
        PyErr_Format(PyExc_ValueError, "preactivation= is required %s: pass the array that the forward filled "
                     "(linear(..., preactivation=h) / swiglu(..., preactivation=h))", why);
        return -1;
    }
    return fs_tensor_import(st, pre_arg, "preactivation", c->stream, FS_ROUTE_AUTO, FS_FLOATS, &c->t[T_PRE]) < 0 ||
           check_rows_like_x(&c->t[T_PRE], "preactivation", &c->t[T_X], cols, &c->ld[T_PRE]) < 0 ? -1 : 0;
}

/* A scratch array of rows x cols in x's dtype on x's device: its data in *data, a new reference in *obj. */
static int scratch(fs_state *st, grad_call *c, int64_t rows, int64_t cols, void **data, PyObject **obj)
{
    const int64_t shape[2] = {rows, cols};
    char *ptr = NULL;
    *obj = fs_new_output(st, &c->t[T_X], 2, shape, c->t[T_X].dtype, c->stream, &ptr);
    *data = ptr;
    return *obj ? 0 : -1;
}

/* dy = dh W for dh [M, hcols] (rows ldh apart) against W^T = weight rows (w2: the second half's rows). */
static fs_gemm_params dx_product(const grad_call *c, const void *dh, int64_t ldh, int64_t hcols)
{
    fs_gemm_params p;
    memset(&p, 0, sizeof p);
    p.x = dh;
    p.ldx = ldh;
    p.w = c->t[T_W].data;
    p.ldw = c->t[T_W].strides[0];
    p.w2 = c->t[T_W2].data;
    p.ldw2 = c->t[T_W2].data ? c->t[T_W2].strides[0] : 0;
    p.trans_w = 1;
    p.y = c->t[T_DX].data;
    p.ldy = c->ld[T_DX];
    p.M = (int)c->M;
    p.N = (int)c->K;
    p.K = (int)hcols;
    p.dtype = p.out_dtype = c->t[T_X].dtype;
    return p;
}

/* dW = dh^T x for the rows columns of dh from dh (rows ldh apart) into dw (rows ldw apart). */
static fs_gemm_params dw_product(const grad_call *c, const void *dh, int64_t ldh, int64_t rows, void *dw, int64_t ldw)
{
    fs_gemm_params p;
    memset(&p, 0, sizeof p);
    p.x = dh;
    p.ldx = ldh;
    p.trans_x = 1;
    p.w = c->t[T_X].data;
    p.ldw = c->ld[T_X];
    p.trans_w = 1;
    p.y = dw;
    p.ldy = ldw;
    p.M = (int)rows;
    p.N = (int)c->K;
    p.K = (int)c->M;
    p.dtype = p.out_dtype = c->t[T_X].dtype;
    return p;
}

/* Run a product, or zero its output when there is nothing to sum (K = 0: no rows for dW, no columns of dy for dx). */
static int run_product(fs_state *st, grad_call *c, const fs_gemm_params *p)
{
    fs_tensor *const device[1] = {&c->t[T_X]}; /* where to run; the producers were waited for */
    if (p->K > 0 || !c->t[T_X].is_cuda) return fs_run_gemm(st, p, device, 0, c->stream);
    const size_t item = fs_dtype_itemsize(p->out_dtype);
    return fs_gpu_zero(p->y, (size_t)p->ldy * item, (size_t)p->N * item, (size_t)p->M, c->t[T_X].device, c->stream);
}

/* Release the arrays and the gradients not returned. */
static void grad_call_clear(grad_call *c)
{
    for (int i = 0; i < T_COUNT; i++) {
        fs_tensor_release(&c->t[i]);
        Py_XDECREF(c->obj[i]);
    }
}

PyObject *fs_linear_backward(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"dy", "x", "weight", "preactivation", "activation", "bias_grad", "dx", "dweight", "dbias",
                             "stream", NULL};
    PyObject *dy_arg, *x_arg, *w_arg, *pre_arg = Py_None, *act_arg = Py_None, *dx_arg = Py_None, *dw_arg = Py_None,
             *db_arg = Py_None, *stream_arg = Py_None, *result = NULL, *dh_obj = NULL;
    int bias_grad = 0;
    fs_activation act;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|$OOpOOOO:linear_backward", kwlist, &dy_arg, &x_arg, &w_arg, &pre_arg,
                                     &act_arg, &bias_grad, &dx_arg, &dw_arg, &db_arg, &stream_arg))
        return NULL;
    if (fs_parse_activation(act_arg, &act) < 0) return NULL;
    if (db_arg != Py_None && !bias_grad) {
        PyErr_SetString(PyExc_ValueError, "dbias= given but bias_grad is False: pass bias_grad=True to compute it");
        return NULL;
    }
    fs_state *st = fs_get_state(module);
    grad_call c;
    memset(&c, 0, sizeof c);
    if (import_inputs(st, &c, dy_arg, x_arg, w_arg, NULL, stream_arg, 0) < 0 ||
        import_preactivation(st, &c, pre_arg, c.N, act != FS_ACT_NONE ? "with an activation" : NULL) < 0)
        goto done;
    const fs_tensor *x = &c.t[T_X];
    const fs_dtype dt = x->dtype;
    const int64_t wshape[2] = {c.N, c.K};
    if (gradient(st, &c, T_DX, dx_arg, "dx", x->ndim, x->shape, dt, 0) < 0 ||
        gradient(st, &c, T_DW, dw_arg, "dweight", 2, wshape, dt, 0) < 0 ||
        (bias_grad && gradient(st, &c, T_DB, db_arg, "dbias", 1, wshape, dt, 1) < 0))
        goto done;
    fs_tensor *all[T_COUNT];
    for (int i = 0; i < T_COUNT; i++) all[i] = &c.t[i];
    if (x->is_cuda && fs_wait_producers(all, T_COUNT, c.stream) < 0) goto done;

    /* dh = dy act'(h), and db: the elementwise pass; without an activation dh is dy itself */
    const void *dh = c.t[T_DY].data;
    int64_t ldh = c.ld[T_DY];
    if (act != FS_ACT_NONE || bias_grad) {
        fs_act_params a;
        memset(&a, 0, sizeof a);
        a.h = act != FS_ACT_NONE ? c.t[T_PRE].data : NULL;
        a.ldh = c.ld[T_PRE];
        a.dy = c.t[T_DY].data;
        a.lddy = c.ld[T_DY];
        if (act != FS_ACT_NONE) {
            if (scratch(st, &c, c.M, c.N, &a.out, &dh_obj) < 0) goto done;
            a.ldo = c.N;
            dh = a.out;
            ldh = c.N;
        }
        a.dbias = bias_grad ? c.t[T_DB].data : NULL;
        a.dbias_dtype = c.t[T_DB].dtype;
        a.M = (int)c.M;
        a.N = (int)c.N;
        a.dtype = dt;
        a.act = act;
        a.backward = 1;
        if (fs_run_activation(st, &a, all, 0, c.stream) < 0) goto done;
    }
    const fs_gemm_params pdx = dx_product(&c, dh, ldh, c.N);
    const fs_gemm_params pdw = dw_product(&c, dh, ldh, c.N, c.t[T_DW].data, c.ld[T_DW]);
    if (run_product(st, &c, &pdx) < 0 || run_product(st, &c, &pdw) < 0) goto done;
    result = PyTuple_Pack(3, c.obj[T_DX], c.obj[T_DW], bias_grad ? c.obj[T_DB] : Py_None);
done:
    Py_XDECREF(dh_obj);
    grad_call_clear(&c);
    return result;
}

PyObject *fs_swiglu_backward(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"dy", "x", "w_gate", "w_up", "preactivation", "dx", "dw_gate", "dw_up", "stream", NULL};
    PyObject *dy_arg, *x_arg, *wg_arg, *wu_arg = Py_None, *pre_arg = Py_None, *dx_arg = Py_None, *dwg_arg = Py_None,
             *dwu_arg = Py_None, *stream_arg = Py_None, *result = NULL, *dh_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|O$OOOOO:swiglu_backward", kwlist, &dy_arg, &x_arg, &wg_arg, &wu_arg,
                                     &pre_arg, &dx_arg, &dwg_arg, &dwu_arg, &stream_arg))
        return NULL;
    const int packed = wu_arg == Py_None;
    if (packed && dwu_arg != Py_None) {
        PyErr_SetString(PyExc_ValueError, "dw_up= given but the weight is packed (w_up=None): its gradient is dw_gate, "
                        "of w_gate's shape (2 N, K)");
        return NULL;
    }
    fs_state *st = fs_get_state(module);
    grad_call c;
    memset(&c, 0, sizeof c);
    if (import_inputs(st, &c, dy_arg, x_arg, wg_arg, wu_arg, stream_arg, 1) < 0 ||
        import_preactivation(st, &c, pre_arg, 2 * c.N, "(the gate and up projections)") < 0)
        goto done;
    const fs_tensor *x = &c.t[T_X];
    const fs_dtype dt = x->dtype;
    const int64_t wshape[2] = {packed ? 2 * c.N : c.N, c.K};
    if (gradient(st, &c, T_DX, dx_arg, "dx", x->ndim, x->shape, dt, 0) < 0 ||
        gradient(st, &c, T_DW, dwg_arg, "dw_gate", 2, wshape, dt, 0) < 0 ||
        (!packed && gradient(st, &c, T_DW2, dwu_arg, "dw_up", 2, wshape, dt, 0) < 0))
        goto done;
    fs_tensor *all[T_COUNT];
    for (int i = 0; i < T_COUNT; i++) all[i] = &c.t[i];
    if (x->is_cuda && fs_wait_producers(all, T_COUNT, c.stream) < 0) goto done;

    /* (dg | du) [M, 2N] by the elementwise pass, then dx = dg Wg + du Wu as one product (K = 2N) */
    void *dgu;
    if (scratch(st, &c, c.M, 2 * c.N, &dgu, &dh_obj) < 0) goto done;
    if (c.M > 0) {
        fs_act_params a;
        memset(&a, 0, sizeof a);
        a.h = c.t[T_PRE].data;
        a.ldh = c.ld[T_PRE];
        a.dy = c.t[T_DY].data;
        a.lddy = c.ld[T_DY];
        a.out = dgu;
        a.ldo = 2 * c.N;
        a.M = (int)c.M;
        a.N = (int)c.N;
        a.dtype = dt;
        a.swiglu = 1;
        a.backward = 1;
        if (fs_run_activation(st, &a, all, 0, c.stream) < 0) goto done;
    }
    const fs_gemm_params pdx = dx_product(&c, dgu, 2 * c.N, 2 * c.N);
    if (run_product(st, &c, &pdx) < 0) goto done;
    /* dWg = dg^T x and dWu = du^T x: one product into a packed [2N, K] gradient, or one each */
    const size_t half = (size_t)c.N * fs_dtype_itemsize(dt);
    fs_gemm_params pdw = dw_product(&c, dgu, 2 * c.N, packed ? 2 * c.N : c.N, c.t[T_DW].data, c.ld[T_DW]);
    if (run_product(st, &c, &pdw) < 0) goto done;
    if (!packed) {
        pdw = dw_product(&c, (char *)dgu + half, 2 * c.N, c.N, c.t[T_DW2].data, c.ld[T_DW2]);
        if (run_product(st, &c, &pdw) < 0) goto done;
    }
    result = packed ? PyTuple_Pack(2, c.obj[T_DX], c.obj[T_DW]) : PyTuple_Pack(3, c.obj[T_DX], c.obj[T_DW], c.obj[T_DW2]);
done:
    Py_XDECREF(dh_obj);
    grad_call_clear(&c);
    return result;
}
