/* Launchers of the CUDA GEMM kernels, callable from the C host (csrc/gpu.c). */
#ifndef FLASHSCI_GEMM_CUDA_H
#define FLASHSCI_GEMM_CUDA_H

#include <cuda_runtime_api.h>

#include "gemm/params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a GEMM is launched: output tile, K step, ring stages, grid (persistent kernels: min(work items, SMs)), and the
 * K chunks each tile of a last, partial round is split into (1: none). */
typedef struct {
    int bm, bn, bk, stages, threads, smem, grid;
    long long tiles;
    int split;
    int keeps_pre; /* the launch keeps p->pre itself (the Hopper kernel's activation warps); else the caller runs the
                    * products into pre, then the activation pass (fs_gemm_pre_products, fs_gemm_pre_pass) */
} fs_gemm_plan;

/* What a launch with p->pre set returns when it does not keep the pre-activation itself (nothing launched): the
 * caller runs the products into pre, then the activation pass. */
#define FS_GEMM_PRE_DECLINED cudaErrorNotSupported

/* Launch the portable tensor-core GEMM (sm_80+, mma.sync, fp16/bf16, N and K multiples of 8) on stream; the
 * device is current. With plan non-NULL nothing is launched: the plan is filled instead. */
cudaError_t fs_gemm_sm80(const fs_gemm_params *p, int device, cudaStream_t stream, fs_gemm_plan *plan);

/* Whether the Hopper GEMM (sm_90a: TMA, wgmma, warp specialisation) was built into this library. */
int fs_gemm_sm90_built(void);

/* Launch the Hopper GEMM on stream (device current, sm_count SMs), or with plan non-NULL describe it; tile_n picks
 * the tile width (128, 160, 192, 256; 0: by the problem's shape). */
cudaError_t fs_gemm_sm90(const fs_gemm_params *p, int device, int sm_count, int tile_n, cudaStream_t stream,
                         fs_gemm_plan *plan);

#ifdef __cplusplus
}
#endif
#endif
