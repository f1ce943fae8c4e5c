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
 *   dtype; Y has out_dtype; accumulation is fp32 (fp64 on the CPU).
 * The backward's products read an operand transposed: trans_x, x holds X^T ([K, M], rows ldx apart); trans_w, w
 *   holds W^T ([K, N], rows ldw apart). dX = dH W is (X = dH, trans_w, w = W); dW = dH^T X is (trans_x, x = dH,
 *   trans_w, w = X). Transposed products take no bias, activation or SwiGLU. With trans_w, a non-NULL w2 holds the
 *   second half of W^T's rows (K even; rows K / 2 .. K of W^T are w2's rows 0 .. K / 2, ldw2 apart): the SwiGLU
 *   backward's dX = dG Wg + dU Wu as one product of X = (dG | dU) with separate gate and up weights.
 * On the GPU with pre non-NULL the forward also keeps its pre-activation for the backward: pre [M, N] (SwiGLU:
 *   [M, 2 N], X Wg^T then X Wu^T; dtype, rows ldpre apart, 16-byte aligned; out_dtype == dtype) gets X W^T + bias
 *   rounded to dtype, and Y is the activation of those rounded values. */
typedef struct {
    const void *x, *w, *w2, *bias;
    void *y, *pre;
    int64_t ldx, ldw, ldw2, ldy, ldpre;
    int M, N, K;
    fs_dtype dtype, bias_dtype, out_dtype;
    fs_activation act;
    unsigned char swiglu, trans_x, trans_w; /* flags in bytes: the struct stays small, a kernel parameter */
} fs_gemm_params;

#ifdef __cplusplus
}
#endif
#endif
