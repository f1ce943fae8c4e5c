/* Hopper attention forward: the kernel's shared memory. Its size (sm90_smem, for the launch) and, in device code, its
 * layout (sm90_shared) carved out of the dynamic shared memory once at the kernel's start (sm90_carve). */
#ifndef FLASHSCI_ATTENTION_SM90_SMEM_CUH
#define FLASHSCI_ATTENTION_SM90_SMEM_CUH

#include "attention/sm90/scheduler.cuh"
#include "attention/sm90/tile.cuh"

/* shared memory: Q tile, K ring, V ring, an O staging tile per consumer warpgroup (1024-byte aligned), with the
 * protein options (FEAT) two T5 tables (for the items of alternate Q tile loads), the mbarriers, the current work item,
 * the coordinates of each staging tile's store; plus 1 KiB alignment slack */
template <int D, int BC, int NWG, bool BIAS> constexpr int sm90_smem()
{
    using t = fs_sm90_tile<D, BC, NWG>;
    return (2 * 64 * NWG + 2 * t::STAGES * BC) * D * 2 + (BIAS ? 2 * 4 * FS_SM90_T5_STRIDE : 0) + (4 + 4 * t::STAGES) * 8 +
           FS_SM90_WORK_BYTES + NWG * 16 + 1024;
}

#ifdef FS_WGMMA
/* The Q tile, the K and V rings (stage s at s Bc D, 64-column halves Bc rows apart), a 64 x D O staging tile per consumer
 * warpgroup, the T5 tables (FEAT, T5: two of FS_SM90_T5_STRIDE, the one of the item whose Q tile loads in phase q_phase
 * at q_phase), the mbarriers, the current work item (written by the producer thread, which then arrives on item_full;
 * every consumer thread arrives on item_read once it has read it: an arrive orders the arriving thread's own accesses
 * only) and per consumer warpgroup its staging tile's store coordinates (row, h, b). */
template <typename T> struct sm90_shared {
    T *sQ, *sK, *sV, *sO;
    float *s_t5;
    uint64_t *q_full, *q_empty, *k_full, *k_empty, *v_full, *v_empty, *item_full, *item_read;
    sm90_work *s_work;
    int4 *s_ostore;
};

/* The layout of instantiation K in smem_raw, from its first 1024-byte boundary (smem_align1024). */
template <class K> FS_DEV_T sm90_shared<typename K::T> sm90_carve(unsigned char *smem_raw)
{
    using T = typename K::T;
    constexpr int D = K::D, BC = K::BC, STAGES = K::STAGES, BR = K::BR;
    sm90_shared<T> sh;
    sh.sQ = reinterpret_cast<T *>(smem_align1024(smem_raw));
    sh.sK = sh.sQ + BR * D;
    sh.sV = sh.sK + STAGES * BC * D;
    sh.sO = sh.sV + STAGES * BC * D;
    sh.s_t5 = reinterpret_cast<float *>(sh.sO + BR * D);
    sh.q_full = reinterpret_cast<uint64_t *>(sh.s_t5 + (K::BIAS ? 2 * FS_SM90_T5_STRIDE : 0));
    sh.q_empty = sh.q_full + 1;
    sh.k_full = sh.q_empty + 1;
    sh.k_empty = sh.k_full + STAGES;
    sh.v_full = sh.k_empty + STAGES;
    sh.v_empty = sh.v_full + STAGES;
    sh.item_full = sh.v_empty + STAGES;
    sh.item_read = sh.item_full + 1;
    sh.s_work = reinterpret_cast<sm90_work *>(sh.item_read + 1);
    sh.s_ostore = reinterpret_cast<int4 *>(reinterpret_cast<unsigned char *>(sh.s_work) + FS_SM90_WORK_BYTES);
    return sh;
}
#endif

#endif
