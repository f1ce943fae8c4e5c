/* The elementwise passes around the GEMM when gradients are wanted (the forward keeps the pre-activation, so the
 * activation runs as a pass of its own; the backward turns dy into dh = dy act'(h) and sums dh's columns into the
 * bias gradient): the problem shared by the host (csrc/linear_backward.c), the CUDA kernels (gemm/activation.cu)
 * and the CPU ones (gemm/cpu/activation_cpu.c). Plain C. */
#ifndef FLASHSCI_GEMM_ACTIVATION_H
#define FLASHSCI_GEMM_ACTIVATION_H

#include <stdint.h>

#include "gemm/params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Over M rows of N columns (strides in elements, rows ld apart, the last dimension contiguous), one dtype:
 *   forward,  linear:  y = act(h)                      h [M, N]   -> out [M, N]
 *   forward,  SwiGLU:  y = silu(g) u                   h [M, 2N] (g | u) -> out [M, N]
 *   backward, linear:  dh = dy act'(h)                 dy, h [M, N] -> out [M, N] (NULL: act none, only the sums)
 *   backward, SwiGLU:  dg = dy u silu'(g), du = dy silu(g)   dy [M, N], h [M, 2N] -> out [M, 2N] (dg | du)
 * With dbias non-NULL (linear backward) the column sums of dh go there: N values in dbias_dtype (fp16, bf16, fp32;
 * the CPU also fp64), accumulated in fp32 on the GPU and fp64 on the CPU. */
typedef struct {
    const void *h, *dy;
    void *out, *dbias;
    int64_t ldh, lddy, ldo;
    int M, N;
    fs_dtype dtype, dbias_dtype;
    fs_activation act;
    int swiglu, backward;
} fs_act_params;

#ifdef __cplusplus
}
#endif
#endif
