/* flashsci.attention(q, k, v, /, *, causal, scale, layout, out, return_lse, stream, key_padding_mask,
 * seqlens, bias, t5_bias, rotary): argument parsing,
 * the checks that turn bad input into clear errors, output allocation in the caller's framework, and
 * dispatch to the C CPU kernel or the CUDA kernels. */
#include "flashsci.h"


enum { KW_CAUSAL, KW_SCALE, KW_LAYOUT, KW_OUT, KW_RETURN_LSE, KW_STREAM, KW_KPM, KW_SEQLENS, KW_BIAS, KW_T5, KW_ROTARY, KW_COUNT };

typedef struct {
    PyObject *q, *k, *v, *out, *stream, *kpm, *seqlens, *bias;
    int return_lse, bshd;
    fs_attn_options opt;
    fs_t5_args t5;
} attn_args;

/* Parse the vectorcall arguments: q, k, v positional, everything else keyword-only. */
static int parse_args(fs_state *st, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, attn_args *a)
{
    PyObject *kw[KW_COUNT] = {NULL};
    memset(a, 0, sizeof *a);
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "attention() takes 3 positional arguments (q, k, v) but %zd were given", nargs);
        return -1;
    }
    a->q = args[0];
    a->k = args[1];
    a->v = args[2];
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        int slot = -1;
        for (int j = 0; j < KW_COUNT && slot < 0; j++)
            if (name == PyTuple_GET_ITEM(st->kw_names, j)) slot = j;
        for (int j = 0; j < KW_COUNT && slot < 0; j++)
            if (PyUnicode_Compare(name, PyTuple_GET_ITEM(st->kw_names, j)) == 0) slot = j;
        if (slot < 0) {
            PyErr_Format(PyExc_TypeError, "attention() got an unexpected keyword argument '%S'", name);
            return -1;
        }
        kw[slot] = args[nargs + i];
    }
    if (kw[KW_CAUSAL] && (a->opt.causal = PyObject_IsTrue(kw[KW_CAUSAL])) < 0) return -1;
    if (kw[KW_RETURN_LSE] && (a->return_lse = PyObject_IsTrue(kw[KW_RETURN_LSE])) < 0) return -1;
    if (kw[KW_SCALE] && fs_parse_scale(kw[KW_SCALE], &a->opt.has_scale, &a->opt.scale) < 0) return -1;
    if (kw[KW_LAYOUT]) {
        PyObject *l = kw[KW_LAYOUT];
        if (!PyUnicode_Check(l)) {
            PyErr_Format(PyExc_TypeError, "layout must be a str ('bhsd' or 'bshd'), got %.100s", Py_TYPE(l)->tp_name);
            return -1;
        }
        if (PyUnicode_CompareWithASCIIString(l, "bshd") == 0) a->bshd = 1;
        else if (PyUnicode_CompareWithASCIIString(l, "bhsd") != 0) {
            PyErr_Format(PyExc_ValueError, "layout must be 'bhsd' (torch SDPA) or 'bshd' (FlashAttention), got %R", l);
            return -1;
        }
    }
    a->out = kw[KW_OUT] == Py_None ? NULL : kw[KW_OUT];
    a->stream = kw[KW_STREAM] == Py_None ? NULL : kw[KW_STREAM];
    a->kpm = kw[KW_KPM] == Py_None ? NULL : kw[KW_KPM];
    a->seqlens = kw[KW_SEQLENS] == Py_None ? NULL : kw[KW_SEQLENS];
    a->bias = kw[KW_BIAS] == Py_None ? NULL : kw[KW_BIAS];
    if (kw[KW_T5] && kw[KW_T5] != Py_None && fs_parse_t5(kw[KW_T5], &a->t5) < 0) return -1;
    if (kw[KW_ROTARY] && fs_parse_rotary(kw[KW_ROTARY], &a->opt.rotary, &a->opt.rotary_base) < 0) return -1;
    return 0;
}

int fs_run_attention(fs_state *st, const fs_attn_params *p, fs_tensor *const *arrays, int n, uintptr_t stream)
{
    const int64_t rows = p->cu_seqlens_q ? p->total_q * p->H : (int64_t)p->B * p->H * p->Sq;
    if (rows == 0) return 0; /* no query row: the result is empty */
    const int no_keys = p->cu_seqlens_q ? p->total_k == 0 : p->Sk == 0;
    if (arrays[0]->is_cuda) {
        if (fs_wait_producers(arrays, n, stream) < 0) return -1;
        /* no key at all: every row is fully masked (zeros, lse -inf), written without the attention kernels */
        return no_keys ? fs_gpu_attention_no_keys(p, arrays[0]->device, stream)
                       : fs_gpu_attention(p, arrays[0]->device, stream, &st->choice);
    }
    return fs_cpu_run_attention(p, st->num_threads);
}

PyObject *fs_attention(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    fs_state *st = fs_get_state(module);
    attn_args a;
    fs_tensor tq, tk, tv, to, tm, tl, tb, tt; /* q, k, v, out, key_padding_mask, seqlens, bias, t5 table */
    fs_tensor *const t[3] = {&tq, &tk, &tv};
    fs_tensor *const aux[4] = {&tm, &tl, &tb, &tt};
    PyObject *out = NULL, *lse = NULL, *result = NULL;
    uintptr_t stream = 0;
    memset(&tq, 0, sizeof tq); memset(&tk, 0, sizeof tk); memset(&tv, 0, sizeof tv); memset(&to, 0, sizeof to);
    for (int i = 0; i < 4; i++) memset(aux[i], 0, sizeof *aux[i]);

    if (parse_args(st, args, nargs, kwnames, &a) < 0) return NULL;
    if (a.stream && fs_parse_stream(st, a.stream, &stream) < 0) return NULL;
    if (fs_tensor_import(st, a.q, "q", stream, FS_ROUTE_AUTO, FS_FLOATS, &tq) < 0) goto done;
    if (!a.stream && tq.is_cuda && tq.source == FS_SRC_TORCH && fs_torch_current_stream(st, tq.device, &stream) < 0) goto done;
    if (fs_tensor_import(st, a.k, "k", stream, FS_ROUTE_AUTO, FS_FLOATS, &tk) < 0) goto done;
    if (fs_tensor_import(st, a.v, "v", stream, FS_ROUTE_AUTO, FS_FLOATS, &tv) < 0) goto done;
    if (fs_check_padded_qkv(a.bshd, t) < 0) goto done;
    if (fs_check_rotary(a.opt.rotary, tq.shape[3]) < 0) goto done;
    if ((a.opt.has_scale && fs_check_scale(a.opt.scale, tq.dtype) < 0) ||
        fs_check_keys(tk.shape[a.bshd ? 1 : 2], tq.dtype, "Sk (keys per row)") < 0)
        goto done;
    if (a.stream && !tq.is_cuda) {
        PyErr_SetString(PyExc_ValueError, "stream= applies to CUDA inputs, but q, k and v are on the CPU");
        goto done;
    }

    int ib, ih, is;
    fs_layout_dims(a.bshd, &ib, &ih, &is);
    int64_t oshape[4];
    memcpy(oshape, tq.shape, sizeof oshape);
    const int64_t lshape[3] = {tq.shape[ib], tq.shape[ih], tq.shape[is]};
    const fs_dtype ldtype = tq.dtype == FS_F64 ? FS_F64 : FS_F32;
    if (a.out) {
        if (fs_tensor_import(st, a.out, "out", stream, FS_ROUTE_AUTO, FS_FLOATS, &to) < 0 || fs_check_out(&to, t, fs_qkv_names, 3, oshape, 4, tq.dtype) < 0) goto done;
        out = Py_NewRef(a.out);
    } else {
        char *data;
        if (!(out = fs_new_output(st, &tq, 4, oshape, tq.dtype, stream, &data))) goto done;
        to.data = data;
        to.ndim = 4;
        to.dtype = tq.dtype;
        memcpy(to.shape, oshape, sizeof oshape);
        to.strides[3] = 1;
        for (int i = 2; i >= 0; i--) to.strides[i] = to.strides[i + 1] * oshape[i + 1];
    }
    char *lse_data = NULL;
    if (a.return_lse && !(lse = fs_new_output(st, &tq, 3, lshape, ldtype, stream, &lse_data))) goto done;

    fs_attn_params p;
    fs_attn_params_build(&p, &a.opt, (int)tq.shape[ib], (int)tq.shape[ih], (int)tk.shape[ih], (int)tq.shape[is],
                         (int)tk.shape[is], (int)tq.shape[3], tq.dtype, fs_operand_padded(&tq, a.bshd),
                         fs_operand_padded(&tk, a.bshd), fs_operand_padded(&tv, a.bshd), fs_operand_padded(&to, a.bshd));
    p.lse = lse_data;
    p.lse_sb = (int64_t)p.H * p.Sq;
    p.lse_sh = p.Sq;
    if (a.kpm && (fs_tensor_import(st, a.kpm, "key_padding_mask", stream, FS_ROUTE_AUTO, 1u << FS_BOOL, &tm) < 0 ||
                  fs_check_kpm(&tm, &tq, &p, &p) < 0))
        goto done;
    if (a.seqlens && (fs_tensor_import(st, a.seqlens, "seqlens", stream, FS_ROUTE_AUTO, 1u << FS_I32, &tl) < 0 ||
                      fs_check_seqlens(&tl, &tq, &p, &p) < 0))
        goto done;
    if (a.bias && (fs_tensor_import(st, a.bias, "bias", stream, FS_ROUTE_AUTO, FS_FLOATS, &tb) < 0 ||
                   fs_check_bias(&tb, &tq, &p, &p) < 0))
        goto done;
    if (a.t5.table && (fs_tensor_import(st, a.t5.table, "t5_bias table", stream, FS_ROUTE_AUTO, FS_FLOATS, &tt) < 0 ||
                       fs_check_t5(&tt, &tq, &a.t5, &p) < 0))
        goto done;
    fs_tensor *const arrays[8] = {&tq, &tk, &tv, &to, &tm, &tl, &tb, &tt};
    if (fs_run_attention(st, &p, arrays, 8, stream) < 0) goto done;
    result = a.return_lse ? PyTuple_Pack(2, out, lse) : Py_NewRef(out);
done:
    for (int i = 0; i < 3; i++) fs_tensor_release(t[i]);
    for (int i = 0; i < 4; i++) fs_tensor_release(aux[i]);
    fs_tensor_release(&to);
    Py_XDECREF(out);
    Py_XDECREF(lse);
    return result;
}
