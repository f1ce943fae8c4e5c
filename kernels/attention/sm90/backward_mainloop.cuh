/* Hopper attention backward: the consumers' main loop. Each of the two consumer warpgroups owns 64 keys of the block's
 * K_j, V_j (in shared memory for the whole block) and keeps their dV and dK in registers. Per query tile, in log2 units
 * (c = scale log2 e; L_i the forward's logsumexp, D_i = rowsum(dO_i o O_i)):
 *   S^T  = K_j Q_i^T, dP^T = V_j dO_i^T      (wgmma, both operands in shared memory, K-major)
 *   P^T  = exp2(S^T c + B^T - L_i log2 e)     (0 where masked: causal key > query, keys past the sequence, padded keys;
 *                                             B the T5 bias, log2 units, in T5 kernels: backward_t5.cuh)
 *   dS^T = P^T o (dP^T - D_i)                 (T5 kernels: summed by relative position for the table's gradient)
 *   dV_j += P^T dO_i, dK_j += dS^T Q_i        (wgmma, P^T and dS^T from registers, dO_i and Q_i MN-major)
 *   dQ_i += dS K_j                            (dS^T through shared memory as an MN-major A; both warpgroups' keys)
 * dQ_i goes to the float32 accumulator by shared memory and the writer warp's TMA reductions, or by atomics
 * (backward_dq.cuh); in deterministic runs (ORDERED) writer warps add each warpgroup's share of a tile after the key
 * blocks before its own have added theirs, so every element's sum has one order. */
#ifndef FLASHSCI_ATTENTION_SM90_BACKWARD_MAINLOOP_CUH
#define FLASHSCI_ATTENTION_SM90_BACKWARD_MAINLOOP_CUH

#include <math.h>

#include <type_traits>

#include "attention/sm90/backward_barriers.cuh"
#include "attention/sm90/backward_dq.cuh"
#include "attention/sm90/backward_epilogue.cuh"
#include "attention/sm90/backward_producer.cuh"
#include "attention/sm90/backward_t5.cuh"
#include "attention/sm90/backward_tile.cuh"
#include "attention/sm90/softmax.cuh"
#include "common/tma.cuh"

#ifdef FS_WGMMA
/* dQ_i (64 query rows x N columns) = dS K_j: dS^T's query panel at a, K_j's columns at b (both MN-major), Bc / 16
 * k-steps of 16 key rows. */
template <int N, int BC, typename T> FS_DEV_T void bwd_dq_product(float *dq, uint32_t a, uint32_t b)
{
#pragma unroll
    for (int kk = 0; kk < BC / 16; kk++)
        wgmma_ss_mn<N, T>(dq, desc_sw128(a + kk * 16 * 128, BC * 128, 1024), desc_sw128(b + kk * 16 * 128, BC * 128, 1024), kk > 0);
}

/* A consumer thread's work for block blk, the CTA's bi-th (consumer warpgroup cw_arg); s, phase: the ring's stage and
 * phase, steps: (persistent) the CTA's steps so far (dS^T's buffer, the staging's and the turns' first), carried from
 * block to block. The delta pass's instantiation (K::DELTA) ends each step after P^T and dP^T (continue): the rest of
 * the step is unreachable there by design, hence no warning 128. */
#pragma nv_diag_suppress 128
template <class K>
FS_DEV_T void sm90_bwd_consumer_block(const sm90_bwd_shared<typename K::T> &sh, const fs_sm90_bwd_args &a,
                                      const CUtensorMap *map_dk, const CUtensorMap *map_dv, const sm90_bwd_block &blk,
                                      int cw_arg, int bi, int &s, int &phase, int &steps)
{
    using T = typename K::T;
    constexpr int D = K::D, DS = K::DS, BR = K::BR, BC = K::BC, STAGES = K::STAGES, NQ = K::NQ, NO = K::NO;
    const fs_attn_bwd_params &g = a.g;
    const fs_attn_params &p = g.p;
    /* persistent: the thread's index read in each block (volatile), so that what derives from it (descriptors,
     * addresses, the rotary's frequencies) is computed per block, not hoisted out of the CTA's loop over its blocks,
     * where it held registers through every step (hundreds of bytes of spills) */
    unsigned tid = threadIdx.x;
    if constexpr (K::PERSIST) asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
    const int cw = K::PERSIST ? (int)(tid >> 7) - 1 : cw_arg; /* consumer warpgroup 0, 1 */
    const int warp = (tid >> 5) & 3, lane = tid & 31, gr = lane >> 2, t4 = lane & 3;
    const int key0 = blk.k0 + cw * 64 + warp * 16 + gr; /* this thread's keys: key0, key0 + 8 */
    const int q_len = blk.seq.q_len, k_len = blk.seq.k_len;
    /* keys the key padding mask drops (P = 0) */
    bool kept[2] = {true, true};
    if (p.kpm)
#pragma unroll
        for (int r = 0; r < 2; r++)
            kept[r] = key0 + 8 * r < k_len && p.kpm[blk.b * p.kpm_sb + (int64_t)(key0 + 8 * r) * p.kpm_sk];
    const bool dropped = !kept[0] || !kept[1];
    const uint32_t k_base = smem_addr(sh.sK), v_base = smem_addr(sh.sV), ds_base = smem_addr(sh.sdS);
    float dv[NO * 4], dk[NO * 4];
#pragma unroll
    for (int i = 0; i < NO * 4; i++) dv[i] = dk[i] = 0.f;
    const bool t5_grad = K::T5 && a.t5_part;
    if (t5_grad) {
        if (bi > 0) bwd_consumers_sync(); /* the block before's flush has read the rows */
        bwd_t5_zero(sh.t5_grad, tid - 128);
        bwd_consumers_sync();
    }
    mbar_wait(sh.kv_full, bi & 1);
    if (!K::PERSIST && cw == 1 && blk.n_iter > 0) bwd_turn_pass(cw); /* warpgroup 0 issues first */
    for (int it = 0; it < blk.n_iter; it++, steps += K::PERSIST) {
        const int h = sm90_bwd_head(p, blk, it), q0 = sm90_bwd_q0<K>(blk, it);
        const int step = K::PERSIST ? steps : it; /* the CTA's steps so far */
        const uint32_t q_base = smem_addr(sh.sQ + s * BR * DS), do_base = smem_addr(sh.sdO + s * BR * DS);
        mbar_wait(&sh.full[s], phase);

        /* S^T = K_j Q_i^T, dP^T = V_j dO_i^T: this warpgroup's 64 keys (rows 64 cw ..) x Br queries, D / 16 k-steps of
         * 32 bytes along a 128-byte row (the next 64-column half at kk = 4) */
        float st[NQ * 4], dp[NQ * 4];
        if (K::PERSIST && cw == 1 && step == 0) bwd_turn_pass(cw); /* ... and the turns run on from block to block
                                                                     * (a warpgroup's pass always follows its wait) */
        bwd_turn_wait(cw);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            const uint32_t ka = (kk >> 2) * BC * 128 + cw * 64 * 128 + 32 * (kk & 3), qa = (kk >> 2) * BR * 128 + 32 * (kk & 3);
            wgmma_ss<BR, T>(st, desc_sw128(k_base + ka, 16, 1024), desc_sw128(q_base + qa, 16, 1024), kk > 0);
        }
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            const uint32_t ka = (kk >> 2) * BC * 128 + cw * 64 * 128 + 32 * (kk & 3), qa = (kk >> 2) * BR * 128 + 32 * (kk & 3);
            wgmma_ss<BR, T>(dp, desc_sw128(v_base + ka, 16, 1024), desc_sw128(do_base + qa, 16, 1024), kk > 0);
        }
        wgmma_commit();
        bwd_turn_pass(cw);

        /* P^T = exp2(S^T c + B^T - L_i log2 e) while dP^T lands (B: the T5 bias in log2 units, T5 kernels); element
         * (n, r, c): key key0 + 8r, query q0 + 8n + 2 t4 + c. K::EXP_AHEAD: L_i's and D_i's first values read ahead of
         * the waits (a wait's memory clobber keeps loads behind it) and the unmasked tiles' loop apart from the masked
         * ones' (sm90_bwd_config) */
        const float *L = sh.sL + s * BR, *Di = sh.sD + s * BR;
        const bool masked = (K::CAUSAL && blk.k0 + cw * 64 + 63 > q0) || blk.k0 + BC > k_len || dropped;
        constexpr int AHEAD = K::EXP_AHEAD ? 4 : 0;
        bool t5_inside = false;
        const int t5_at = K::T5 ? bwd_t5_index<NQ>(a, blk.k0 + cw * 64, q0, key0, t4, t5_inside) : 0;
        const float *t5 = sh.t5_bias + t5_at;
        float2 l_ahead[AHEAD + 1];
#pragma unroll
        for (int n = 0; n < AHEAD; n++) l_ahead[n] = *reinterpret_cast<const float2 *>(L + 8 * n + 2 * t4);
        wgmma_wait<1>();
        auto exp_tile = [&](auto with_mask) {
#pragma unroll
            for (int n = 0; n < NQ; n++) {
                const float2 l2 = n < AHEAD ? l_ahead[n] : *reinterpret_cast<const float2 *>(L + 8 * n + 2 * t4);
#pragma unroll
                for (int r = 0; r < 2; r++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        float &x = st[4 * n + 2 * r + c];
                        const float l = c ? l2.y : l2.x;
                        x = exp2_approx(fmaf(x, a.scale_log2, K::T5 ? t5[-8 * (n - r) - c] - l : -l));
                        if (with_mask) {
                            const int key = key0 + 8 * r, query = q0 + 8 * n + 2 * t4 + c;
                            if (key >= k_len || (K::CAUSAL && key > query) || !kept[r]) x = 0.f;
                        }
                    }
            }
        };
        if constexpr (K::EXP_AHEAD) {
            if (masked) exp_tile(std::true_type{});
            else exp_tile(std::false_type{});
        } else exp_tile(masked);
        float2 d_ahead[AHEAD + 1];
#pragma unroll
        for (int n = 0; n < AHEAD; n++) d_ahead[n] = *reinterpret_cast<const float2 *>(Di + 8 * n + 2 * t4);
        wgmma_wait<0>();
        if constexpr (K::DELTA) { /* the delta pass: rowsum(P o dP), nothing else */
            bwd_delta_step<K>(st, dp, reinterpret_cast<float *>(sh.sdS) + (step & 1) * 8 * BR,
                              a.delta_out + fs_bwd_row(p, blk.b, h, blk.seq.qo, q0), q0, q_len, cw, tid - 128);
            mbar_arrive(&sh.empty[s]);
            if (++s == STAGES) { s = 0; phase ^= 1; }
            continue;
        }
        /* dS^T = P^T o (dP^T - D_i) */
#pragma unroll
        for (int n = 0; n < NQ; n++) {
            const float2 d2 = n < AHEAD ? d_ahead[n] : *reinterpret_cast<const float2 *>(Di + 8 * n + 2 * t4);
#pragma unroll
            for (int r = 0; r < 2; r++) {
                dp[4 * n + 2 * r] = st[4 * n + 2 * r] * (dp[4 * n + 2 * r] - d2.x);
                dp[4 * n + 2 * r + 1] = st[4 * n + 2 * r + 1] * (dp[4 * n + 2 * r + 1] - d2.y);
            }
        }
        uint32_t pk[NQ][2], dsk[NQ][2];
        sm90_pack_p<NQ, T>(st, pk);
        sm90_pack_p<NQ, T>(dp, dsk);
        if (t5_grad) bwd_t5_grad<NQ>(dp, sh.t5_grad, t5_at, t5_inside, t4, lane); /* no product in flight */

        /* dS^T into buffer step & 1 (the other warpgroup read the one before it ahead of the last barrier): panels of 64
         * queries, key rows of 128 bytes, 16-byte chunk x of row y at x ^ (y % 8). stmatrix: lane l addresses row l % 8
         * of matrix l / 8 (rows + 8 for odd matrices, the next 8 queries for matrices 2, 3) */
        const uint32_t ds_buf = ds_base + (step & 1) * BC * BR * 2;
        const int ds_row = cw * 64 + warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
        for (int kk = 0; kk < BR / 16; kk++) {
            const int qc = 2 * kk + (lane >> 4);
            stmatrix_x4(ds_buf + (qc >> 3) * BC * 128 + ds_row * 128 + (((qc & 7) ^ (lane & 7)) << 4), dsk[2 * kk][0],
                        dsk[2 * kk][1], dsk[2 * kk + 1][0], dsk[2 * kk + 1][1]);
        }
        fence_proxy_async();

        /* acc += X^T B for X^T = P^T or dS^T (packed accumulator fragments) and B = dO_i or Q_i at b_base: Br / 16 k-steps
         * of 16 query rows (2 KiB) each */
        auto issue_xt = [&](float (&acc)[NO * 4], const uint32_t (&x)[NQ][2], uint32_t b_base) {
#pragma unroll
            for (int kk = 0; kk < BR / 16; kk++) {
                const uint32_t af[4] = {x[2 * kk][0], x[2 * kk][1], x[2 * kk + 1][0], x[2 * kk + 1][1]};
                wgmma_rs<D, T>(acc, af, desc_sw128(b_base + kk * 16 * 128, BR * 128, 1024));
            }
            wgmma_commit();
        };
        /* dV_j += P^T dO_i, while the other warpgroup's dS^T lands */
        wgmma_fence();
        issue_xt(dv, pk, do_base);
        float dq[32];
        bwd_consumers_sync();
        /* dQ_i = dS K_j over the block's Bc keys: this warpgroup's 64 rows x 64 columns (D = 64: query panel cw, K's
         * columns; D = 128: query panel 0, K's half cw; D = 80: query panel 0, K's first half for warpgroup 0 and its
         * 16 columns of the second for warpgroup 1: cw by redux.sync, a uniform register, for on a plain branch ptxas
         * serializes every wgmma of the kernel), Bc / 16 k-steps of 16 key rows */
        const uint32_t a_panel = D == 64 ? cw : 0, b_panel = D == 64 ? 0 : cw;
        const uint32_t dq_a = ds_buf + a_panel * BC * 128, dq_b = k_base + b_panel * BC * 128;
        if constexpr (D == 80) {
            if (__reduce_max_sync(0xffffffffu, (unsigned)cw)) bwd_dq_product<16, BC, T>(dq, dq_a, dq_b);
            else bwd_dq_product<64, BC, T>(dq, dq_a, dq_b);
        } else bwd_dq_product<64, BC, T>(dq, dq_a, dq_b);
        wgmma_commit();
        /* dK_j += dS^T Q_i, running while dQ_i is added */
        issue_xt(dk, dsk, q_base);
        wgmma_wait<1>();
        sm90_bwd_dq_out<K>(sh, a, blk, dq, h, q0, step, cw, warp, gr, t4);
        wgmma_wait<0>();
        mbar_arrive(&sh.empty[s]); /* Q_i, dO_i, L_i, D_i read: every consumer thread arrives (each its own reads) */
        if (++s == STAGES) { s = 0; phase ^= 1; }
    }
    if constexpr (K::PERSIST) mbar_arrive(sh.kv_empty); /* K_j, V_j read (every product waited for): the next may load */
    if (!K::PERSIST && cw == 0 && blk.n_iter > 0) bwd_turn_wait(cw); /* the last pass taken (barrier counts balanced) */
    if constexpr (K::DELTA) return;
    if (t5_grad) bwd_t5_flush<K>(sh.t5_grad, a, blk, tid - 128);

    sm90_bwd_epilogue<K>(sh, a, map_dk, map_dv, blk, dv, dk, key0, t4, cw);
}
#pragma nv_diag_default 128

/* A consumer thread's whole work (consumer warpgroup cw = 0, 1): the CTA's blocks in turn, then (persistent) the last
 * turn's pass and the writer's free of the last staging taken. A named barrier's arrivals and waits alternate strictly
 * (an arrival before the wait for the one before would complete it without its waiter), so in persistent CTAs the
 * turns and the staging's frees run through the CTA's steps, not per block. */
template <class K>
FS_DEV_T void sm90_bwd_consumer(const sm90_bwd_shared<typename K::T> &sh, const fs_sm90_bwd_args &a, const CUtensorMap *map_dk,
                                const CUtensorMap *map_dv, const sm90_bwd_block &first, int cw)
{
    int s = 0, phase = 0, steps = 0;
    if constexpr (!K::PERSIST) {
        sm90_bwd_consumer_block<K>(sh, a, map_dk, map_dv, first, cw, 0, s, phase, steps);
    } else {
        SM90_BWD_FOR_EACH_BLOCK(blk, n) sm90_bwd_consumer_block<K>(sh, a, map_dk, map_dv, blk, cw, n, s, phase, steps);
        if (cw == 0 && steps > 0) bwd_turn_wait(cw); /* the last pass taken (barrier counts balanced) */
        if (K::STAGED && steps > 0) bwd_dq_free_wait(cw);
    }
}
#endif

#endif
