/* Hopper attention backward, host side: which problems its kernel takes and its per-dtype launchers
 * (backward_fp16.cu, backward_bf16.cu), called by the backward's dispatcher (attention/backward_dispatch.cu). */
#ifndef FLASHSCI_ATTENTION_SM90_BACKWARD_H
#define FLASHSCI_ATTENTION_SM90_BACKWARD_H

#include <cuda_runtime_api.h>

#include "attention/params.h"

/* What the kernel takes beyond the problem: the pre-pass's workspaces, the counters that order dQ's adds in
 * deterministic runs, and the rotation dK is turned back by. */
typedef struct {
    float *dq_acc;      /* float32 rows of the data's head dim (the backward's fs_bwd_row), zeroed; the kernel adds column j
                         * at fs_dq_slot(j) */
    const float *delta; /* rowsum(dO o O) per row */
    int *dq_order;      /* deterministic runs: fs_sm90_order_ints(g) zeroed ints (dQ's adds in key-block order); else NULL */
    int rotary;         /* dK rotated back by rotary_base (the forward rotated q and k over all D columns) */
    float rotary_base;
} fs_sm90_bwd_work;

/* Whether the Hopper backward takes g (the kernels' view: q and k as read, rotary off; rotary: the forward rotated them
 * over rotary_dim columns) on an sm_90 device: built for 90a, fp16/bf16, D = 64, 80, 96, 112 or 128, causal or not, grouped-query
 * heads, packed sequences, seqlens, key padding masks, rotary over the whole head dim; not the bias or the T5 bias. */
int fs_sm90_backward_covers(const fs_attn_bwd_params *g, int rotary, int rotary_dim);
/* The counters a deterministic run of g takes (w->dq_order). */
size_t fs_sm90_order_ints(const fs_attn_params *p);
/* dk, dv, and dQ added into w->dq_acc, for fp16 or bf16. */
cudaError_t fs_sm90_backward_fp16(const fs_attn_bwd_params *g, const fs_sm90_bwd_work *w, int device, cudaStream_t stream);
cudaError_t fs_sm90_backward_bf16(const fs_attn_bwd_params *g, const fs_sm90_bwd_work *w, int device, cudaStream_t stream);

#endif
