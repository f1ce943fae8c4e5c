/* The passes around the attention backward's main kernel (backward.cuh), sm_80+, fp16/bf16:
 *   pre:  D_i = rowsum(dO_i o O_i) in float32 (zeros where a delta pass computes D_i = rowsum(P o dP) instead: the
 *         runs with dbias or the T5 table's gradient), and dQ's float32 accumulator zeroed (the main kernel adds to it)
 *         where the Hopper kernel does not zero it itself;
 *   post: dQ = scale * accumulator (its rows in fs_dq_slot's order), rotated back when the forward rotated q, converted
 *         to dq's dtype and strides; a thread takes FS_POST_HEADS heads of a row, whose rotation angles are the same.
 * and the T5 table's gradient summed from the dQ kernel's per-block partials. Memory-bound: each reads and writes its rows once, a thread per 16-byte chunk (pre) or chunk pair (post: the pair a
 * rotation couples, x[c] and x[c + D/2]).
 *
 * Build: part of the extension; alone: nvcc -O3 -std=c++17 -gencode=arch=compute_80,code=sm_80 -Ikernels -c kernels/attention/sm80/backward_passes.cu
 * Run:   pytest tests/test_attention_backward_gpu.py
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "attention/rotary/rotary.cuh"
#include "attention/sequence.cuh"
#include "attention/sm80/backward.h"
#include "attention/sm80/backward_dq.cuh"
#include "common/launch.cuh"

#define FS_PASS_THREADS 256
#define FS_POST_HEADS 4 /* heads per post-pass thread: one set of rotation angles for all */

typedef struct {
    fs_attn_bwd_params g;
    fs_bwd_work w;
    int S, nb;       /* rows per batch and batches: (Sq, B) padded, (total_q, 1) packed */
    int acc_d;       /* columns of dQ's accumulator: the kernels' head dim */
    int delta_zero;  /* pre: Delta zeroed, not computed (a delta pass follows: dbias, dtable) */
    int acc_zero;    /* pre: the accumulator zeroed (the Hopper kernel that zeroes it itself: not) */
} fs_pass_args;

/* Batch, row in the batch and head of pass row r (of nb * S) and head h: the workspace row and the tensors' offsets. */
typedef struct { int b, i; int64_t ws_row; } fs_pass_row;
FS_DEV fs_pass_row pass_row(const fs_pass_args &a, long long r, int h)
{
    fs_pass_row x;
    x.b = (int)(r / a.S);
    x.i = (int)(r % a.S);
    x.ws_row = a.g.p.cu_seqlens_q ? (int64_t)h * a.g.p.total_q + x.i : ((int64_t)x.b * a.g.p.H + h) * a.S + x.i;
    return x;
}

/* Pre-pass: TPR threads per row (a power of two at least D / 8; any D % 8 == 0), one block per row block x head. */
template <int TPR, typename T>
__global__ void __launch_bounds__(FS_PASS_THREADS) backward_pre(const fs_pass_args a)
{
    constexpr int ROWS = FS_PASS_THREADS / TPR;
    const fs_attn_params &p = a.g.p;
    const int D = p.D, h = blockIdx.x % p.H, c = threadIdx.x % TPR;
    const long long r = (long long)(blockIdx.x / p.H) * ROWS + threadIdx.x / TPR;
    const bool row = r < (long long)a.nb * a.S;
    const bool live = row && c < D / 8 && !a.delta_zero; /* every thread reaches the shuffles */
    float sum = 0.f;
    if (live) {
        const fs_pass_row x = pass_row(a, r, h);
        const uint4 o = __ldg(reinterpret_cast<const uint4 *>(static_cast<const T *>(p.o) + x.b * p.o_sb + h * p.o_sh +
                                                               x.i * p.o_ss + c * 8));
        const uint4 d = __ldg(reinterpret_cast<const uint4 *>(static_cast<const T *>(a.g.dout) + x.b * a.g.do_sb +
                                                               h * a.g.do_sh + x.i * a.g.do_ss + c * 8));
        const uint32_t *ow = reinterpret_cast<const uint32_t *>(&o), *dw = reinterpret_cast<const uint32_t *>(&d);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 of = unpack2<T>(ow[e]), df = unpack2<T>(dw[e]);
            sum = fmaf(of.x, df.x, fmaf(of.y, df.y, sum));
        }
    }
    if (row && a.acc_zero && c < a.acc_d / 8) { /* the accumulator's row, a.acc_d >= D columns */
        float4 *acc = reinterpret_cast<float4 *>(a.w.dq_acc + pass_row(a, r, h).ws_row * a.acc_d + c * 8);
        acc[0] = acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int m = TPR / 2; m > 0; m /= 2) sum += __shfl_xor_sync(0xffffffff, sum, m);
    if (row && c == 0) a.w.delta[pass_row(a, r, h).ws_row] = sum;
}

/* Post-pass: D / 16 threads per row, each the chunk pair (c, c + D/16) of 8 elements for FS_POST_HEADS heads, whose
 * rotation angles it computes once (dq = rotated back, scaled, converted):
 *   dq[.., c'] = s (acc[c'] cos a + acc[c' + D/2] sin a),  dq[.., c' + D/2] = s (acc[c' + D/2] cos a - acc[c'] sin a) */
template <int D, typename T>
__global__ void __launch_bounds__(FS_PASS_THREADS) backward_post(const fs_pass_args a)
{
    constexpr int HALF = D / 16, ROWS = FS_PASS_THREADS / HALF;
    const fs_attn_params &p = a.g.p;
    const int groups = (p.H + FS_POST_HEADS - 1) / FS_POST_HEADS;
    const int h0 = blockIdx.x % groups * FS_POST_HEADS, c = threadIdx.x % HALF;
    const long long r = (long long)(blockIdx.x / groups) * ROWS + threadIdx.x / HALF;
    if (threadIdx.x >= ROWS * HALF || r >= (long long)a.nb * a.S) return;
    float lo[FS_POST_HEADS][8], hi[FS_POST_HEADS][8];
#pragma unroll
    for (int j = 0; j < FS_POST_HEADS; j++) { /* every head's loads in flight before the arithmetic */
        if (h0 + j >= p.H) break;
        const float *acc = a.w.dq_acc + pass_row(a, r, h0 + j).ws_row * D;
#pragma unroll
        for (int e = 0; e < 8; e += 2) { /* the accumulator's order (fs_dq_slot): column pairs apart */
            *reinterpret_cast<float2 *>(&lo[j][e]) = *reinterpret_cast<const float2 *>(acc + fs_dq_slot(8 * c + e));
            *reinterpret_cast<float2 *>(&hi[j][e]) = *reinterpret_cast<const float2 *>(acc + fs_dq_slot(8 * (c + HALF) + e));
        }
    }
    const fs_pass_row x = pass_row(a, r, 0);
    float cs[8], sn[8];
    if (a.w.rotary) {
        const int pos = p.cu_seqlens_q ? x.i - __ldg(p.cu_seqlens_q + packed_sequence(p.cu_seqlens_q, p.B, x.i)) : x.i;
        float freq[8];
#pragma unroll
        for (int e = 0; e < 8; e++) freq[e] = rotary_inv_freq(c * 8 + e, D, a.w.rotary_base);
        chunk_angles((float)pos, freq, cs, sn);
    }
#pragma unroll
    for (int j = 0; j < FS_POST_HEADS; j++) {
        if (h0 + j >= p.H) break;
        if (a.w.rotary) {
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float u = lo[j][e], v = hi[j][e];
                lo[j][e] = u * cs[e] + v * sn[e];
                hi[j][e] = v * cs[e] - u * sn[e];
            }
        }
        uint4 out_lo, out_hi;
        uint32_t *wl = reinterpret_cast<uint32_t *>(&out_lo), *wh = reinterpret_cast<uint32_t *>(&out_hi);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            wl[e] = pack2<T>(lo[j][2 * e] * a.w.scale, lo[j][2 * e + 1] * a.w.scale);
            wh[e] = pack2<T>(hi[j][2 * e] * a.w.scale, hi[j][2 * e + 1] * a.w.scale);
        }
        T *dq = static_cast<T *>(a.g.dq) + x.b * a.g.dq_sb + (h0 + j) * a.g.dq_sh + x.i * a.g.dq_ss;
        *reinterpret_cast<uint4 *>(dq + c * 8) = out_lo;
        *reinterpret_cast<uint4 *>(dq + (c + HALF) * 8) = out_hi;
    }
}

/* Launch a pass kernel (prepared into handle) over every (row, head) of a, rows_per_block rows and heads_per_block heads
 * a block. */
static cudaError_t launch_rows(const void *kernel, fs_kernel *handle, int rows_per_block, int heads_per_block,
                               const fs_pass_args *a, int device, cudaStream_t stream)
{
    const long long blocks = ((long long)a->nb * a->S + rows_per_block - 1) / rows_per_block *
                             ((a->g.p.H + heads_per_block - 1) / heads_per_block);
    if (blocks == 0) return cudaSuccess;
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    cudaError_t err = fs_kernel_prepare(kernel, handle, 0, device);
    void *args[] = {const_cast<fs_pass_args *>(a)};
    return err != cudaSuccess ? err : fs_launch(handle, device, (unsigned)blocks, FS_PASS_THREADS, 0, stream, args);
}

/* Launch the pre-pass, TPR threads a row. */
template <int TPR, typename T>
static cudaError_t launch_pre(const fs_pass_args *a, int device, cudaStream_t stream)
{
    static fs_kernel handle;
    return launch_rows((const void *)backward_pre<TPR, T>, &handle, FS_PASS_THREADS / TPR, 1, a, device, stream);
}

template <typename T>
static cudaError_t launch_pre_dtype(const fs_pass_args *a, int device, cudaStream_t stream)
{
    const int ch = (a->acc_d > a->g.p.D ? a->acc_d : a->g.p.D) / 8;
    return ch <= 4 ? launch_pre<4, T>(a, device, stream) : ch <= 8 ? launch_pre<8, T>(a, device, stream)
         : ch <= 16 ? launch_pre<16, T>(a, device, stream) : launch_pre<32, T>(a, device, stream);
}

/* Launch the post-pass, D / 16 threads a row. */
template <int D, typename T>
static cudaError_t launch_post(const fs_pass_args *a, int device, cudaStream_t stream)
{
    static fs_kernel handle;
    return launch_rows((const void *)backward_post<D, T>, &handle, FS_PASS_THREADS / (D / 16), FS_POST_HEADS, a, device,
                       stream);
}

template <typename T>
static cudaError_t launch_post_dtype(const fs_pass_args *a, int device, cudaStream_t stream)
{
    switch (a->g.p.D) {
    case 32: return launch_post<32, T>(a, device, stream);
    case 64: return launch_post<64, T>(a, device, stream);
    case 80: return launch_post<80, T>(a, device, stream); /* 80, 112: the Hopper kernel's narrow head dims */
    case 96: return launch_post<96, T>(a, device, stream);
    case 112: return launch_post<112, T>(a, device, stream);
    case 128: return launch_post<128, T>(a, device, stream);
    case 256: return launch_post<256, T>(a, device, stream);
    default: return cudaErrorNotSupported;
    }
}

/* The arguments of a pass over g. */
static fs_pass_args pass_args(const fs_attn_bwd_params *g, const fs_bwd_work *w, int acc_d)
{
    fs_pass_args a;
    a.g = *g;
    a.w = *w;
    a.S = g->p.cu_seqlens_q ? (int)g->p.total_q : g->p.Sq;
    a.nb = g->p.cu_seqlens_q ? 1 : g->p.B;
    a.acc_d = acc_d;
    a.delta_zero = g->dbias != NULL || g->dtable != NULL; /* both run a delta pass (sm80 dQ kernel, sm90 DELTA) */
    a.acc_zero = w->dq_zeroed == NULL;
    return a;
}

cudaError_t fs_sm80_backward_pre(const fs_attn_bwd_params *g, const fs_bwd_work *w, int acc_d, int device, cudaStream_t stream)
{
    const fs_pass_args a = pass_args(g, w, acc_d);
    return g->p.dtype == FS_BF16 ? launch_pre_dtype<__nv_bfloat16>(&a, device, stream) : launch_pre_dtype<__half>(&a, device, stream);
}

cudaError_t fs_sm80_backward_post(const fs_attn_bwd_params *g, const fs_bwd_work *w, int device, cudaStream_t stream)
{
    const fs_pass_args a = pass_args(g, w, g->p.D);
    return g->p.dtype == FS_BF16 ? launch_post_dtype<__nv_bfloat16>(&a, device, stream) : launch_post_dtype<__half>(&a, device, stream);
}

/* dtable[h][n] = sum over batches and query tiles of the partial bucket sums, one thread per (h, n), in order. */
__global__ void backward_t5_sum(const float *part, float *dtable, int64_t sh, int B, int H, int n_qt, int nb)
{
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= H * nb) return;
    const int h = idx / nb, n = idx % nb;
    float sum = 0.f;
    for (int b = 0; b < B; b++)
        for (int qt = 0; qt < n_qt; qt++) sum += part[((int64_t)(b * H + h) * n_qt + qt) * nb + n];
    dtable[h * sh + n] = sum;
}

cudaError_t fs_sm80_backward_t5_sum(const fs_attn_bwd_params *g, const float *part, int device, cudaStream_t stream)
{
    static fs_kernel handle;
    const fs_attn_params *p = &g->p;
    int n_qt = (p->Sq + fs_bwd_dq_tile<64>::BR - 1) / fs_bwd_dq_tile<64>::BR, B = p->B, H = p->H, nb = p->t5_buckets;
    int64_t sh = g->dtable_sh;
    float *dtable = g->dtable;
    const int items = H * nb;
    if (items == 0) return cudaSuccess;
    cudaError_t err = fs_kernel_prepare((const void *)backward_t5_sum, &handle, 0, device);
    void *args[] = {(void *)&part, &dtable, &sh, &B, &H, &n_qt, &nb};
    return err != cudaSuccess ? err : fs_launch(&handle, device, (unsigned)((items + 127) / 128), 128, 0, stream, args);
}
