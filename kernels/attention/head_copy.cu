/* Head-vector copies for the head dims without a kernel of their own (D % 8 == 0 up to 256; native: 32, 64, 96, 128,
 * 256): q, k, v (and dO) are copied into zero-padded rows of the next native size Dp, rotated on the way when the
 * problem uses rotary (over the true D: pairs (c, c + D/2), inv_freq of D), the kernels run at Dp, and the outputs come
 * back through the same copy: the first D columns, the gradients of rotated inputs rotated back (the transpose), dQ
 * from its float32 accumulator scaled by the softmax scale. Zero columns change no score and no output column. A
 * thread owns a pair of 8-column chunks (x1, its rotation partner x2; 4 columns where D / 2 is not a multiple of 8) or
 * one chunk past the rotation, of one row and FS_HC_HEADS heads: vector loads and stores, the pair's angles computed
 * once from a shared inv_freq table for all its heads; memory-bound. Versions: docs/notes/rotary.md.
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

#define FS_HC_THREADS 256
#define FS_HC_HEADS 2 /* heads per thread */

/* W columns of a source of element type S, as loaded (packed pairs of T, or float bits). */
template <typename S, int W> struct src_chunk {
    uint32_t w[W * sizeof(S) / 4];
};

/* Columns j0 .. j0 + W - 1 of the source at element offset at, by vector loads (j0 < D_src). */
template <typename S, int W> FS_DEV_T void load_chunk(const fs_head_copy &c, int64_t at, int j0, src_chunk<S, W> &x)
{
    const S *p = static_cast<const S *>(c.src) + at + j0;
    constexpr int bytes = W * sizeof(S); /* 8, 16 or 32 */
    if constexpr (sizeof(S) == 4) { /* dQ's accumulator: column pairs apart (fs_dq_slot) */
#pragma unroll
        for (int e = 0; e < W; e += 2)
            *reinterpret_cast<uint2 *>(x.w + e) = __ldg(reinterpret_cast<const uint2 *>(static_cast<const S *>(c.src) + at +
                                                                                      fs_dq_slot(j0 + e)));
        return;
    }
    if constexpr (bytes == 8) *reinterpret_cast<uint2 *>(x.w) = __ldg(reinterpret_cast<const uint2 *>(p));
    else
#pragma unroll
        for (int e = 0; e < bytes; e += 16)
            *reinterpret_cast<uint4 *>(x.w + e / 4) = __ldg(reinterpret_cast<const uint4 *>(reinterpret_cast<const char *>(p) + e));
}

/* Elements e, e + 1 of a chunk as floats. */
template <typename T, typename S, int W> FS_DEV_T float2 chunk_pair(const src_chunk<S, W> &x, int e)
{
    if constexpr (sizeof(S) == 4) return make_float2(__uint_as_float(x.w[e]), __uint_as_float(x.w[e + 1]));
    else return unpack2<T>(x.w[e / 2]);
}

/* W columns (packed pairs, already scaled) to columns j0 .. of the destination at element offset at: one vector store. */
template <typename T, int W> FS_DEV_T void store_chunk(const fs_head_copy &c, int64_t at, int j0, const uint32_t (&w)[W / 2])
{
    T *p = static_cast<T *>(c.dst) + at + j0;
    if (W == 8) *reinterpret_cast<uint4 *>(p) = *reinterpret_cast<const uint4 *>(w);
    else *reinterpret_cast<uint2 *>(p) = *reinterpret_cast<const uint2 *>(w);
}

/* A row's units: rd / 2W pairs of W-column chunks (x1 at j, x2 at j + rd / 2: turned together, their W angles computed
 * once), then (D_dst - rd) / W chunks copied (zeros past D_src). One thread per (row, unit) and FS_HC_HEADS heads, every
 * head's loads in flight (packed, as loaded) before the arithmetic; a block holds whole rows of one head group (groups
 * fastest). S: the source's element type (T, or float for dQ's accumulator). */
template <typename T, typename S, int W>
__global__ void __launch_bounds__(FS_HC_THREADS) head_copy(const fs_head_copy c)
{
    __shared__ float s_freq[128];
    const int half = c.rd / 2, pairs = half / W, units = pairs + (c.D_dst - c.rd) / W, rows_per_block = FS_HC_THREADS / units;
    for (int i = threadIdx.x; i < half; i += FS_HC_THREADS) s_freq[i] = rotary_inv_freq(i, c.rd, c.base);
    __syncthreads();

    const int groups = (c.H + FS_HC_HEADS - 1) / FS_HC_HEADS, h0 = blockIdx.x % groups * FS_HC_HEADS;
    const long long r = (long long)(blockIdx.x / groups) * rows_per_block + threadIdx.x / units;
    if (threadIdx.x >= rows_per_block * units || r >= (long long)c.nb * c.S) return;
    const int u = threadIdx.x % units, b = (int)(r / c.S), i = (int)(r % c.S);
    const int j0 = u < pairs ? u * W : c.rd + (u - pairs) * W;
    const int64_t src0 = b * c.s_sb + (int64_t)i * c.s_ss, dst0 = b * c.d_sb + (int64_t)i * c.d_ss;
    const int nh = min(FS_HC_HEADS, c.H - h0);
    uint32_t o1[W / 2], o2[W / 2];
    if (u >= pairs && j0 >= c.D_src) { /* zero columns */
#pragma unroll
        for (int e = 0; e < W / 2; e++) o1[e] = 0u;
#pragma unroll
        for (int k = 0; k < FS_HC_HEADS; k++)
            if (k < nh) store_chunk<T, W>(c, dst0 + (h0 + k) * c.d_sh, j0, o1);
        return;
    }
    src_chunk<S, W> x1[FS_HC_HEADS], x2[FS_HC_HEADS];
#pragma unroll
    for (int k = 0; k < FS_HC_HEADS; k++)
        if (k < nh) {
            load_chunk<S, W>(c, src0 + (h0 + k) * c.s_sh, j0, x1[k]);
            if (u < pairs) load_chunk<S, W>(c, src0 + (h0 + k) * c.s_sh, j0 + half, x2[k]);
        }
    if (u < pairs) {
        /* x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin at angle pos * inv_freq_j (inverse: sin -> -sin) */
        const int pos = c.cu ? i - __ldg(c.cu + packed_sequence(c.cu, c.n_seq, i)) : i;
        float cs[W], sn[W];
#pragma unroll
        for (int e = 0; e < W; e++) {
            sincos_reduced((float)pos * s_freq[j0 + e], &sn[e], &cs[e]);
            if (c.inverse) sn[e] = -sn[e];
        }
#pragma unroll
        for (int k = 0; k < FS_HC_HEADS; k++)
            if (k < nh) {
#pragma unroll
                for (int e = 0; e < W; e += 2) {
                    const float2 a = chunk_pair<T>(x1[k], e), y = chunk_pair<T>(x2[k], e);
                    o1[e / 2] = pack2<T>((a.x * cs[e] - y.x * sn[e]) * c.scale, (a.y * cs[e + 1] - y.y * sn[e + 1]) * c.scale);
                    o2[e / 2] = pack2<T>((y.x * cs[e] + a.x * sn[e]) * c.scale, (y.y * cs[e + 1] + a.y * sn[e + 1]) * c.scale);
                }
                store_chunk<T, W>(c, dst0 + (h0 + k) * c.d_sh, j0, o1);
                store_chunk<T, W>(c, dst0 + (h0 + k) * c.d_sh, j0 + half, o2);
            }
        return;
    }
#pragma unroll
    for (int k = 0; k < FS_HC_HEADS; k++)
        if (k < nh) {
#pragma unroll
            for (int e = 0; e < W; e += 2) {
                const float2 a = chunk_pair<T>(x1[k], e);
                o1[e / 2] = pack2<T>(a.x * c.scale, a.y * c.scale);
            }
            store_chunk<T, W>(c, dst0 + (h0 + k) * c.d_sh, j0, o1);
        }
}

/* Whether every row of the copy starts 16 bytes aligned (the host's checks make it so; strides of single rows, heads
 * or batches are never used). */
static int copy_aligned(const fs_head_copy *c)
{
    const int64_t se = c->src_f32 ? 4 : 2;
    const int64_t s[3] = {c->s_sb * se, c->s_sh * se, c->s_ss * se}, d[3] = {c->d_sb * 2, c->d_sh * 2, c->d_ss * 2};
    const int used[3] = {c->nb > 1, c->H > 1, c->S > 1};
    for (int k = 0; k < 3; k++)
        if (used[k] && (s[k] % 16 || d[k] % 16)) return 0;
    return (uintptr_t)c->src % 16 == 0 && (uintptr_t)c->dst % 16 == 0;
}

extern "C" int fs_attention_run_dim(int D)
{
    return D <= 32 ? 32 : D <= 64 ? 64 : D <= 96 ? 96 : D <= 128 ? 128 : 256;
}

extern "C" cudaError_t fs_head_copy_launch(const fs_head_copy *c, fs_dtype dtype, int device, cudaStream_t stream)
{
    static fs_kernel handles[2][2][2];
    /* chunks of 8 columns, or of 4 where the rotation's halves are not a multiple of 8 (D = 72, 88, 104, 120) */
    const int wide = c->rd % 16 == 0, W = wide ? 8 : 4;
    const int units = c->rd / (2 * W) + (c->D_dst - c->rd) / W, rows_per_block = FS_HC_THREADS / units;
    const long long groups = (c->H + FS_HC_HEADS - 1) / FS_HC_HEADS;
    const long long blocks = ((long long)c->nb * c->S + rows_per_block - 1) / rows_per_block * groups;
    if (blocks == 0) return cudaSuccess;
    if (blocks > 0x7fffffffLL || c->rd > 256) return cudaErrorInvalidConfiguration;
    if (!copy_aligned(c)) return cudaErrorMisalignedAddress;
    const int bf = dtype == FS_BF16, f32 = c->src_f32 != 0;
    const void *const kernels[2][2][2] = {
        {{(const void *)head_copy<__half, __half, 4>, (const void *)head_copy<__half, __half, 8>},
         {(const void *)head_copy<__half, float, 4>, (const void *)head_copy<__half, float, 8>}},
        {{(const void *)head_copy<__nv_bfloat16, __nv_bfloat16, 4>, (const void *)head_copy<__nv_bfloat16, __nv_bfloat16, 8>},
         {(const void *)head_copy<__nv_bfloat16, float, 4>, (const void *)head_copy<__nv_bfloat16, float, 8>}}};
    fs_kernel *handle = &handles[bf][f32][wide];
    cudaError_t err = fs_kernel_prepare(kernels[bf][f32][wide], handle, 0, device);
    void *args[] = {const_cast<fs_head_copy *>(c)};
    return err != cudaSuccess ? err : fs_launch(handle, device, (unsigned)blocks, FS_HC_THREADS, 0, stream, args);
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
