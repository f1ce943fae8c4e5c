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

#ifdef __cplusplus
}
#endif
#endif
