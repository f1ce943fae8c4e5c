/* Head-vector copies between a problem's own head dim and the next one a kernel is built for (head_copy.cu). */
#ifndef FLASHSCI_ATTENTION_HEAD_COPY_H
#define FLASHSCI_ATTENTION_HEAD_COPY_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "attention/params.h"

/* Rows nb x S (packed: nb = 1, S tokens, positions restarting at each cu[i]) x H heads, D_src columns read from src,
 * D_dst written to dst (zeros past D_src). rd > 0: pairs (c, c + rd/2), c < rd/2, turn by pos * inv_freq_c of rd
 * (inverse: the transpose, for gradients). Every value is multiplied by scale. Strides in elements. */
typedef struct {
    const void *src;
    void *dst;
    int src_f32;               /* src is float32 (dQ's accumulator, its columns at fs_dq_slot), else dst's dtype */
    int64_t s_sb, s_sh, s_ss, d_sb, d_sh, d_ss;
    int D_src, D_dst;
    int nb, S, H;
    const int32_t *cu;
    int n_seq;
    int rd, inverse;
    float base, scale;
} fs_head_copy;

#ifdef __cplusplus
extern "C" {
#endif

/* The head dim the kernels run a problem of head dim D at: D itself or the next of 32, 64, 96, 128, 256. */
int fs_attention_run_dim(int D);

/* Launch one copy (dtype fp16 or bf16) on stream; device is current. */
cudaError_t fs_head_copy_launch(const fs_head_copy *c, fs_dtype dtype, int device, cudaStream_t stream);

/* The forward of p (a head dim without its own kernel) at head dim Dp > p->D (a size a kernel is built for): q, k, v
 * copied (rotated) into stream-ordered scratch, run(padded problem, ctx), the output's first D columns copied back. */
cudaError_t fs_attention_forward_padded(const fs_attn_params *p, int Dp, int device, cudaStream_t stream,
                                        cudaError_t (*run)(const fs_attn_params *p, void *ctx), void *ctx);

#ifdef __cplusplus
}
#endif
#endif
