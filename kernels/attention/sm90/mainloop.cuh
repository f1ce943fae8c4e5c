/* Hopper attention forward: the consumers' main loop. Each consumer warpgroup takes 64 query rows of the work item;
 * per K/V tile it issues S_{j+1} = Q K_{j+1}^T and O += P_j V_j by wgmma in its turn (ping-pong with the other
 * warpgroups), runs the online softmax of S_{j+1} (softmax.cuh) and rescales O; the epilogue (epilogue.cuh) stores
 * O / l. */
#ifndef FLASHSCI_ATTENTION_SM90_MAINLOOP_CUH
#define FLASHSCI_ATTENTION_SM90_MAINLOOP_CUH

#include <math.h>

#include "attention/sm90/epilogue.cuh"
#include "attention/sm90/smem.cuh"
#include "attention/sm90/softmax.cuh"
#include "attention/sm90/tile.cuh"
#include "common/tma.cuh"

/* Trace hooks, empty here: benchmarks/trace_sm90.cu defines them before including the kernel to stamp each block's
 * items phase by phase. */
#ifndef FS_SM90_TRACE_CLOCK
#define FS_SM90_TRACE_CONSUMER() do {} while (0)
#define FS_SM90_TRACE_ITEM_READ(n_kv) do {} while (0)
#define FS_SM90_TRACE_CLOCK(field) do {} while (0)
#define FS_SM90_TRACE_ITEM_END(w, n_kv) do {} while (0)
#define FS_SM90_TRACE_BLOCK_END() do {} while (0)
#endif

#ifdef FS_WGMMA
/* Named barriers 1..NWG order the consumer warpgroups' GEMM issues (ping-pong, FlashAttention-3): warpgroup w
 * issues after warpgroup w - 1 has, so one warpgroup's softmax runs while the next one's GEMMs hold the
 * tensor cores. bar.sync waits for the 128 arrivals of the previous warpgroup besides its own 128. */
FS_DEV void issue_turn_wait(int cw) { asm volatile("bar.sync %0, 256;\n" ::"r"(1 + cw) : "memory"); }
template <int NWG> FS_DEV_T void issue_turn_pass(int cw) { asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + (cw + 1) % NWG) : "memory"); }

/* A consumer thread's whole work for its block (warpgroup wg = 1 .. NWG of the block); t5_on: the items carry a T5
 * table. */
template <class K>
FS_DEV_T void sm90_consumer(const sm90_shared<typename K::T> &sh, const CUtensorMap &map_o, const fs_sm90_args &a,
                            bool t5_on, int wg)
{
    using T = typename K::T;
    constexpr int D = K::D, BC = K::BC, NWG = K::NWG, STAGES = K::STAGES, BR = K::BR, NS = K::NS, NO = K::NO;
    constexpr bool FEAT = K::FEAT, KPM = K::KPM, Q_REGS = K::Q_REGS;
    constexpr int BIAS = K::BIAS;
    const fs_attn_params &p = a.p;
    T *const sQ = sh.sQ, *const sK = sh.sK, *const sV = sh.sV, *const sO = sh.sO;
    float *const s_t5 = sh.s_t5;
    uint64_t *const q_full = sh.q_full, *const q_empty = sh.q_empty, *const k_full = sh.k_full, *const k_empty = sh.k_empty;
    uint64_t *const v_full = sh.v_full, *const v_empty = sh.v_empty, *const item_full = sh.item_full,
                    *const item_read = sh.item_read;
    sm90_work *const s_work = sh.s_work;
    int4 *const s_ostore = sh.s_ostore;
    FS_SM90_TRACE_CONSUMER();
    /* D = 64: wg through redux.sync lands in a uniform register, and with it the Q descriptors of S = Q K^T (no
     * R2UR next to the wgmmas: 2.5-3% faster); D = 128 measured 1-2% slower that way */
    const int cw = (D == 64 ? (int)__reduce_max_sync(0xffffffffu, (unsigned)wg) : wg) - 1;
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    if (cw == NWG - 1) issue_turn_pass<NWG>(cw); /* the first warpgroup issues first */
    const uint32_t q_addr = smem_addr(sQ) + cw * 64 * 128, k_base = smem_addr(sK), v_base = smem_addr(sV);
    int s = 0, phase = 0, q_phase = 0, item_phase = 0;
    /* Q_REGS: Q_i as A fragments (qf[kk]: k-step kk, the P layout of issue_pv) */
    uint32_t qf[Q_REGS ? D / 16 : 1][4];
    /* the fragments from the landed Q tile, one ldmatrix.x4 per k-step: matrix i = lane / 8 holds rows 8 (i & 1) ..
     * + 7 of the warp's 16 and 16-byte chunk 2 (kk % 4) + i / 2 of 64-column half kk / 4, at chunk ^ (row % 8) */
    auto load_q = [&]() {
        const uint32_t row = warp * 16 + 8 * ((lane >> 3) & 1) + (lane & 7), hi = lane >> 4;
#pragma unroll
        for (int kk = 0; kk < (Q_REGS ? D / 16 : 0); kk++)
            ldmatrix_x4(q_addr + (kk >> 2) * BR * 128 + row * 128 + (((2 * (kk & 3) + hi) ^ (lane & 7)) << 4), qf[kk]);
    };
    /* S = Q_i K^T on stage s (landed): D/16 k-steps, each 32 bytes further along a 128-byte row (next half at kk = 4);
     * biased (uniform over the warpgroup): S = sc + Q_i K^T, on the T5 bias sc holds (sm90_t5_init) */
    auto issue_s = [&](float (&sc)[NS * 4], bool biased) {
        const uint64_t dk0 = desc_sw128(k_base + s * BC * D * 2, 16, 1024); /* + offset >> 4: the address field
                                                                              * holds addr >> 4, below 2^14 */
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            const uint64_t dk = dk0 + (((kk >> 2) * BC * 128 + 32 * (kk & 3)) >> 4);
            if constexpr (Q_REGS) wgmma_rs_kmajor<BC, T>(sc, qf[kk], dk, kk > 0 || biased);
            else wgmma_ss<BC, T>(sc, desc_sw128(q_addr + (kk >> 2) * BR * 128 + 32 * (kk & 3), 16, 1024), dk, kk > 0 || biased);
        }
        wgmma_commit();
    };
    /* O_i += P V on stage sv (landed): Bc/16 k-steps of 16 V rows (2 KiB) each */
    auto issue_pv = [&](float (&o)[NO * 4], const uint32_t (&pk)[NS][2], int sv) {
        const uint64_t dv0 = desc_sw128(v_base + sv * BC * D * 2, BC * 128, 1024);
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            const uint32_t af[4] = {pk[2 * kk][0], pk[2 * kk][1], pk[2 * kk + 1][0], pk[2 * kk + 1][1]};
            wgmma_rs<D, T>(o, af, dv0 + kk * 16 * 128 / 16);
        }
        wgmma_commit();
    };
    sm90_epilogue<D, NWG, T, FEAT> epi{p, &map_o, sO, s_ostore, cw, warp, lane, t4, false};
    /* A warpgroup whose 64 rows all lie past the sequence (the last query tile of a head when 64 NWG does not
     * divide Sq) issues no GEMM but keeps every barrier of the item, in the main loop's order: it waits for each
     * stage to land before releasing it (an early arrival would count toward the stage's previous use) and passes
     * its issue turns on, so the other warpgroups' GEMMs follow each other without its share of tensor time */
    auto idle_item = [&](int n_kv) {
        mbar_wait(q_full, q_phase);
        q_phase ^= 1;
        int sv = s, phase_v = phase;
        for (int j = 0; j <= n_kv; j++) {
            if (j > 0) mbar_wait(&v_full[sv], phase_v);
            if (j < n_kv) mbar_wait(&k_full[s], phase);
            issue_turn_wait(cw);
            if (j == 0) epi.store();
            issue_turn_pass<NWG>(cw);
            if (lane == 0) {
                if (j < n_kv) mbar_arrive(&k_empty[s]);
                if (j == (Q_REGS ? 0 : n_kv - 1)) mbar_arrive(q_empty); /* as the main path releases Q */
                if (j > 0) mbar_arrive(&v_empty[sv]);
            }
            if (j < n_kv) {
                sv = s;
                phase_v = phase;
                if (++s == STAGES) { s = 0; phase ^= 1; }
            }
        }
    };
    for (;;) {
        /* the item from the producer. n_kv comes from shared memory: redux.sync lands it in a uniform register,
         * and an item with no key to visit leaves through its own branch (O = 0, l = 0) rather than the main
         * loop sitting in a conditional: with both, ptxas keeps the ring's stage and phase and the wgmma
         * descriptors built from them in the uniform datapath instead of 4-5 R2UR moves per wgmma */
        mbar_wait(item_full, item_phase);
        item_phase ^= 1;
        const sm90_work w = *s_work;
        mbar_arrive(item_read);
        const int n_kv = __reduce_max_sync(0xffffffffu, w.n_kv), k_len = w.seq.k_len;
        FS_SM90_TRACE_ITEM_READ(n_kv);
        if (n_kv < 0) break;
        const int row0 = w.q0 + cw * 64 + warp * 16 + g; /* this thread's rows in its sequence: row0, row0 + 8 */
        float o[NO * 4], m_i[2] = {-INFINITY, -INFINITY}, l_i[2] = {0.f, 0.f}, alpha[2];
#pragma unroll
        for (int i = 0; i < NO * 4; i++) o[i] = 0.f;
        float inv[2];
        if (FEAT && n_kv == 0) {
            epi.row_scale(w, row0, m_i, l_i, inv);
            epi.finish(w, row0, o, inv, false);
            continue;
        }
        if (__reduce_max_sync(0xffffffffu, (unsigned)(w.q0 + cw * 64 >= w.seq.q_len))) {
            idle_item(n_kv);
            if (FEAT) { /* zeros for a padded sequence's rows */
                epi.row_scale(w, row0, m_i, l_i, inv);
                epi.finish(w, row0, o, inv, false);
            }
            continue;
        }
        /* this head's T5 bias by relative position (FEAT: log2 units; T5: bias / scale), end entries repeated; it
         * lands with Q (built here by each warpgroup instead, the table took 9% of ProtT5's time at S = 512) */
        const float *t5 = t5_on ? s_t5 + q_phase * FS_SM90_T5_STRIDE + FS_SM90_T5_PAD + a.t5_lneg : nullptr;
        /* T5: the bias of the tile at key k0 into sc ahead of its Q K^T (returns true), or its one entry as the
         * softmax's shift (add, log2 units: t5_ends, the table's end entries, loaded once Q has landed); rw0 uniform,
         * so that the choice is the warpgroup's */
        const int rw0 = BIAS == SM90_T5_ALWAYS ? (int)__reduce_max_sync(0xffffffffu, (unsigned)(w.q0 + cw * 64)) : 0;
        float t5_ends[2] = {0.f, 0.f};
        auto t5_init = [&](float (&sc)[NS * 4], int k0, float &add) {
            add = 0.f;
            return BIAS == SM90_T5_ALWAYS && sm90_t5_init<NS>(sc, t5, a.t5_lneg, a.t5_n, k0, rw0, row0, t4, t5_ends, add);
        };
        { /* the item's K/V tiles */
            uint32_t pk[NS][2];
            mbar_wait(q_full, q_phase);
            q_phase ^= 1;
            load_q();
            if (BIAS == SM90_T5_ALWAYS)
                for (int e = 0; e < 2; e++) t5_ends[e] = t5[e ? a.t5_n - 1 - a.t5_lneg : -a.t5_lneg] * a.scale_log2;
            if constexpr (Q_REGS) { /* Q is in registers: its tile may take the next item's */
                __syncwarp();
                if (lane == 0) mbar_arrive(q_empty);
            }
            FS_SM90_TRACE_CLOCK(FS_TR_C_QREGS);

            float sc[NS * 4]; /* S_j, then P_j: one array for the item's tiles (an array per tile: 24 more
                               * instructions in the plain D = 128 consumers) */
            /* tile 0: S_0, its softmax (O is still zero) */
            {
                const uint2 kt = KPM ? __ldg(a.kpm_list + (w.b * a.kpm_tiles) * 4 + t4) : make_uint2(0, 0);
                float t5_add;
                const bool biased = t5_init(sc, 0, t5_add);
                mbar_wait(&k_full[s], phase);
                FS_SM90_TRACE_CLOCK(FS_TR_C_K0);
                issue_turn_wait(cw);
                FS_SM90_TRACE_CLOCK(FS_TR_C_S0_TURN);
                wgmma_fence();
                issue_s(sc, biased);
                issue_turn_pass<NWG>(cw);
                epi.store(); /* the last item's O, under S_0 */
                wgmma_wait<0>();
                FS_SM90_TRACE_CLOCK(FS_TR_C_S0_DONE);
                if (lane == 0) {
                    mbar_arrive(&k_empty[s]);
                    if (!Q_REGS && n_kv == 1) mbar_arrive(q_empty); /* the item's last Q K^T is done: Q may be refilled */
                }
                sm90_softmax<NS, BIAS, KPM>(sc, p, KPM ? (int)kt.y : 0, k_len, row0, t4, a.scale_log2, t5, a.t5_lneg, a.t5_n,
                                            t5_add, kt.x, m_i, l_i, alpha);
                sm90_pack_p<NS, T>(sc, pk);
            }
            int sv = s, phase_v = phase; /* the stage whose V the pending P V reads */
            if (++s == STAGES) { s = 0; phase ^= 1; }
            /* tile j: S_j and P_{j-1} V_{j-1} issued together; the softmax of S_j, then O rescaled once P V landed
             * (ptxas puts that wait ahead of the softmax: see the header) */
            for (int j = 1; j < n_kv; j++) {
                const uint2 kt = KPM ? __ldg(a.kpm_list + (w.b * a.kpm_tiles + j) * 4 + t4) : make_uint2(0, 0);
                float t5_add;
                const bool biased = t5_init(sc, j * BC, t5_add); /* sc: P_{j-1} is packed in pk */
                mbar_wait(&v_full[sv], phase_v); /* loaded before K_j */
                mbar_wait(&k_full[s], phase);
                issue_turn_wait(cw);
                if (j == 1) FS_SM90_TRACE_CLOCK(FS_TR_C_LOOP_TURN);
                wgmma_fence();
                issue_s(sc, biased);
                issue_pv(o, pk, sv);
                issue_turn_pass<NWG>(cw);
                wgmma_wait<1>(); /* S_j landed */
                if (lane == 0) {
                    mbar_arrive(&k_empty[s]);
                    if (!Q_REGS && j == n_kv - 1) mbar_arrive(q_empty);
                }
                sm90_softmax<NS, BIAS, KPM>(sc, p, KPM ? (int)kt.y : j * BC, k_len, row0, t4, a.scale_log2, t5, a.t5_lneg,
                                            a.t5_n, t5_add, kt.x, m_i, l_i, alpha);
                wgmma_wait<0>(); /* P_{j-1} V_{j-1} landed */
                if (lane == 0) mbar_arrive(&v_empty[sv]);
#pragma unroll
                for (int n = 0; n < NO; n++) {
                    o[4 * n] *= alpha[0];
                    o[4 * n + 1] *= alpha[0];
                    o[4 * n + 2] *= alpha[1];
                    o[4 * n + 3] *= alpha[1];
                }
                sm90_pack_p<NS, T>(sc, pk);
                sv = s;
                phase_v = phase;
                if (++s == STAGES) { s = 0; phase ^= 1; }
            }
            mbar_wait(&v_full[sv], phase_v);
            if ((threadIdx.x & 127) == 0) bulk_wait_read(); /* the staging tile free for finish: see store_o */
            issue_turn_wait(cw);
            FS_SM90_TRACE_CLOCK(FS_TR_C_LAST_TURN);
            wgmma_fence();
            issue_pv(o, pk, sv);
            issue_turn_pass<NWG>(cw);
            epi.row_scale(w, row0, m_i, l_i, inv);
            wgmma_wait<0>();
            FS_SM90_TRACE_CLOCK(FS_TR_C_LAST_DONE);
            if (lane == 0) mbar_arrive(&v_empty[sv]);
        }

        epi.finish(w, row0, o, inv, true);
        FS_SM90_TRACE_ITEM_END(w, n_kv);
    }
    epi.store_synced(); /* the last item's O */
    if ((threadIdx.x & 127) == 0) bulk_wait(); /* the last stores done before the block exits */
    FS_SM90_TRACE_BLOCK_END();
}
#endif

#endif
