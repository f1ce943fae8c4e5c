/* Hopper attention backward, host side: tensor maps and the launch of one instantiation. Included by the per-dtype
 * translation units (backward_fp16.cu, backward_bf16.cu). */
#ifndef FLASHSCI_ATTENTION_SM90_BACKWARD_LAUNCH_CUH
#define FLASHSCI_ATTENTION_SM90_BACKWARD_LAUNCH_CUH

#include "attention/sm90/backward.h"
#include "attention/sm90/backward_kernel.cuh"
#include "attention/sm90/tensor_map.h"
#include "attention/sm90/variants.h"
#include "common/launch.cuh"

/* Blocks of (key block, K/V head, batch), over a persistent grid of one CTA per SM (sm90_bwd_config::PERSIST, padded
 * batches) or one CTA per block; T5: each head's table expanded ahead of it; DELTA: the delta pass. */
template <int D, typename T, bool CAUSAL, bool ORDERED, bool T5, bool DELTA = false>
static cudaError_t bwd90_launch(const fs_attn_bwd_params *g, const fs_sm90_bwd_work *w, int device, cudaStream_t stream)
{
    using tile = fs_sm90_bwd_tile<D>;
    using config = sm90_bwd_config<D, T, CAUSAL, ORDERED, T5, DELTA>;
    constexpr int SMEM = sm90_bwd_smem<config>();
    static fs_kernel handle;
    const fs_attn_params *p = &g->p;
    fs_sm90_bwd_args a;
    a.g = *g;
    a.scale_log2 = (float)(p->scale * 1.4426950408889634);
    a.scale = (float)p->scale;
    a.dq_acc = w->dq_acc;
    a.delta = w->delta;
    a.dq_order = w->dq_order;
    a.ticket = w->dq_order ? w->dq_order + fs_sm90_order_ticket(p) : NULL;
    a.order_tiles = (p->Sq + 63) / 64;
    a.rotary = w->rotary;
    a.rotary_base = w->rotary_base;
    a.n_kblocks = fs_sm90_bwd_kblocks(p);
    a.t5_rows = w->t5_rows;
    a.t5_part = DELTA ? NULL : w->t5_part;
    a.delta_out = DELTA ? w->delta : NULL;
    a.t5_lneg = a.t5_n = a.t5_row = 0;
    if (T5) {
        fs_t5_span(p, &a.t5_lneg, &a.t5_n); /* t5_n <= FS_SM90_BWD_T5_MAX: fs_sm90_backward_covers */
        a.t5_row = fs_sm90_bwd_t5_row(p);
    }
    const int hkv = fs_kv_heads(p), bf16 = p->dtype == FS_BF16;
    const long long blocks = (long long)a.n_kblocks * hkv * p->B;
    /* causal sections: the K/V heads whose q, k, v, dO and dQ accumulator take at most 24 MiB (per K/V head: its
     * query heads' 8 Sq D bytes, its own 4 Sk D) */
    const long long per_head = (8LL * p->Sq * p->kv_group + 4LL * p->Sk) * D, fit = (24LL << 20) / per_head;
    a.section = fit < 1 ? 1 : fit < (long long)hkv * p->B ? (int)fit : hkv * p->B;
    /* the dispatcher's pre-pass left the accumulator to the kernel where it passes dq_zeroed (fs_sm90_backward_zeroes):
     * the kernel zeroes it (ZERO_AHEAD, ZERO_TILES) or, ordered on padded batches without seqlens, every tile's first
     * share is stored (a.dq_planes: its rows past Sq in no other head's); an instantiation that does neither, packed
     * rows or no blocks have it zeroed here (the delta pass writes no dQ) */
    const bool padded = !p->cu_seqlens_q && blocks > 0;
    const bool zeroes = padded && (config::ZERO_AHEAD || (config::ZERO_TILES && !p->seqlens));
    const bool planes = padded && ORDERED && !DELTA && !p->seqlens;
    a.dq_zeroed = zeroes ? w->dq_zeroed : NULL;
    a.dq_planes = planes;
    if (w->dq_zeroed && !zeroes && !planes && !DELTA) {
        const int64_t rows = (int64_t)p->H * (p->cu_seqlens_q ? p->total_q : (int64_t)p->B * p->Sq);
        const cudaError_t zerr = cudaMemsetAsync(w->dq_acc, 0, 4 * (size_t)rows * p->D, stream);
        if (zerr != cudaSuccess) return zerr;
    }
    if (blocks == 0) return cudaSuccess;
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    a.blocks = (int)blocks;
    int sms = 0;
    cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
    a.resident = sms; /* one CTA per SM (__launch_bounds__(384, 1) and the shared memory) */
    /* the dispatcher skips the post-pass where it passes dq_done (fs_sm90_backward_converts): an instantiation that
     * does not convert dQ must not take it, or dq would stay unwritten */
    if (w->dq_done && !config::CONVERT) return cudaErrorNotSupported;
    a.dq_done = w->dq_done;
    const bool persistent = config::PERSIST && !p->cu_seqlens_q && !p->seqlens; /* padded batches: blocks alike */
    const unsigned grid = persistent && blocks > sms ? (unsigned)sms : (unsigned)blocks;
    int sq, sk, nb; /* packed sequences: all rows as one batch */
    sm90_extent(p, 1, &sq, &nb);
    sm90_extent(p, 0, &sk, &nb);
    CUtensorMap mq, mk, mv, mdo, mdq = {}, mdk = {}, mdv = {};
    err = sm90_map(&mq, p->q, bf16, sq, p->H, nb, p->D, p->q_ss, p->q_sh, p->q_sb, tile::BR);
    if (err == cudaSuccess) err = sm90_map(&mk, p->k, bf16, sk, hkv, nb, p->D, p->k_ss, p->k_sh, p->k_sb, tile::BC);
    if (err == cudaSuccess) err = sm90_map(&mv, p->v, bf16, sk, hkv, nb, p->D, p->v_ss, p->v_sh, p->v_sb, tile::BC);
    if (err == cudaSuccess) err = sm90_map(&mdo, g->dout, bf16, sq, p->H, nb, p->D, g->do_ss, g->do_sh, g->do_sb, tile::BR);
    if (config::STAGED && err == cudaSuccess) {
        /* the dQ accumulator as rows of D floats (staged dQ's TMA reductions; their row coordinates are int32), in
         * planes of Sq rows per (batch, query head) where the tiles' first shares are stored */
        const int64_t rows = (int64_t)p->H * (p->cu_seqlens_q ? p->total_q : (int64_t)p->B * p->Sq);
        const cuuint64_t row_bytes = 4 * (cuuint64_t)p->D;
        err = rows > 0x7fffffffLL ? cudaErrorInvalidConfiguration
              : planes ? fs_make_tensor_map_f32(&mdq, w->dq_acc, p->D, p->Sq, row_bytes, 16, 64, (cuuint64_t)p->B * p->H,
                                                row_bytes * p->Sq)
                       : fs_make_tensor_map_f32(&mdq, w->dq_acc, p->D, rows, row_bytes, 16, 64);
    }
    /* dV, dK by TMA (sm90_bwd_epilogue): one CTA per block, padded batches, strides a map takes; else direct stores */
    a.dkv_tma = !config::PERSIST && !DELTA && !p->cu_seqlens_q &&
                sm90_strides_ok(sk, hkv, nb, g->dk_ss, g->dk_sh, g->dk_sb) &&
                sm90_strides_ok(sk, hkv, nb, g->dv_ss, g->dv_sh, g->dv_sb) &&
                sm90_map(&mdk, g->dk, bf16, sk, hkv, nb, p->D, g->dk_ss, g->dk_sh, g->dk_sb, 64) == cudaSuccess &&
                sm90_map(&mdv, g->dv, bf16, sk, hkv, nb, p->D, g->dv_ss, g->dv_sh, g->dv_sb, 64) == cudaSuccess;
    if (T5 && (DELTA || !w->t5_part) && err == cudaSuccess) /* once: the delta pass runs first with the same tables */
        err = fs_sm90_t5_expand(p, a.t5_lneg, a.t5_n, a.t5_row, FS_LOG2E, w->t5_rows, device, stream);
    if (err == cudaSuccess)
        err = fs_kernel_prepare((const void *)attention_bwd_sm90<D, T, CAUSAL, ORDERED, T5, DELTA>, &handle, SMEM, device);
    void *args[] = {&mq, &mk, &mv, &mdo, &mdq, &mdk, &mdv, &a};
    if (err == cudaSuccess) err = fs_launch(&handle, device, grid, 384, SMEM, stream, args);
    return err;
}

/* The instantiation for g: head dim, causal, dQ's adds ordered (deterministic) or not, the T5 bias (non-causal, not
 * ordered: fs_sm90_backward_covers). */
template <int D, typename T>
static cudaError_t bwd90_launch_d(const fs_attn_bwd_params *g, const fs_sm90_bwd_work *w, int device, cudaStream_t stream)
{
    const bool ordered = w->dq_order != NULL;
    if (g->p.t5_table && w->t5_part) { /* the table's gradient: D_i = rowsum(P o dP) by the delta pass first */
        cudaError_t err = bwd90_launch<D, T, false, false, true, true>(g, w, device, stream);
        return err != cudaSuccess ? err : bwd90_launch<D, T, false, false, true>(g, w, device, stream);
    }
    if (g->p.t5_table) return bwd90_launch<D, T, false, false, true>(g, w, device, stream);
    if (g->p.causal)
        return ordered ? bwd90_launch<D, T, true, true, false>(g, w, device, stream)
                       : bwd90_launch<D, T, true, false, false>(g, w, device, stream);
    return ordered ? bwd90_launch<D, T, false, true, false>(g, w, device, stream)
                   : bwd90_launch<D, T, false, false, false>(g, w, device, stream);
}

template <typename T>
static cudaError_t bwd90_launch_dtype(const fs_attn_bwd_params *g, const fs_sm90_bwd_work *w, int device, cudaStream_t stream)
{
    /* D = 80 (the 2.7B LM's head dim) on its own kernel, products over 80 columns and shared memory as at 128: 8-14%
     * less time than the D = 128 kernel reading 80 columns (from 2048 tokens); deterministic runs and the T5 bias's
     * stay there (an ordered instantiation at 80, staged, would have its wgmmas serialized for want of registers).
     * 96, 112 on the D = 128 kernel, zeros past their columns */
    if (g->p.D == 80 && !w->dq_order && !g->p.t5_table)
        return g->p.causal ? bwd90_launch<80, T, true, false, false>(g, w, device, stream)
                           : bwd90_launch<80, T, false, false, false>(g, w, device, stream);
    switch (sm90_kernel_dim(g->p.D)) {
    case 64: return bwd90_launch_d<64, T>(g, w, device, stream);
    case 128: return bwd90_launch_d<128, T>(g, w, device, stream);
    default: return cudaErrorNotSupported;
    }
}

#endif
