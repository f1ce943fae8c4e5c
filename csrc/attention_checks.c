/* The attention entry points' array checks: q, k, v (ranks, layouts, matching sizes, grouped heads), the key-padding
 * mask, per-sequence lengths, the additive bias, T5's table, cu_seqlens, and the limits on scale, keys and rotary.
 * Each raises a TypeError/ValueError naming what was expected; the checked arrays are filled into fs_attn_params. */
#include "flashsci.h"

#include <float.h>
#include <math.h>

#include "attention/cpu/attention_cpu.h"

const char *const fs_qkv_names[3] = {"q", "k", "v"};

/* T5 table: float (H, num_buckets). */
int fs_check_t5(const fs_tensor *x, const fs_tensor *q, const fs_t5_args *a, fs_attn_params *out)
{
    char b1[160];
    if (fs_check_aux(x, "t5_bias table", q) < 0) return -1;
    if (x->ndim != 2 || x->shape[0] != out->H || x->shape[1] != a->buckets) {
        PyErr_Format(PyExc_ValueError, "t5_bias table must have shape (H, num_buckets) = (%d, %d), got %s", out->H,
                     a->buckets, fs_shape_str(x->shape, x->ndim, b1, sizeof b1));
        return -1;
    }
    const int64_t lneg = out->Sq - 1 < a->max_distance ? out->Sq - 1 : a->max_distance;
    const int64_t lpos = out->Sk - 1 < a->max_distance ? out->Sk - 1 : a->max_distance;
    if (q->is_cuda && lneg + lpos + 1 > FS_CUDA_T5_MAX) {
        PyErr_Format(PyExc_ValueError, "t5_bias on CUDA covers at most %d relative positions, min(Sq - 1, max_distance) + "
                     "min(Sk - 1, max_distance) + 1; got %lld (Sq=%d, Sk=%d, max_distance=%d)", FS_CUDA_T5_MAX,
                     (long long)(lneg + lpos + 1), out->Sq, out->Sk, a->max_distance);
        return -1;
    }
    out->t5_table = x->data;
    out->t5_sh = x->strides[0];
    out->t5_sn = x->strides[1];
    out->t5_buckets = a->buckets;
    out->t5_max_distance = a->max_distance;
    out->t5_bidirectional = a->bidirectional;
    out->t5_dtype = x->dtype;
    return 0;
}

/* q, k, v of one entry point: rank, grad, one dtype and device, sizes, contiguous last dim, alignment, and a
 * head dim and dtype the device's kernels support. */
int fs_check_qkv(fs_tensor *const t[3], int ndim, const char *layout)
{
    const char *const *names = fs_qkv_names;
    char b1[160], b2[160];
    if (t[0]->ndim == ndim && t[0]->shape[ndim - 1] == 0) {
        PyErr_SetString(PyExc_ValueError, "q has head dim 0; the head dim must be at least 1");
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        if (t[i]->ndim != ndim) {
            PyErr_Format(PyExc_ValueError, "%s must be %d-D %s, got %d-D shape %s", names[i], ndim, layout, t[i]->ndim,
                         fs_shape_str(t[i]->shape, t[i]->ndim, b1, sizeof b1));
            return -1;
        }
        if (t[i]->requires_grad) {
            PyErr_Format(PyExc_ValueError, "%s requires grad, but flashsci.attention records no autograd history: use "
                         "flashsci.torch_ops.attention (differentiable), or call it under torch.no_grad(), or pass "
                         "%s.detach()", names[i], names[i]);
            return -1;
        }
        if (t[i]->dtype != t[0]->dtype) {
            PyErr_Format(PyExc_TypeError, "%s has dtype %s but q has %s: q, k and v must share one dtype", names[i],
                         fs_dtype_name(t[i]->dtype), fs_dtype_name(t[0]->dtype));
            return -1;
        }
        if (t[i]->is_cuda != t[0]->is_cuda || t[i]->device != t[0]->device) {
            PyErr_Format(PyExc_ValueError, "%s is on %s but q is on %s: q, k and v must be on one device", names[i],
                         fs_device_str(t[i], b1, sizeof b1), fs_device_str(t[0], b2, sizeof b2));
            return -1;
        }
        if (fs_check_sizes(t[i], names[i]) < 0) return -1;
        if (t[i]->strides[ndim - 1] != 1 && t[i]->shape[ndim - 1] != 1 && fs_numel(t[i]) > 0) {
            PyErr_Format(PyExc_ValueError, "%s: the last (head) dimension must be contiguous (stride 1), got stride %lld; "
                         "%s", names[i], (long long)t[i]->strides[ndim - 1], fs_contiguous_hint(t[i]));
            return -1;
        }
        if (fs_check_alignment(t[i], names[i], ndim - 1) < 0) return -1;
    }
    const int64_t D = t[0]->shape[ndim - 1];
    if (t[0]->is_cuda) {
        if (t[0]->dtype != FS_F16 && t[0]->dtype != FS_BF16) {
            PyErr_Format(PyExc_TypeError, "CUDA attention supports float16 and bfloat16, got %s", fs_dtype_name(t[0]->dtype));
            return -1;
        }
        if (D % 8 || D > 256) {
            PyErr_Format(PyExc_ValueError, "CUDA attention supports head dims that are multiples of 8 up to 256, got %lld",
                         (long long)D);
            return -1;
        }
    } else if (D > FS_CPU_MAX_D) {
        PyErr_Format(PyExc_ValueError, "CPU attention supports head dims up to %d, got %lld", FS_CPU_MAX_D, (long long)D);
        return -1;
    }
    return 0;
}

/* Head counts (dimension ih): k and v share one, Hkv, which divides q's, Hq (grouped-query attention, FlashAttention's
 * convention: q head h reads K/V head h / (Hq / Hkv)). */
int fs_check_kv_heads(fs_tensor *const t[3], int ih)
{
    const int64_t hq = t[0]->shape[ih], hk = t[1]->shape[ih], hv = t[2]->shape[ih];
    if (hk == 0 && hq != 0) {
        PyErr_Format(PyExc_ValueError, "k and v have no heads but q has %lld", (long long)hq);
        return -1;
    }
    if (hv != hk) {
        PyErr_Format(PyExc_ValueError, "k has head count %lld but v has %lld: k and v must have one head count", (long long)hk,
                     (long long)hv);
        return -1;
    }
    if (hk && hq % hk) {
        PyErr_Format(PyExc_ValueError, "k and v have head count %lld but q has %lld: the K/V head count must divide q's "
                     "(grouped-query attention: q head h reads K/V head h / (Hq / Hkv))", (long long)hk, (long long)hq);
        return -1;
    }
    return 0;
}

/* Query heads per K/V head, for the kernels. K and V broadcast over every head (head stride 0, e.g. torch's expand)
 * count as one head that all query heads share, which the Hopper kernel's TMA maps can address. */
int fs_kv_group(int64_t hq, int64_t hk, int64_t k_sh, int64_t v_sh)
{
    if (hk == 0) return 1;
    return hk == hq && k_sh == 0 && v_sh == 0 ? (int)hq : (int)(hq / hk);
}

int fs_check_scale(double scale, fs_dtype dtype)
{
    /* non-float64 inputs compute in float32, with the scores in log2 units on CUDA: scale log2(e) must be finite there */
    if (dtype != FS_F64 && fabs(scale) * 1.4426950408889634 > FLT_MAX) {
        char msg[256]; /* PyErr_Format has no float conversion */
        snprintf(msg, sizeof msg, "scale %g is not finite in float32, the precision %s inputs are computed in; |scale| "
                 "must be below %g", scale, fs_dtype_name(dtype), FLT_MAX / 1.4426950408889634);
        PyErr_SetString(PyExc_ValueError, msg);
        return -1;
    }
    return 0;
}

int fs_check_keys(int64_t keys, fs_dtype dtype, const char *what)
{
    if (dtype != FS_F64 && keys > FS_MAX_KEYS) {
        PyErr_Format(PyExc_ValueError, "%s = %lld: flashsci accumulates %s attention in float32, exact to rounding for "
                     "rows of at most 2**24 = %d keys; use float64 inputs on the CPU for longer rows", what,
                     (long long)keys, fs_dtype_name(dtype), FS_MAX_KEYS);
        return -1;
    }
    return 0;
}

/* Rotary embeddings rotate the two halves of each head vector: the head dim must be even. */
int fs_check_rotary(int on, int64_t D)
{
    if (on && D % 2) {
        PyErr_Format(PyExc_ValueError, "rotary needs an even head dim, got %lld", (long long)D);
        return -1;
    }
    return 0;
}

/* (B, H, S, D) positions of a 4-D tensor's dimensions in the chosen layout. */
void fs_layout_dims(int bshd, int *ib, int *ih, int *is)
{
    *ib = 0;
    *ih = bshd ? 2 : 1;
    *is = bshd ? 1 : 2;
}

/* All q/k/v checks: rank, dtype, device, shapes (K/V heads may serve groups of query heads), strides, sizes,
 * alignment, head dim. */
int fs_check_padded_qkv(int bshd, fs_tensor *const t[3])
{
    static const char *names[3] = {"q", "k", "v"};
    const char *layout = bshd ? "(B, S, H, D) for layout 'bshd'" : "(B, H, S, D) for layout 'bhsd'";
    char b1[160], b2[160];
    int ib, ih, is;
    fs_layout_dims(bshd, &ib, &ih, &is);
    if (fs_check_qkv(t, 4, layout) < 0) return -1;
    static const char *what[2] = {"batch size", "head dim"};
    const int dims[2] = {ib, 3};
    for (int i = 1; i < 3; i++)
        for (int j = 0; j < 2; j++)
            if (t[i]->shape[dims[j]] != t[0]->shape[dims[j]]) {
                PyErr_Format(PyExc_ValueError, "%s has %s %lld but q has %lld (q %s, %s %s, layout '%s')", names[i], what[j],
                             (long long)t[i]->shape[dims[j]], (long long)t[0]->shape[dims[j]],
                             fs_shape_str(t[0]->shape, 4, b1, sizeof b1), names[i], fs_shape_str(t[i]->shape, 4, b2, sizeof b2),
                             bshd ? "bshd" : "bhsd");
                return -1;
            }
    if (fs_check_kv_heads(t, ih) < 0) return -1;
    if (t[1]->shape[is] != t[2]->shape[is]) {
        PyErr_Format(PyExc_ValueError, "k has sequence length %lld but v has %lld: they must match",
                     (long long)t[1]->shape[is], (long long)t[2]->shape[is]);
        return -1;
    }
    if ((int64_t)t[0]->shape[ib] * t[0]->shape[ih] > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "batch x heads = %lld; flashsci supports below 2**31",
                     (long long)(t[0]->shape[ib] * t[0]->shape[ih]));
        return -1;
    }
    return 0;
}

/* key_padding_mask: bool (B or 1, Sk). Fills the kernel's pointer and strides (stride 0 when broadcast). */
int fs_check_kpm(const fs_tensor *m, const fs_tensor *q, const fs_attn_params *p, fs_attn_params *out)
{
    char b1[160];
    if (fs_check_aux(m, "key_padding_mask", q) < 0) return -1;
    if (m->ndim != 2 || (m->shape[0] != p->B && m->shape[0] != 1) || m->shape[1] != p->Sk) {
        PyErr_Format(PyExc_ValueError, "key_padding_mask must have shape (B, Sk) = (%d, %d) (True = keep), got %s", p->B, p->Sk,
                     fs_shape_str(m->shape, m->ndim, b1, sizeof b1));
        return -1;
    }
    out->kpm = (const uint8_t *)m->data;
    out->kpm_sb = m->shape[0] == 1 ? 0 : m->strides[0];
    out->kpm_sk = m->strides[1];
    return 0;
}

/* seqlens: int32 (B,), contiguous, self-attention (Sq == Sk); values checked on the CPU. */
int fs_check_seqlens(const fs_tensor *l, const fs_tensor *q, const fs_attn_params *p, fs_attn_params *out)
{
    char b1[160];
    if (fs_check_aux(l, "seqlens", q) < 0) return -1;
    if (l->ndim != 1 || l->shape[0] != p->B) {
        PyErr_Format(PyExc_ValueError, "seqlens must have shape (B,) = (%d,), got %s", p->B, fs_shape_str(l->shape, l->ndim, b1, sizeof b1));
        return -1;
    }
    if (l->strides[0] != 1 && l->shape[0] != 1) {
        PyErr_Format(PyExc_ValueError, "seqlens must be contiguous, got stride %lld", (long long)l->strides[0]);
        return -1;
    }
    if (p->Sq != p->Sk) {
        PyErr_Format(PyExc_ValueError, "seqlens is for self-attention on a padded batch (Sq == Sk), got Sq=%d, Sk=%d; "
                     "use key_padding_mask or attention_varlen", p->Sq, p->Sk);
        return -1;
    }
    for (int b = 0; !l->is_cuda && b < p->B; b++) {
        const int32_t v = ((const int32_t *)l->data)[b];
        if (v < 0 || v > p->Sq) {
            PyErr_Format(PyExc_ValueError, "seqlens[%d] = %d is outside [0, S] = [0, %d]", b, (int)v, p->Sq);
            return -1;
        }
    }
    out->seqlens = (const int32_t *)l->data;
    return 0;
}

/* bias: float, broadcastable (numpy rules, right-aligned) to (B, H, Sq, Sk) in that order for both layouts. */
int fs_check_bias(const fs_tensor *x, const fs_tensor *q, const fs_attn_params *p, fs_attn_params *out)
{
    char b1[160];
    const int64_t full[4] = {p->B, p->H, p->Sq, p->Sk};
    int64_t st[4] = {0, 0, 0, 0};
    if (fs_check_aux(x, "bias", q) < 0) return -1;
    int ok = x->ndim >= 1 && x->ndim <= 4;
    for (int i = 0; ok && i < x->ndim; i++) {
        const int d = 4 - x->ndim + i;
        ok = x->shape[i] == full[d] || x->shape[i] == 1;
        st[d] = x->shape[i] == 1 ? 0 : x->strides[i];
    }
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "bias of shape %s does not broadcast to (B, H, Sq, Sk) = (%d, %d, %d, %d)",
                     fs_shape_str(x->shape, x->ndim, b1, sizeof b1), p->B, p->H, p->Sq, p->Sk);
        return -1;
    }
    out->bias = x->data;
    out->bias_sb = st[0]; out->bias_sh = st[1]; out->bias_sq = st[2]; out->bias_sk = st[3];
    out->bias_dtype = x->dtype;
    return 0;
}

/* cu_seqlens: int32 (B + 1,), contiguous; on the CPU also 0 first, non-decreasing, total last, and no
 * sequence longer than max_seqlen. */
int fs_check_cu_seqlens(const fs_tensor *c, const char *name, const fs_tensor *q, int64_t total, long long max_seqlen)
{
    char b1[160];
    if (fs_check_aux(c, name, q) < 0) return -1;
    if (c->ndim != 1 || c->shape[0] < 1) {
        PyErr_Format(PyExc_ValueError, "%s must have shape (B + 1,) with B >= 0, got %s", name,
                     fs_shape_str(c->shape, c->ndim, b1, sizeof b1));
        return -1;
    }
    if (c->strides[0] != 1 && c->shape[0] > 1) {
        PyErr_Format(PyExc_ValueError, "%s must be contiguous, got stride %lld", name, (long long)c->strides[0]);
        return -1;
    }
    const int32_t *v = (const int32_t *)c->data;
    for (int64_t b = 0; !c->is_cuda && b < c->shape[0]; b++) {
        if (b == 0 ? v[0] != 0 : v[b] < v[b - 1]) {
            PyErr_Format(PyExc_ValueError, "%s must start at 0 and never decrease, got %s[%lld] = %d", name, name,
                         (long long)b, (int)v[b]);
            return -1;
        }
        if (b > 0 && v[b] - v[b - 1] > max_seqlen) {
            PyErr_Format(PyExc_ValueError, "sequence %lld has %d tokens, more than max_seqlen %lld given for %s",
                         (long long)b - 1, (int)(v[b] - v[b - 1]), max_seqlen, name);
            return -1;
        }
    }
    if (!c->is_cuda && v[c->shape[0] - 1] != total) {
        PyErr_Format(PyExc_ValueError, "%s ends at %d but the packed tensor has %lld tokens", name,
                     (int)v[c->shape[0] - 1], (long long)total);
        return -1;
    }
    return 0;
}
