/* GEMM problem description shared by the host dispatch (csrc/linear.c) and the GEMM kernel families
 * (gemm/cpu, gemm/sm80, gemm/sm90). Plain C. */
#ifndef FLASHSCI_GEMM_H
#define FLASHSCI_GEMM_H

#include <stdint.h>

#include "common/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The epilogue activation, applied to x W^T + bias in fp32 before the one store. */
typedef enum { FS_ACT_NONE = 0, FS_ACT_RELU, FS_ACT_GELU, FS_ACT_GELU_TANH, FS_ACT_SILU, FS_NUM_ACTS } fs_activation;

/* Y = act(X W^T + bias), or with swiglu Y = silu(X W^T) * (X W2^T):
 *   X [M, K] rows ldx apart, W and W2 [N, K] (nn.Linear layout) rows ldw / ldw2 apart, bias [N] or NULL,
 *   Y [M, N] rows ldy apart. Strides in elements, the last dimension contiguous everywhere. X, W, W2 share
 *   dtype; Y has out_dtype; accumulation is fp32 (fp64 on the CPU). */
typedef struct {
    const void *x, *w, *w2, *bias;
    void *y;
    int64_t ldx, ldw, ldw2, ldy;
    int M, N, K;
    fs_dtype dtype, bias_dtype, out_dtype;
    fs_activation act;
    int swiglu;
} fs_gemm_params;

#ifdef __cplusplus
}
#endif
#endif
