/* Hopper attention, host side: the TMA tensor maps the forward and backward kernels read q, k, v, o and dO through,
 * and the head dims they take through them. */
#ifndef FLASHSCI_ATTENTION_SM90_TENSOR_MAP_H
#define FLASHSCI_ATTENTION_SM90_TENSOR_MAP_H

#include <stdint.h>

#include "common/tma.cuh"

/* The head dim of the kernel that runs data of head dim d, or 0: 64 and 128 their own; 80, 96 and 112 the D = 128
 * kernel, whose boxes of 64 columns read zeros past the data's d columns (TMA's out-of-bounds fill) and whose stores
 * drop the columns past them, so no padded copies are made (the backward runs 80 on an instantiation of its own with
 * the same boxes: backward_launch.cuh). d % 16 == 0: the rotary pre-pass and the backward's
 * post-pass turn chunk pairs of 8 columns at d / 2 apart. */
static inline int sm90_kernel_dim(int d)
{
    return d == 64 ? 64 : d > 64 && d <= 128 && d % 16 == 0 ? 128 : 0;
}

/* A 4-D tensor map over one of q, k, v, o, dO as (D, S, H, B) read in boxes of 64 columns x rows (columns past D
 * read as zeros, stores past D dropped); a size-1 dim gets a nominal stride (TMA wants every stride a nonzero
 * multiple of 16 bytes). */
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
