/* Hopper attention backward, host side: which problems its kernel takes and its per-dtype launchers
 * (backward_fp16.cu, backward_bf16.cu), called by the backward's dispatcher (attention/backward_dispatch.cu). */
#ifndef FLASHSCI_ATTENTION_SM90_BACKWARD_H
#define FLASHSCI_ATTENTION_SM90_BACKWARD_H

#include <cuda_runtime_api.h>

#include "attention/params.h"

/* Whether the Hopper backward takes g (the kernels' view: q and k as read, head dim native) on an sm_90 device: built
 * for 90a, fp16/bf16, D = 64 or 128, causal or not, grouped-query heads; none of the protein options (packed sequences,
 * seqlens, key padding, bias, T5), no rotary, no deterministic dQ. */
int fs_sm90_backward_covers(const fs_attn_bwd_params *g, int rotary);
/* dk, dv, and dQ added into dq_acc (float32 rows of D, zeroed; delta: rowsum(dO o O)), for fp16 or bf16. */
cudaError_t fs_sm90_backward_fp16(const fs_attn_bwd_params *g, float *dq_acc, const float *delta, int device, cudaStream_t stream);
cudaError_t fs_sm90_backward_bf16(const fs_attn_bwd_params *g, float *dq_acc, const float *delta, int device, cudaStream_t stream);

#endif
