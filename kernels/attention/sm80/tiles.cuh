/* Shared-memory tiles of the sm80 attention kernels (forward kernel.cuh, backward backward*.cuh): the row pitch and the
 * asynchronous copy of a tile of head vectors into the 16-byte-chunk XOR swizzle (common/cuda_ptx.cuh's swz). */
#ifndef FLASHSCI_ATTENTION_SM80_TILES_CUH
#define FLASHSCI_ATTENTION_SM80_TILES_CUH

#include <stdint.h>

#include "common/cuda_ptx.cuh"

/* Shared-memory row pitch in elements: a multiple of 64 so the 16-byte-chunk XOR swizzle stays in-row. */
template <int D> struct fs_pitch { enum { VALUE = D < 64 ? 64 : (D + 63) / 64 * 64 }; };

/* Async-copy ROWS x D elements (row stride in elements) into a swizzled tile; rows >= valid are zeroed. Where the
 * block's threads cover whole rows a pass and a pass is a multiple of the swizzle's 8 rows, a thread's chunks are one
 * column at rows r, r + RS, ...: one address each side, then constant steps (the general loop's division, swizzle and
 * 64-bit product per chunk had made the backward's per-step tile loads several hundred instructions). */
template <int ROWS, int D, int THREADS, typename T>
FS_DEV void load_tile(T *tile, const T *g, int64_t stride, int valid, int tid)
{
    constexpr int CH = D / 8, P = fs_pitch<D>::VALUE, RS = THREADS / CH; /* RS: rows a pass */
    if constexpr (THREADS % CH == 0 && RS % 8 == 0 && ROWS % RS == 0) {
        const int r = (unsigned)tid / CH, c = (unsigned)tid % CH;
        const uint32_t dst = smem_addr(tile + swz<P>(r, c * 8));
        const T *src = g + r * stride + c * 8;
#pragma unroll
        for (int k = 0; k < ROWS / RS; k++) /* rows past valid: zero-filled, nothing read from src */
            cp_async16(dst + k * RS * P * (int)sizeof(T), src + k * RS * stride, r + k * RS < valid);
    } else {
#pragma unroll
        for (int i = tid; i < ROWS * CH; i += THREADS) {
            const int r = i / CH, c = i % CH;
            const bool ok = r < valid;
            cp_async16(smem_addr(tile + swz<P>(r, c * 8)), g + (ok ? r * stride + c * 8 : 0), ok);
        }
    }
}

#endif
