/* Rotary pre-pass for the attention kernels (the Hopper one always, the sm80 one from 512 queries and keys): q and k
 * rotated once (ESM / HF convention, rotary.cuh) into contiguous (batch, head, seq, dim) copies in the launch's
 * workspace, which the attention kernel then reads like any other input. Below that the sm80 kernel rotates in shared
 * memory, where every query tile's block turns each K tile again (53% over the plain kernel at 8 x 40 x 1024 x 64);
 * here each key is turned once.
 *
 * Build: part of the extension (CMakeLists.txt); alone: nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Ikernels -c kernels/attention/rotary/rotary.cu
 * Run:   pytest tests/test_attention_features_gpu.py -k rotary (against HF's ESM rotary + float64 attention)
 *
 * A thread owns one 16-byte chunk pair (x1[8c .. 8c + 7], x2 the same) of one row and FS_ROT_HEADS heads: the
 * 8 angles' sin and cos are computed once and applied to every head, and all its heads' loads are in flight before
 * the arithmetic. Memory-bound: it reads and writes q and k once each.
 *
 * Versions and measurements: docs/notes/rotary.md.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "attention/launchers.h"
#include "common/launch.cuh"
#include "attention/rotary/rotary.cuh"
#include "attention/sequence.cuh"

#define FS_ROT_THREADS 256
#define FS_ROT_HEADS 4 /* heads per thread */

/* One side (q or k) of the pre-pass: rows r < nb * S of src; packed (cu non-NULL): nb = 1, S the packed token count,
 * positions restarting at each cu[i]; padded: position r % S. */
typedef struct {
    const void *src;
    void *dst;                 /* (nb, H, S, D) contiguous */
    int64_t ss, sh, sb;        /* source strides, elements */
    int S, nb, H;              /* rows per batch, batches, heads (k: the K/V heads) */
    const int32_t *cu;         /* n_seq + 1 sequence starts, or NULL */
    int n_seq;
} fs_rotary_side;

typedef struct {
    fs_rotary_side side[2];    /* q, k */
    int H;                     /* q's heads, at least k's: the grid's head groups */
    float base;
} fs_rotary_args;

/* One block per (row block, side, group of FS_ROT_HEADS heads), heads fastest; D / 16 threads per row. */
template <int D, typename T>
__global__ void __launch_bounds__(FS_ROT_THREADS) rotary_qk(const fs_rotary_args a)
{
    constexpr int CH = D / 16, ROWS = FS_ROT_THREADS / CH;
    __shared__ float s_freq[D / 2];
    for (int i = threadIdx.x; i < D / 2; i += FS_ROT_THREADS) s_freq[i] = rotary_inv_freq(i, D, a.base);
    __syncthreads();

    const int groups = (a.H + FS_ROT_HEADS - 1) / FS_ROT_HEADS, h0 = blockIdx.x % groups * FS_ROT_HEADS;
    const fs_rotary_side &s = a.side[blockIdx.x / groups % 2];
    const long long r = (long long)(blockIdx.x / groups / 2) * ROWS + threadIdx.x / CH;
    if (threadIdx.x >= ROWS * CH || r >= (long long)s.nb * s.S || h0 >= s.H) return;
    const int c = threadIdx.x % CH, b = (int)(r / s.S), row = (int)(r % s.S);
    const int pos = s.cu ? row - __ldg(s.cu + packed_sequence(s.cu, s.n_seq, row)) : row;
    float cs[8], sn[8];
    chunk_angles((float)pos, s_freq + c * 8, cs, sn);

    const T *src = static_cast<const T *>(s.src) + b * s.sb + row * s.ss + c * 8;
    T *dst = static_cast<T *>(s.dst) + ((long long)b * s.H * s.S + row) * D + c * 8;
    uint4 x1[FS_ROT_HEADS], x2[FS_ROT_HEADS];
#pragma unroll
    for (int i = 0; i < FS_ROT_HEADS; i++)
        if (h0 + i < s.H) {
            x1[i] = __ldg(reinterpret_cast<const uint4 *>(src + (h0 + i) * s.sh));
            x2[i] = __ldg(reinterpret_cast<const uint4 *>(src + (h0 + i) * s.sh + D / 2));
        }
#pragma unroll
    for (int i = 0; i < FS_ROT_HEADS; i++)
        if (h0 + i < s.H) {
            rotate_chunk<T>(*reinterpret_cast<uint32_t(*)[4]>(&x1[i]), *reinterpret_cast<uint32_t(*)[4]>(&x2[i]), cs, sn);
            T *d = dst + (long long)(h0 + i) * s.S * D;
            *reinterpret_cast<uint4 *>(d) = x1[i];
            *reinterpret_cast<uint4 *>(d + D / 2) = x2[i];
        }
}

/* One side (query_side: q, else k) of the pre-pass, rotated into dst. */
static fs_rotary_side rotary_side(const fs_attn_params *p, int query_side, void *dst)
{
    fs_rotary_side s;
    const bool packed = p->cu_seqlens_q != NULL;
    s.src = query_side ? p->q : p->k;
    s.dst = dst;
    s.ss = query_side ? p->q_ss : p->k_ss;
    s.sh = query_side ? p->q_sh : p->k_sh;
    s.sb = query_side ? p->q_sb : p->k_sb;
    s.S = packed ? (int)(query_side ? p->total_q : p->total_k) : query_side ? p->Sq : p->Sk;
    s.nb = packed ? 1 : p->B;
    s.H = query_side ? p->H : fs_kv_heads(p);
    s.cu = packed ? (query_side ? p->cu_seqlens_q : p->cu_seqlens_k) : NULL;
    s.n_seq = p->B;
    return s;
}

/* Elements of one side's rotated copy. */
static size_t side_elems(const fs_rotary_side *s, const fs_attn_params *p)
{
    return (size_t)s->nb * s->S * s->H * p->D;
}

extern "C" size_t fs_rotary_bytes(const fs_attn_params *p)
{
    const fs_rotary_side q = rotary_side(p, 1, NULL), k = rotary_side(p, 0, NULL);
    return 2 * (side_elems(&q, p) + side_elems(&k, p));
}

template <int D, typename T>
static cudaError_t launch(const fs_rotary_args *a, int device, cudaStream_t stream)
{
    static fs_kernel handle;
    constexpr int ROWS = FS_ROT_THREADS / (D / 16);
    long long rows = 0;
    for (int i = 0; i < 2; i++)
        if (a->side[i].nb * (long long)a->side[i].S > rows) rows = a->side[i].nb * (long long)a->side[i].S;
    const long long blocks = (rows + ROWS - 1) / ROWS * 2 * ((a->H + FS_ROT_HEADS - 1) / FS_ROT_HEADS);
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    cudaError_t err = fs_kernel_prepare((const void *)rotary_qk<D, T>, &handle, 0, device);
    void *args[] = {const_cast<fs_rotary_args *>(a)};
    return err != cudaSuccess ? err : fs_launch(&handle, device, (unsigned)blocks, FS_ROT_THREADS, 0, stream, args);
}

template <typename T>
static cudaError_t launch_dtype(const fs_rotary_args *a, int D, int device, cudaStream_t stream)
{
    switch (D) {
    case 32: return launch<32, T>(a, device, stream);
    case 64: return launch<64, T>(a, device, stream);
    case 80: return launch<80, T>(a, device, stream); /* 80, 112: the Hopper kernels' narrow head dims */
    case 96: return launch<96, T>(a, device, stream);
    case 112: return launch<112, T>(a, device, stream);
    case 128: return launch<128, T>(a, device, stream);
    case 256: return launch<256, T>(a, device, stream);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t fs_rotary_qk(const fs_attn_params *p, int device, cudaStream_t stream, void *ws, fs_attn_params *rotated)
{
    fs_rotary_args a;
    a.side[0] = rotary_side(p, 1, ws);
    a.side[1] = rotary_side(p, 0, static_cast<uint16_t *>(ws) + side_elems(&a.side[0], p));
    a.H = p->H;
    a.base = p->rotary_base;
    *rotated = *p;
    rotated->rotary = 0;
    rotated->q = a.side[0].dst;
    rotated->k = a.side[1].dst;
    rotated->q_ss = rotated->k_ss = p->D;
    rotated->q_sh = (int64_t)a.side[0].S * p->D;
    rotated->k_sh = (int64_t)a.side[1].S * p->D;
    rotated->q_sb = p->cu_seqlens_q ? 0 : rotated->q_sh * p->H;
    rotated->k_sb = p->cu_seqlens_q ? 0 : rotated->k_sh * a.side[1].H;
    return p->dtype == FS_BF16 ? launch_dtype<__nv_bfloat16>(&a, p->D, device, stream) : launch_dtype<__half>(&a, p->D, device, stream);
}
