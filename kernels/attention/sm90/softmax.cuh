/* Hopper attention forward: the online softmax of one S tile in the consumer warpgroups' registers (masks, the T5
 * bias, the running max and sum), the T5 bias as S's initial value (sm90_t5_init), 1 / l on the FMA pipe and P packed
 * into the A fragments of P V. */
#ifndef FLASHSCI_ATTENTION_SM90_SOFTMAX_CUH
#define FLASHSCI_ATTENTION_SM90_SOFTMAX_CUH

#include <math.h>

#include "attention/params.h"
#include "attention/sm90/tile.cuh"
#include "common/wgmma.cuh"

#ifdef FS_WGMMA
/* T5 kernels: the T5 bias of the S tile at key k0 of a consumer warpgroup's rows rw0 .. rw0 + 63 (rw0 and k0 uniform
 * over the warpgroup), from t5 (bias / scale of relative position col - row, clamped to -t5_lneg .. t5_n - 1 - t5_lneg,
 * at t5[col - row]). Where the tile's positions reach into the span, this thread's elements (rows row0, row0 + 8) go
 * into s as the initial value that S = Q K^T accumulates on, and the call returns true with add = 0; a tile wholly
 * before or after the span returns false with add = ends[0] or ends[1], the shift of its scores. Loaded ahead of the
 * tile's issue turn, the loads land while the warpgroup waits for it (in the softmax, with Q in registers, ptxas issued
 * each load just ahead of its use: 8% slower at S = 512). No clamp per element: the positions reach at most 8 NS + 62
 * past the span, where the table repeats its end entries. */
template <int NS>
FS_DEV bool sm90_t5_init(float (&s)[NS * 4], const float *t5, int t5_lneg, int t5_n, int k0, int rw0, int row0, int t4,
                         const float (&ends)[2], float &add)
{
    static_assert(8 * NS + 62 <= FS_SM90_T5_PAD, "a tile's positions stay within the T5 table's padding");
    const int lo = k0 - (rw0 + 63), hi = k0 + NS * 8 - 1 - rw0;
    const bool before = hi <= -t5_lneg, after = lo >= t5_n - 1 - t5_lneg;
    add = before ? ends[0] : after ? ends[1] : 0.f;
    if (before || after) return false;
    /* element (n, r, c) has rel = base + 8 (n - r) + c */
    const float *base = t5 + (k0 + 2 * t4 - row0);
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int c = 0; c < 2; c++) s[4 * n + 2 * r + c] = base[8 * (n - r) + c];
    return true;
}

/* Online softmax of one S tile in place (NS column groups of 8, rows g and g + 8 of this thread's warp): masks,
 * then m_i <- max(m_i, rowmax(S) c); S <- P = exp2(S c - m_i); l_i <- alpha l_i + rowsum(P); returns
 * alpha = exp2(m_old - m_i) per row for the caller to rescale O with. Rows with every key masked so far keep
 * m_i = -inf and use 0 in its place (P = 0, no NaN). P stays fp32: packing it to the A fragments of P V waits
 * until the previous P V has read them. FEAT: keys past k_len are masked, so are the columns set in drop
 * (bit 2 n + c for this thread's column 8 n + 2 t4 + c: sm90_kpm_prepare). BIAS = SM90_T5_IF_SET: t5 (NULL: none)
 * adds the T5 bias (log2 units) of relative position col - row, clamped to -t5_lneg .. t5_n - 1 - t5_lneg, at
 * t5[col - row]; a tile whose positions all clamp to one entry only shifts the exponent, and the others' reach no
 * further than 8 NS + 7 past that span, where the table repeats its end entries (FS_SM90_T5_PAD): no clamp per
 * element. BIAS = SM90_T5_ALWAYS: S holds the bias where it varies over the tile (sm90_t5_init), and t5_add (log2
 * units) shifts the tile's scores. */
template <int NS, int BIAS, bool KPM>
FS_DEV void sm90_softmax(float (&s)[NS * 4], const fs_attn_params &p, int k0, int k_len, int row0, int t4, float scale_log2,
                         const float *t5, int t5_lneg, int t5_n, float t5_add, uint32_t drop, float (&m_i)[2],
                         float (&l_i)[2], float (&alpha)[2])
{
    const bool prescale = scale_log2 <= 0.f; /* a non-positive scale flips the max: scale before it */
    const float mul = prescale ? 1.f : scale_log2;
    if (prescale)
#pragma unroll
        for (int i = 0; i < NS * 4; i++) s[i] *= scale_log2;
    /* keys past the sequence and, for causal, keys after the query (col > row) */
    if (k0 + NS * 8 > k_len || (p.causal && k0 + NS * 8 - 1 > row0)) {
#pragma unroll
        for (int i = 0; i < NS * 4; i++) {
            const int col = k0 + (i >> 2) * 8 + 2 * t4 + (i & 1), row = row0 + ((i >> 1) & 1) * 8;
            if (col >= k_len || (p.causal && col > row)) s[i] = -INFINITY;
        }
    }
    if (KPM && drop)
#pragma unroll
        for (int i = 0; i < NS * 4; i++)
            if (drop >> (2 * (i >> 2) + (i & 1)) & 1) s[i] = -INFINITY;
    /* scores in log2 units are x = S tile_mul + tile_add */
    float tile_mul = mul, tile_add = BIAS == SM90_T5_ALWAYS ? t5_add : 0.f;
    static_assert(8 * NS + 7 <= FS_SM90_T5_PAD, "a tile's positions stay within the T5 table's padding");
    if (BIAS == SM90_T5_IF_SET && t5) {
        const int top = t5_n - 1 - t5_lneg;
        const int lo = min(max(k0 - (row0 + 8), -t5_lneg), top), hi = min(max(k0 + NS * 8 - 1 - row0, -t5_lneg), top);
        if (lo == hi) {
            tile_add = t5[lo];
        } else {
            /* element (n, r, c) has rel = base + 8 (n - r) + c: one table load per distinct dd = n - r and c */
            const float *t5_base = t5 + (k0 + 2 * t4 - row0);
#pragma unroll
            for (int dd = -1; dd < NS; dd++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const float bias = t5_base[8 * dd + c];
#pragma unroll
                    for (int r = 0; r < 2; r++)
                        if (dd + r >= 0 && dd + r < NS) s[4 * (dd + r) + 2 * r + c] = fmaf(s[4 * (dd + r) + 2 * r + c], mul, bias);
                }
            tile_mul = 1.f;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < NS; n++) mx = fmaxf(mx, fmaxf(s[4 * n + 2 * r], s[4 * n + 2 * r + 1]));
        if (BIAS) mx = fmaf(mx, tile_mul, tile_add); /* lanes of a row may differ in tile_mul / tile_add */
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
        const float m_new = fmaxf(m_i[r], BIAS ? mx : mx * mul), m_use = m_new == -INFINITY ? 0.f : m_new;
        alpha[r] = exp2_approx(m_i[r] - m_use);
        m_i[r] = m_new;
        const float shift = BIAS ? tile_add - m_use : -m_use;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < NS; n++) {
            s[4 * n + 2 * r] = exp2_approx(fmaf(s[4 * n + 2 * r], tile_mul, shift));
            s[4 * n + 2 * r + 1] = exp2_approx(fmaf(s[4 * n + 2 * r + 1], tile_mul, shift));
            sum += s[4 * n + 2 * r] + s[4 * n + 2 * r + 1];
        }
        l_i[r] = l_i[r] * alpha[r] + sum;
    }
}

/* 1 / x for a positive normal x on the FMA pipe: a bit-pattern estimate (relative error at most 5.1%) and three Newton
 * steps (at most 9e-8). An item's last row sums are inverted while its last P V runs, when the other warpgroup's
 * exponentials fill the special-function unit: there rcp.approx took the P V's latency and 360 cycles more
 * (benchmarks/trace_sm90.cu). */
FS_DEV float rcp_newton(float x)
{
    float y = __int_as_float(0x7ef311c3 - __float_as_int(x));
#pragma unroll
    for (int i = 0; i < 3; i++) y = fmaf(y, fmaf(-x, y, 1.f), y);
    return y;
}

/* P (fp32, accumulator layout) to the A fragments of P V: pk[n][r] holds columns 8n + 2 t4, + 1 of row g + 8r. */
template <int NS, typename T> FS_DEV_T void sm90_pack_p(const float (&s)[NS * 4], uint32_t (&pk)[NS][2])
{
#pragma unroll
    for (int n = 0; n < NS; n++) {
        pk[n][0] = pack2<T>(s[4 * n], s[4 * n + 1]);
        pk[n][1] = pack2<T>(s[4 * n + 2], s[4 * n + 3]);
    }
}
#endif

#endif
