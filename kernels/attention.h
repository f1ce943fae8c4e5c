/* Attention problem description shared by the host dispatch (csrc/) and every kernel family (kernels/).
 * Plain C so that both the C host and the CUDA launchers include it. */
#ifndef FLASHSCI_ATTENTION_H
#define FLASHSCI_ATTENTION_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FS_F16 = 0, FS_BF16 = 1, FS_F32 = 2, FS_F64 = 3, FS_BOOL = 4, FS_I32 = 5, FS_I64 = 6, FS_NUM_DTYPES } fs_dtype;
#define FS_FLOATS ((1u << FS_F16) | (1u << FS_BF16) | (1u << FS_F32) | (1u << FS_F64))

/* One attention problem, O = softmax(scale * Q K^T [+ causal mask]) V, in (batch, head, seq, dim) terms.
 * Strides are in elements; the head dimension is contiguous (stride 1) in every tensor.
 * Causal masking is top-left aligned, as torch's is_causal: query i sees keys j <= i. */
typedef struct {
    const void *q, *k, *v;
    void *o;
    void *lse;                 /* [B, H, Sq] contiguous, float32 (float64 for FS_F64 inputs); may be NULL */
    int64_t q_sb, q_sh, q_ss;  /* batch, head, sequence strides */
    int64_t k_sb, k_sh, k_ss;
    int64_t v_sb, v_sh, v_ss;
    int64_t o_sb, o_sh, o_ss;
    int B, H, Sq, Sk, D;
    double scale;
    int causal;
    fs_dtype dtype;
} fs_attn_params;

#ifdef __cplusplus
}
#endif
#endif
