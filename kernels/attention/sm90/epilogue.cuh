/* Hopper attention forward: the epilogue of a work item in one consumer warpgroup. 1 / l and the logsumexp per row
 * (row_scale), then O_i / l_i through the warpgroup's staging tile and a TMA store issued after the next barrier the
 * warpgroup passes (finish, store), or by direct stores for the last rows of a packed sequence; columns past the data's
 * head dim p.D are dropped either way. */
#ifndef FLASHSCI_ATTENTION_SM90_EPILOGUE_CUH
#define FLASHSCI_ATTENTION_SM90_EPILOGUE_CUH

#include <math.h>

#include "attention/sm90/scheduler.cuh"
#include "attention/sm90/softmax.cuh"
#include "attention/sm90/tile.cuh"
#include "common/tma.cuh"

#ifdef FS_WGMMA
/* Named barrier 1 + NWG + cw: the 128 threads of consumer warpgroup cw alone. */
template <int NWG> FS_DEV_T void warpgroup_sync(int cw) { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + NWG + cw) : "memory"); }

/* The epilogue state of consumer warpgroup cw (this thread: warp, lane, t4 = lane % 4): its staging tile sO + cw 64 D,
 * the tile's store coordinates in s_ostore[cw], and whether a store of it is pending. */
template <int D, int NWG, typename T, bool FEAT> struct sm90_epilogue {
    static constexpr int NO = D / 8, HALVES = D / 64;
    const fs_attn_params &p;
    const CUtensorMap *map_o;
    T *sO;
    int4 *s_ostore;
    int cw, warp, lane, t4;
    bool o_pending;

    /* 1 / l_i per row (l summed over the four lanes of a row) and lse = (m_i + log2 l_i) ln 2, once the last
     * softmax is done (the main loop: while the last P V runs); FEAT: rows past a padded sequence's length get
     * 1 / l = 0 (zeros) and lse -inf, those past a packed one's no lse */
    FS_DEV_T void row_scale(const sm90_work &w, int row0, const float (&m_i)[2], const float (&l_i)[2], float (&inv)[2])
    {
        const bool packed = FEAT && p.cu_seqlens_q;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = l_i[r];
            l += __shfl_xor_sync(0xffffffff, l, 1);
            l += __shfl_xor_sync(0xffffffff, l, 2);
            const int row = row0 + 8 * r;
            if (FEAT && row >= w.seq.q_len) l = 0.f;
            inv[r] = l > 0.f ? rcp_newton(l) : 0.f; /* l >= 1 where a key counts: its row max weighs 1 */
            if (p.lse && t4 == 0 && row < (packed ? w.seq.q_len : p.Sq))
                static_cast<float *>(p.lse)[w.b * p.lse_sb + w.h * p.lse_sh + w.seq.qo + row] =
                    l == 0.f ? -INFINITY : (m_i[r] + __log2f(l)) * 0.69314718055994531f; /* NaN l: NaN */
        }
    }

    /* O leaves through the warpgroup's staging tile (64 rows, boxes of 64 columns, 128-byte swizzle: 16-byte chunk k
     * of row r at k ^ (r % 8), and r % 8 = g), stored by TMA, which drops rows past Sq (H200: 8-19% of the time at
     * D = 128, S = 1024 went to the direct 4-byte stores this replaced). The warpgroup's first thread issues the store
     * after the next barrier that every thread of the warpgroup passes (o_pending; store): on the main path the
     * next item's S_0 issue turn, so that no warpgroup barrier and no store issue lie between an item's last P V and
     * the next item's S_0 (benchmarks/trace_sm90.cu: about 330 of the 2700 cycles an item boundary took). On the
     * main path the tile is free by the time O is written: the first thread waits for the last store to have read
     * it ahead of the last P V's issue turn (in_turn); elsewhere finish waits itself. */
    FS_DEV_T void store()
    {
        if (o_pending && (threadIdx.x & 127) == 0) {
            const int4 c = s_ostore[cw];
            for (int h = 0; h < HALVES; h++) tma_store_4d(map_o, sO + cw * 64 * D + h * 64 * 64, h * 64, c.x, c.y, c.z);
            bulk_commit();
        }
        o_pending = false;
    }

    /* the same where no barrier of the warpgroup came since the tile was written: one of its own first */
    FS_DEV_T void store_synced()
    {
        if (o_pending) {
            warpgroup_sync<NWG>(cw);
            store();
        }
    }

    /* O_i / l_i out (inv: row_scale); FEAT: rows past a packed sequence's length are not written */
    FS_DEV_T void finish(const sm90_work &w, int row0, const float (&o)[NO * 4], const float (&inv)[2], bool in_turn)
    {
        const bool packed = FEAT && p.cu_seqlens_q;
        if (!packed || __reduce_max_sync(0xffffffffu, (unsigned)(w.q0 + cw * 64 + 64 <= w.seq.q_len))) {
            unsigned char *tile = reinterpret_cast<unsigned char *>(sO + cw * 64 * D);
            if (!in_turn) {
                store_synced();
                if ((threadIdx.x & 127) == 0) bulk_wait_read();
                warpgroup_sync<NWG>(cw);
            }
            stmatrix_rows_sw128<NO, T>(smem_addr(tile), 64 * 128, o, inv, warp, lane);
            fence_proxy_async();
            if ((threadIdx.x & 127) == 0) s_ostore[cw] = make_int4((int)w.seq.qo + w.q0 + cw * 64, w.h, w.tb, 0);
            o_pending = true;
        } else { /* the last rows of a packed sequence: a TMA box would run into the next one's */
            T *gO = static_cast<T *>(p.o) + w.h * p.o_sh + w.seq.qo * p.o_ss;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = row0 + 8 * r;
                if (row >= w.seq.q_len) continue;
#pragma unroll
                for (int n = 0; n < NO; n++)
                    if (n * 8 < p.D) /* a head dim below D: its columns only (sm90_kernel_dim) */
                        *reinterpret_cast<uint32_t *>(gO + (int64_t)row * p.o_ss + n * 8 + 2 * t4) =
                            pack2<T>(o[4 * n + 2 * r] * inv[r], o[4 * n + 2 * r + 1] * inv[r]);
            }
        }
    }
};
#endif

#endif
