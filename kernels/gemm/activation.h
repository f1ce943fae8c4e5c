/* The elementwise passes around the GEMM when gradients are wanted (the forward keeps the pre-activation, so the
 * activation runs as a pass of its own; the backward turns dy into dh = dy act'(h) and sums dh's columns into the
 * bias gradient): the problem shared by the host (csrc/linear_backward.c), the CUDA kernels (gemm/activation.cu)
 * and the CPU ones (gemm/cpu/activation_cpu.c). Plain C. */
#ifndef FLASHSCI_GEMM_ACTIVATION_H
#define FLASHSCI_GEMM_ACTIVATION_H

#include <stdint.h>
#include <string.h>

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

/* A forward keeping its pre-activation in two steps (where the GEMM's epilogue does not keep it), the first step's
 * products into q, their count returned: x W^T + bias into p->pre, no activation (SwiGLU: the gate and the up
 * product into pre's two halves). */
static inline int fs_gemm_pre_products(const fs_gemm_params *p, fs_gemm_params q[2])
{
    q[0] = *p;
    q[0].pre = NULL;
    q[0].act = FS_ACT_NONE;
    q[0].swiglu = 0;
    q[0].w2 = NULL;
    q[0].y = p->pre;
    q[0].ldy = p->ldpre;
    q[0].out_dtype = p->dtype;
    if (!p->swiglu) return 1;
    q[1] = q[0];
    q[1].w = p->w2;
    q[1].ldw = p->ldw2;
    q[1].y = (char *)p->pre + (size_t)p->N * fs_dtype_itemsize(p->dtype);
    return 2;
}

/* The second step: the forward pass from p->pre to p->y. */
static inline fs_act_params fs_gemm_pre_pass(const fs_gemm_params *p)
{
    fs_act_params a;
    memset(&a, 0, sizeof a);
    a.h = p->pre;
    a.ldh = p->ldpre;
    a.out = p->y;
    a.ldo = p->ldy;
    a.M = p->M;
    a.N = p->N;
    a.dtype = p->dtype;
    a.act = p->act;
    a.swiglu = p->swiglu;
    return a;
}

#ifdef __cplusplus
}
#endif
#endif
