/* Attention backward on sm_80+, host side of the main kernel (backward.cuh) and of the deterministic runs' dQ kernel
 * (backward_dq.cuh): the variant per problem and the launches. Included by the per-dtype translation units. */
#ifndef FLASHSCI_ATTENTION_SM80_BACKWARD_LAUNCH_CUH
#define FLASHSCI_ATTENTION_SM80_BACKWARD_LAUNCH_CUH

#include "attention/sm80/backward.cuh"
#include "attention/sm80/backward.h"
#include "attention/sm80/backward_dbias.cuh"
#include "attention/sm80/backward_dq.cuh"
#include "common/launch.cuh"

/* Launch the main kernel for head dim D (one block per key block, K/V head and batch, key block fastest: causal runs
 * start with the key blocks that see the most queries), then for deterministic runs and the T5 gradient the dQ kernel
 * (one block per query block, head and batch), then for bias_grad the dbias kernel (one block per tile of the bias's
 * index space). FEAT: the kernels with sequences of their own lengths (1) and with the other protein options (2);
 * MASK: those that test each score's mask (causal, the key padding mask; a plain non-causal run's kernel compares no
 * query with a key). */
template <int D, typename T, int FEAT, bool MASK>
static cudaError_t bwd_launch(const fs_attn_bwd_params *g, const fs_bwd_work *w, int device, int optin, cudaStream_t stream)
{
    using tile = fs_bwd_tile<D, !MASK>;
    using sm = fs_bwd_smem<D, T, !MASK>;
    using dq_tile = fs_bwd_dq_tile<D>;
    const fs_attn_params *p = &g->p;
    static fs_kernel main_handle, dq_handle, dbias_handle;
    fs_bwd_args a;
    a.g = *g;
    a.scale_log2 = (float)(p->scale * 1.4426950408889634);
    a.scale = w->scale;
    a.dq_acc = w->dq_acc;
    a.delta = w->delta;
    a.n_kblocks = (p->Sk + tile::BC - 1) / tile::BC;
    a.rotary = w->rotary;
    a.rotary_base = w->rotary_base;
    a.rotary_dim = w->rotary_dim;
    a.dq_kernel = g->deterministic || g->dtable;
    a.t5_part = w->t5_part;
    a.dq_smem_ds = fs_bwd_dq_smem<D, T>::DS;
    a.t5_n = a.t5_lneg = 0;
    if (p->t5_table) fs_t5_span(p, &a.t5_lneg, &a.t5_n); /* t5_n <= FS_CUDA_T5_MAX, checked by the host */
    const long long blocks = (long long)a.n_kblocks * fs_kv_heads(p) * p->B;
    const long long dq_blocks = (long long)(p->Sq + dq_tile::BR - 1) / dq_tile::BR * p->H * p->B;
    if (blocks > 0x7fffffffLL || dq_blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    /* double-buffered Q_i and dO_i where the device's shared memory allows, else single */
    a.stages = sm::bytes(2, a.t5_n) <= optin ? 2 : 1;
    const int smem = sm::bytes(a.stages, a.t5_n), dq_smem = fs_bwd_dq_smem<D, T>::bytes(a.t5_n);
    if (smem > optin || ((a.dq_kernel || g->dbias) && dq_smem > optin)) return cudaErrorNotSupported;
    cudaError_t err = cudaSuccess;
    void *args[] = {&a};
    a.delta_pass = 0;
    a.delta_out = w->delta;
    if ((g->dbias || g->dtable) && dq_blocks > 0) { /* Delta as rowsum(P o dP) for the gradients that sum dS over rows */
        err = fs_kernel_prepare((const void *)attention_bwd_dq_sm80<D, T, FEAT != 0>, &dq_handle,
                                fs_bwd_dq_smem<D, T>::bytes(FS_CUDA_T5_MAX), device);
        a.delta_pass = 1;
        if (err == cudaSuccess) err = fs_launch(&dq_handle, device, (unsigned)dq_blocks, dq_tile::THREADS, dq_smem, stream, args);
        a.delta_pass = 0;
        if (err != cudaSuccess) return err;
    }
    if (blocks > 0) {
        err = fs_kernel_prepare((const void *)attention_bwd_sm80<D, T, FEAT, MASK>, &main_handle,
                                sm::bytes(2, FS_CUDA_T5_MAX), device);
        if (err == cudaSuccess) err = fs_launch(&main_handle, device, (unsigned)blocks, tile::THREADS, smem, stream, args);
        if (err != cudaSuccess) return err;
    }
    if (a.dq_kernel && dq_blocks > 0) {
        err = fs_kernel_prepare((const void *)attention_bwd_dq_sm80<D, T, FEAT != 0>, &dq_handle,
                                fs_bwd_dq_smem<D, T>::bytes(FS_CUDA_T5_MAX), device);
        if (err == cudaSuccess) err = fs_launch(&dq_handle, device, (unsigned)dq_blocks, dq_tile::THREADS, dq_smem, stream, args);
        if (err != cudaSuccess) return err;
    }
    if (g->dbias) {
        using db = fs_bwd_dbias_tile<D>;
        const int64_t *dims = g->dbias_dims;
        const long long tiles = (dims[2] == 1 ? 1 : (p->Sq + db::BR - 1) / db::BR) * (dims[3] == 1 ? 1 : (p->Sk + db::BC - 1) / db::BC);
        const long long db_blocks = dims[0] * dims[1] * tiles;
        const int db_smem = fs_bwd_dbias_smem<D, T>::bytes(a.t5_n);
        if (db_blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
        if (db_smem > optin) return cudaErrorNotSupported;
        if (db_blocks > 0 && (err = fs_kernel_prepare((const void *)attention_bwd_dbias_sm80<D, T>, &dbias_handle,
                                                     fs_bwd_dbias_smem<D, T>::bytes(FS_CUDA_T5_MAX), device)) == cudaSuccess)
            err = fs_launch(&dbias_handle, device, (unsigned)db_blocks, db::THREADS, db_smem, stream, args);
    }
    return err;
}

/* The variant for g: the plain kernel unless an option needs a protein one (the one for sequences of their own
 * lengths where that is all); a non-causal plain run's kernel (the tall tile) where the device's shared memory per
 * block holds its tile, else the masked one. */
template <int D, typename T>
static cudaError_t bwd_launch_d(const fs_attn_bwd_params *g, const fs_bwd_work *w, int device, cudaStream_t stream)
{
    const fs_attn_params *p = &g->p;
    int optin = 0;
    const cudaError_t err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err != cudaSuccess) return err;
    if (p->kpm || p->bias || p->t5_table || w->rotary) return bwd_launch<D, T, 2, true>(g, w, device, optin, stream);
    /* non-causal runs mask no score (keys and queries past a length are zero rows) */
    const bool mask = p->causal || fs_bwd_smem<D, T, true>::bytes(1, 0) > optin;
    if (p->cu_seqlens_q || p->seqlens)
        return mask ? bwd_launch<D, T, 1, true>(g, w, device, optin, stream) : bwd_launch<D, T, 1, false>(g, w, device, optin, stream);
    return mask ? bwd_launch<D, T, 0, true>(g, w, device, optin, stream) : bwd_launch<D, T, 0, false>(g, w, device, optin, stream);
}

template <typename T>
static cudaError_t bwd_launch_dtype(const fs_attn_bwd_params *g, const fs_bwd_work *w, int device, cudaStream_t stream)
{
    switch (g->p.D) {
    case 32: return bwd_launch_d<32, T>(g, w, device, stream);
    case 64: return bwd_launch_d<64, T>(g, w, device, stream);
    case 96: return bwd_launch_d<96, T>(g, w, device, stream);
    case 128: return bwd_launch_d<128, T>(g, w, device, stream);
    case 256: return bwd_launch_d<256, T>(g, w, device, stream);
    default: return cudaErrorNotSupported;
    }
}

#endif
