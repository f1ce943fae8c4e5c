/* Head-vector copies for the head dims without a kernel of their own (D % 8 == 0 up to 256; native: 32, 64, 96, 128,
 * 256): q, k, v (and dO) are copied into zero-padded rows of the next native size Dp, rotated on the way when the
 * problem uses rotary (over the true D: pairs (c, c + D/2), inv_freq of D), the kernels run at Dp, and the outputs come
 * back through the same copy: the first D columns, the gradients of rotated inputs rotated back (the transpose), dQ
 * from its float32 accumulator scaled by the softmax scale. Zero columns change no score and no output column. One
 * thread per 8-column chunk (16-byte loads and stores; a thread per element ran 4x slower than the attention kernel
 * it fed at (4, 32, 2048, 80)), each element's rotation partner read beside it; memory-bound.
 *
 * Build: part of the extension; alone: nvcc -O3 -std=c++17 -gencode=arch=compute_80,code=sm_80 -Ikernels -c kernels/attention/head_copy.cu
 * Run:   pytest tests/test_attention_gpu.py -k head_dim; pytest tests/test_attention_backward_gpu.py -k head_dim
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "attention/head_copy.h"
#include "attention/rotary/rotary.cuh"
#include "attention/sequence.cuh"
#include "common/launch.cuh"

/* Element j of row (b, i), head h of the source, as float. */
template <typename T>
FS_DEV_T float src_at(const fs_head_copy &c, int b, int i, int h, int j)
{
    const int64_t at = b * c.s_sb + h * c.s_sh + (int64_t)i * c.s_ss + j;
    return c.src_f32 ? static_cast<const float *>(c.src)[at] : (float)static_cast<const T *>(c.src)[at];
}

/* Columns j0 .. j0 + 7 of row (b, i), head h of the source (D_src % 8 == 0: all inside or all past it, zeros), as
 * float: 16-byte loads where the copy is aligned (vec), else element by element. */
template <typename T>
FS_DEV_T void src_chunk(const fs_head_copy &c, bool vec, int b, int i, int h, int j0, float (&x)[8])
{
    if (j0 >= c.D_src) {
#pragma unroll
        for (int e = 0; e < 8; e++) x[e] = 0.f;
        return;
    }
    const int64_t at = b * c.s_sb + h * c.s_sh + (int64_t)i * c.s_ss + j0;
    if (vec && c.src_f32) {
        const float4 *p = reinterpret_cast<const float4 *>(static_cast<const float *>(c.src) + at);
        const float4 u = __ldg(p), w = __ldg(p + 1);
        x[0] = u.x; x[1] = u.y; x[2] = u.z; x[3] = u.w; x[4] = w.x; x[5] = w.y; x[6] = w.z; x[7] = w.w;
    } else if (vec) {
        const uint4 u = __ldg(reinterpret_cast<const uint4 *>(static_cast<const T *>(c.src) + at));
        const uint32_t *w = reinterpret_cast<const uint32_t *>(&u);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 f = unpack2<T>(w[e]);
            x[2 * e] = f.x;
            x[2 * e + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) x[e] = src_at<T>(c, b, i, h, j0 + e);
    }
}

/* One thread per 8-column chunk of an output row (row, head, chunk; chunks fastest), 256 threads a block; the rotation
 * partner of each element read beside it (the chunk at j ± rd/2 is in the same row, cached). */
template <typename T>
__global__ void __launch_bounds__(256) head_copy(const fs_head_copy c, int vec)
{
    const int chunks = c.D_dst / 8;
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)c.nb * c.S * c.H * chunks) return;
    const int j0 = (int)(t % chunks) * 8;
    const long long rh = t / chunks;
    const int h = (int)(rh % c.H);
    const long long r = rh / c.H;
    const int b = (int)(r / c.S), i = (int)(r % c.S);
    float x[8];
    src_chunk<T>(c, vec, b, i, h, j0, x);
    if (c.rd > 0 && j0 < c.rd) {
        const int half = c.rd / 2;
        const int pos = c.cu ? i - __ldg(c.cu + packed_sequence(c.cu, c.n_seq, i)) : i;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const int j = j0 + e, k = j < half ? j : j - half;
            if (j >= c.rd) break;
            const float y = src_at<T>(c, b, i, h, j < half ? j + half : j - half); /* the partner */
            float s, co;
            sincos_reduced((float)pos * rotary_inv_freq(k, c.rd, c.base), &s, &co);
            if (c.inverse) s = -s;
            /* x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin (inverse: sin -> -sin) */
            x[e] = j < half ? x[e] * co - y * s : x[e] * co + y * s;
        }
    }
    T *dst = static_cast<T *>(c.dst) + b * c.d_sb + h * c.d_sh + (int64_t)i * c.d_ss + j0;
    if (vec) {
        uint4 u;
        uint32_t *w = reinterpret_cast<uint32_t *>(&u);
#pragma unroll
        for (int e = 0; e < 4; e++) w[e] = pack2<T>(x[2 * e] * c.scale, x[2 * e + 1] * c.scale);
        *reinterpret_cast<uint4 *>(dst) = u;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) dst[e] = T(x[e] * c.scale);
    }
}

/* Whether every row of the copy starts 16 bytes aligned (16-byte loads and stores). */
static int copy_aligned(const fs_head_copy *c)
{
    const int64_t se = c->src_f32 ? 4 : 2;
    const int64_t s[6] = {c->s_sb * se, c->s_sh * se, c->s_ss * se, c->d_sb * 2, c->d_sh * 2, c->d_ss * 2};
    for (int k = 0; k < 6; k++)
        if (s[k] % 16) return 0;
    return (uintptr_t)c->src % 16 == 0 && (uintptr_t)c->dst % 16 == 0;
}

extern "C" int fs_attention_run_dim(int D)
{
    return D <= 32 ? 32 : D <= 64 ? 64 : D <= 96 ? 96 : D <= 128 ? 128 : 256;
}

extern "C" cudaError_t fs_head_copy_launch(const fs_head_copy *c, fs_dtype dtype, int device, cudaStream_t stream)
{
    static fs_kernel handles[2];
    const long long blocks = ((long long)c->nb * c->S * c->H * (c->D_dst / 8) + 255) / 256;
    if (blocks == 0) return cudaSuccess;
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    const bool bf = dtype == FS_BF16;
    const void *kernel = bf ? (const void *)head_copy<__nv_bfloat16> : (const void *)head_copy<__half>;
    cudaError_t err = fs_kernel_prepare(kernel, &handles[bf], 0, device);
    int vec = copy_aligned(c);
    void *args[] = {const_cast<fs_head_copy *>(c), &vec};
    return err != cudaSuccess ? err : fs_launch(&handles[bf], device, (unsigned)blocks, 256, 0, stream, args);
}

/* A copy of one operand of p (q: query side) between its strides and the token-major scratch layout (nb, S, H, Dp). */
static fs_head_copy side_copy(const fs_attn_params *p, int query_side, const void *src, int64_t sb, int64_t sh, int64_t ss,
                              void *dst, int H, int Dp, int rotate)
{
    fs_head_copy c;
    const int packed = p->cu_seqlens_q != NULL;
    c.src = src;
    c.dst = dst;
    c.src_f32 = 0;
    c.s_sb = sb;
    c.s_sh = sh;
    c.s_ss = ss;
    c.nb = packed ? 1 : p->B;
    c.S = packed ? (int)(query_side ? p->total_q : p->total_k) : query_side ? p->Sq : p->Sk;
    c.H = H;
    c.d_ss = (int64_t)H * Dp;
    c.d_sh = Dp;
    c.d_sb = packed ? 0 : (int64_t)c.S * H * Dp;
    c.D_src = p->D;
    c.D_dst = Dp;
    c.cu = packed ? (query_side ? p->cu_seqlens_q : p->cu_seqlens_k) : NULL;
    c.n_seq = p->B;
    c.rd = rotate ? p->D : 0;
    c.inverse = 0;
    c.base = p->rotary_base;
    c.scale = 1.f;
    return c;
}

extern "C" cudaError_t fs_attention_forward_padded(const fs_attn_params *p, int Dp, int device, cudaStream_t stream,
                                                   cudaError_t (*run)(const fs_attn_params *p, void *ctx), void *ctx)
{
    const int Hkv = fs_kv_heads(p), packed = p->cu_seqlens_q != NULL;
    const size_t rows_q = packed ? (size_t)p->total_q : (size_t)p->B * p->Sq, rows_k = packed ? (size_t)p->total_k : (size_t)p->B * p->Sk;
    const size_t n_q = rows_q * p->H * Dp, n_k = rows_k * Hkv * Dp;
    char *buf = NULL;
    cudaError_t err = cudaMallocAsync((void **)&buf, 2 * (2 * n_q + 2 * n_k) + 16, stream);
    if (err != cudaSuccess) return err;
    char *q = buf, *k = q + 2 * n_q, *v = k + 2 * n_k, *o = v + 2 * n_k;
    fs_head_copy cq = side_copy(p, 1, p->q, p->q_sb, p->q_sh, p->q_ss, q, p->H, Dp, p->rotary);
    fs_head_copy ck = side_copy(p, 0, p->k, p->k_sb, p->k_sh, p->k_ss, k, Hkv, Dp, p->rotary);
    fs_head_copy cv = side_copy(p, 0, p->v, p->v_sb, p->v_sh, p->v_ss, v, Hkv, Dp, 0);
    fs_attn_params pp = *p;
    pp.D = Dp;
    pp.rotary = 0;
    pp.q = q; pp.k = k; pp.v = v; pp.o = o;
    pp.q_sb = pp.o_sb = cq.d_sb; pp.q_sh = pp.o_sh = cq.d_sh; pp.q_ss = pp.o_ss = cq.d_ss;
    pp.k_sb = pp.v_sb = ck.d_sb; pp.k_sh = pp.v_sh = ck.d_sh; pp.k_ss = pp.v_ss = ck.d_ss;
    /* back: the first D columns of the output */
    fs_head_copy co = side_copy(p, 1, o, cq.d_sb, cq.d_sh, cq.d_ss, p->o, p->H, p->D, 0);
    co.D_src = co.D_dst = p->D;
    co.d_sb = p->o_sb; co.d_sh = p->o_sh; co.d_ss = p->o_ss;
    if ((err = cudaMemsetAsync(o, 0, 2 * n_q, stream)) == cudaSuccess && /* rows no sequence covers come back as zeros */
        (err = fs_head_copy_launch(&cq, p->dtype, device, stream)) == cudaSuccess &&
        (err = fs_head_copy_launch(&ck, p->dtype, device, stream)) == cudaSuccess &&
        (err = fs_head_copy_launch(&cv, p->dtype, device, stream)) == cudaSuccess && (err = run(&pp, ctx)) == cudaSuccess)
        err = fs_head_copy_launch(&co, p->dtype, device, stream);
    const cudaError_t fr = cudaFreeAsync(buf, stream);
    return err != cudaSuccess ? err : fr;
}
