/* What the CPU attention kernels (forward.c, backward.c) share: rows of any float dtype to and from float or double,
 * one bias / table value as double, the rotary rotation (and its inverse), and one sequence's rows. */
#ifndef FLASHSCI_ATTENTION_CPU_COMMON_H
#define FLASHSCI_ATTENTION_CPU_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "attention/cpu/attention_cpu.h"
#include "attention/params.h"
#include "common/half.h"

#define FS_CPU_BR 32 /* query rows per block                          */
#define FS_CPU_BC 64 /* key rows per block                            */

/* x86-64 with GCC or Clang: kernels with a build for AVX2 + FMA (__attribute__((target("avx2,fma")))) beside the
 * portable one, which fs_cpu_avx2() picks at run time */
#if defined(__x86_64__) && defined(__GNUC__)
#define FS_CPU_AVX2 1
static inline int fs_cpu_avx2(void)
{
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#else
#define FS_CPU_AVX2 0
#endif

/* One element of a float dtype, widened to double (bias and T5 table values). */
static inline double fs_load_scalar(const void *src, fs_dtype dt)
{
    switch (dt) {
    case FS_F16: return fs_half_to_float(*(const uint16_t *)src);
    case FS_BF16: return fs_bf16_to_float(*(const uint16_t *)src);
    case FS_F32: return *(const float *)src;
    default: return *(const double *)src;
    }
}

/* Load n elements of dtype dt into floats. */
static inline void fs_load_row_f(const void *src, fs_dtype dt, float *dst, int n)
{
    const uint16_t *h = (const uint16_t *)src;
    switch (dt) {
    case FS_F16: for (int i = 0; i < n; i++) dst[i] = fs_half_to_float(h[i]); break;
    case FS_BF16: for (int i = 0; i < n; i++) dst[i] = fs_bf16_to_float(h[i]); break;
    case FS_F32: for (int i = 0; i < n; i++) dst[i] = ((const float *)src)[i]; break;
    default: for (int i = 0; i < n; i++) dst[i] = (float)((const double *)src)[i]; break;
    }
}

/* Store n floats as dtype dt. */
static inline void fs_store_row_f(const float *src, fs_dtype dt, void *dst, int n)
{
    uint16_t *h = (uint16_t *)dst;
    switch (dt) {
    case FS_F16: for (int i = 0; i < n; i++) h[i] = fs_float_to_half(src[i]); break;
    case FS_BF16: for (int i = 0; i < n; i++) h[i] = fs_float_to_bf16(src[i]); break;
    case FS_F32: for (int i = 0; i < n; i++) ((float *)dst)[i] = src[i]; break;
    default: for (int i = 0; i < n; i++) ((double *)dst)[i] = src[i]; break;
    }
}

/* The angle's cosine and sine of rotary pair i (0 <= i < D / 2) at position pos: angle = pos inv_freq_i in float32,
 * inv_freq_i = 1 / base^(2i / D), as HF computes it. */
static inline void fs_rotary_angle(int i, int D, int64_t pos, float base, float *c, float *s)
{
    const float inv_freq = 1.0f / powf(base, (float)(2 * i) / (float)D);
    const float angle = (float)pos * inv_freq;
    *c = cosf(angle);
    *s = sinf(angle);
}

/* One call's rotary cos / sin by position: row pos holds the cosines of its D / 2 pair angles, then their sines (the
 * angles of fs_rotary_angle, bit for bit); NULL without rotary, above 64 MiB or without the memory (each row then
 * computes its own angles: a powf and a sincos per pair). Free with free(). */
static inline float *fs_rotary_table(const fs_attn_params *p)
{
    const int64_t n = p->Sq > p->Sk ? p->Sq : p->Sk, D = p->D;
    if (!p->rotary || n * D > ((int64_t)16 << 20)) return NULL;
    float *t = (float *)malloc((size_t)(n * D) * sizeof(float));
    for (int i = 0; t && i < D / 2; i++)
        for (int64_t pos = 0; pos < n; pos++) fs_rotary_angle(i, (int)D, pos, p->rotary_base, t + pos * D + i, t + pos * D + D / 2 + i);
    return t;
}

/* Rotary embedding of one head vector in place by the angles of its position's row cs of a rotary table (ESM's
 * x cos + rotate_half(x) sin: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin with x1 = x[:D/2], x2 = x[D/2:]); dir = -1
 * applies the inverse (the transpose), which takes a gradient with respect to the rotated vector back to the vector. */
static inline void fs_rotate_row_f(float *x, int D, const float *cs, int dir)
{
    for (int i = 0; i < D / 2; i++) {
        const float c = cs[i], s = cs[i + D / 2] * (float)dir, x1 = x[i], x2 = x[i + D / 2];
        x[i] = x1 * c - x2 * s;
        x[i + D / 2] = x2 * c + x1 * s;
    }
}

/* The same for double vectors. */
static inline void fs_rotate_row_d(double *x, int D, const float *cs, int dir)
{
    for (int i = 0; i < D / 2; i++) {
        const double c = cs[i], s = (double)cs[i + D / 2] * dir, x1 = x[i], x2 = x[i + D / 2];
        x[i] = x1 * c - x2 * s;
        x[i + D / 2] = x2 * c + x1 * s;
    }
}

/* Row pos of the call's rotary table rot, or without a table that row's angles computed into own
 * (FS_CPU_MAX_D floats). */
static inline const float *fs_rotary_row(const float *rot, int D, int64_t pos, float base, float *own)
{
    if (rot) return rot + pos * D;
    for (int i = 0; i < D / 2; i++) fs_rotary_angle(i, D, pos, base, own + i, own + D / 2 + i);
    return own;
}

/* x rotated for position pos (dir -1: the inverse) by row pos of the call's rotary table rot, or without a table by
 * that row's angles computed here. */
static inline void fs_rotate_at_f(float *x, int D, const float *rot, int64_t pos, float base, int dir)
{
    float own[FS_CPU_MAX_D];
    fs_rotate_row_f(x, D, fs_rotary_row(rot, D, pos, base, own), dir);
}

static inline void fs_rotate_at_d(double *x, int D, const float *rot, int64_t pos, float base, int dir)
{
    float own[FS_CPU_MAX_D];
    fs_rotate_row_d(x, D, fs_rotary_row(rot, D, pos, base, own), dir);
}

/* Sequence b's rows: its first query and key rows in the (packed) tensors and its lengths, cut by seqlens. */
typedef struct { int64_t qo, ko, q_len, k_len; } fs_cpu_seq;
static inline fs_cpu_seq fs_cpu_sequence(const fs_attn_params *p, int64_t b)
{
    fs_cpu_seq s;
    s.qo = p->cu_seqlens_q ? p->cu_seqlens_q[b] : 0;
    s.ko = p->cu_seqlens_k ? p->cu_seqlens_k[b] : 0;
    s.q_len = p->cu_seqlens_q ? p->cu_seqlens_q[b + 1] - s.qo : p->Sq;
    s.k_len = p->cu_seqlens_k ? p->cu_seqlens_k[b + 1] - s.ko : p->Sk;
    if (p->seqlens) {
        const int64_t len = p->seqlens[b] < 0 ? 0 : p->seqlens[b];
        s.q_len = len < s.q_len ? len : s.q_len;
        s.k_len = len < s.k_len ? len : s.k_len;
    }
    return s;
}

#endif
