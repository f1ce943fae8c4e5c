/* What the CUDA attention kernels (attention/sm80, attention/sm90) share about a problem's protein options:
 * one sequence's row offsets and lengths (packed variable length, seqlens) and float loads of the bias / T5
 * tables in any float dtype. */
#ifndef FLASHSCI_ATTENTION_SEQ_CUH
#define FLASHSCI_ATTENTION_SEQ_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/params.h"
#include "common/cuda_ptx.cuh"

#define FS_LOG2E 1.4426950408889634f

/* One element of a float tensor (bias, T5 table) as float. */
FS_DEV float load_float(const void *base, int64_t i, fs_dtype dt)
{
    if (dt == FS_F32) return __ldg(static_cast<const float *>(base) + i);
    if (dt == FS_F64) return (float)__ldg(static_cast<const double *>(base) + i);
    const unsigned short bits = __ldg(static_cast<const unsigned short *>(base) + i);
    return dt == FS_F16 ? __half2float(__ushort_as_half(bits)) : __bfloat162float(__ushort_as_bfloat16(bits));
}

/* This block's sequence: packed row offsets and lengths (cu_seqlens values are not checked on the host
 * for CUDA inputs, so they are clamped to the packed tensors here), then seqlens. */
typedef struct { int64_t qo, ko; int q_len, k_len; } fs_seq;
FS_DEV fs_seq seq_geometry(const fs_attn_params &p, int b)
{
    fs_seq s = {0, 0, p.Sq, p.Sk};
    if (p.cu_seqlens_q) {
        s.qo = min(max((int64_t)p.cu_seqlens_q[b], (int64_t)0), p.total_q);
        s.ko = min(max((int64_t)p.cu_seqlens_k[b], (int64_t)0), p.total_k);
        s.q_len = (int)max((int64_t)0, min((int64_t)p.cu_seqlens_q[b + 1] - s.qo, min((int64_t)p.Sq, p.total_q - s.qo)));
        s.k_len = (int)max((int64_t)0, min((int64_t)p.cu_seqlens_k[b + 1] - s.ko, min((int64_t)p.Sk, p.total_k - s.ko)));
    }
    if (p.seqlens) {
        const int len = min(max(p.seqlens[b], 0), p.Sq);
        s.q_len = min(s.q_len, len);
        s.k_len = min(s.k_len, len);
    }
    return s;
}

/* Row of (b, h, i) in the backward's float32 workspaces (Delta, dQ's accumulator): (B, H, Sq) padded, (H, total_q) packed. */
FS_DEV int64_t fs_bwd_row(const fs_attn_params &p, int b, int h, int64_t qo, int i)
{
    return p.cu_seqlens_q ? (int64_t)h * p.total_q + qo + i : ((int64_t)b * p.H + h) * p.Sq + i;
}

/* Where column pair (j, j + 1) (j even) of a dQ accumulator row lies: each 16-column group in the mma fragments'
 * order (mma.sync's m16n8 and wgmma's accumulators alike), column 16m + 8e + 2t + c at 16m + 4t + 2e + c, so that a
 * thread's pairs of n8 groups 2m and 2m + 1 (t = its lane % 4) are one float4 add or store. */
FS_DEV int fs_dq_slot(int j)
{
    return (j & ~15) | (j >> 1 & 3) << 2 | (j >> 3 & 1) << 1;
}

/* The sequence of packed row r: the last i < n with cu[i] <= r (0 if none; values unchecked, as in the kernels). */
FS_DEV int packed_sequence(const int32_t *cu, int n, int r)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (__ldg(cu + mid) <= r) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

#endif
