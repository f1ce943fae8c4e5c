/* Hopper attention forward, host side: tensor maps, workspace, the pre-passes (rotary, T5 tables, key padding lists:
 * prepare.cu) and the launch of one kernel instantiation on a persistent grid. Included by the per-dtype translation units
 * (forward_fp16.cu, forward_bf16.cu). */
#ifndef FLASHSCI_ATTENTION_SM90_LAUNCH_CUH
#define FLASHSCI_ATTENTION_SM90_LAUNCH_CUH

#include "attention/launchers.h"
#include "attention/sm90/kernel.cuh"
#include "attention/sm90/scheduler.cuh"
#include "attention/sm90/tensor_map.h"
#include "attention/sm90/variants.h"
#include "common/launch.cuh"
#include "common/tma.cuh"
#include "common/workspace.h"

/* Launch one tile shape on a persistent grid (one block per SM, at most one per work item), or only describe it;
 * p->D may be below the kernel's D (sm90_kernel_dim: the tensor maps fill and drop the columns past it).
 * FEAT: the kernel with packed sequences, seqlens and the T5 bias; KPM: with a key padding mask too; T5: the plain
 * kernel with the T5 bias. */
template <int D, int BC, int NWG, typename T, bool FEAT, bool KPM = false, bool T5 = false>
static cudaError_t launch(const fs_attn_params *p, int device, int sm_count, cudaStream_t stream, fs_sm80_plan *plan)
{
    constexpr int BR = 64 * NWG, THREADS = 128 * (NWG + 1), SMEM = sm90_smem<D, BC, NWG, FEAT || T5>();
    static fs_kernel handle;
    const void *kernel = (const void *)attention_fwd_sm90<D, BC, NWG, T, FEAT, KPM, T5>;
    fs_sm90_args a;
    a.p = *p;
    a.scale_log2 = (float)(p->scale * 1.4426950408889634);
    a.n_qtiles = (p->Sq + BR - 1) / BR;
    a.section = sm90_section(p);
    a.t5_lneg = a.t5_n = a.t5_row = 0;
    a.t5_rows = NULL;
    if (p->t5_table) { /* t5_n <= FS_SM90_T5_MAX: fs_attention_sm90_covers */
        fs_t5_span(p, &a.t5_lneg, &a.t5_n);
        a.t5_row = (a.t5_n + 2 * FS_SM90_T5_PAD + 3) / 4 * 4;
    }
    const long long items = (long long)p->B * p->H * a.n_qtiles;
    if (items > 0x7fffffffLL - 2LL * sm_count) return cudaErrorInvalidConfiguration; /* claims count to items + grid */
    a.items = (int)items;
    a.claims = NULL;
    const int grid = items < sm_count ? (int)items : sm_count;
    /* light last tiles (idle warpgroups) of the last grid / 3 heads at the end of the order, where their 8 us fill the
     * blocks that end early (ESM-C: 0.63 of a full tile's time; the blocks ended 7 us apart, benchmarks/trace_sm90.cu);
     * at most the heads whose K/V stay in L2 meanwhile (a.section: with all 32 heads' light tiles last, 1 x 32 x 16384
     * took 4670 us against 4466) */
    const int late = grid / 3 < a.section ? grid / 3 : a.section;
    a.late_heads = !FEAT && !p->causal && p->Sq % BR && a.n_qtiles > 1 ? (late > 0 ? late : 1) : 0;
    if (plan) {
        *plan = fs_sm80_plan{0, 1, BR, BC, THREADS, SMEM, a.n_qtiles, 1, 1, grid, 0, p->rotary ? 2 : 0};
        return cudaSuccess;
    }
    /* workspace: the claim counters, then (T5) the expanded tables, (key padding) each batch's tile counts and list,
     * (rotary) q and k rotated by the pre-pass */
    const int claims = sm90_claims(p, BR);
    a.kpm_tiles = (p->Sk + BC - 1) / BC;
    const size_t kpm_at = FS_COUNTER_BYTES + (size_t)p->H * a.t5_row * 4;
    const size_t kpm_list_at = kpm_at + ((size_t)p->B * (a.kpm_tiles + 2) * 4 + 15) / 16 * 16;
    const size_t kpm_bytes = p->kpm ? kpm_list_at - kpm_at + (size_t)p->B * a.kpm_tiles * 4 * 8 : 0;
    const size_t rot_at = (kpm_at + kpm_bytes + 255) / 256 * 256;
    void *ws = NULL;
    cudaError_t err = fs_kernel_prepare(kernel, &handle, SMEM, device);
    if (err == cudaSuccess && (claims || p->t5_table || p->kpm || p->rotary))
        err = fs_workspace_get(device, stream, rot_at + (p->rotary ? fs_rotary_bytes(p) : 0), &ws);
    if (err != cudaSuccess) return err;
    unsigned char *wsb = static_cast<unsigned char *>(ws);
    if (claims) a.claims = static_cast<int *>(ws);
    a.kpm_count = NULL;
    a.kpm_list = NULL;
    if (p->kpm) {
        int *count = reinterpret_cast<int *>(wsb + kpm_at);
        uint2 *list = reinterpret_cast<uint2 *>(wsb + kpm_list_at);
        err = fs_sm90_kpm_prepare(p, BC, a.kpm_tiles, count, list, device, stream);
        a.kpm_count = count;
        a.kpm_list = list;
    }
    fs_attn_params rotated; /* from here on p describes the rotated copies */
    if (p->rotary && err == cudaSuccess) {
        err = fs_rotary_qk(p, device, stream, wsb + rot_at, &rotated);
        a.p = rotated;
        p = &rotated;
    }
    if (err == cudaSuccess && p->t5_table) {
        float *rows = reinterpret_cast<float *>(wsb + FS_COUNTER_BYTES);
        const float mul = T5 ? (float)(1.0 / p->scale) : FS_LOG2E; /* T5 tables hold bias / scale: sm90_t5_init */
        err = fs_sm90_t5_expand(p, a.t5_lneg, a.t5_n, a.t5_row, mul, rows, device, stream);
        a.t5_rows = rows;
    }
    const int bf16 = p->dtype == FS_BF16;
    int sq, sk, nb;
    sm90_extent(p, 1, &sq, &nb);
    sm90_extent(p, 0, &sk, &nb);
    CUtensorMap mq, mk, mv, mo;
    if (err == cudaSuccess) err = sm90_map(&mq, p->q, bf16, sq, p->H, nb, p->D, p->q_ss, p->q_sh, p->q_sb, BR);
    const int hkv = fs_kv_heads(p);
    if (err == cudaSuccess) err = sm90_map(&mk, p->k, bf16, sk, hkv, nb, p->D, p->k_ss, p->k_sh, p->k_sb, BC);
    if (err == cudaSuccess) err = sm90_map(&mv, p->v, bf16, sk, hkv, nb, p->D, p->v_ss, p->v_sh, p->v_sb, BC);
    if (err == cudaSuccess) err = sm90_map(&mo, p->o, bf16, sq, p->H, nb, p->D, p->o_ss, p->o_sh, p->o_sb, 64);
    void *args[] = {&mq, &mk, &mv, &mo, &a};
    if (err == cudaSuccess) err = fs_launch(&handle, device, grid, THREADS, SMEM, stream, args);
    if (ws) {
        cudaError_t rerr = fs_workspace_release(stream, ws);
        if (err == cudaSuccess) err = rerr;
    }
    return err;
}

/* Variant v (variants.h) of the kernel for element type T. */
template <typename T>
static cudaError_t launch_variant(fs_sm90_variant v, const fs_attn_params *p, int device, int sm_count, cudaStream_t stream,
                                  fs_sm80_plan *plan)
{
    constexpr int W64 = sm90_nwg(64), W128 = sm90_nwg(128);
    switch (v) {
    case FS_SM90_D64: return launch<64, 128, W64, T, false>(p, device, sm_count, stream, plan);
    case FS_SM90_D64_2WG: return launch<64, 128, 2, T, false>(p, device, sm_count, stream, plan);
    case FS_SM90_D64_FEAT: return launch<64, 128, W64, T, true>(p, device, sm_count, stream, plan);
    case FS_SM90_D64_FEAT_BC64: return launch<64, 64, W64, T, true>(p, device, sm_count, stream, plan);
    case FS_SM90_D64_KPM: return launch<64, 128, W64, T, true, true>(p, device, sm_count, stream, plan);
    case FS_SM90_D128: return launch<128, 128, W128, T, false>(p, device, sm_count, stream, plan);
    case FS_SM90_D128_T5: return launch<128, 128, W128, T, false, false, true>(p, device, sm_count, stream, plan);
    case FS_SM90_D128_FEAT: return launch<128, 128, W128, T, true>(p, device, sm_count, stream, plan);
    case FS_SM90_D128_KPM: return launch<128, 128, W128, T, true, true>(p, device, sm_count, stream, plan);
    }
    return cudaErrorInvalidValue;
}

#endif
