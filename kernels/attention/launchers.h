/* Launchers of the CUDA attention kernels, callable from the C host (csrc/gpu.c). */
#ifndef FLASHSCI_ATTENTION_CUDA_H
#define FLASHSCI_ATTENTION_CUDA_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "attention/params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a problem is launched: tile variant, grid, KV splits (cluster: those of a query tile form a thread-block
 * cluster), resident blocks per SM, and rotary: 0 none, 1 in the kernel, 2 by the pre-pass. */
typedef struct {
    int small, kv_groups, br, bc, threads, smem, n_qtiles, n_splits, blocks_per_sm;
    long long blocks;
    int cluster, rotary;
} fs_sm80_plan;

/* Launch tensor-core flash attention (sm_80+, fp16/bf16, D in {32, 64, 96, 128, 256}) on stream; device
 * is the current device, of compute capability major.x. sm_count sizes the grid (KV splits for small problems).
 * With plan non-NULL nothing is launched: the plan is filled instead. Returns the launch's error code. */
cudaError_t fs_attention_sm80(const fs_attn_params *p, int device, int sm_count, int major, cudaStream_t stream,
                              fs_sm80_plan *plan);

/* Whether the Hopper kernel (sm_90a, wgmma) takes this problem on an sm_90 device with sm_count SMs: built
 * for 90a, fp16/bf16, D = 64 or 128, no additive bias (packed sequences, seqlens, key padding masks, T5 and
 * rotary are covered), TMA-able strides, enough query tiles to fill the SMs. */
int fs_attention_sm90_covers(const fs_attn_params *p, int sm_count);

/* Launch the Hopper kernel on stream (device is current; a persistent grid of at most sm_count blocks), or with
 * plan non-NULL only describe the launch. */
cudaError_t fs_attention_sm90(const fs_attn_params *p, int device, int sm_count, cudaStream_t stream, fs_sm80_plan *plan);

/* The gradients of g on CUDA (fp16/bf16; backward_dispatch.cu): a pre-pass (Delta = rowsum(dO o O), dq's float32
 * accumulator zeroed), the main kernel by key block (dk, dv; dq by atomics or bulk reductions, or with g->deterministic
 * by a second kernel by query block), a post-pass (dq scaled and converted), and the passes of dbias and the T5
 * table's gradient; head dims without a kernel of their own run padded to the next one. sm90: the Hopper main kernel
 * (sm_90a) may run where it covers the problem; else the portable ones (sm_80+). */
cudaError_t fs_attention_backward_gpu(const fs_attn_bwd_params *g, int device, int sm90, cudaStream_t stream);

/* Every query row of p (padded or packed) written as zeros and its lse as -inf (fill.cu): the result of attention
 * over no key at all, where the kernels have nothing to load. */
cudaError_t fs_attention_no_keys(const fs_attn_params *p, cudaStream_t stream);

/* Bytes of workspace the rotary pre-pass needs for p's q and k (fp16/bf16). */
size_t fs_rotary_bytes(const fs_attn_params *p);

/* Rotary pre-pass (rotary.cu, fp16/bf16, D in {32, 64, 96, 128, 256}): q and k of p rotated into ws (fs_rotary_bytes,
 * 16-byte aligned) on stream; *rotated is p reading them, with rotary off. */
cudaError_t fs_rotary_qk(const fs_attn_params *p, int device, cudaStream_t stream, void *ws, fs_attn_params *rotated);

#ifdef __cplusplus
}
#endif
#endif
