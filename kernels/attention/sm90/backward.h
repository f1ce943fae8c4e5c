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
    float *delta;       /* rowsum(dO o O) per row; the T5 gradient's runs: rowsum(P o dP) by the delta pass */
    int *dq_order;      /* deterministic runs: fs_sm90_order_ints(g) zeroed ints (dQ's adds in one order per tile, the
                         * CTAs' block counter); else NULL */
    int rotary;         /* dK rotated back by rotary_base (the forward rotated q and k over all D columns) */
    float rotary_base;
    float *t5_rows;     /* the T5 bias: H fs_sm90_bwd_t5_row(p) floats, the tables as the kernel's blocks load them */
    float *t5_part;     /* the T5 gradient's sums by relative position per (b, h, key block), or NULL */
    int *dq_done;       /* where the kernel converts dQ into g->dq itself (fs_sm90_backward_converts):
                         * fs_sm90_dq_done_ints(g) zeroed ints; else NULL (the post-pass converts) */
    int *dq_zeroed;     /* where the kernel needs dq_acc unzeroed (fs_sm90_backward_zeroes): fs_sm90_dq_zeroed_ints(g)
                         * zeroed ints for the zeroing's counts and flags, dq_acc not zeroed; else NULL (zeroed) */
} fs_sm90_bwd_work;

/* Whether the Hopper backward takes g (the kernels' view: q and k as read, rotary off; rotary: the forward rotated them
 * over rotary_dim columns) on an sm_90 device: built for 90a, fp16/bf16, D = 64, 80, 96, 112 or 128, causal or not,
 * grouped-query heads, packed sequences, seqlens, key padding masks, rotary over the whole head dim, the T5 bias and
 * its table's gradient (non-causal, not deterministic, no grouped heads, up to FS_SM90_BWD_T5_MAX relative positions);
 * not the additive bias. */
int fs_sm90_backward_covers(const fs_attn_bwd_params *g, int rotary, int rotary_dim);
/* The kernel's key blocks (Bc = 128 keys at every head dim) per batch and K/V head. */
int fs_sm90_bwd_kblocks(const fs_attn_params *p);
/* The floats of a head's T5 table as the kernel loads it (w->t5_rows holds H of them), and those of the gradient's
 * sums by relative position per batch, head and key block (w->t5_part). */
int fs_sm90_bwd_t5_row(const fs_attn_params *p);
size_t fs_sm90_bwd_t5_part_floats(const fs_attn_params *p);
/* g->dtable from the kernel's sums by position in part (backward_t5_sum.cu). */
cudaError_t fs_sm90_backward_t5_sum(const fs_attn_bwd_params *g, const float *part, int device, cudaStream_t stream);
/* The counters a deterministic run of g takes (w->dq_order): two per (batch, head, 64 queries), then (at
 * fs_sm90_order_ticket) the one the CTAs take their blocks from. */
size_t fs_sm90_order_ints(const fs_attn_params *p);
size_t fs_sm90_order_ticket(const fs_attn_params *p);
/* Whether the kernel (which covers g) converts dQ into g->dq itself, so that no post-pass follows: its persistent
 * instantiation (D = 64, non-causal, padded batches without seqlens, not deterministic, no T5 bias) where there is no
 * rotation to turn back (rotary: the forward rotated q); and the tile counters it then takes (w->dq_done). */
int fs_sm90_backward_converts(const fs_attn_bwd_params *g, int rotary);
size_t fs_sm90_dq_done_ints(const fs_attn_params *p);
/* Whether the kernel (which covers g) needs no zeroed dQ accumulator from the pre-pass: its non-causal instantiations
 * that stage dQ and run one CTA per block (not D = 64 without the T5 bias, which runs persistent; not D = 80's own,
 * which adds by atomics) zero it themselves ahead of their adds, on padded batches; causal ones at D = 96-128 zero
 * each query tile by its first writer, on padded batches without seqlens; deterministic runs on padded batches
 * without seqlens store each tile's first share rather than add it; and the counters and flags the zeroing takes
 * (w->dq_zeroed, also the sign that the pre-pass left the accumulator). */
int fs_sm90_backward_zeroes(const fs_attn_bwd_params *g);
size_t fs_sm90_dq_zeroed_ints(const fs_attn_params *p);
/* dk, dv, and dQ added into w->dq_acc, for fp16 or bf16. */
cudaError_t fs_sm90_backward_fp16(const fs_attn_bwd_params *g, const fs_sm90_bwd_work *w, int device, cudaStream_t stream);
cudaError_t fs_sm90_backward_bf16(const fs_attn_bwd_params *g, const fs_sm90_bwd_work *w, int device, cudaStream_t stream);

#endif
