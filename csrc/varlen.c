/* flashsci.attention_varlen: packed variable-length attention on [total_tokens, H, D] tensors with
 * FlashAttention's cu_seqlens convention, so a batch of proteins of 80 to 8000 residues carries no padding. */
#include "flashsci.h"

PyObject *fs_attention_varlen(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "causal",
                             "scale", "out", "return_lse", "stream", "t5_bias", "rotary", NULL};
    fs_state *st = fs_get_state(module);
    PyObject *q, *k, *v, *cq, *ck, *mq, *mk, *scale = Py_None, *out_arg = Py_None, *stream_arg = Py_None, *t5_arg = Py_None,
             *rotary_arg = Py_None;
    PyObject *out = NULL, *lse = NULL, *result = NULL;
    long long max_q, max_k;
    int return_lse = 0;
    fs_attn_options opt = {0};
    fs_t5_args t5 = {NULL, 0, 0, 0};
    fs_tensor tq, tk, tv, to, tcq, tck, tt;
    fs_tensor *const t[3] = {&tq, &tk, &tv};
    fs_tensor *const all[7] = {&tq, &tk, &tv, &to, &tcq, &tck, &tt};
    uintptr_t stream = 0;
    for (int i = 0; i < 7; i++) memset(all[i], 0, sizeof *all[i]);

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOO|$pOOpOOO:attention_varlen", kwlist, &q, &k, &v, &cq, &ck, &mq,
                                     &mk, &opt.causal, &scale, &out_arg, &return_lse, &stream_arg, &t5_arg, &rotary_arg))
        return NULL;
    if (fs_parse_scale(scale, &opt.has_scale, &opt.scale) < 0) return NULL;
    if (t5_arg != Py_None && fs_parse_t5(t5_arg, &t5) < 0) return NULL;
    if (fs_parse_rotary(rotary_arg, &opt.rotary, &opt.rotary_base) < 0) return NULL;
    if (fs_parse_max_seqlen(mq, "max_seqlen_q", &max_q) < 0 || fs_parse_max_seqlen(mk, "max_seqlen_k", &max_k) < 0)
        return NULL;
    if (stream_arg != Py_None && fs_parse_stream(st, stream_arg, &stream) < 0) return NULL;
    if (fs_tensor_import(st, q, "q", stream, FS_ROUTE_AUTO, FS_FLOATS, &tq) < 0) goto done;
    if (stream_arg == Py_None && tq.is_cuda && tq.source == FS_SRC_TORCH && fs_torch_current_stream(st, tq.device, &stream) < 0)
        goto done;
    if (fs_tensor_import(st, k, "k", stream, FS_ROUTE_AUTO, FS_FLOATS, &tk) < 0 ||
        fs_tensor_import(st, v, "v", stream, FS_ROUTE_AUTO, FS_FLOATS, &tv) < 0 ||
        fs_check_qkv(t, 3, "(total_tokens, H, D)") < 0)
        goto done;
    char b1[160], b2[160];
    for (int i = 1; i < 3; i++)
        if (t[i]->shape[2] != tq.shape[2]) {
            PyErr_Format(PyExc_ValueError, "%s has shape %s but q has %s: the head dims must match", i == 1 ? "k" : "v",
                         fs_shape_str(t[i]->shape, 3, b1, sizeof b1), fs_shape_str(tq.shape, 3, b2, sizeof b2));
            goto done;
        }
    if (fs_check_kv_heads(t, 1) < 0) goto done;
    if (fs_check_rotary(opt.rotary, tq.shape[2]) < 0) goto done;
    if ((opt.has_scale && fs_check_scale(opt.scale, tq.dtype) < 0) || fs_check_keys(max_k, tq.dtype, "max_seqlen_k") < 0)
        goto done;
    if (tk.shape[0] != tv.shape[0]) {
        PyErr_Format(PyExc_ValueError, "k has %lld tokens but v has %lld: they must match", (long long)tk.shape[0],
                     (long long)tv.shape[0]);
        goto done;
    }
    if (fs_tensor_import(st, cq, "cu_seqlens_q", stream, FS_ROUTE_AUTO, 1u << FS_I32, &tcq) < 0 ||
        fs_tensor_import(st, ck, "cu_seqlens_k", stream, FS_ROUTE_AUTO, 1u << FS_I32, &tck) < 0 ||
        fs_check_cu_seqlens(&tcq, "cu_seqlens_q", &tq, tq.shape[0], max_q) < 0 ||
        fs_check_cu_seqlens(&tck, "cu_seqlens_k", &tq, tk.shape[0], max_k) < 0)
        goto done;
    if (tcq.shape[0] != tck.shape[0]) {
        PyErr_Format(PyExc_ValueError, "cu_seqlens_q has %lld entries but cu_seqlens_k has %lld: one per sequence plus one",
                     (long long)tcq.shape[0], (long long)tck.shape[0]);
        goto done;
    }

    if (out_arg != Py_None) {
        if (fs_tensor_import(st, out_arg, "out", stream, FS_ROUTE_AUTO, FS_FLOATS, &to) < 0 ||
            fs_check_out(&to, t, fs_qkv_names, 3, tq.shape, 3, tq.dtype) < 0)
            goto done;
        out = Py_NewRef(out_arg);
    } else {
        char *data;
        if (!(out = fs_new_output(st, &tq, 3, tq.shape, tq.dtype, stream, &data))) goto done;
        to.data = data;
        to.strides[0] = tq.shape[1] * tq.shape[2];
        to.strides[1] = tq.shape[2];
    }
    fs_attn_params p;
    fs_attn_params_build(&p, &opt, (int)tcq.shape[0] - 1, (int)tq.shape[1], (int)tk.shape[1], (int)max_q, (int)max_k,
                         (int)tq.shape[2], tq.dtype, fs_operand_packed(&tq), fs_operand_packed(&tk), fs_operand_packed(&tv),
                         fs_operand_packed(&to));
    p.cu_seqlens_q = (const int32_t *)tcq.data;
    p.cu_seqlens_k = (const int32_t *)tck.data;
    p.total_q = tq.shape[0];
    p.total_k = tk.shape[0];
    if (t5.table && (fs_tensor_import(st, t5.table, "t5_bias table", stream, FS_ROUTE_AUTO, FS_FLOATS, &tt) < 0 ||
                     fs_check_t5(&tt, &tq, &t5, &p) < 0))
        goto done;
    if (return_lse) {
        const int64_t lshape[2] = {tq.shape[1], tq.shape[0]};   /* (H, total_q), FlashAttention's varlen lse */
        char *lse_data;
        if (!(lse = fs_new_output(st, &tq, 2, lshape, tq.dtype == FS_F64 ? FS_F64 : FS_F32, stream, &lse_data))) goto done;
        p.lse = lse_data;
        p.lse_sh = tq.shape[0];
    }
    if (fs_run_attention(st, &p, all, 7, stream) < 0) goto done;
    result = return_lse ? PyTuple_Pack(2, out, lse) : Py_NewRef(out);
done:
    for (int i = 0; i < 7; i++) fs_tensor_release(all[i]);
    Py_XDECREF(out);
    Py_XDECREF(lse);
    return result;
}
