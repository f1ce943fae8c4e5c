/* Tensor-core GEMM with bias / activation / SwiGLU epilogues for sm_80+ (mma.sync), the portable path:
 * y = act(x W^T + bias) or silu(x Wg^T) * (x Wu^T), fp16/bf16 in, fp32 accumulation.
 *
 * Build: part of the extension (CMakeLists.txt); alone:
 *   nvcc -O3 -std=c++17 -arch=sm_80 -Ikernels -Xptxas -v -c kernels/gemm/sm80/gemm.cu
 * Run:   bash benchmarks/gpu_check.sh   (tests/test_linear_gpu.py runs it on Hopper too, forced)
 *
 * A block of 8 warps (2 x 4) owns a BM x BN output tile; each warp a 64 x 32 sub-tile of 4 x 4 m16n8k16
 * fragments. X and W tiles of BK = 64 columns stream through a 3-stage cp.async ring, stored as 128-byte
 * rows with the 16-byte chunk index XORed by row mod 8 (conflict-free ldmatrix). Rows past M / N and
 * columns past K are zero-filled by the copies; the epilogue masks the stores.
 * SwiGLU: the BN rows of the W tile are BN/2 gate rows then the same BN/2 rows of Wu; each warp's four
 * fragments are two gate and the matching two up fragments, so one thread holds both factors.
 * Transposed operands (the backward's dX = dH W and dW = dH^T X): a tile of X^T or W^T is BK rows of k by 128
 * columns, kept as two 64-column panels of the same swizzled layout and read into fragments by ldmatrix.trans.
 *
 * Versions and measurements: docs/notes/gemm.md.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common/cuda_ptx.cuh"
#include "gemm/launchers.h"
#include "gemm/epilogue.cuh"
#include "common/launch.cuh"

/* ---- tile configuration, one place ---- */
#define BM 128
#define BN 128
#define BK 64
#define STAGES 3
#define THREADS 256
#define SMEM_BYTES (STAGES * (BM + BN) * BK * 2)

/* Async-copy rows [0, ROWS) x BK columns from k0 into a swizzled stage; row r reads src_row(r), NULL past
 * the matrix (zero-filled, as are columns past K; any is a valid global address for those). */
template <int ROWS, typename T, typename RowFn>
FS_DEV void load_stage(T *tile, RowFn src_row, int k0, int K, const T *any, int tid)
{
#pragma unroll
    for (int i = tid; i < ROWS * (BK / 8); i += THREADS) {
        const int r = i / (BK / 8), c = i % (BK / 8), k = k0 + c * 8;
        const T *src = src_row(r);
        const bool ok = src && k < K;
        cp_async16(smem_addr(tile + swz<BK>(r, c * 8)), ok ? src + k : any, ok);
    }
}

/* Async-copy a tile stored transposed: rows k0 .. k0 + BK of a [K, cols] matrix (row k at src_row(k), NULL past
 * K), columns c0 .. c0 + 128 (zero past cols, a multiple of 8), into two swizzled 64-column panels of BK rows. */
template <typename T, typename RowFn>
FS_DEV void load_stage_t(T *tile, RowFn src_row, int c0, int cols, const T *any, int tid)
{
#pragma unroll
    for (int i = tid; i < BK * 16; i += THREADS) {
        const int r = i / 16, c = i % 16, col = c0 + c * 8;
        const T *src = src_row(r);
        const bool ok = src && col < cols;
        cp_async16(smem_addr(tile + (c / 8) * BK * 64 + swz<64>(r, (c % 8) * 8)), ok ? src + col : any, ok);
    }
}

/* Element offset of (k, mn) in a tile loaded by load_stage_t. */
FS_DEV int swz_t(int k, int mn) { return (mn / 64) * BK * 64 + swz<64>(k, mn % 64); }

/* Store a warp's 64 x 32 accumulators from this thread's row0 / col0 (with SwiGLU fragments 0, 1 are gate
 * and 2, 3 the matching up fragments). */
template <bool SWIGLU> struct epilogue80 {
    template <fs_activation ACT> FS_DEV void run(const fs_gemm_params &p, const float (&acc)[4][4][4], int row0, int col0)
    {
#pragma unroll
        for (int mi = 0; mi < 4; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int nj = 0; nj < (SWIGLU ? 2 : 4); nj++)
                    gemm_store_pair<SWIGLU, ACT>(p, row0 + mi * 16 + 8 * h, col0 + nj * 8, acc[mi][nj][2 * h],
                                                 acc[mi][nj][2 * h + 1], SWIGLU ? acc[mi][nj + 2][2 * h] : 0.f,
                                                 SWIGLU ? acc[mi][nj + 2][2 * h + 1] : 0.f);
    }
};

template <typename T, bool SWIGLU, bool TX, bool TW>
__global__ void __launch_bounds__(THREADS, 2) gemm_sm80(const fs_gemm_params p, int tiles_m, int tiles_n)
{
    extern __shared__ uint4 smem_v4[];
    T *sA = reinterpret_cast<T *>(smem_v4), *sB = sA + STAGES * BM * BK;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wm = warp >> 2, wn = warp & 3;
    const int g = lane >> 2, t4 = lane & 3;
    constexpr int OUT_BN = SWIGLU ? BN / 2 : BN; /* output columns per tile */
    int tm, tn;
    gemm_tile_coords(blockIdx.x, tiles_m, tiles_n, &tm, &tn);
    /* W^T in two halves (w2 with W^T given): each half its own K steps, as in the Hopper kernel */
    const bool halves = TW && !TX && p.w2;
    const int m0 = tm * BM, n0 = tn * OUT_BN, nk_half = (p.K / 2 + BK - 1) / BK, nk = halves ? 2 * nk_half : (p.K + BK - 1) / BK;
    const T *x = static_cast<const T *>(p.x), *w = static_cast<const T *>(p.w), *w2 = static_cast<const T *>(p.w2);

    auto x_row = [&](int r) -> const T * { return m0 + r < p.M ? x + (int64_t)(m0 + r) * p.ldx : nullptr; };
    auto w_row = [&](int r) -> const T * {
        if (!SWIGLU) return n0 + r < p.N ? w + (int64_t)(n0 + r) * p.ldw : nullptr;
        const int n = n0 + (r & (BN / 2 - 1));
        return n >= p.N ? nullptr : r < BN / 2 ? w + (int64_t)n * p.ldw : w2 + (int64_t)n * p.ldw2;
    };
    auto load = [&](int kt) {
        if (kt < nk) {
            /* halves: step kt of the second half reads X from column K / 2 and W^T's rows from w2 */
            const int second = halves && kt >= nk_half, k0 = (kt - second * nk_half) * BK, xk0 = second * (p.K / 2) + k0;
            const int w_rows = halves ? p.K / 2 : p.K;
            const T *wt = second ? w2 : w;
            const int64_t ldwt = second ? p.ldw2 : p.ldw;
            /* transposed: row r of the tile is row k0 + r of X^T or W^T */
            auto xt_row = [&](int r) -> const T * { return k0 + r < p.K ? x + (int64_t)(k0 + r) * p.ldx : nullptr; };
            auto wt_row = [&](int r) -> const T * { return k0 + r < w_rows ? wt + (int64_t)(k0 + r) * ldwt : nullptr; };
            if (TX) load_stage_t(sA + (kt % STAGES) * BM * BK, xt_row, m0, p.M, x, tid);
            else load_stage<BM>(sA + (kt % STAGES) * BM * BK, x_row, xk0, p.K, x, tid);
            if (TW) load_stage_t(sB + (kt % STAGES) * BN * BK, wt_row, n0, p.N, x, tid);
            else load_stage<BN>(sB + (kt % STAGES) * BN * BK, w_row, k0, p.K, x, tid);
        }
        cp_async_commit();
    };
    for (int s = 0; s < STAGES - 1; s++) load(s);

    /* this warp's W-tile rows: fragment pairs (0,1) and (2,3), 16 rows each (SwiGLU: gate pair, up pair) */
    const int brow[2] = {SWIGLU ? wn * 16 : wn * 32, SWIGLU ? BN / 2 + wn * 16 : wn * 32 + 16};
    /* fragment (mi, nj) element e: row row0 + 16 mi + 8 (e / 2), column col0 + 8 nj + e % 2; the bias is the
     * accumulators' start value */
    const int row0 = m0 + wm * 64 + g, col0 = n0 + (SWIGLU ? wn * 16 : wn * 32) + 2 * t4;
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = SWIGLU ? 0.f : gemm_acc_init(p, col0 + 8 * j + e % 2);

    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads(); /* stage kt landed for all threads; all are done with the stage refilled next */
        load(kt + STAGES - 1);
        const T *a = sA + (kt % STAGES) * BM * BK, *b = sB + (kt % STAGES) * BN * BK;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t af[4][4], bf[4][2];
            /* fragment matrices as ldmatrix numbers them by lane / 8: A (rows 0-7 | 8-15) x (k 0-7 | 8-15) row-fastest,
             * B (k 0-7 | 8-15) x (rows 0-7 | 8-15) k-fastest; transposed tiles are read along k with .trans */
            const int j = lane >> 3, r8 = lane & 7;
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                if (TX) ldmatrix_x4_trans(smem_addr(a + swz_t(kk + (j >> 1) * 8 + r8, wm * 64 + mi * 16 + (j & 1) * 8)), af[mi]);
                else ldmatrix_x4(smem_addr(a + swz<BK>(wm * 64 + mi * 16 + (lane & 15), kk + (lane >> 4) * 8)), af[mi]);
            }
#pragma unroll
            for (int pr = 0; pr < 2; pr++) {
                uint32_t r[4];
                if (TW) ldmatrix_x4_trans(smem_addr(b + swz_t(kk + (j & 1) * 8 + r8, brow[pr] + (j >> 1) * 8)), r);
                else ldmatrix_x4(smem_addr(b + swz<BK>(brow[pr] + (lane & 7) + ((lane >> 4) << 3), kk + ((lane >> 3) & 1) * 8)), r);
                bf[2 * pr][0] = r[0];
                bf[2 * pr][1] = r[1];
                bf[2 * pr + 1][0] = r[2];
                bf[2 * pr + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int nj = 0; nj < 4; nj++) mma16816<T>(acc[mi][nj], af[mi], bf[nj][0], bf[nj][1]);
        }
    }
    cp_async_wait<0>();

    if (SWIGLU) epilogue80<true>::template run<FS_ACT_SILU>(p, acc, row0, col0);
    else if (TX || TW) epilogue80<false>::template run<FS_ACT_NONE>(p, acc, row0, col0); /* plain products */
    else gemm_epilogue_dispatch<epilogue80<false>>(p.act, p, acc, row0, col0);
}

template <typename T, bool SWIGLU, bool TX = false, bool TW = false>
static cudaError_t launch(const fs_gemm_params *p, int device, cudaStream_t stream, fs_gemm_plan *plan)
{
    static fs_kernel handle;
    const void *kernel = (const void *)gemm_sm80<T, SWIGLU, TX, TW>;
    const int out_bn = SWIGLU ? BN / 2 : BN;
    const int tiles_m = (p->M + BM - 1) / BM, tiles_n = (p->N + out_bn - 1) / out_bn;
    const long long tiles = (long long)tiles_m * tiles_n;
    if (tiles > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    if (plan) {
        *plan = fs_gemm_plan{BM, out_bn, BK, STAGES, THREADS, SMEM_BYTES, (int)tiles, tiles, 1, 0};
        return cudaSuccess;
    }
    cudaError_t err = fs_kernel_prepare(kernel, &handle, SMEM_BYTES, device);
    if (err != cudaSuccess) return err;
    fs_gemm_params a = *p;
    void *args[] = {&a, (void *)&tiles_m, (void *)&tiles_n};
    return fs_launch(&handle, device, (unsigned)tiles, THREADS, SMEM_BYTES, stream, args);
}

/* The backward's products: X W^T with W, or both operands, stored transposed. */
template <typename T> static cudaError_t launch_transposed(const fs_gemm_params *p, int device, cudaStream_t stream, fs_gemm_plan *plan)
{
    return p->trans_x ? launch<T, false, true, true>(p, device, stream, plan) : launch<T, false, false, true>(p, device, stream, plan);
}

extern "C" cudaError_t fs_gemm_sm80(const fs_gemm_params *p, int device, cudaStream_t stream, fs_gemm_plan *plan)
{
    if (p->pre && !plan) return FS_GEMM_PRE_DECLINED; /* never keeps it (plan.keeps_pre 0): the caller's two steps */
    if ((p->trans_x && !p->trans_w) || (p->trans_w && p->w2 && (p->trans_x || p->K % 2))) return cudaErrorInvalidValue;
    if (p->trans_w) return p->dtype == FS_F16 ? launch_transposed<__half>(p, device, stream, plan)
                                              : launch_transposed<__nv_bfloat16>(p, device, stream, plan);
    if (p->dtype == FS_F16) return p->swiglu ? launch<__half, true>(p, device, stream, plan) : launch<__half, false>(p, device, stream, plan);
    return p->swiglu ? launch<__nv_bfloat16, true>(p, device, stream, plan) : launch<__nv_bfloat16, false>(p, device, stream, plan);
}
