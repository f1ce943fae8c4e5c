/* Rotary embedding arithmetic shared by the sm80 attention kernel (rotation in place in shared memory), the rotary
 * pre-pass (rotary.cu) and the backward kernels (gradients turned back). ESM / HF convention: the head vector's halves x1 = x[:D/2], x2 = x[D/2:] turn by
 * angle pos * inv_freq_i, inv_freq_i = 1 / base^(2i / D) in float32:  x1' = x1 cos - x2 sin,  x2' = x2 cos + x1 sin. */
#ifndef FLASHSCI_ROTARY_CUH
#define FLASHSCI_ROTARY_CUH

#include "common/cuda_ptx.cuh"

/* inv_freq_i of a head dim D, as HF computes it in float32. */
FS_DEV float rotary_inv_freq(int i, int D, float base)
{
    return 1.0f / powf(base, (float)(2 * i) / (float)D);
}

/* sin and cos of a float32 angle: reduced to [-pi, pi] with a two-part 2 pi, then the hardware units
 * (absolute error ~3e-7 for the angles rotary embeddings use, far below fp16 rounding) */
FS_DEV void sincos_reduced(float x, float *s, float *c)
{
    const float n = rintf(x * 0.159154943091895336f);
    const float r = fmaf(n, 1.74845553e-7f, fmaf(n, -6.28318548202514648f, x));
    __sincosf(r, s, c);
}

/* Rotate the gradient of a rotated vector back (the transpose of the rotation): for the pair (c, c + D/2) at angle
 * a:  dx_c = dr_c cos a + dr_{c+D/2} sin a,  dx_{c+D/2} = dr_{c+D/2} cos a - dr_c sin a. */
FS_DEV void unrotate_pair(float &lo, float &hi, float pos, float inv_freq)
{
    float s, c;
    sincos_reduced(pos * inv_freq, &s, &c);
    const float x = lo, y = hi;
    lo = x * c + y * s;
    hi = y * c - x * s;
}

/* cos and sin of pos * freq[i] for the 8 pairs of a 16-byte chunk. */
FS_DEV void chunk_angles(float pos, const float *freq, float (&cs)[8], float (&sn)[8])
{
#pragma unroll
    for (int i = 0; i < 8; i++) sincos_reduced(pos * freq[i], &sn[i], &cs[i]);
}

/* Rotate the 8 pairs of a chunk: w1 holds x1[i .. i + 7], w2 the matching x2, as packed pairs of T. */
template <typename T>
FS_DEV_T void rotate_chunk(uint32_t (&w1)[4], uint32_t (&w2)[4], const float (&cs)[8], const float (&sn)[8])
{
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const float2 x1 = unpack2<T>(w1[e]), x2 = unpack2<T>(w2[e]);
        w1[e] = pack2<T>(x1.x * cs[2 * e] - x2.x * sn[2 * e], x1.y * cs[2 * e + 1] - x2.y * sn[2 * e + 1]);
        w2[e] = pack2<T>(x2.x * cs[2 * e] + x1.x * sn[2 * e], x2.y * cs[2 * e + 1] + x1.y * sn[2 * e + 1]);
    }
}

#endif
