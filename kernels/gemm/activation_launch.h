/* Launcher of the elementwise passes (gemm/activation.cu), callable from the C host (csrc/gpu.c). */
#ifndef FLASHSCI_GEMM_ACTIVATION_LAUNCH_H
#define FLASHSCI_GEMM_ACTIVATION_LAUNCH_H

#include <cuda_runtime_api.h>

#include "gemm/activation.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Run p (fp16 / bf16; 16-byte aligned rows, N a multiple of 8) on stream, the device current. */
cudaError_t fs_activation_gpu(const fs_act_params *p, int device, cudaStream_t stream);

/* A linear forward that keeps its pre-activation (p->pre) in two steps, for the GEMM paths that do not keep it in
 * their epilogue: the product into pre (fs_gemm_into_pre), then y = act(pre) by this pass. */
cudaError_t fs_activation_of_pre(const fs_gemm_params *p, int device, cudaStream_t stream);

/* p's product with its output in p->pre and no activation (the first of the two steps). */
static inline fs_gemm_params fs_gemm_into_pre(const fs_gemm_params *p)
{
    fs_gemm_params q = *p;
    q.pre = NULL;
    q.act = FS_ACT_NONE;
    q.y = p->pre;
    q.ldy = p->ldpre;
    q.out_dtype = p->dtype;
    return q;
}

#ifdef __cplusplus
}
#endif
#endif
