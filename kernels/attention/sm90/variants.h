/* Hopper attention forward, host side: the interfaces between its translation units. The kernel instantiations the
 * dispatcher (dispatch.cu) chooses from and their launchers, one translation unit per dtype (forward_fp16.cu,
 * forward_bf16.cu); the pre-pass kernels' launchers (prepare.cu). */
#ifndef FLASHSCI_ATTENTION_SM90_VARIANTS_H
#define FLASHSCI_ATTENTION_SM90_VARIANTS_H

#include <cuda_runtime_api.h>

#include "attention/launchers.h"
#include "attention/params.h"

/* The instantiations: head dim, key tile Bc, consumer warpgroups (tile.cuh), and which options the kernel takes. */
typedef enum {
    FS_SM90_D64,           /* plain, Bc = 128, three consumer warpgroups */
    FS_SM90_D64_2WG,       /* plain, Bc = 128, two (below one item per SM: sm90_two_wg64) */
    FS_SM90_D64_FEAT,      /* protein options (packed, seqlens, T5), Bc = 128 */
    FS_SM90_D64_FEAT_BC64, /* protein options, Bc = 64 (short key ranges: sm90_narrow_keys) */
    FS_SM90_D64_KPM,       /* protein options with a key padding mask */
    FS_SM90_D128,          /* plain, Q in registers */
    FS_SM90_D128_T5,       /* plain with the T5 bias (ProtT5) */
    FS_SM90_D128_FEAT,     /* protein options */
    FS_SM90_D128_KPM,      /* protein options with a key padding mask */
} fs_sm90_variant;

/* Launch variant v of the kernel for fp16 or bf16 (p->dtype), or with plan non-NULL only describe the launch. */
cudaError_t fs_sm90_forward_fp16(fs_sm90_variant v, const fs_attn_params *p, int device, int sm_count, cudaStream_t stream,
                                 fs_sm80_plan *plan);
cudaError_t fs_sm90_forward_bf16(fs_sm90_variant v, const fs_attn_params *p, int device, int sm_count, cudaStream_t stream,
                                 fs_sm80_plan *plan);

/* The rows and batches TMA addresses q / o (query side) or k / v with: the padded batch, or all packed rows as
 * one batch. */
/* prepare.cu: each head's T5 table (bias times mul of relative positions -t5_lneg .. t5_n - 1 - t5_lneg, padded) into
 * out, row floats per head; each batch's list of the key tiles (bc keys) that keep a key into count and list. */
cudaError_t fs_sm90_t5_expand(const fs_attn_params *p, int t5_lneg, int t5_n, int row, float mul, float *out, int device,
                              cudaStream_t stream);
cudaError_t fs_sm90_kpm_prepare(const fs_attn_params *p, int bc, int tiles, int *count, uint2 *list, int device,
                                cudaStream_t stream);

static inline void sm90_extent(const fs_attn_params *p, int query_side, int *S, int *B)
{
    *S = p->cu_seqlens_q ? (int)(query_side ? p->total_q : p->total_k) : query_side ? p->Sq : p->Sk;
    *B = p->cu_seqlens_q ? 1 : p->B;
}

#endif
