/* Hopper attention backward: the T5 bias and its table's gradient. A block holds its head's table by relative position
 * rel = key - query (log2 units, FS_SM90_T5_PAD entries each side repeating the ends: index FS_SM90_T5_PAD + t5_lneg +
 * rel, as the forward's: sm90_t5_expand). A thread's S^T element (n, r, c) (key key0 + 8 r, query q0 + 8 n + 2 t4 + c)
 * lies on diagonal d = n - r, rel = key0 - q0 - 2 t4 - 8 d - c: one base index per step and immediate offsets. The
 * gradient, dS summed by relative position, goes into four rows of shared memory (one per lane of a row's quad), whose
 * sums by position the block stores at its end; a pass after the kernel adds them over the blocks and into buckets
 * (sm90_bwd_t5_sum, backward_t5_sum.cu). The table's gradient sums dS over whole rows, where D_i = rowsum(dO o O)
 * from the rounded output no longer averages out (H200, bf16, scale 1: 2-4x torch's error): its runs take D_i =
 * rowsum(P o dP) from the kernel's delta pass (K::DELTA) instead. */
#ifndef FLASHSCI_ATTENTION_SM90_BACKWARD_T5_CUH
#define FLASHSCI_ATTENTION_SM90_BACKWARD_T5_CUH

#include "attention/sm90/backward_barriers.cuh"
#include "attention/sm90/backward_producer.cuh"
#include "attention/sm90/backward_tile.cuh"

#ifdef FS_WGMMA
/* A step's table index for this thread's diagonal d = 0, c = 0 (its element (n, r, c) at index - 8 (n - r) - c) in the
 * consumer warpgroup's tile (keys kw .. kw + 63, queries q0 .. q0 + Br - 1). Where the tile's positions reach into the
 * table's span, the index of its rel (the positions past the span land in the padding); a tile wholly before or after
 * the span takes an index in the left or right padding, where every one of its elements reads the end entry and adds
 * its gradient (folded into that entry by bwd_t5_flush). */
template <int NQ>
FS_DEV_T int bwd_t5_index(const fs_sm90_bwd_args &a, int kw, int q0, int key0, int t4, bool &inside)
{
    const int hi = kw + 63 - q0, lo = kw - (q0 + 8 * NQ - 1), top = a.t5_n - 1 - a.t5_lneg;
    inside = hi > -a.t5_lneg && lo < top;
    /* inside: rel >= lo > -t5_lneg - 62 - Br and rel <= hi < top + 62 + Br, within the padding; outside: offsets
     * -8 NQ + 7 .. 8 from the index, inside the padding of FS_SM90_T5_PAD >= 8 NQ + 2 */
    static_assert(8 * NQ + 62 < FS_SM90_T5_PAD, "a tile's positions stay within the T5 table's padding");
    if (inside) return FS_SM90_T5_PAD + a.t5_lneg + key0 - q0 - 2 * t4;
    return (hi <= -a.t5_lneg ? 0 : FS_SM90_T5_PAD + a.t5_n) + 8 * NQ - 7;
}
/* The tile's dS^T (ds, this thread's accumulator fragments) added into the gradient rows by relative position: inside
 * the span, per diagonal and column parity into this lane's row (row t4: lanes of one warp never share an address;
 * the adds are atomic for the other warps); outside, the warp's sum into the end entry's padding. */
template <int NQ>
FS_DEV_T void bwd_t5_grad(const float (&ds)[NQ * 4], float *grad, int index, bool inside, int t4, int lane)
{
    if (inside) {
        float *g = grad + t4 * FS_SM90_BWD_T5_GRAD_STRIDE + index;
#pragma unroll
        for (int d = -1; d < NQ; d++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                /* diagonal d: element (d, 0, c) and (d + 1, 1, c) */
                const float v = (d >= 0 ? ds[4 * d + c] : 0.f) + (d + 1 < NQ ? ds[4 * (d + 1) + 2 + c] : 0.f);
                atomicAdd(g - 8 * d - c, v);
            }
    } else {
        float v = 0.f;
#pragma unroll
        for (int i = 0; i < NQ * 4; i++) v += ds[i];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) atomicAdd(grad + index, v);
    }
}

/* The gradient rows zeroed by the consumers (ct = 0 .. 255: their thread) before their first step. */
FS_DEV void bwd_t5_zero(float *grad, int ct)
{
    for (int i = ct; i < 4 * FS_SM90_BWD_T5_GRAD_STRIDE + 4; i += 256) grad[i] = 0.f;
}

/* The block's gradient by relative position into t5_part at ((b H + h) n_kblocks + key block) t5_n, after its last step
 * (the consumers, ct = 0 .. 255): the paddings' sums (consumer warps 0, 1), then each position's sum over the four
 * rows, the paddings' added at the ends. Sums in a fixed order. */
template <class K> FS_DEV_T void bwd_t5_flush(float *grad, const fs_sm90_bwd_args &a, const sm90_bwd_block &blk, int ct)
{
    constexpr int GS = FS_SM90_BWD_T5_GRAD_STRIDE, PAD = FS_SM90_T5_PAD;
    const int warp = ct >> 5, lane = ct & 31, n = a.t5_n;
    float *pads = grad + 4 * GS;
    bwd_consumers_sync();
    if (warp < 2) {
        const int lo = warp ? PAD + n : 0, hi = warp ? a.t5_row : PAD;
        float v = 0.f;
        for (int i = lo + lane; i < hi; i += 32) v += (grad[i] + grad[GS + i]) + (grad[2 * GS + i] + grad[3 * GS + i]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) pads[warp] = v;
    }
    bwd_consumers_sync();
    float *part = a.t5_part + (((int64_t)blk.b * a.g.p.H + blk.hkv) * a.n_kblocks + blk.k0 / K::BC) * n;
    for (int e = ct; e < n; e += 256) {
        const int i = PAD + e;
        float v = (grad[i] + grad[GS + i]) + (grad[2 * GS + i] + grad[3 * GS + i]);
        if (e == 0) v += pads[0];
        if (e == n - 1) v += pads[1];
        part[e] = v;
    }
}

/* The delta pass (K::DELTA): rowsum(P o dP) of the step's tile over this warpgroup's keys, per query column: this
 * thread's two keys, then the warp's 16 (lanes 4 apart), then the block's 8 warps through shared memory (buf: 8 Br
 * floats, a buffer per step parity), added into delta by one atomic per query row of the tile. */
template <class K>
FS_DEV_T void bwd_delta_step(const float (&p)[K::NQ * 4], const float (&dp)[K::NQ * 4], float *buf, float *delta,
                             int q0, int q_len, int cw, int ct)
{
    constexpr int NQ = K::NQ, BR = K::BR;
    const int warp = (ct >> 5) & 3, lane = ct & 31, t4 = lane & 3;
    float col[2 * NQ];
#pragma unroll
    for (int n = 0; n < NQ; n++)
#pragma unroll
        for (int c = 0; c < 2; c++) /* keys key0 (r = 0) and key0 + 8 */
            col[2 * n + c] = fmaf(p[4 * n + c], dp[4 * n + c], p[4 * n + 2 + c] * dp[4 * n + 2 + c]);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1)
#pragma unroll
        for (int i = 0; i < 2 * NQ; i++) col[i] += __shfl_xor_sync(0xffffffffu, col[i], o);
    if (lane < 4)
#pragma unroll
        for (int n = 0; n < NQ; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) buf[(cw * 4 + warp) * BR + 8 * n + 2 * t4 + c] = col[2 * n + c];
    bwd_consumers_sync();
    for (int q = ct; q < BR; q += 256) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < 8; w++) v += buf[w * BR + q];
        if (q0 + q < q_len) atomicAdd(delta + q, v);
    }
}
#endif

#endif
