/* Attention backward on sm_80+, host side: the passes around the main kernel (backward_passes.cu) and the per-dtype
 * launchers of the main kernel (backward_fp16.cu, backward_bf16.cu), called by attention/backward_dispatch.cu. */
#ifndef FLASHSCI_ATTENTION_SM80_BACKWARD_H
#define FLASHSCI_ATTENTION_SM80_BACKWARD_H

#include <cuda_runtime_api.h>

#include "attention/params.h"

/* What the passes and the main kernel share: the float32 workspaces and how dq and dk come back. */
typedef struct {
    float *dq_acc;     /* [rows][D]: (B, H, Sq) rows padded, (H, total_q) packed; columns at fs_dq_slot */
    float *delta;      /* [rows] */
    int64_t rows;
    float scale;       /* the softmax scale (dQ and dK are scaled by it) */
    int rotary;        /* rotate dq and dk back by rotary_base (the forward rotated q and k) */
    int rotary_dim;    /* ... over this many columns: the problem's own head dim (less than D in padded runs) */
    float *t5_part;    /* T5 gradient: bucket sums per (b, h, query tile of 64), or the Hopper kernel's sums by
                        * relative position (fs_sm90_bwd_t5_part_floats) */
    int t5_hopper;     /* set by the main kernels' launch: t5_part is the Hopper kernel's */
    float *t5_rows;    /* the Hopper kernel's T5 tables (fs_sm90_bwd_t5_row floats a head) */
    float rotary_base;
    int sm90;          /* the Hopper main kernel may run (an sm_90 device, not forced to the portable one) */
    int *dq_order;     /* deterministic runs on the Hopper kernel: its dQ counters (fs_sm90_order_ints), or NULL */
    int *dq_done;      /* runs whose Hopper kernel converts dQ itself: its tile counters (fs_sm90_dq_done_ints), or NULL */
    int *dq_zeroed;    /* runs whose Hopper kernel needs no zeroed accumulator: its counters and flags
                        * (fs_sm90_dq_zeroed_ints, after dq_done's), or NULL */
} fs_bwd_work;

/* Delta = rowsum(dO o O) (zeros where a delta pass follows: g->dbias, g->dtable) and dQ's accumulator (rows of acc_d
 * floats: the kernels' head dim) zeroed (but where the main kernel zeroes it: w->dq_zeroed), for every row of g. */
cudaError_t fs_sm80_backward_pre(const fs_attn_bwd_params *g, const fs_bwd_work *w, int acc_d, int device, cudaStream_t stream);
/* dtable = the T5 gradient's partial bucket sums added over batches and query tiles, in a fixed order. */
cudaError_t fs_sm80_backward_t5_sum(const fs_attn_bwd_params *g, const float *part, int device, cudaStream_t stream);
/* dq = dQ's accumulator scaled (and rotated back), in dq's dtype and strides (native head dims). */
cudaError_t fs_sm80_backward_post(const fs_attn_bwd_params *g, const fs_bwd_work *w, int device, cudaStream_t stream);
/* The main kernel, by key block: dk, dv, and dQ's accumulator by atomics. g->p reads q and k as rotated (rotary off). */
cudaError_t fs_sm80_backward_fp16(const fs_attn_bwd_params *g, const fs_bwd_work *w, int device, cudaStream_t stream);
cudaError_t fs_sm80_backward_bf16(const fs_attn_bwd_params *g, const fs_bwd_work *w, int device, cudaStream_t stream);

#endif
