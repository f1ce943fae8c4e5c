/* Attention forward on sm_80+, host side: shared-memory extras, workspace (KV splits, the rotary pre-pass) and the
 * launch of one tile variant, and the variant chosen per problem. Included by the per-dtype translation units. */
#ifndef FLASHSCI_ATTENTION_SM80_LAUNCH_CUH
#define FLASHSCI_ATTENTION_SM80_LAUNCH_CUH

#include "attention/sm80/dispatch.h"
#include "attention/sm80/kernel.cuh"
#include "common/launch.cuh"
#include "common/workspace.h"

/* Shared-memory extras of a FEAT launch (rotary frequencies, T5 bias by relative position, KV tile list);
 * returns their bytes. */
template <int D, int BC>
static int plan_extras(const fs_attn_params *p, fs_sm80_args *a)
{
    int bytes = 0;
    a->ext_freq = a->ext_t5 = a->ext_list = 0;
    a->t5_n = a->t5_lneg = a->list_tiles = 0;
    if (p->rotary) {
        a->ext_freq = bytes;
        bytes += 4 * (D / 2);
    }
    if (p->t5_table) {
        a->ext_t5 = bytes;
        fs_t5_span(p, &a->t5_lneg, &a->t5_n); /* t5_n <= FS_CUDA_T5_MAX, checked by the host */
        bytes += 4 * a->t5_n;
    }
    const int n_kv = (p->Sk + BC - 1) / BC;
    if (p->kpm && n_kv <= FS_LIST_MAX) { /* the list, then the padded-key flags */
        a->ext_list = bytes;
        a->list_tiles = n_kv;
        bytes += 4 * n_kv;
    }
    return (bytes + 15) & ~15;
}

/* Launch one tile variant (grid = query tiles x KV splits x batch*heads, flattened), or only describe it.
 * FEAT: the kernel with the protein options (packing, padding, bias, T5, rotary). rot: the problem whose q and k
 * the rotary pre-pass rotates first (p is then rot with rotary off), or NULL. */
template <int D, typename T, int V, bool FEAT>
static cudaError_t launch_variant(const fs_attn_params *p, const fs_attn_params *rot, int sm_count, int device, int cluster,
                                  cudaStream_t stream, fs_sm80_plan *plan)
{
    using tile = fs_tile_for<D, V, FEAT>;
    constexpr int BR = 16 * tile::MT * tile::WARPS, BC = tile::BC, BCS = BC * tile::KVG;
    constexpr int THREADS = fs_block<D, V, FEAT>::THREADS;
    constexpr int RING = (BR + 2 * BCS * tile::STAGES) * fs_pitch<D>::VALUE * (int)sizeof(T);
    static fs_kernel handle;
    const void *kernel = (const void *)attention_fwd_sm80<D, T, V, FEAT>;
    cudaError_t err = fs_kernel_prepare(kernel, &handle, RING + (FEAT ? FS_EXT_MAX : 0), device);
    if (err != cudaSuccess) return err;

    fs_sm80_args a;
    a.p = *p;
    a.scale_log2 = (float)(p->scale * 1.4426950408889634);
    a.n_qtiles = (p->Sq + BR - 1) / BR;
    const long long bh = (long long)p->B * p->H, blocks = bh * a.n_qtiles;
    a.cluster = cluster > 1;
    a.n_splits = a.cluster ? cluster : fs_sm80_choose_splits(blocks, (fs_sm80_visited_keys(p, a.n_qtiles * BR) + BCS - 1) / BCS, sm_count);
    a.o_part = a.lse_part = NULL;
    a.counters = NULL;
    const int smem = RING + (FEAT ? plan_extras<D, BC>(p, &a) : 0);
    if (blocks * a.n_splits > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    if (plan) {
        plan->small = V != FS_BIG;
        plan->kv_groups = tile::KVG;
        plan->br = BR;
        plan->bc = BC;
        plan->threads = THREADS;
        plan->smem = smem;
        plan->n_qtiles = a.n_qtiles;
        plan->n_splits = a.n_splits;
        plan->cluster = a.cluster;
        plan->blocks = blocks * a.n_splits;
        plan->rotary = rot ? 2 : p->rotary ? 1 : 0;
        return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&plan->blocks_per_sm, kernel, THREADS, smem);
    }
    /* workspace: the split counters and partial results, then (rotary pre-pass) q and k rotated */
    void *ws = NULL;
    const bool split = a.n_splits > 1 && !a.cluster;
    const size_t rows = split ? (size_t)bh * p->Sq * a.n_splits : 0;
    const size_t rot_at = (FS_COUNTER_BYTES + rows * (D + 1) * sizeof(float) + 255) / 256 * 256;
    if ((split || rot) && (err = fs_workspace_get(device, stream, rot ? rot_at + fs_rotary_bytes(rot) : rot_at, &ws)) != cudaSuccess)
        return err;
    if (split) {
        a.counters = (int *)ws;
        a.o_part = (float *)((char *)ws + FS_COUNTER_BYTES);
        a.lse_part = a.o_part + rows * D;
    }
    if (rot) err = fs_rotary_qk(rot, device, stream, (char *)ws + rot_at, &a.p);
    void *args[] = {&a};
    if (err == cudaSuccess)
        err = a.cluster ? fs_launch_cluster(&handle, device, (unsigned)(blocks * a.n_splits), THREADS, smem, a.n_splits, stream, args)
                        : fs_launch(&handle, device, (unsigned)(blocks * a.n_splits), THREADS, smem, stream, args);
    if (ws) {
        cudaError_t rerr = fs_workspace_release(stream, ws);
        if (err == cudaSuccess) err = rerr;
    }
    return err;
}

/* Big tiles when they fill the SMs, else 64-row tiles: split over clusters where they pay (choose_cluster); else at
 * D <= 64 without protein options, 4 KV groups when every block gets an SM of its own and the keys span 3+ tiles
 * (H200: (1,1,512) 10.8 -> 8.8 us; 2 groups at two blocks per SM were slower on (8,8,256), 8.9 -> 9.2-9.6 us: there
 * the loads, not the chains, bound it). */
template <int D, typename T>
static cudaError_t launch(const fs_attn_params *p, int device, int sm_count, int major, cudaStream_t stream, fs_sm80_plan *plan)
{
    constexpr int BR = 16 * fs_tile<D, FS_BIG>::MT * fs_tile<D, FS_BIG>::WARPS, SBR = 16 * fs_tile<D, FS_SMALL>::WARPS;
    constexpr int SBC = fs_tile<D, FS_SMALL>::BC;
    fs_attn_params unrotated; /* with the rotary pre-pass: p as the kernel sees it, q and k already rotated */
    const fs_attn_params *rot = NULL;
    if (p->rotary && fs_sm80_rotary_prepass(p)) {
        unrotated = *p;
        unrotated.rotary = 0;
        rot = p;
        p = &unrotated;
    }
    const bool feat = p->cu_seqlens_q || p->kpm || p->seqlens || p->bias || p->t5_table || p->rotary;
    const long long bh = (long long)p->B * p->H, small_blocks = bh * ((p->Sq + SBR - 1) / SBR);
    if (bh * ((p->Sq + BR - 1) / BR) >= sm_count)
        return feat ? launch_variant<D, T, FS_BIG, true>(p, rot, sm_count, device, 0, stream, plan)
                    : launch_variant<D, T, FS_BIG, false>(p, rot, sm_count, device, 0, stream, plan);
    if (feat) return launch_variant<D, T, FS_SMALL, true>(p, rot, sm_count, device, 0, stream, plan);
    const int cluster = fs_sm80_choose_cluster(small_blocks, (fs_sm80_visited_keys(p, (p->Sq + SBR - 1) / SBR * SBR) + SBC - 1) / SBC, sm_count, major);
    if (cluster) return launch_variant<D, T, FS_SMALL, false>(p, rot, sm_count, device, cluster, stream, plan);
    if (D <= 64 && p->Sk > 2 * SBC && small_blocks <= sm_count)
        return launch_variant<D, T, D <= 64 ? FS_SMALL_G4 : FS_SMALL, false>(p, rot, sm_count, device, 0, stream, plan);
    return launch_variant<D, T, FS_SMALL, false>(p, rot, sm_count, device, 0, stream, plan);
}

template <typename T>
static cudaError_t launch_dtype(const fs_attn_params *p, int device, int sm_count, int major, cudaStream_t stream,
                                fs_sm80_plan *plan)
{
    switch (p->D) {
    case 32: return launch<32, T>(p, device, sm_count, major, stream, plan);
    case 64: return launch<64, T>(p, device, sm_count, major, stream, plan);
    case 96: return launch<96, T>(p, device, sm_count, major, stream, plan);
    case 128: return launch<128, T>(p, device, sm_count, major, stream, plan);
    case 256: return launch<256, T>(p, device, sm_count, major, stream, plan);
    default: return cudaErrorInvalidValue;
    }
}

#endif
