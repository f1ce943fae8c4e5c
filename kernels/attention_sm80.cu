/* Tensor-core flash attention forward for sm_80+ (Ampere, Ada, Hopper through mma.sync): fp16/bf16 in,
 * fp32 accumulation, online softmax, one pass over K/V, no S x S buffer.
 *
 * Build: part of the extension (CMakeLists.txt); alone for SASS/resource checks:
 *   nvcc -O3 -gencode=arch=compute_90,code=sm_90 -Xptxas -v -c kernels/attention_sm80.cu
 * Run:   bash benchmarks/gpu_check.sh (GPU tests + benchmark against torch SDPA)
 *
 * Notation (FlashAttention-2): a block owns a query tile Q_i of Br = 16 * WARPS rows (16 per warp) and
 * streams key/value tiles K_j, V_j of Bc rows through shared memory, keeping per row the running max
 * m_i, the running denominator l_i and the unnormalised output O_i in registers. Scores are kept in
 * log2 units (scale * log2 e folded in) so the exponentials are single ex2 instructions.
 *
 * Pipeline per KV tile (single K and V buffers, cp.async):
 *   wait K_j; sync; issue V_j; S = Q K_j^T; mask; softmax; wait V_j; sync; issue K_{j+1}; O += P V_j
 * Small problems (fewer blocks than SMs) split the KV range over blocks; a combine kernel merges the
 * partial results by their logsumexp.
 *
 * History (H200 fp16, TF/s at D=64 / D=128 on long sequences, FA2 = 298 / 337; benchmarks/NOTES.md):
 *   v1  16 rows per warp, 2 barriers per tile, single K/V buffers             200 / 208
 *   v2  2 row tiles per warp, 3-stage cp.async ring, scale in the exp2 FFMA   266 / 257
 *   v3  FA2 tile shapes, small-tile variant, KV splits merged in-kernel       293 / 245 (spills)
 *   v5  split merge with all loads in flight (was latency-bound, 40 us)
 *   v6  precomputed ldmatrix lane offsets (no spills at D=128)                296 / 280
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "attention_cuda.h"

#define FS_DEV static __device__ __forceinline__
#define FS_DEV_T __device__ __forceinline__ /* templates and their specialisations: no storage class */

/* ---- tile configuration, one place: warps per block, m16 row tiles per warp (Br = 16 * MT * WARPS),
 * Bc, cp.async ring depth, and whether Q fragments stay in registers (else reloaded per KV tile) ---- */
template <int W, int M, int B, int S, int Q> struct fs_cfg { enum { WARPS = W, MT = M, BC = B, STAGES = S, Q_IN_REGS = Q }; };
/* tuning builds override one head dim without editing: -DFS_TUNE_D=64 -DFS_TUNE_W=4 -DFS_TUNE_MT=2 -DFS_TUNE_BC=64 -DFS_TUNE_Q=1 */
#ifndef FS_TUNE_D
#define FS_TUNE_D 0
#define FS_TUNE_W 0
#define FS_TUNE_MT 0
#define FS_TUNE_BC 0
#define FS_TUNE_Q 0
#endif
#define FS_PICK(d, field, value) (FS_TUNE_D == d ? FS_TUNE_##field : value)
#define FS_TILE(d, w, mt, bc, q) \
    template <> struct fs_tile<d, false> : fs_cfg<FS_PICK(d, W, w), FS_PICK(d, MT, mt), FS_PICK(d, BC, bc), 3, FS_PICK(d, Q, q)> {}
#define FS_TILE_SMALL(d, w, mt, bc, q) template <> struct fs_tile<d, true> : fs_cfg<w, mt, bc, 3, q> {}
/* SMALL: problems whose big tiles leave SMs idle get 64-row query tiles (more blocks, shorter chains) */
template <int D, bool SMALL> struct fs_tile;
/*      D    WARPS MT  BC   Q_IN_REGS */
FS_TILE(32,  4,    2,  128, 0);
FS_TILE(64,  4,    2,  128, 0);
FS_TILE(96,  4,    2,  32,  0);
FS_TILE(128, 4,    2,  32,  0);
FS_TILE(256, 4,    1,  32,  0);
FS_TILE_SMALL(32,  4, 1, 64, 1);
FS_TILE_SMALL(64,  4, 1, 64, 1);
FS_TILE_SMALL(96,  4, 1, 64, 1);
FS_TILE_SMALL(128, 4, 1, 64, 1);
FS_TILE_SMALL(256, 4, 1, 32, 0);

/* Shared-memory row pitch in elements: a multiple of 64 so the 16-byte-chunk XOR swizzle stays in-row. */
template <int D> struct fs_pitch { enum { VALUE = D < 64 ? 64 : (D + 63) / 64 * 64 }; };

#define FS_MAX_SPLITS 16
#define FS_COUNTER_BYTES 16384 /* per-query-tile split counters; splitting needs blocks <= sm_count / 2 */

/* Everything a launch needs beyond the problem: KV splits and their fp32 workspace. */
typedef struct {
    fs_attn_params p;
    float scale_log2;  /* scale * log2(e) */
    int n_qtiles, n_splits;
    float *o_part;     /* [splits][B*H][Sq][D], each split normalised by its own l */
    float *lse_part;   /* [splits][B*H][Sq], natural log */
    int *counters;     /* [B*H][n_qtiles] finished splits per query tile, zero between launches */
} fs_sm80_args;

/* ---- PTX wrappers ---- */

FS_DEV uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16-byte async copy global -> shared; zero-fills when !valid (src is then not read). */
FS_DEV void cp_async16(uint32_t dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
FS_DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> FS_DEV_T void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

FS_DEV void ldmatrix_x4(uint32_t addr, uint32_t r[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
FS_DEV void ldmatrix_x4_trans(uint32_t addr, uint32_t r[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

/* C += A B for one m16n8k16 tile (A row-major 16x16, B column-major 16x8, C fp32). */
template <typename T> FS_DEV_T void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
template <> FS_DEV_T void mma16816<__half>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> FS_DEV_T void mma16816<__nv_bfloat16>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats rounded to a packed pair of T (lo in the low half). */
template <typename T> FS_DEV_T uint32_t pack2(float lo, float hi);
template <> FS_DEV_T uint32_t pack2<__half>(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}
template <> FS_DEV_T uint32_t pack2<__nv_bfloat16>(float lo, float hi)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

template <typename T> FS_DEV_T T from_float(float x);
template <> FS_DEV_T __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> FS_DEV_T __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

FS_DEV float exp2_approx(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Element offset of (row, col) in a swizzled tile: 16-byte chunk index XOR (row mod 8), so the eight
 * rows one ldmatrix reads hit eight different bank groups. */
template <int PITCH> FS_DEV int swz(int row, int col)
{
    return row * PITCH + ((((col >> 3) ^ (row & 7)) << 3) | (col & 7));
}

/* Async-copy ROWS x D elements (row stride in elements) into a swizzled tile; rows >= valid are zeroed. */
template <int ROWS, int D, int THREADS, typename T>
FS_DEV void load_tile(T *tile, const T *g, int64_t stride, int valid, int tid)
{
    constexpr int CH = D / 8;
#pragma unroll
    for (int i = tid; i < ROWS * CH; i += THREADS) {
        const int r = i / CH, c = i % CH;
        const bool ok = r < valid;
        cp_async16(smem_addr(tile + swz<fs_pitch<D>::VALUE>(r, c * 8)), g + (ok ? r * stride + c * 8 : 0), ok);
    }
}

template <int D, typename T, bool SMALL>
__global__ void __launch_bounds__(fs_tile<D, SMALL>::WARPS * 32) attention_fwd_sm80(const fs_sm80_args a)
{
    using tile = fs_tile<D, SMALL>;
    constexpr int WARPS = tile::WARPS, MT = tile::MT, BC = tile::BC, STAGES = tile::STAGES;
    constexpr int BR = 16 * MT * WARPS, THREADS = WARPS * 32, WR = 16 * MT; /* WR: rows per warp */
    constexpr int PITCH = fs_pitch<D>::VALUE, KD = D / 16, NS = BC / 8, NO = D / 8;
    constexpr bool Q_IN_REGS = tile::Q_IN_REGS;
    extern __shared__ __align__(128) unsigned char smem[];
    T *sQ = reinterpret_cast<T *>(smem), *sKV = sQ + BR * PITCH; /* ring: stage s holds K at 2s, V at 2s+1 */

    const fs_attn_params &p = a.p;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;

    /* block -> (query tile, split, batch*head); query tile fastest so one head's blocks share K/V in L2,
     * heaviest causal tiles first */
    int bid = blockIdx.x;
    int qt = bid % a.n_qtiles;
    bid /= a.n_qtiles;
    const int split = bid % a.n_splits, bh = bid / a.n_splits, b = bh / p.H, h = bh % p.H;
    if (p.causal) qt = a.n_qtiles - 1 - qt;
    const int q0 = qt * BR, q_rows = min(BR, p.Sq - q0);

    const T *gQ = static_cast<const T *>(p.q) + b * p.q_sb + h * p.q_sh + (int64_t)q0 * p.q_ss;
    const T *gK = static_cast<const T *>(p.k) + b * p.k_sb + h * p.k_sh;
    const T *gV = static_cast<const T *>(p.v) + b * p.v_sb + h * p.v_sh;

    /* KV tiles this block visits: causal (top-left) rows q0.. see keys below q0 + BR */
    const int kv_end = p.causal ? min(p.Sk, q0 + BR) : p.Sk;
    const int n_kv = (kv_end + BC - 1) / BC, per_split = (n_kv + a.n_splits - 1) / a.n_splits;
    const int t_begin = split * per_split, t_end = min(n_kv, t_begin + per_split);

    /* issue K_t, V_t into ring stage t % STAGES (nothing past t_end; the group is committed regardless) */
    auto load_kv = [&](int t) {
        if (t < t_end) {
            T *st = sKV + (t % STAGES) * 2 * BC * PITCH;
            const int rows = min(BC, p.Sk - t * BC);
            load_tile<BC, D, THREADS>(st, gK + (int64_t)t * BC * p.k_ss, p.k_ss, rows, tid);
            load_tile<BC, D, THREADS>(st + BC * PITCH, gV + (int64_t)t * BC * p.v_ss, p.v_ss, rows, tid);
        }
        cp_async_commit();
    };
    load_tile<BR, D, THREADS>(sQ, gQ, p.q_ss, q_rows, tid);
    for (int s = 0; s < STAGES - 1; s++) load_kv(t_begin + s);

    float acc_o[MT][NO][4];
    float m_i[MT][2], l_i[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int n = 0; n < NO; n++) acc_o[mt][n][0] = acc_o[mt][n][1] = acc_o[mt][n][2] = acc_o[mt][n][3] = 0.f;
        m_i[mt][0] = m_i[mt][1] = -INFINITY;
        l_i[mt][0] = l_i[mt][1] = 0.f;
    }
    uint32_t qf[Q_IN_REGS ? MT : 1][Q_IN_REGS ? KD : 1][4];
    /* ldmatrix lane offsets (elements) into the swizzled tiles. The XOR touches only the low 3 bits of
     * the 16-byte chunk index, so chunk 2k + x lands at 8 (k >> 2) + ((2 (k & 3) + x) ^ (row & 7)): four
     * lane offsets per operand cover every k-step, the rest is a compile-time constant. */
    int q_off[4], k_off[4], v_off[4];
    {
        const int l7 = lane & 7, mi = lane >> 3;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            q_off[c] = (warp * WR + (lane & 15)) * PITCH + 8 * ((2 * c + (lane >> 4)) ^ l7);
            k_off[c] = (l7 + (mi >> 1) * 8) * PITCH + 8 * ((2 * c + (mi & 1)) ^ l7);
            v_off[c] = (l7 + (mi & 1) * 8) * PITCH + 8 * ((2 * c + (mi >> 1)) ^ l7);
        }
    }
    const uint32_t sQ_addr = smem_addr(sQ);
    const int warp_row = q0 + warp * WR; /* first query row of this warp */
    /* scores are scaled by scale*log2(e) inside the exponent (one FFMA); a non-positive scale is applied
     * up front instead, so that the row max stays the max of the scaled scores */
    const bool prescale = a.scale_log2 <= 0.f;
    const float mul = prescale ? 1.f : a.scale_log2;

    for (int j = t_begin; j < t_end; j++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads(); /* tile j has landed for all threads; every warp is done with tile j - 1's stage */
        load_kv(j + STAGES - 1);
        const uint32_t sK_addr = smem_addr(sKV + (j % STAGES) * 2 * BC * PITCH), sV_addr = sK_addr + 2 * BC * PITCH;
        const int k0 = j * BC;

        /* S = Q K_j^T (raw scores, fp32); each K fragment feeds MT row tiles */
        float s[MT][NS][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int n = 0; n < NS; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            uint32_t af[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const uint32_t qaddr = sQ_addr + 2 * (q_off[kk & 3] + 64 * (kk >> 2) + mt * 16 * PITCH);
                if (Q_IN_REGS) {
                    if (j == t_begin) ldmatrix_x4(qaddr, qf[Q_IN_REGS ? mt : 0][Q_IN_REGS ? kk : 0]);
#pragma unroll
                    for (int e = 0; e < 4; e++) af[mt][e] = qf[Q_IN_REGS ? mt : 0][Q_IN_REGS ? kk : 0][e];
                } else {
                    ldmatrix_x4(qaddr, af[mt]);
                }
            }
#pragma unroll
            for (int np = 0; np < NS / 2; np++) {
                uint32_t bf[4];
                ldmatrix_x4(sK_addr + 2 * (k_off[kk & 3] + 64 * (kk >> 2) + np * 16 * PITCH), bf);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816<T>(s[mt][2 * np], af[mt], bf[0], bf[1]);
                    mma16816<T>(s[mt][2 * np + 1], af[mt], bf[2], bf[3]);
                }
            }
        }

        if (prescale)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int n = 0; n < NS; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[mt][n][e] *= a.scale_log2;
        /* mask keys past Sk and, for causal, keys after the query (col > row) */
        if (k0 + BC > p.Sk || (p.causal && k0 + BC - 1 > warp_row)) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int n = 0; n < NS; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int col = k0 + n * 8 + 2 * t4 + (e & 1), row = warp_row + mt * 16 + g + (e >> 1) * 8;
                        if (col >= p.Sk || (p.causal && col > row)) s[mt][n][e] = -INFINITY;
                    }
        }

        /* m_new = max(m_i, rowmax(S) * c), c = scale log2e;  P = exp2(S c - m_new);
         * l_i = exp2(m_i - m_new) l_i + rowsum(P);  O_i = exp2(m_i - m_new) O_i.
         * P is packed to T pairs at once (pk[mt][n][r]: row g + 8r), so the fp32 scores die here. */
        uint32_t pk[MT][NS][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mx = -INFINITY;
#pragma unroll
                for (int n = 0; n < NS; n++) mx = fmaxf(mx, fmaxf(s[mt][n][2 * r], s[mt][n][2 * r + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
                const float m_new = fmaxf(m_i[mt][r], mx * mul), m_use = m_new == -INFINITY ? 0.f : m_new;
                const float alpha = exp2_approx(m_i[mt][r] - m_use);
                m_i[mt][r] = m_new;
                float sum = 0.f;
#pragma unroll
                for (int n = 0; n < NS; n++) {
                    const float p0 = exp2_approx(fmaf(s[mt][n][2 * r], mul, -m_use));
                    const float p1 = exp2_approx(fmaf(s[mt][n][2 * r + 1], mul, -m_use));
                    sum += p0 + p1;
                    pk[mt][n][r] = pack2<T>(p0, p1);
                }
                l_i[mt][r] = l_i[mt][r] * alpha + sum;
#pragma unroll
                for (int n = 0; n < NO; n++) {
                    acc_o[mt][n][2 * r] *= alpha;
                    acc_o[mt][n][2 * r + 1] *= alpha;
                }
            }

        /* O_i += P V_j: the S accumulators of two n8 tiles are exactly the A fragment of one k16 step */
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            uint32_t af[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                af[mt][0] = pk[mt][2 * kk][0];
                af[mt][1] = pk[mt][2 * kk][1];
                af[mt][2] = pk[mt][2 * kk + 1][0];
                af[mt][3] = pk[mt][2 * kk + 1][1];
            }
#pragma unroll
            for (int np = 0; np < NO / 2; np++) {
                uint32_t bf[4];
                ldmatrix_x4_trans(sV_addr + 2 * (v_off[np & 3] + 64 * (np >> 2) + kk * 16 * PITCH), bf);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816<T>(acc_o[mt][2 * np], af[mt], bf[0], bf[1]);
                    mma16816<T>(acc_o[mt][2 * np + 1], af[mt], bf[2], bf[3]);
                }
            }
        }
    }
    cp_async_wait<0>();

    /* l_i is summed over the four lanes that share a row; O_i / l_i; lse = (m_i + log2 l_i) ln 2 */
    float inv[MT][2], lse[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = l_i[mt][r];
            l += __shfl_xor_sync(0xffffffff, l, 1);
            l += __shfl_xor_sync(0xffffffff, l, 2);
            inv[mt][r] = l > 0.f ? 1.f / l : 0.f;
            lse[mt][r] = l > 0.f ? (m_i[mt][r] + __log2f(l)) * 0.69314718055994531f : -INFINITY;
        }
    const int64_t bh_row = (int64_t)bh * p.Sq;

    if (a.n_splits > 1) {
        /* partial result of this split, fp32 from registers, normalised by its own l */
        const int64_t rows_all = (int64_t)p.B * p.H * p.Sq;
        float *op = a.o_part + ((int64_t)split * rows_all + bh_row) * D;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = warp_row + mt * 16 + g + r * 8;
                if (row >= p.Sq) continue;
#pragma unroll
                for (int n = 0; n < NO; n++)
                    *reinterpret_cast<float2 *>(op + (int64_t)row * D + n * 8 + 2 * t4) =
                        make_float2(acc_o[mt][n][2 * r] * inv[mt][r], acc_o[mt][n][2 * r + 1] * inv[mt][r]);
                if (t4 == 0) a.lse_part[split * rows_all + bh_row + row] = lse[mt][r];
            }
        /* the last split to finish this query tile merges all of them:
         * O = sum_s exp(lse_s - M) O_s / sum_s exp(lse_s - M),  lse = M + log sum_s exp(lse_s - M) */
        __shared__ int last;
        __threadfence();
        __syncthreads();
        int *counter = a.counters + (int64_t)bh * a.n_qtiles + qt;
        if (tid == 0) {
            last = atomicAdd(counter, 1) == a.n_splits - 1;
            if (last) *counter = 0; /* ready for the next launch on this workspace */
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
        /* every thread merges 4-column chunks; the loads of all splits are independent and in flight together */
        T *gO = static_cast<T *>(p.o) + b * p.o_sb + h * p.o_sh;
        constexpr int C4 = D / 4;
        for (int i = tid; i < q_rows * C4; i += THREADS) {
            const int r = i / C4, c = i % C4;
            const int64_t idx = bh_row + q0 + r;
            float ls[FS_MAX_SPLITS], mx = -INFINITY, sum = 0.f;
            float4 x[FS_MAX_SPLITS], o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int sp = 0; sp < FS_MAX_SPLITS; sp++) /* all loads first: one L2 round trip per item */
                if (sp < a.n_splits) {
                    ls[sp] = __ldcg(a.lse_part + sp * rows_all + idx);
                    x[sp] = __ldcg(reinterpret_cast<const float4 *>(a.o_part + (sp * rows_all + idx) * D) + c);
                }
#pragma unroll
            for (int sp = 0; sp < FS_MAX_SPLITS; sp++)
                if (sp < a.n_splits) mx = fmaxf(mx, ls[sp]);
#pragma unroll
            for (int sp = 0; sp < FS_MAX_SPLITS; sp++)
                if (sp < a.n_splits) {
                    const float w = mx == -INFINITY ? 0.f : __expf(ls[sp] - mx);
                    sum += w;
                    o.x += w * x[sp].x; o.y += w * x[sp].y; o.z += w * x[sp].z; o.w += w * x[sp].w;
                }
            const float invs = sum > 0.f ? 1.f / sum : 0.f;
            const uint2 packed = make_uint2(pack2<T>(o.x * invs, o.y * invs), pack2<T>(o.z * invs, o.w * invs));
            *reinterpret_cast<uint2 *>(gO + (int64_t)(q0 + r) * p.o_ss + c * 4) = packed;
            if (p.lse && c == 0) static_cast<float *>(p.lse)[idx] = sum > 0.f ? mx + __logf(sum) : -INFINITY;
        }
        return;
    }

    /* stage this warp's rows in its own rows of sQ, then 16-byte coalesced stores (after every lane's
     * last ldmatrix of those rows) */
    __syncwarp();
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int n = 0; n < NO; n++)
                *reinterpret_cast<uint32_t *>(sQ + swz<PITCH>(warp * WR + mt * 16 + g + r * 8, n * 8 + 2 * t4)) =
                    pack2<T>(acc_o[mt][n][2 * r] * inv[mt][r], acc_o[mt][n][2 * r + 1] * inv[mt][r]);
    __syncwarp();
    T *gO = static_cast<T *>(p.o) + b * p.o_sb + h * p.o_sh;
#pragma unroll
    for (int i = lane; i < WR * (D / 8); i += 32) {
        const int r = i / (D / 8), c = i % (D / 8), row = warp_row + r;
        if (row < p.Sq)
            *reinterpret_cast<uint4 *>(gO + (int64_t)row * p.o_ss + c * 8) =
                *reinterpret_cast<const uint4 *>(sQ + swz<PITCH>(warp * WR + r, c * 8));
    }
    if (p.lse && t4 == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = warp_row + mt * 16 + g + r * 8;
                if (row < p.Sq) static_cast<float *>(p.lse)[bh_row + row] = lse[mt][r];
            }
    }
}

/* Raise a kernel's dynamic shared-memory limit once per device. */
static cudaError_t prepare_kernel(const void *fn, int smem, int device, unsigned long long *done_mask)
{
    if (device < 64 && (*done_mask >> device) & 1ULL) return cudaSuccess;
    cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err == cudaSuccess && device < 64) *done_mask |= 1ULL << device;
    return err;
}

/* Split-KV workspace. Outside graph capture, one cached buffer per (device, stream): every use of it is
 * ordered on its stream, so reuse is race-free and costs no allocation. Under capture the graph owns a
 * stream-ordered allocation instead (a cached pointer baked into a graph could be freed later). */
#define FS_WS_SLOTS 16
typedef struct { int device; cudaStream_t stream; void *ptr; size_t bytes; } fs_ws_slot;
static fs_ws_slot ws_slots[FS_WS_SLOTS];
static int ws_next_evict;

static int stream_capturing(cudaStream_t stream)
{
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(stream, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone;
}

/* Hand out at least bytes of workspace ordered on stream, its first FS_COUNTER_BYTES zeroed. Kernels
 * leave every counter they use back at zero, so zeroing at allocation is enough. */
static cudaError_t workspace_get(int device, cudaStream_t stream, size_t bytes, void **ptr)
{
    if (stream_capturing(stream)) {
        cudaError_t err = cudaMallocAsync(ptr, bytes, stream);
        return err != cudaSuccess ? err : cudaMemsetAsync(*ptr, 0, FS_COUNTER_BYTES, stream);
    }
    fs_ws_slot *slot = NULL;
    for (int i = 0; i < FS_WS_SLOTS && !slot; i++)
        if (ws_slots[i].ptr && ws_slots[i].device == device && ws_slots[i].stream == stream) slot = &ws_slots[i];
    for (int i = 0; i < FS_WS_SLOTS && !slot; i++)
        if (!ws_slots[i].ptr) slot = &ws_slots[i];
    if (!slot) { /* all slots taken by other streams: free one (cudaFree waits for its pending work) */
        slot = &ws_slots[ws_next_evict++ % FS_WS_SLOTS];
        cudaError_t err = cudaFree(slot->ptr);
        slot->ptr = NULL;
        if (err != cudaSuccess) return err;
    }
    if (slot->ptr && slot->bytes < bytes) {
        cudaError_t err = cudaFreeAsync(slot->ptr, stream);
        slot->ptr = NULL;
        if (err != cudaSuccess) return err;
    }
    if (!slot->ptr) {
        bytes = bytes < (1u << 20) ? (1u << 20) : bytes + bytes / 4;
        cudaError_t err = cudaMallocAsync(&slot->ptr, bytes, stream);
        if (err != cudaSuccess) { slot->ptr = NULL; return err; }
        slot->device = device;
        slot->stream = stream;
        slot->bytes = bytes;
        if ((err = cudaMemsetAsync(slot->ptr, 0, FS_COUNTER_BYTES, stream)) != cudaSuccess) return err;
    }
    *ptr = slot->ptr;
    return cudaSuccess;
}

/* Give back workspace from workspace_get: only the capture-time allocation is freed. */
static cudaError_t workspace_release(cudaStream_t stream, void *ptr)
{
    return stream_capturing(stream) ? cudaFreeAsync(ptr, stream) : cudaSuccess;
}

/* KV splits: only when the query tiles leave at least half the SMs idle and the key range is long
 * (16+ tiles: below that the merge costs more than the parallelism saves, measured on the H200);
 * each split keeps two KV tiles, and the split counters fit FS_COUNTER_BYTES. */
static int choose_splits(long long blocks, int n_kv, int sm_count)
{
    if (2 * blocks > sm_count || n_kv < 16 || blocks > FS_COUNTER_BYTES / (long long)sizeof(int)) return 1;
    int s = (int)((sm_count + blocks - 1) / blocks);
    s = s < n_kv / 2 ? s : n_kv / 2;
    return s < FS_MAX_SPLITS ? s : FS_MAX_SPLITS;
}

/* Launch one tile variant (grid = query tiles x KV splits x batch*heads, flattened), or only describe it. */
template <int D, typename T, bool SMALL>
static cudaError_t launch_variant(const fs_attn_params *p, int sm_count, int device, cudaStream_t stream, fs_sm80_plan *plan)
{
    using tile = fs_tile<D, SMALL>;
    constexpr int BR = 16 * tile::MT * tile::WARPS, BC = tile::BC, THREADS = 32 * tile::WARPS;
    constexpr int SMEM = (BR + 2 * BC * tile::STAGES) * fs_pitch<D>::VALUE * (int)sizeof(T);
    static unsigned long long prepared;
    const void *kernel = (const void *)attention_fwd_sm80<D, T, SMALL>;
    cudaError_t err = prepare_kernel(kernel, SMEM, device, &prepared);
    if (err != cudaSuccess) return err;

    fs_sm80_args a;
    a.p = *p;
    a.scale_log2 = (float)(p->scale * 1.4426950408889634);
    a.n_qtiles = (p->Sq + BR - 1) / BR;
    const long long bh = (long long)p->B * p->H, blocks = bh * a.n_qtiles;
    a.n_splits = choose_splits(blocks, (p->Sk + BC - 1) / BC, sm_count);
    a.o_part = a.lse_part = NULL;
    a.counters = NULL;
    if (blocks * a.n_splits > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    if (plan) {
        plan->small = SMALL;
        plan->br = BR;
        plan->bc = BC;
        plan->threads = THREADS;
        plan->smem = SMEM;
        plan->n_qtiles = a.n_qtiles;
        plan->n_splits = a.n_splits;
        plan->blocks = blocks * a.n_splits;
        return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&plan->blocks_per_sm, kernel, THREADS, SMEM);
    }
    void *ws = NULL;
    if (a.n_splits > 1) {
        const size_t rows = (size_t)bh * p->Sq * a.n_splits;
        if ((err = workspace_get(device, stream, FS_COUNTER_BYTES + rows * (D + 1) * sizeof(float), &ws)) != cudaSuccess)
            return err;
        a.counters = (int *)ws;
        a.o_part = (float *)((char *)ws + FS_COUNTER_BYTES);
        a.lse_part = a.o_part + rows * D;
    }
    void *args[] = {&a};
    err = cudaLaunchKernel(kernel, dim3((unsigned)(blocks * a.n_splits)), dim3(THREADS), args, SMEM, stream);
    if (ws) {
        cudaError_t rerr = workspace_release(stream, ws);
        if (err == cudaSuccess) err = rerr;
    }
    return err;
}

/* Big tiles when they fill the SMs, else the small-tile variant. */
template <int D, typename T>
static cudaError_t launch(const fs_attn_params *p, int device, int sm_count, cudaStream_t stream, fs_sm80_plan *plan)
{
    using big = fs_tile<D, false>;
    constexpr int BR = 16 * big::MT * big::WARPS;
    if ((long long)p->B * p->H * ((p->Sq + BR - 1) / BR) < sm_count)
        return launch_variant<D, T, true>(p, sm_count, device, stream, plan);
    return launch_variant<D, T, false>(p, sm_count, device, stream, plan);
}

template <typename T>
static cudaError_t launch_dtype(const fs_attn_params *p, int device, int sm_count, cudaStream_t stream, fs_sm80_plan *plan)
{
    switch (p->D) {
    case 32: return launch<32, T>(p, device, sm_count, stream, plan);
    case 64: return launch<64, T>(p, device, sm_count, stream, plan);
    case 96: return launch<96, T>(p, device, sm_count, stream, plan);
    case 128: return launch<128, T>(p, device, sm_count, stream, plan);
    case 256: return launch<256, T>(p, device, sm_count, stream, plan);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t fs_attention_sm80(const fs_attn_params *p, int device, int sm_count, cudaStream_t stream,
                                         fs_sm80_plan *plan)
{
    if (p->dtype == FS_F16) return launch_dtype<__half>(p, device, sm_count, stream, plan);
    if (p->dtype == FS_BF16) return launch_dtype<__nv_bfloat16>(p, device, sm_count, stream, plan);
    return cudaErrorInvalidValue;
}
