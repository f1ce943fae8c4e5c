/* Hopper attention, host side: the TMA tensor maps the forward and backward kernels read q, k, v, o and dO through. */
#ifndef FLASHSCI_ATTENTION_SM90_TENSOR_MAP_H
#define FLASHSCI_ATTENTION_SM90_TENSOR_MAP_H

#include <stdint.h>

#include "common/tma.cuh"

/* A 4-D tensor map over one of q, k, v as (D, S, H, B) read in boxes of 64 columns x rows; a size-1 dim gets
 * a nominal stride (TMA wants every stride a nonzero multiple of 16 bytes). */
static inline cudaError_t sm90_map(CUtensorMap *map, const void *base, int bf16, int S, int H, int B, int D, int64_t ss,
                            int64_t sh, int64_t sb, int rows)
{
    const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)S, (cuuint64_t)H, (cuuint64_t)B};
    cuuint64_t strides[3] = {(cuuint64_t)ss * 2, (cuuint64_t)sh * 2, (cuuint64_t)sb * 2};
    cuuint64_t extent = (cuuint64_t)D * 2;
    for (int i = 0; i < 3; i++) {
        if (dims[i + 1] == 1) strides[i] = extent;
        extent = strides[i] * dims[i + 1];
    }
    const cuuint32_t box[4] = {64, (cuuint32_t)rows, 1, 1};
    return fs_make_tensor_map(map, base, bf16, 4, dims, strides, box);
}

/* Every stride of a dim longer than 1 nonzero (TMA cannot broadcast) and below 2^39 elements. */
static inline int sm90_strides_ok(int S, int H, int B, int64_t ss, int64_t sh, int64_t sb)
{
    const int64_t lim = 1LL << 39;
    return (S == 1 || (ss > 0 && ss < lim)) && (H == 1 || (sh > 0 && sh < lim)) && (B == 1 || (sb > 0 && sb < lim));
}

#endif
