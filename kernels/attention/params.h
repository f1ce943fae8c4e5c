/* Attention problem description shared by the host dispatch (csrc/) and every kernel family (kernels/).
 * Plain C so that both the C host and the CUDA launchers include it. */
#ifndef FLASHSCI_ATTENTION_H
#define FLASHSCI_ATTENTION_H

#include <math.h>
#include <stdint.h>

#include "common/dtype.h"

#ifdef __CUDACC__
#define FS_HD __host__ __device__
#else
#define FS_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* One attention problem, O = softmax(scale * Q K^T [+ causal mask]) V, in (batch, head, seq, dim) terms.
 * Strides are in elements; the head dimension is contiguous (stride 1) in every tensor.
 * Causal masking is top-left aligned, as torch's is_causal: query i sees keys j <= i. */
typedef struct {
    const void *q, *k, *v;
    void *o;
    void *lse;                 /* float32 (float64 for FS_F64 inputs), element (b, h, i) at lse_sb b + lse_sh h + i
                                  (+ cu_seqlens_q[b] when packed); may be NULL */
    int64_t lse_sb, lse_sh;
    int64_t q_sb, q_sh, q_ss;  /* batch, head, sequence strides */
    int64_t k_sb, k_sh, k_ss;
    int64_t v_sb, v_sh, v_ss;
    int64_t o_sb, o_sh, o_ss;
    int B, H, Sq, Sk, D;
    int kv_group;              /* query heads per K/V head (grouped-query attention): q head h reads K/V head h / kv_group */
    double scale;
    int causal;
    fs_dtype dtype;
    /* packed variable length (FlashAttention's convention): sequence b owns rows cu_seqlens_q[b] ..
     * cu_seqlens_q[b + 1] - 1 of q and o, and cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1 of k and v; B is
     * the number of sequences, Sq and Sk the longest lengths, batch strides 0. NULL = padded batches */
    const int32_t *cu_seqlens_q, *cu_seqlens_k;
    int64_t total_q, total_k; /* packed token counts: CUDA kernels clamp cu_seqlens to them (values unchecked there) */
    /* key padding: key j of batch b is kept when kpm[b * kpm_sb + j * kpm_sk] != 0 (bool bytes); NULL = none */
    const uint8_t *kpm;
    int64_t kpm_sb, kpm_sk;
    /* seqlens[b] (int32, self-attention on a padded batch): queries and keys at or past it are skipped and
     * those query rows are written as zeros; NULL = none */
    const int32_t *seqlens;
    /* additive bias on the scaled scores, broadcast over [B, H, Sq, Sk] (stride 0 where broadcast); NULL = none */
    const void *bias;
    int64_t bias_sb, bias_sh, bias_sq, bias_sk;
    fs_dtype bias_dtype;
    /* rotary embeddings applied in the kernel to q (after scaling by scale, as ESM2 does) and k, ESM/HF
     * convention: half-split rotate_half, inv_freq_i = 1 / base^(2i / D) in float32, positions 0.. per
     * sequence; rotary = 0 for none */
    int rotary;
    float rotary_base;
    /* T5 relative-position bias computed in the kernel: score(i, j) += t5_table[h * t5_sh + bucket(j - i) * t5_sn] */
    const void *t5_table;
    int64_t t5_sh, t5_sn;
    int t5_buckets, t5_max_distance, t5_bidirectional;
    fs_dtype t5_dtype;
} fs_attn_params;

/* The gradients of one attention problem: p is the forward's problem as it ran (q, k, v, the options), with o and
 * lse the forward's output and logsumexp (inputs here); dO has o's layout. dq, dk, dv have q's, k's and v's shapes
 * (dk, dv summed over the query heads that share a K/V head: p.kv_group is H / Hkv here, also for K/V broadcast over
 * the heads); rotary gradients are with respect to the unrotated q and k. dbias, when wanted, has the bias's own
 * shape (dims dbias_dims, 1 where the bias broadcasts, strides in elements) and dtype; dtable (H, t5_buckets, float32)
 * receives the T5 table's gradient. Strides in elements; the head dimension is contiguous everywhere. */
typedef struct {
    fs_attn_params p;
    const void *dout;
    int64_t do_sb, do_sh, do_ss;
    void *dq, *dk, *dv;
    int64_t dq_sb, dq_sh, dq_ss, dk_sb, dk_sh, dk_ss, dv_sb, dv_sh, dv_ss;
    void *dbias;
    int64_t dbias_dims[4];     /* (B or 1, H or 1, Sq or 1, Sk or 1) */
    int64_t dbias_strides[4];
    float *dtable;
    int64_t dtable_sh;         /* elements between heads; buckets contiguous */
    int deterministic;         /* bit-identical results run to run (CUDA: no float atomics) */
} fs_attn_bwd_params;

/* K and V's head count, Hkv = H / kv_group. */
static inline int fs_kv_heads(const fs_attn_params *p)
{
    return p->H / p->kv_group;
}

/* CUDA kernels keep the T5 bias of every relative position in shared memory (clamped where buckets saturate):
 * min(Sq - 1, max_distance) + min(Sk - 1, max_distance) + 1 entries, at most this many */
#define FS_CUDA_T5_MAX 16384

/* The T5 relative positions the CUDA kernels tabulate: -*lneg .. *n - 1 - *lneg; positions beyond clamp to the
 * ends, where the buckets have saturated (|rel| >= max_distance) or no query / key pair reaches. */
static inline void fs_t5_span(const fs_attn_params *p, int *lneg, int *n)
{
    const int neg = p->Sq - 1 < p->t5_max_distance ? p->Sq - 1 : p->t5_max_distance;
    const int pos = p->Sk - 1 < p->t5_max_distance ? p->Sk - 1 : p->t5_max_distance;
    *lneg = neg;
    *n = neg + pos + 1;
}

/* T5's relative-position bucket of rel = key position - query position, exactly as HF transformers'
 * T5Attention._relative_position_bucket (float32 log, truncation toward zero). */
static inline FS_HD int fs_t5_bucket(int rel, int num_buckets, int max_distance, int bidirectional)
{
    int bucket = 0;
    if (bidirectional) {
        num_buckets /= 2;
        if (rel > 0) bucket = num_buckets;
        rel = rel < 0 ? -rel : rel;
    } else {
        rel = rel < 0 ? -rel : 0;
    }
    const int max_exact = num_buckets / 2;
    if (rel < max_exact) return bucket + rel;
    const float ratio = (float)rel / (float)max_exact;
    const float span = (float)log((double)max_distance / (double)max_exact);
    int large = max_exact + (int)(logf(ratio) / span * (float)(num_buckets - max_exact));
    return bucket + (large < num_buckets - 1 ? large : num_buckets - 1);
}

#ifdef __cplusplus
}
#endif
#endif
