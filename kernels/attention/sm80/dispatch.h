/* Attention forward on sm_80+, host side: the heuristics that shape a launch (dispatch.cu) and the per-dtype
 * launchers (forward_fp16.cu, forward_bf16.cu). */
#ifndef FLASHSCI_ATTENTION_SM80_DISPATCH_H
#define FLASHSCI_ATTENTION_SM80_DISPATCH_H

#include <cuda_runtime_api.h>

#include "attention/launchers.h"
#include "attention/params.h"

#define FS_MAX_SPLITS 16
#define FS_MAX_CLUSTER 8 /* blocks of a thread-block cluster (the portable limit) */

/* KV splits merged through global memory for `blocks` query-tile blocks over n_kv key tiles (1: none). */
int fs_sm80_choose_splits(long long blocks, int n_kv, int sm_count);
/* Keys the longest query tile visits when the query tiles cover rows 0 .. q_end - 1. */
int fs_sm80_visited_keys(const fs_attn_params *p, long long q_end);
/* Blocks of a thread-block cluster that split each query tile's keys (0: no cluster). */
int fs_sm80_choose_cluster(long long blocks, int n_kv, int sm_count, int major);
/* Whether rotary runs as a pre-pass (rotary.cu) rather than inside the kernel. */
bool fs_sm80_rotary_prepass(const fs_attn_params *p);

/* Launch (or with plan non-NULL describe) the fp16 / bf16 kernels; the device is current, of compute capability major. */
cudaError_t fs_sm80_forward_fp16(const fs_attn_params *p, int device, int sm_count, int major, cudaStream_t stream,
                                 fs_sm80_plan *plan);
cudaError_t fs_sm80_forward_bf16(const fs_attn_params *p, int device, int sm_count, int major, cudaStream_t stream,
                                 fs_sm80_plan *plan);

#endif
