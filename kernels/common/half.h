/* IEEE binary16 and bfloat16 <-> float conversions for the C CPU kernels (round to nearest even), and rows
 * of any float dtype to and from double. */
#ifndef FLASHSCI_HALF_H
#define FLASHSCI_HALF_H

#include <stdint.h>
#include <string.h>

#include "common/dtype.h"

/* Widen an IEEE half to float (exact). Branch-free so that row loops vectorise: the half's exponent and mantissa
 * shifted into a float's place and scaled by 2^112 (rebias 15 -> 127; subnormal halves come out as the normal floats
 * they are), inf / NaN given the float's all-ones exponent, then the sign. */
static inline float fs_half_to_float(uint16_t h)
{
    const uint32_t shifted = (uint32_t)(h & 0x7fffu) << 13, scale_bits = 0x77800000u; /* 2^112 */
    float f, scale;
    memcpy(&f, &shifted, 4);
    memcpy(&scale, &scale_bits, 4);
    f *= scale;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    bits = (h & 0x7c00u) == 0x7c00u ? shifted | 0x7f800000u : bits; /* inf / NaN (payload kept) */
    bits |= (uint32_t)(h & 0x8000u) << 16;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round a float to the nearest IEEE half, ties to even, with overflow to inf. */
static inline uint16_t fs_float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);          /* rounds past 65504 */
    if (ax < 0x38800000u) {                                          /* half subnormal or zero */
        if (ax < 0x33000000u) return (uint16_t)sign;                 /* below half of the smallest */
        uint32_t man = (ax & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(ax >> 23);                           /* 14..24 */
        uint32_t res = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (res & 1u))) res++;
        return (uint16_t)(sign | res);
    }
    uint32_t res = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (res & 1u))) res++;
    return (uint16_t)(sign | res);
}

/* Widen a bfloat16 to float (exact). */
static inline float fs_bf16_to_float(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round a float to the nearest bfloat16, ties to even; NaN stays NaN. */
static inline uint16_t fs_float_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* Load n elements of float dtype dt, widened to double. */
static inline void fs_load_row_d(const void *src, fs_dtype dt, double *dst, int n)
{
    const uint16_t *h = (const uint16_t *)src;
    switch (dt) {
    case FS_F16: for (int i = 0; i < n; i++) dst[i] = fs_half_to_float(h[i]); break;
    case FS_BF16: for (int i = 0; i < n; i++) dst[i] = fs_bf16_to_float(h[i]); break;
    case FS_F32: for (int i = 0; i < n; i++) dst[i] = ((const float *)src)[i]; break;
    default: for (int i = 0; i < n; i++) dst[i] = ((const double *)src)[i]; break;
    }
}

/* Store n doubles as float dtype dt (16-bit types round through float). */
static inline void fs_store_row_d(const double *src, fs_dtype dt, void *dst, int n)
{
    uint16_t *h = (uint16_t *)dst;
    switch (dt) {
    case FS_F16: for (int i = 0; i < n; i++) h[i] = fs_float_to_half((float)src[i]); break;
    case FS_BF16: for (int i = 0; i < n; i++) h[i] = fs_float_to_bf16((float)src[i]); break;
    case FS_F32: for (int i = 0; i < n; i++) ((float *)dst)[i] = (float)src[i]; break;
    default: for (int i = 0; i < n; i++) ((double *)dst)[i] = src[i]; break;
    }
}

#endif
