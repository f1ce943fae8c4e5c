/* flashsci.attention_backward and flashsci.attention_varlen_backward: the gradients of attention given the forward's
 * output and logsumexp. Argument parsing, the checks that turn bad input into clear errors, the gradients'
 * allocation in the caller's framework, and dispatch to the CPU or CUDA kernels. */
#include "flashsci.h"

/* The arrays and options of one backward call. */
typedef struct {
    PyObject *dout, *q, *k, *v, *out, *lse, *kpm, *seqlens, *bias, *dq, *dk, *dv, *stream;
    fs_attn_options opt;
    fs_t5_args t5;
    int bshd, bias_grad, t5_grad, deterministic;
} bwd_args;

/* The tensors a backward call imports: inputs, optional arrays and the gradients it writes. */
enum { T_DOUT, T_Q, T_K, T_V, T_OUT, T_LSE, T_KPM, T_LENS, T_BIAS, T_T5, T_CQ, T_CK, T_DQ, T_DK, T_DV, T_COUNT };

/* Options shared by both entry points: scale, rotary, T5 (parsed), and the gradient flags. */
static int parse_common(PyObject *scale, PyObject *rotary, PyObject *t5, bwd_args *a)
{
    if (fs_parse_scale(scale, &a->opt.has_scale, &a->opt.scale) < 0) return -1;
    if (fs_parse_rotary(rotary, &a->opt.rotary, &a->opt.rotary_base) < 0) return -1;
    if (t5 != Py_None && fs_parse_t5(t5, &a->t5) < 0) return -1;
    if (a->t5_grad && !a->t5.table) {
        PyErr_SetString(PyExc_ValueError, "t5_grad=True needs t5_bias");
        return -1;
    }
    if (a->bias_grad && !a->bias) {
        PyErr_SetString(PyExc_ValueError, "bias_grad=True needs bias");
        return -1;
    }
    return 0;
}

/* dout and out: the shape and dtype of the forward's output (q's), on q's device, last dim contiguous. */
static int check_like_output(const fs_tensor *x, const char *name, const fs_tensor *q)
{
    char b1[160], b2[160], d1[32], d2[32];
    if (x->dtype != q->dtype) {
        PyErr_Format(PyExc_TypeError, "%s has dtype %s but q has %s", name, fs_dtype_name(x->dtype), fs_dtype_name(q->dtype));
        return -1;
    }
    if (x->is_cuda != q->is_cuda || x->device != q->device) {
        PyErr_Format(PyExc_ValueError, "%s is on %s but q is on %s", name, fs_device_str(x, d1, sizeof d1),
                     fs_device_str(q, d2, sizeof d2));
        return -1;
    }
    if (x->ndim != q->ndim || memcmp(x->shape, q->shape, sizeof(int64_t) * q->ndim)) {
        PyErr_Format(PyExc_ValueError, "%s has shape %s but the attention output has q's shape %s", name,
                     fs_shape_str(x->shape, x->ndim, b1, sizeof b1), fs_shape_str(q->shape, q->ndim, b2, sizeof b2));
        return -1;
    }
    if (fs_check_sizes(x, name) < 0) return -1;
    if (x->strides[x->ndim - 1] != 1 && x->shape[x->ndim - 1] > 1 && fs_numel(x) > 0) {
        PyErr_Format(PyExc_ValueError, "%s: the last dimension must be contiguous (stride 1), got stride %lld; %s", name,
                     (long long)x->strides[x->ndim - 1], fs_contiguous_hint(x));
        return -1;
    }
    return fs_check_alignment(x, name, x->ndim - 1);
}

/* lse: the forward's logsumexp, float32 (float64 for float64 inputs), of shape lshape, last dim contiguous. */
static int check_lse(const fs_tensor *l, const fs_tensor *q, const int64_t *lshape, int ndim)
{
    char b1[160], b2[160];
    const fs_dtype want = q->dtype == FS_F64 ? FS_F64 : FS_F32;
    if (fs_check_aux(l, "lse", q) < 0) return -1;
    if (l->dtype != want) {
        PyErr_Format(PyExc_TypeError, "lse has dtype %s; the forward returns %s for %s inputs (return_lse=True)",
                     fs_dtype_name(l->dtype), fs_dtype_name(want), fs_dtype_name(q->dtype));
        return -1;
    }
    if (l->ndim != ndim || memcmp(l->shape, lshape, sizeof(int64_t) * ndim)) {
        PyErr_Format(PyExc_ValueError, "lse has shape %s but the forward's logsumexp has shape %s",
                     fs_shape_str(l->shape, l->ndim, b1, sizeof b1), fs_shape_str(lshape, ndim, b2, sizeof b2));
        return -1;
    }
    if (l->strides[ndim - 1] != 1 && lshape[ndim - 1] > 1 && fs_numel(l) > 0) {
        PyErr_Format(PyExc_ValueError, "lse: the last dimension must be contiguous (stride 1), got stride %lld; %s",
                     (long long)l->strides[ndim - 1], fs_contiguous_hint(l));
        return -1;
    }
    return 0;
}

/* A gradient: the caller's array (checked like out=) or a new one shaped like its input x; *obj gets a new reference. */
static int gradient(fs_state *st, PyObject *given, const char *name, fs_tensor *x, fs_tensor *const *inputs,
                    const char *const *names, int n, uintptr_t stream, fs_tensor *t, PyObject **obj)
{
    return fs_output_array(st, given, name, x, x->ndim, x->shape, x->dtype, inputs, names, n, stream, t, obj);
}

/* dbias in the bias's own shape and dtype (contiguous), and its dims and strides right-aligned to (B, H, Sq, Sk). */
static PyObject *new_dbias(fs_state *st, const fs_tensor *bias, const fs_tensor *q, uintptr_t stream, fs_attn_bwd_params *g)
{
    char *data;
    PyObject *obj = fs_new_output(st, q, bias->ndim, bias->shape, bias->dtype, stream, &data);
    if (!obj) return NULL;
    int64_t compact = 1;
    for (int d = 3; d >= 0; d--) {
        const int i = bias->ndim - 4 + d;
        g->dbias_dims[d] = i >= 0 ? bias->shape[i] : 1;
        g->dbias_strides[d] = i >= 0 && bias->shape[i] > 1 ? compact : 0;
        compact *= g->dbias_dims[d];
    }
    g->dbias = data;
    return obj;
}

/* Run the gradients: the CUDA kernels on stream (after the streams the arrays named), else the CPU kernel. */
static int run_backward(fs_state *st, const fs_attn_bwd_params *g, fs_tensor *const *arrays, int n, uintptr_t stream)
{
    if (arrays[T_Q]->is_cuda)
        return fs_wait_producers(arrays, n, stream) < 0 ? -1 : fs_gpu_attention_backward(g, arrays[T_Q]->device, stream, &st->choice);
    return fs_cpu_run_backward(g, st->num_threads);
}

/* The result tuple (dq, dk, dv[, dbias][, dtable]). */
static PyObject *result_tuple(PyObject *dq, PyObject *dk, PyObject *dv, PyObject *dbias, PyObject *dtable)
{
    PyObject *items[5] = {dq, dk, dv, dbias, dtable};
    int n = 3;
    if (dbias) items[n++] = dbias;
    if (dtable) items[n++] = dtable;
    PyObject *r = PyTuple_New(n);
    for (int i = 0; r && i < n; i++) PyTuple_SET_ITEM(r, i, Py_NewRef(items[i]));
    return r;
}

/* Limits of the CUDA backward: the T5 gradient's bucket count. */
static int cuda_unsupported(const bwd_args *a, const fs_attn_params *p)
{
    if (a->t5_grad && p->t5_buckets > 1024) {
        PyErr_Format(PyExc_ValueError, "CUDA attention backward: t5_grad supports up to 1024 buckets, got %d", p->t5_buckets);
        return -1;
    }
    return 0;
}

/* Shared tail of both entry points: T5 table and its gradient, the gradients dq, dk, dv, the run. g->p is built. */
static PyObject *finish(fs_state *st, bwd_args *a, fs_tensor *t, fs_attn_bwd_params *g, uintptr_t stream)
{
    PyObject *dq = NULL, *dk = NULL, *dv = NULL, *dbias = NULL, *dtable = NULL, *result = NULL;
    fs_attn_params *p = &g->p;
    fs_tensor *const inputs[6] = {&t[T_DOUT], &t[T_Q], &t[T_K], &t[T_V], &t[T_OUT], &t[T_LSE]};
    static const char *const in_names[6] = {"dout", "q", "k", "v", "out", "lse"};
    if (a->t5.table && (fs_tensor_import(st, a->t5.table, "t5_bias table", stream, FS_ROUTE_AUTO, FS_FLOATS, &t[T_T5]) < 0 ||
                        fs_check_t5(&t[T_T5], &t[T_Q], &a->t5, p) < 0))
        goto done;
    if (gradient(st, a->dq, "dq", &t[T_Q], inputs, in_names, 6, stream, &t[T_DQ], &dq) < 0 ||
        gradient(st, a->dk, "dk", &t[T_K], inputs, in_names, 6, stream, &t[T_DK], &dk) < 0 ||
        gradient(st, a->dv, "dv", &t[T_V], inputs, in_names, 6, stream, &t[T_DV], &dv) < 0)
        goto done;
    if (t[T_Q].is_cuda && cuda_unsupported(a, p) < 0) goto done;
    if (a->bias_grad && !(dbias = new_dbias(st, &t[T_BIAS], &t[T_Q], stream, g))) goto done;
    if (a->t5_grad) {
        const int64_t shape[2] = {p->H, a->t5.buckets};
        char *data;
        if (!(dtable = fs_new_output(st, &t[T_Q], 2, shape, FS_F32, stream, &data))) goto done;
        g->dtable = (float *)data;
        g->dtable_sh = a->t5.buckets;
    }
    int ib, ih, is;
    fs_layout_dims(a->bshd, &ib, &ih, &is);
    const fs_operand dqo = p->cu_seqlens_q ? fs_operand_packed(&t[T_DQ]) : fs_operand_padded(&t[T_DQ], a->bshd);
    const fs_operand dko = p->cu_seqlens_q ? fs_operand_packed(&t[T_DK]) : fs_operand_padded(&t[T_DK], a->bshd);
    const fs_operand dvo = p->cu_seqlens_q ? fs_operand_packed(&t[T_DV]) : fs_operand_padded(&t[T_DV], a->bshd);
    g->dq = dqo.data; g->dq_sb = dqo.sb; g->dq_sh = dqo.sh; g->dq_ss = dqo.ss;
    g->dk = dko.data; g->dk_sb = dko.sb; g->dk_sh = dko.sh; g->dk_ss = dko.ss;
    g->dv = dvo.data; g->dv_sb = dvo.sb; g->dv_sh = dvo.sh; g->dv_ss = dvo.ss;
    g->deterministic = a->deterministic;
    fs_tensor *arrays[T_COUNT];
    for (int i = 0; i < T_COUNT; i++) arrays[i] = &t[i];
    if (run_backward(st, g, arrays, T_COUNT, stream) < 0) goto done;
    result = result_tuple(dq, dk, dv, dbias, dtable);
done:
    Py_XDECREF(dq);
    Py_XDECREF(dk);
    Py_XDECREF(dv);
    Py_XDECREF(dbias);
    Py_XDECREF(dtable);
    return result;
}

/* Import the arrays common to both entry points (dout, q, k, v, out, lse), q first to learn the stream. */
static int import_common(fs_state *st, bwd_args *a, fs_tensor *t, uintptr_t *stream)
{
    if (a->stream && fs_parse_stream(st, a->stream, stream) < 0) return -1;
    if (fs_tensor_import(st, a->q, "q", *stream, FS_ROUTE_AUTO, FS_FLOATS, &t[T_Q]) < 0) return -1;
    if (!a->stream && t[T_Q].is_cuda && t[T_Q].source == FS_SRC_TORCH && fs_torch_current_stream(st, t[T_Q].device, stream) < 0)
        return -1;
    if (a->stream && !t[T_Q].is_cuda) {
        PyErr_SetString(PyExc_ValueError, "stream= applies to CUDA inputs, but q, k and v are on the CPU");
        return -1;
    }
    if (fs_tensor_import(st, a->k, "k", *stream, FS_ROUTE_AUTO, FS_FLOATS, &t[T_K]) < 0 ||
        fs_tensor_import(st, a->v, "v", *stream, FS_ROUTE_AUTO, FS_FLOATS, &t[T_V]) < 0 ||
        fs_tensor_import(st, a->dout, "dout", *stream, FS_ROUTE_AUTO, FS_FLOATS, &t[T_DOUT]) < 0 ||
        fs_tensor_import(st, a->out, "out", *stream, FS_ROUTE_AUTO, FS_FLOATS, &t[T_OUT]) < 0 ||
        fs_tensor_import(st, a->lse, "lse", *stream, FS_ROUTE_AUTO, (1u << FS_F32) | (1u << FS_F64), &t[T_LSE]) < 0)
        return -1;
    return 0;
}

/* The checks both entry points share once q, k, v passed their layout's: dout, out, options, limits. */
static int check_common(bwd_args *a, fs_tensor *t, int64_t D, int64_t keys)
{
    if (check_like_output(&t[T_DOUT], "dout", &t[T_Q]) < 0 || check_like_output(&t[T_OUT], "out", &t[T_Q]) < 0) return -1;
    if (fs_check_rotary(a->opt.rotary, D) < 0) return -1;
    if ((a->opt.has_scale && fs_check_scale(a->opt.scale, t[T_Q].dtype) < 0) || fs_check_keys(keys, t[T_Q].dtype, "Sk (keys per row)") < 0)
        return -1;
    return 0;
}

PyObject *fs_attention_backward(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"dout", "q", "k", "v", "out", "lse", "causal", "scale", "layout", "key_padding_mask",
                             "seqlens", "bias", "t5_bias", "rotary", "dq", "dk", "dv", "bias_grad", "t5_grad",
                             "deterministic", "stream", NULL};
    fs_state *st = fs_get_state(module);
    bwd_args a;
    PyObject *scale = Py_None, *layout = Py_None, *t5 = Py_None, *rotary = Py_None, *result = NULL;
    fs_tensor t[T_COUNT];
    uintptr_t stream = 0;
    memset(&a, 0, sizeof a);
    memset(t, 0, sizeof t);
    a.kpm = a.seqlens = a.bias = a.dq = a.dk = a.dv = a.stream = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO|$pOOOOOOOOOOpppO:attention_backward", kwlist, &a.dout, &a.q,
                                     &a.k, &a.v, &a.out, &a.lse, &a.opt.causal, &scale, &layout, &a.kpm, &a.seqlens,
                                     &a.bias, &t5, &rotary, &a.dq, &a.dk, &a.dv, &a.bias_grad, &a.t5_grad,
                                     &a.deterministic, &a.stream))
        return NULL;
    PyObject **opt_args[] = {&a.kpm, &a.seqlens, &a.bias, &a.dq, &a.dk, &a.dv, &a.stream};
    for (size_t i = 0; i < sizeof opt_args / sizeof *opt_args; i++)
        if (*opt_args[i] == Py_None) *opt_args[i] = NULL;
    if (layout != Py_None) {
        if (!PyUnicode_Check(layout)) {
            PyErr_Format(PyExc_TypeError, "layout must be a str ('bhsd' or 'bshd'), got %.100s", Py_TYPE(layout)->tp_name);
            return NULL;
        }
        if (!PyUnicode_CompareWithASCIIString(layout, "bshd")) a.bshd = 1;
        else if (PyUnicode_CompareWithASCIIString(layout, "bhsd"))
            return PyErr_Format(PyExc_ValueError, "layout must be 'bhsd' (torch SDPA) or 'bshd' (FlashAttention), got %R", layout);
    }
    if (parse_common(scale, rotary, t5, &a) < 0) return NULL;
    if (import_common(st, &a, t, &stream) < 0) goto done;
    fs_tensor *const qkv[3] = {&t[T_Q], &t[T_K], &t[T_V]};
    if (fs_check_padded_qkv(a.bshd, qkv) < 0) goto done;
    int ib, ih, is;
    fs_layout_dims(a.bshd, &ib, &ih, &is);
    const int64_t lshape[3] = {t[T_Q].shape[ib], t[T_Q].shape[ih], t[T_Q].shape[is]};
    if (check_common(&a, t, t[T_Q].shape[3], t[T_K].shape[is]) < 0 || check_lse(&t[T_LSE], &t[T_Q], lshape, 3) < 0) goto done;
    fs_attn_bwd_params g;
    memset(&g, 0, sizeof g);
    fs_attn_params *p = &g.p;
    fs_attn_params_build(p, &a.opt, (int)t[T_Q].shape[ib], (int)t[T_Q].shape[ih], (int)t[T_K].shape[ih],
                         (int)t[T_Q].shape[is], (int)t[T_K].shape[is], (int)t[T_Q].shape[3], t[T_Q].dtype,
                         fs_operand_padded(&t[T_Q], a.bshd), fs_operand_padded(&t[T_K], a.bshd),
                         fs_operand_padded(&t[T_V], a.bshd), fs_operand_padded(&t[T_OUT], a.bshd));
    p->kv_group = t[T_K].shape[ih] ? (int)(t[T_Q].shape[ih] / t[T_K].shape[ih]) : 1; /* dk, dv per given K/V head */
    p->lse = t[T_LSE].data;
    p->lse_sb = t[T_LSE].strides[0];
    p->lse_sh = t[T_LSE].strides[1];
    const fs_operand dout = fs_operand_padded(&t[T_DOUT], a.bshd);
    g.dout = dout.data; g.do_sb = dout.sb; g.do_sh = dout.sh; g.do_ss = dout.ss;
    if (a.kpm && (fs_tensor_import(st, a.kpm, "key_padding_mask", stream, FS_ROUTE_AUTO, 1u << FS_BOOL, &t[T_KPM]) < 0 ||
                  fs_check_kpm(&t[T_KPM], &t[T_Q], p, p) < 0))
        goto done;
    if (a.seqlens && (fs_tensor_import(st, a.seqlens, "seqlens", stream, FS_ROUTE_AUTO, 1u << FS_I32, &t[T_LENS]) < 0 ||
                      fs_check_seqlens(&t[T_LENS], &t[T_Q], p, p) < 0))
        goto done;
    if (a.bias && (fs_tensor_import(st, a.bias, "bias", stream, FS_ROUTE_AUTO, FS_FLOATS, &t[T_BIAS]) < 0 ||
                   fs_check_bias(&t[T_BIAS], &t[T_Q], p, p) < 0))
        goto done;
    result = finish(st, &a, t, &g, stream);
done:
    for (int i = 0; i < T_COUNT; i++) fs_tensor_release(&t[i]);
    return result;
}

PyObject *fs_attention_varlen_backward(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"dout", "q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                             "max_seqlen_k", "causal", "scale", "t5_bias", "rotary", "dq", "dk", "dv", "t5_grad",
                             "deterministic", "stream", NULL};
    fs_state *st = fs_get_state(module);
    bwd_args a;
    PyObject *scale = Py_None, *t5 = Py_None, *rotary = Py_None, *cq, *ck, *mq, *mk, *result = NULL;
    long long max_q, max_k;
    fs_tensor t[T_COUNT];
    uintptr_t stream = 0;
    memset(&a, 0, sizeof a);
    memset(t, 0, sizeof t);
    a.dq = a.dk = a.dv = a.stream = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOO|$pOOOOOOppO:attention_varlen_backward", kwlist, &a.dout,
                                     &a.q, &a.k, &a.v, &a.out, &a.lse, &cq, &ck, &mq, &mk, &a.opt.causal, &scale,
                                     &t5, &rotary, &a.dq, &a.dk, &a.dv, &a.t5_grad, &a.deterministic, &a.stream))
        return NULL;
    PyObject **opt_args[] = {&a.dq, &a.dk, &a.dv, &a.stream};
    for (size_t i = 0; i < sizeof opt_args / sizeof *opt_args; i++)
        if (*opt_args[i] == Py_None) *opt_args[i] = NULL;
    if (parse_common(scale, rotary, t5, &a) < 0) return NULL;
    if (fs_parse_max_seqlen(mq, "max_seqlen_q", &max_q) < 0 || fs_parse_max_seqlen(mk, "max_seqlen_k", &max_k) < 0)
        return NULL;
    if (import_common(st, &a, t, &stream) < 0) goto done;
    fs_tensor *const qkv[3] = {&t[T_Q], &t[T_K], &t[T_V]};
    char b1[160], b2[160];
    if (fs_check_qkv(qkv, 3, "(total_tokens, H, D)") < 0) goto done;
    for (int i = 1; i < 3; i++)
        if (qkv[i]->shape[2] != t[T_Q].shape[2]) {
            PyErr_Format(PyExc_ValueError, "%s has shape %s but q has %s: the head dims must match", i == 1 ? "k" : "v",
                         fs_shape_str(qkv[i]->shape, 3, b1, sizeof b1), fs_shape_str(t[T_Q].shape, 3, b2, sizeof b2));
            goto done;
        }
    if (fs_check_kv_heads(qkv, 1) < 0) goto done;
    if (t[T_K].shape[0] != t[T_V].shape[0]) {
        PyErr_Format(PyExc_ValueError, "k has %lld tokens but v has %lld: they must match", (long long)t[T_K].shape[0],
                     (long long)t[T_V].shape[0]);
        goto done;
    }
    const int64_t lshape[2] = {t[T_Q].shape[1], t[T_Q].shape[0]};
    if (check_common(&a, t, t[T_Q].shape[2], max_k) < 0 || check_lse(&t[T_LSE], &t[T_Q], lshape, 2) < 0) goto done;
    if (fs_tensor_import(st, cq, "cu_seqlens_q", stream, FS_ROUTE_AUTO, 1u << FS_I32, &t[T_CQ]) < 0 ||
        fs_tensor_import(st, ck, "cu_seqlens_k", stream, FS_ROUTE_AUTO, 1u << FS_I32, &t[T_CK]) < 0 ||
        fs_check_cu_seqlens(&t[T_CQ], "cu_seqlens_q", &t[T_Q], t[T_Q].shape[0], max_q) < 0 ||
        fs_check_cu_seqlens(&t[T_CK], "cu_seqlens_k", &t[T_Q], t[T_K].shape[0], max_k) < 0)
        goto done;
    if (t[T_CQ].shape[0] != t[T_CK].shape[0]) {
        PyErr_Format(PyExc_ValueError, "cu_seqlens_q has %lld entries but cu_seqlens_k has %lld: one per sequence plus one",
                     (long long)t[T_CQ].shape[0], (long long)t[T_CK].shape[0]);
        goto done;
    }
    fs_attn_bwd_params g;
    memset(&g, 0, sizeof g);
    fs_attn_params *p = &g.p;
    fs_attn_params_build(p, &a.opt, (int)t[T_CQ].shape[0] - 1, (int)t[T_Q].shape[1], (int)t[T_K].shape[1], (int)max_q,
                         (int)max_k, (int)t[T_Q].shape[2], t[T_Q].dtype, fs_operand_packed(&t[T_Q]),
                         fs_operand_packed(&t[T_K]), fs_operand_packed(&t[T_V]), fs_operand_packed(&t[T_OUT]));
    p->kv_group = t[T_K].shape[1] ? (int)(t[T_Q].shape[1] / t[T_K].shape[1]) : 1;
    p->cu_seqlens_q = (const int32_t *)t[T_CQ].data;
    p->cu_seqlens_k = (const int32_t *)t[T_CK].data;
    p->total_q = t[T_Q].shape[0];
    p->total_k = t[T_K].shape[0];
    p->lse = t[T_LSE].data;
    p->lse_sh = t[T_LSE].strides[0];
    const fs_operand dout = fs_operand_packed(&t[T_DOUT]);
    g.dout = dout.data; g.do_sh = dout.sh; g.do_ss = dout.ss;
    result = finish(st, &a, t, &g, stream);
done:
    for (int i = 0; i < T_COUNT; i++) fs_tensor_release(&t[i]);
    return result;
}
