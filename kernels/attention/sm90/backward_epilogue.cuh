/* Hopper attention backward: the consumers' epilogue, a block's dV_j and dK_j out of registers. dK scaled (and turned
 * back where the forward rotated k), rows past the sequence zeroed in a padded batch. On padded batches the kernels
 * that take a CTA per block (not K::PERSIST, whose next K_j, V_j load into the same shared memory) stage each tensor in
 * the warpgroup's own rows of V_j's tile by stmatrix and store it by TMA (fs_sm90_bwd_args::dkv_tma); elsewhere each
 * thread stores its pairs of columns. */
#ifndef FLASHSCI_ATTENTION_SM90_BACKWARD_EPILOGUE_CUH
#define FLASHSCI_ATTENTION_SM90_BACKWARD_EPILOGUE_CUH

#include "attention/rotary/rotary.cuh"
#include "attention/sm90/backward_barriers.cuh"
#include "attention/sm90/backward_producer.cuh"
#include "attention/sm90/backward_tile.cuh"
#include "common/tma.cuh"

#ifdef FS_WGMMA
/* dK (a thread's NO column groups of 8, rows key0 and key0 + 8) rotated back over rd = 16 HALF columns: group n pairs
 * with n + HALF; HALF a constant so that the pairs stay in registers. */
template <int HALF, int NO>
FS_DEV_T void bwd_unrotate(float (&dk)[NO * 4], int key0, int t4, int rd, float base)
{
#pragma unroll
    for (int n = 0; n < HALF; n++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const float inv_freq = rotary_inv_freq(8 * n + 2 * t4 + c, rd, base);
#pragma unroll
            for (int r = 0; r < 2; r++) unrotate_pair(dk[4 * n + 2 * r + c], dk[4 * (n + HALF) + 2 * r + c], (float)(key0 + 8 * r), inv_freq);
        }
}

/* One tensor (x: dV or dK, times mul[r] for row r) of consumer warpgroup cw's 64 keys through its rows of V_j's tile
 * (64-column halves of Bc rows, 128-byte swizzle) to map's rows row0.. of K/V head hkv, batch tb; the map drops rows
 * and columns past its ends. The warpgroup's first thread issues the store and waits for it to have read the tile
 * before the warpgroup writes it again. */
template <class K>
FS_DEV_T void bwd_store_tma(const sm90_bwd_shared<typename K::T> &sh, const CUtensorMap *map, const float (&x)[K::NO * 4],
                            const float (&mul)[2], int cw, int row0, int hkv, int tb)
{
    using T = typename K::T;
    constexpr int NO = K::NO, BC = K::BC;
    const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
    T *tile = sh.sV + cw * 64 * 64;
    stmatrix_rows_sw128<NO, T>(smem_addr(tile), BC * 128, x, mul, warp, lane);
    fence_proxy_async();
    bwd_warpgroup_sync(cw);
    if (tid == 0) {
#pragma unroll
        for (int h = 0; h < (NO * 8 + 63) / 64; h++) tma_store_4d(map, tile + h * BC * 64, h * 64, row0, hkv, tb);
        bulk_commit();
        bulk_wait_read();
    }
    bwd_warpgroup_sync(cw);
}

/* dV_j and dK_j of consumer warpgroup cw's keys key0, key0 + 8 (this thread's rows; t4: its lane % 4, which persistent
 * consumers read per block) out: dK scaled and rotated back over the data's head dim p.D (column c pairs with c + p.D /
 * 2, both this thread's); inside the sequence, zeros past it in a padded batch (none for packed rows); the columns
 * past p.D (zeros: sm90_kernel_dim) are not stored. The warpgroup's products have all completed, and V_j's rows of
 * this warpgroup are read by its own products only. */
template <class K>
FS_DEV_T void sm90_bwd_epilogue(const sm90_bwd_shared<typename K::T> &sh, const fs_sm90_bwd_args &a, const CUtensorMap *map_dk,
                                const CUtensorMap *map_dv, const sm90_bwd_block &blk, float (&dv)[K::NO * 4],
                                float (&dk)[K::NO * 4], int key0, int t4, int cw)
{
    using T = typename K::T;
    constexpr int D = K::D, NO = K::NO;
    const fs_attn_bwd_params &g = a.g;
    const fs_attn_params &p = g.p;
    const int k_len = blk.seq.k_len;
    if (a.rotary) {
        if constexpr (D != 128) bwd_unrotate<D / 16, NO>(dk, key0, t4, p.D, a.rotary_base);
        else if (p.D == 80) bwd_unrotate<5, NO>(dk, key0, t4, p.D, a.rotary_base); /* deterministic runs */
        else if (p.D == 96) bwd_unrotate<6, NO>(dk, key0, t4, p.D, a.rotary_base);
        else if (p.D == 112) bwd_unrotate<7, NO>(dk, key0, t4, p.D, a.rotary_base);
        else bwd_unrotate<8, NO>(dk, key0, t4, p.D, a.rotary_base);
    }
    const float keep[2] = {key0 < k_len ? 1.f : 0.f, key0 + 8 < k_len ? 1.f : 0.f};
    if (!K::PERSIST && a.dkv_tma) {
        const float keep_scaled[2] = {keep[0] * a.scale, keep[1] * a.scale};
        bwd_store_tma<K>(sh, map_dv, dv, keep, cw, blk.k0 + cw * 64, blk.hkv, blk.tb);
        bwd_store_tma<K>(sh, map_dk, dk, keep_scaled, cw, blk.k0 + cw * 64, blk.hkv, blk.tb);
        return;
    }
    const int rows = p.cu_seqlens_q ? k_len : p.Sk;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key0 + 8 * r;
        if (key >= rows) continue;
        const int64_t at = (int64_t)(blk.seq.ko + key);
        T *dvp = static_cast<T *>(g.dv) + blk.tb * g.dv_sb + blk.hkv * g.dv_sh + at * g.dv_ss + 2 * t4;
        T *dkp = static_cast<T *>(g.dk) + blk.tb * g.dk_sb + blk.hkv * g.dk_sh + at * g.dk_ss + 2 * t4;
#pragma unroll
        for (int n = 0; n < NO; n++)
            if (D != 128 || 8 * n < p.D) {
                *reinterpret_cast<uint32_t *>(dvp + 8 * n) = pack2<T>(dv[4 * n + 2 * r] * keep[r], dv[4 * n + 2 * r + 1] * keep[r]);
                *reinterpret_cast<uint32_t *>(dkp + 8 * n) =
                    pack2<T>(dk[4 * n + 2 * r] * a.scale * keep[r], dk[4 * n + 2 * r + 1] * a.scale * keep[r]);
            }
    }
}
#endif

#endif
