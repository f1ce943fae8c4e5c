/* GEMM with bias / activation / SwiGLU epilogues for Hopper (sm_90a): TMA loads into a shared-memory ring
 * completed on mbarriers, one producer warpgroup and two consumer warpgroups (setmaxnreg), wgmma with both
 * operands in shared memory, a persistent grid walking output tiles in grouped order.
 * y = act(x W^T + bias) or silu(x Wg^T) * (x Wu^T), fp16/bf16 in, fp32 accumulation.
 *
 * Build: part of the extension when the architecture list holds 90a (CMakeLists.txt); alone:
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DFLASHSCI_SM90A -Ikernels -Xptxas -v -c kernels/gemm/sm90/gemm.cu
 * Run:   bash benchmarks/gpu_check.sh
 *
 * A block owns one BM x BN output tile at a time (BM = 128: 64 rows per consumer warpgroup, the M of one
 * wgmma). Per K step of BK = 64 columns (one 128-byte swizzled row per tile row, as TMA writes it):
 *   producer   wait empty[s]; expect (BM + BN) BK 2 bytes on full[s]; TMA X[m0.., k0..] and W[n0.., k0..]
 *   consumers  wait full[s]; 4 x wgmma m64 n(BN) k16; commit; wait until the previous step's group is done
 *              and release its stage on empty[s - 1]
 * TMA zero-fills rows past M and N and columns past K, so tails cost nothing in the main loop. The epilogue
 * (gemm/epilogue.cuh) goes through a shared-memory staging tile and a TMA store, which drops rows and columns
 * past M and N (outputs in another dtype than x, or rows TMA cannot address, take masked direct stores).
 * SwiGLU: the W tile is BN/2 rows of Wg then the same rows of Wu (two TMA boxes), so accumulator i (gate) and
 * i + BN/4 (up) sit in the same thread.
 * A forward keeping its pre-activation h for the backward (p.pre) stores it from the staging tile, before the
 * activation, where the producer warpgroup's activation warps finish the tiles; a SwiGLU forward keeping (g | u)
 * runs this plain kernel on paired tiles (the SwiGLU W tile: g's columns, then u's) and stores both halves.
 * Transposed operands (LAYOUT, the backward's products: 1 W^T given, dX = dH W; 2 X^T and W^T, dW = dH^T X): TMA
 * copies BK rows (k) x 64 columns (m or n) per box, 128-byte swizzled, the panels of a tile one after another, and
 * wgmma reads them MN-major (leading byte offset: the panel stride; stride byte offset: 8 rows of k). Those products
 * split the tiles of a last round that would leave most SMs idle along K: each chunk's sums go to a workspace slot, and
 * the consumer warpgroup counted last on the tile sums them in chunk order and runs the epilogue.
 *
 * Versions and measurements: docs/notes/gemm.md.
 */
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "gemm/launchers.h"
#include "gemm/epilogue.cuh"
#include "common/launch.cuh"
#include "common/tma.cuh"
#include "common/workspace.h"

/* ---- tile configuration, one place ---- */
#define BM 128
#define BK 64
#define THREADS 384 /* producer warpgroup + 2 consumer warpgroups */
#define SMEM_MAX 232448 /* shared memory a Hopper block may opt in to (227 KiB) */
/* Per tile width BN: the output staging tiles (64 x OUT_BN per consumer warpgroup, stored by TMA in boxes of BOX
 * columns: 64 with the 128-byte swizzle, or 32 with the 64-byte one where OUT_BN is no multiple of 64), the
 * bias (two buffers of OUT_BN values as copied, of up to 4 bytes, and one of floats per consumer warpgroup), its and the
 * staging tiles' barriers, the split tiles' flags and alignment slack, then as many
 * ring stages (X and W tiles, full and empty barriers) as fit, at most 6: BN = 256 takes 3, 192 takes 4, 160 5,
 * 128 5 (SwiGLU 3, 4, -, 6). */
template <int BN, bool SWIGLU> struct fs_gemm90_tile {
    enum { OUT_BN = SWIGLU ? BN / 2 : BN, BOX = OUT_BN % 64 == 0 ? 64 : 32,
           FIXED = 2 * 64 * OUT_BN * 2 + 4 * OUT_BN * 4 + 7 * 8 + 1024,
           STAGE_BYTES = (BM + BN) * BK * 2 + 16,
           STAGES = (SMEM_MAX - FIXED) / STAGE_BYTES < 6 ? (SMEM_MAX - FIXED) / STAGE_BYTES : 6,
           SMEM = STAGES * STAGE_BYTES + FIXED };
    static_assert(OUT_BN % 32 == 0, "the staging tile is stored in boxes of 32 or 64 columns");
};

typedef struct {
    fs_gemm_params p;
    int tiles_m, tiles_n, tiles;
    int tma_store; /* the output goes out through shared memory and TMA (same dtype as x, 16-byte aligned rows) */
    int act_warps; /* with tma_store: the producer warpgroup's warps 1-3 apply the activation in the staging tiles */
    int paired;    /* a SwiGLU forward keeping (g | u) in pre: a plain kernel's tile holds BN / 2 columns of g, then
                    * the same columns of u, both stored to pre before the activation warps form silu(g) u */
    /* The backward's products (transposed layouts) split the tiles of a last, partial round along K: work items
     * 0 .. main_tiles - 1 are whole tiles, the rest split chunks of each remaining tile; each chunk's partial sums go to
     * partials ([tail tile][chunk][consumer warpgroup][NA][128] floats), and the warpgroup whose chunk is counted last
     * on arrivals ([tail tile][consumer warpgroup], left at zero) sums them in chunk order and stores the tile. */
    int items, main_tiles, split;
    float *partials;
    unsigned *arrivals;
} fs_gemm90_args;

#ifdef FS_WGMMA
/* Named barrier 1 + cw: the 128 threads of consumer warpgroup cw. */
FS_DEV void warpgroup_sync(int cw) { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + cw) : "memory"); }
/* Named barrier 3: the producer warpgroup's three activation warps. */
FS_DEV void act_warps_sync() { asm volatile("bar.sync 3, 96;\n" ::: "memory"); }
#endif


/* Walk a consumer warpgroup's accumulators (NA per thread) as output column pairs: sink(h, j, v0, v1, u0, u1)
 * gets the pair at row + 8 h, column + 8 j of this thread, bias added (bias: the tile's OUT_BN bias values as
 * float in shared memory from this thread's first column on, NULL: none; SwiGLU: u0, u1 the up projection). In
 * chunks of CHUNK pairs, each chunk's bias loaded
 * before its stores: the compiler cannot move a shared-memory load above a shared-memory store it might alias,
 * so a load per pair between the stores serialised the epilogue on the load latency (2.4 us per 128 x 256 tile,
 * measured); the chunks are fenced from each other so that not every bias load is hoisted (that would spill the
 * accumulators). */
template <int NA, bool SWIGLU, typename SINK> FS_DEV void epilogue_pairs90(const float (&acc)[NA], const float *bias, SINK sink)
{
    constexpr int PAIRS = SWIGLU ? NA / 4 : NA / 2, CHUNK = 8; /* output column pairs per thread */
#pragma unroll
    for (int c = 0; c < PAIRS; c += CHUNK) {
        asm volatile("" ::: "memory");
        float2 b[CHUNK];
#pragma unroll
        for (int q = 0; q < CHUNK; q++)
            b[q] = bias ? *reinterpret_cast<const float2 *>(bias + 8 * ((2 * (c + q)) / 4)) : make_float2(0.f, 0.f);
#pragma unroll
        for (int q = c; q < c + CHUNK; q++) {
            const int i = 2 * q, j = i / 4, h = (i / 2) % 2;
            sink(h, j, acc[i] + b[q - c].x, acc[i + 1] + b[q - c].y, SWIGLU ? acc[i + NA / 2] : 0.f, SWIGLU ? acc[i + NA / 2 + 1] : 0.f);
        }
    }
}

/* Store the accumulators from row0 / col0 of this thread straight to y. */
template <int NA, bool SWIGLU> struct epilogue90 {
    template <fs_activation ACT>
    FS_DEV void run(const fs_gemm_params &p, const float (&acc)[NA], int row0, int col0, const float *bias)
    {
        epilogue_pairs90<NA, SWIGLU>(acc, bias, [&](int h, int j, float v0, float v1, float u0, float u1) {
            gemm_store_pair<SWIGLU, ACT>(p, row0 + 8 * h, col0 + 8 * j, v0, v1, u0, u1);
        });
    }
};

/* The same values written to a consumer warpgroup's staging tile for a TMA store: 64 rows x OUT_BN columns of T
 * in boxes of BOX columns, as TMA's swizzles lay them out: BOX = 64, 128-byte rows, 16-byte chunk k of row r at
 * k ^ (r % 8); BOX = 32, 64-byte rows, chunk k at k ^ (r / 2 % 4). This thread's rows are 16 warp + g (+ 8), so
 * either way a warp's 4-byte stores hit 32 distinct banks. */
template <int NA, bool SWIGLU, typename T, int BOX> struct stage90 {
    template <fs_activation ACT>
    FS_DEV void run(const float (&acc)[NA], int warp, int g, int t4, const float *bias, unsigned char *tile)
    {
        constexpr int CHUNKS = BOX / 8; /* 16-byte chunks per staging row */
        const int swizzle = BOX == 64 ? g : g >> 1;
        epilogue_pairs90<NA, SWIGLU>(acc, bias, [&](int h, int j, float v0, float v1, float u0, float u1) {
            const float2 v = gemm_finish_pair<SWIGLU, ACT>(v0, v1, u0, u1);
            const int r = warp * 16 + g + 8 * h;
            *reinterpret_cast<uint32_t *>(tile + (j / CHUNKS) * (64 * BOX * 2) + r * (BOX * 2) + (((j % CHUNKS) ^ swizzle) << 4) +
                                          4 * t4) = pack2<T>(v.x, v.y);
        });
    }
};

/* The activation applied in place to a staging tile (64 x OUT_BN values of T already holding x W^T + bias) by the
 * three activation warps, thread i taking 16-byte chunks i, i + 96, ...; the order of the values does not matter,
 * so the swizzle does not either. */
template <int OUT_BN, typename T> struct activate_tile90 {
    template <fs_activation ACT> FS_DEV void run(unsigned char *tile, int i)
    {
#pragma unroll 2
        for (int c = i; c < 64 * OUT_BN / 8; c += 96) {
            uint4 *chunk = reinterpret_cast<uint4 *>(tile) + c;
            uint4 v = *chunk;
            uint32_t *w = reinterpret_cast<uint32_t *>(&v);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float2 f = unpack2<T>(w[k]);
                w[k] = pack2<T>(gemm_activate<ACT>(f.x), gemm_activate<ACT>(f.y));
            }
            *chunk = v;
        }
    }
};

/* A consumer warpgroup's staging tile (rows tm BM + 64 cw.., columns tn OUT_BN..) out to y, one TMA box per BOX
 * columns, in one bulk group of the calling thread. */
#ifdef FS_WGMMA
template <int OUT_BN, int BOX>
FS_DEV void store_staging90(const CUtensorMap *map_y, const unsigned char *tile, int tm, int tn, int cw)
{
    for (int b = 0; b < OUT_BN / BOX; b++) tma_store_2d(map_y, tile + b * (64 * BOX * 2), tn * OUT_BN + BOX * b, tm * BM + cw * 64);
    bulk_commit();
}
#endif

/* silu(g) u in place of g in a paired staging tile (64 rows of BN / 2 columns of g, then the same of u, in boxes of
 * 64 columns, so that a value of g and its u lie HALF bytes apart) by the three activation warps, as
 * activate_tile90. */
template <int BN, typename T> FS_DEV void swiglu_tile90(unsigned char *tile, int i)
{
    constexpr int HALF = 64 * BN; /* bytes of one half: 64 rows x BN / 2 columns x 2 bytes */
#pragma unroll 2
    for (int c = i; c < HALF / 16; c += 96) {
        uint4 *chunk = reinterpret_cast<uint4 *>(tile) + c;
        uint4 v = *chunk;
        const uint4 up = *reinterpret_cast<const uint4 *>(tile + HALF + 16 * c);
        uint32_t *w = reinterpret_cast<uint32_t *>(&v);
        const uint32_t *wu = reinterpret_cast<const uint32_t *>(&up);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 g = unpack2<T>(w[k]), u = unpack2<T>(wu[k]);
            w[k] = pack2<T>(gemm_activate<FS_ACT_SILU>(g.x) * u.x, gemm_activate<FS_ACT_SILU>(g.y) * u.y);
        }
        *chunk = v;
    }
}

#ifdef FS_WGMMA
/* Boxes [b0, b1) of a staging tile (64-column boxes) out through map at columns col.., rows row.., in the calling
 * thread's current bulk group. */
FS_DEV void store_boxes90(const CUtensorMap *map, const unsigned char *tile, int b0, int b1, int col, int row)
{
    for (int b = b0; b < b1; b++) tma_store_2d(map, tile + b * (64 * 64 * 2), col + 64 * (b - b0), row);
}
#endif

/* Work item it of a: its output tile and its K steps [*kb, *ke) of nk; *chunk: its chunk of a split tile, or -1. */
FS_DEV void gemm_item90(const fs_gemm90_args &a, int it, int nk, int *tile, int *kb, int *ke, int *chunk)
{
    if (it < a.main_tiles) {
        *tile = it;
        *kb = 0;
        *ke = nk;
        *chunk = -1;
        return;
    }
    const int u = it - a.main_tiles, c = u % a.split;
    *tile = a.main_tiles + u / a.split;
    *chunk = c;
    *kb = (int)((long long)nk * c / a.split);
    *ke = (int)((long long)nk * (c + 1) / a.split);
}

#ifdef FS_WGMMA
/* A split tile's chunk by consumer warpgroup cw: its partial sums out (thread-major, so a warp's stores are
 * contiguous), counted on the tile's arrivals; false for every chunk but the one counted last, whose warpgroup reads
 * all the chunks' sums back in chunk order into acc (the same result whichever chunk came last), leaves the count at
 * zero and returns true: it goes on to the epilogue. flag: a word of shared memory for the warpgroup. */
template <int NA> FS_DEV bool split_chunk90(const fs_gemm90_args &a, float (&acc)[NA], int tile, int chunk, int cw, int *flag)
{
    const int tid = threadIdx.x & 127, tail = tile - a.main_tiles;
    float *mine = a.partials + (((size_t)tail * a.split + chunk) * 2 + cw) * 128 * NA;
#pragma unroll
    for (int i = 0; i < NA; i++) mine[i * 128 + tid] = acc[i];
    __threadfence(); /* the sums visible before the count */
    warpgroup_sync(cw);
    unsigned *count = a.arrivals + tail * 2 + cw;
    if (tid == 0) *flag = atomicAdd(count, 1u) == (unsigned)a.split - 1;
    warpgroup_sync(cw);
    if (!*flag) return false;
    __threadfence(); /* every chunk's sums, counted before this one, are visible */
#pragma unroll
    for (int i = 0; i < NA; i++) acc[i] = 0.f;
    for (int c = 0; c < a.split; c++) {
        const float *part = a.partials + (((size_t)tail * a.split + c) * 2 + cw) * 128 * NA;
#pragma unroll
        for (int i = 0; i < NA; i++) acc[i] += __ldcg(part + i * 128 + tid); /* past L1: written by other SMs */
    }
    if (tid == 0) *count = 0;
    return true;
}
#endif

/* Operand layouts: X W^T as nn.Linear stores them; W^T given (X W); X^T and W^T given (X^T W). */
enum { LAYOUT_NT = 0, LAYOUT_NN = 1, LAYOUT_TN = 2 };

template <int BN, typename T, bool SWIGLU, int LAYOUT>
__global__ void __launch_bounds__(THREADS, 1)
gemm_sm90(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
          const __grid_constant__ CUtensorMap map_w2, const __grid_constant__ CUtensorMap map_y,
          const __grid_constant__ CUtensorMap map_pre, const __grid_constant__ CUtensorMap map_pre2, const fs_gemm90_args a)
{
#ifdef FS_WGMMA
    constexpr int STAGES = fs_gemm90_tile<BN, SWIGLU>::STAGES, OUT_BN = SWIGLU ? BN / 2 : BN, NA = BN / 2,
                  BOX = fs_gemm90_tile<BN, SWIGLU>::BOX;
    extern __shared__ unsigned char smem_raw[];
    /* TMA's 128-byte swizzle and the wgmma descriptors address 1024-byte atoms: align the base */
    T *sA = reinterpret_cast<T *>(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));
    T *sB = sA + STAGES * BM * BK, *sC = sB + STAGES * BN * BK; /* sC: a 64 x OUT_BN staging tile per consumer warpgroup */
    /* a tile's bias: OUT_BN values of the bias dtype in the buffer of the tile's parity, copied by the producer with
     * the tile's first K step (completing on that stage's full barrier) and released on bias_empty by every consumer
     * thread once it has widened its share into its warpgroup's float buffer (sBiasF, [consumer warpgroup][OUT_BN]) */
    unsigned char *sBias = reinterpret_cast<unsigned char *>(sC + 2 * 64 * OUT_BN);
    float *sBiasF = reinterpret_cast<float *>(sBias + 2 * OUT_BN * 4);
    uint64_t *full = reinterpret_cast<uint64_t *>(sBiasF + 2 * OUT_BN), *empty = full + STAGES, *bias_empty = empty + STAGES;
    /* with act_warps, per consumer warpgroup: its staging tile written (each of its threads arrives) / stored (each
     * activation thread arrives, the one issuing the TMA store once the store has read the tile) */
    uint64_t *staged = bias_empty + 2, *stored = staged + 2;
    int *split_flag = reinterpret_cast<int *>(stored + 2); /* [consumer warpgroup] */
    const fs_gemm_params &p = a.p;
    /* W^T in two halves (w2 with W^T given: the SwiGLU backward's dX = dG Wg + dU Wu): each half its own K steps, the
     * first half's last step reading zeros from w past its rows whatever X holds there */
    const bool halves = LAYOUT == LAYOUT_NN && p.w2;
    const int wg = threadIdx.x >> 7, nk_half = (p.K / 2 + BK - 1) / BK, nk = halves ? 2 * nk_half : (p.K + BK - 1) / BK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 8); /* lane 0 of each consumer warp */
        }
        for (int c = 0; c < 2; c++) {
            mbar_init(&bias_empty[c], 256);
            mbar_init(&staged[c], 128);
            mbar_init(&stored[c], 96);
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) { /* producer: one thread issues every TMA load */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            tma_prefetch_map(&map_x);
            tma_prefetch_map(&map_w);
            tma_prefetch_map(&map_w2);
            tma_prefetch_map(&map_y);
            int s = 0, phase = 0, i = 0;
            const int bias_size = p.bias_dtype == FS_F32 ? 4 : 2;
            for (int it = blockIdx.x; it < a.items; it += gridDim.x, i++) {
                int t, kb, ke, chunk, tm, tn;
                gemm_item90(a, it, nk, &t, &kb, &ke, &chunk);
                gemm_tile_coords(t, a.tiles_m, a.tiles_n, &tm, &tn);
                /* the W tile in two boxes of BN / 2 rows (SwiGLU, paired: the gate rows, then the same rows of the
                 * up weight) */
                const bool pairs = SWIGLU || a.paired;
                const CUtensorMap *wmap1 = pairs ? &map_w2 : &map_w;
                const int wrow0 = pairs ? tn * (BN / 2) : tn * BN, wrow1 = pairs ? wrow0 : wrow0 + BN / 2;
                /* the tile's bias columns that exist (N is a multiple of 8: whole 16-byte chunks) */
                const uint32_t bias_bytes = !SWIGLU && p.bias ? min(OUT_BN, p.N - tn * OUT_BN) * bias_size : 0;
                for (int kt = kb; kt < ke; kt++) {
                    mbar_wait(&empty[s], phase ^ 1);
                    if (kt == 0 && bias_bytes) mbar_wait(&bias_empty[i & 1], ((i >> 1) & 1) ^ 1);
                    mbar_expect_tx(&full[s], (BM + BN) * BK * 2 + (kt == 0 ? bias_bytes : 0));
                    /* A: X's rows (halves: the second half's columns from K / 2 on), or X^T's 64-column panels */
                    const int second = halves && kt >= nk_half, k0 = (kt - second * nk_half) * BK;
                    if (LAYOUT == LAYOUT_TN)
                        for (int b = 0; b < BM / 64; b++) tma_load_2d(sA + s * BM * BK + b * BK * 64, &map_x, tm * BM + 64 * b, k0, &full[s]);
                    else
                        tma_load_2d(sA + s * BM * BK, &map_x, second * (p.K / 2) + k0, tm * BM, &full[s]);
                    /* B: W's rows in two boxes (SwiGLU: gate rows, then up rows), or W^T's panels (halves: from w2) */
                    if (LAYOUT == LAYOUT_NT) {
                        tma_load_2d(sB + s * BN * BK, &map_w, k0, wrow0, &full[s]);
                        tma_load_2d(sB + s * BN * BK + (BN / 2) * BK, wmap1, k0, wrow1, &full[s]);
                    } else {
                        for (int b = 0; b < BN / 64; b++)
                            tma_load_2d(sB + s * BN * BK + b * BK * 64, second ? &map_w2 : &map_w, tn * BN + 64 * b, k0, &full[s]);
                    }
                    if (kt == 0 && bias_bytes)
                        bulk_load(sBias + (i & 1) * OUT_BN * 4, static_cast<const unsigned char *>(p.bias) + (size_t)tn * OUT_BN * bias_size,
                                  bias_bytes, &full[s]);
                    if (++s == STAGES) { s = 0; phase ^= 1; }
                }
            }
        } else if (LAYOUT == LAYOUT_NT && !SWIGLU && a.act_warps && threadIdx.x >= 32) {
            /* activation warps 1-3: for each tile and consumer warpgroup cw, once cw has staged x W^T + bias, store
             * it to the kept pre-activation (if any), apply the activation there and store the tile to y with TMA,
             * while the consumers run the next tile's wgmmas. Paired (SwiGLU keeping (g | u)): g's boxes to pre's
             * first half, u's to its second, then silu(g) u in g's place out to y. */
            const int i = threadIdx.x - 32, HB = BN / 128; /* paired: 64-column boxes per half */
            int parity = 0;
            for (int t = blockIdx.x; t < a.tiles; t += gridDim.x, parity ^= 1) {
                int tm, tn;
                gemm_tile_coords(t, a.tiles_m, a.tiles_n, &tm, &tn);
                for (int cw = 0; cw < 2; cw++) {
                    unsigned char *tile = reinterpret_cast<unsigned char *>(sC + cw * 64 * OUT_BN);
                    const int row = tm * BM + cw * 64, col = tn * (BN / 2);
                    mbar_wait(&staged[cw], parity);
                    if (p.pre) { /* out to pre as staged, read by TMA before the tile is activated in place */
                        if (i == 0) {
                            if (a.paired) {
                                store_boxes90(&map_pre, tile, 0, HB, col, row);
                                store_boxes90(&map_pre2, tile, HB, 2 * HB, col, row);
                                bulk_commit();
                            } else {
                                store_staging90<OUT_BN, BOX>(&map_pre, tile, tm, tn, cw);
                            }
                            bulk_wait_read();
                        }
                        act_warps_sync();
                    }
                    if (a.paired) swiglu_tile90<BN, T>(tile, i);
                    else gemm_epilogue_dispatch<activate_tile90<OUT_BN, T>>(p.act, tile, i);
                    fence_proxy_async();
                    act_warps_sync();
                    if (i == 0) {
                        if (a.paired) {
                            store_boxes90(&map_y, tile, 0, HB, col, row);
                            bulk_commit();
                        } else {
                            store_staging90<OUT_BN, BOX>(&map_y, tile, tm, tn, cw);
                        }
                        bulk_wait_read();
                    }
                    mbar_arrive(&stored[cw]);
                }
            }
            if (i == 0) bulk_wait(); /* the last stores done before the block exits */
        }
    } else { /* consumers */
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        const int cw = __reduce_max_sync(0xffffffffu, wg - 1), warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
        int s = 0, phase = 0, tile_count = 0;
        const bool act_warps = LAYOUT == LAYOUT_NT && !SWIGLU && a.act_warps;
        for (int it = blockIdx.x; it < a.items; it += gridDim.x) {
            int t, kb, ke, chunk, tm, tn;
            gemm_item90(a, it, nk, &t, &kb, &ke, &chunk);
            gemm_tile_coords(t, a.tiles_m, a.tiles_n, &tm, &tn);
            const int row0 = tm * BM + cw * 64 + warp * 16 + g, col0 = tn * OUT_BN + 2 * t4;
            /* this tile's bias lands with its first K step (the full barrier waited on below); widened after the
             * main loop */
            const int parity = tile_count & 1;
            float *bias = !SWIGLU && p.bias ? sBiasF + cw * OUT_BN : nullptr;
            /* a warpgroup barrier per tile, unconditional (a bar.sync under a branch pushes the main loop's stage,
             * phase and wgmma descriptors out of the uniform registers: 4 R2UR moves per wgmma); it also keeps the
             * warpgroup's float bias buffer from being rewritten while a thread still reads the previous tile's */
            warpgroup_sync(cw);
            tile_count++;
            /* accumulator i sits at row row0 + 8 ((i / 2) % 2), column col0 + 8 (i / 4) + i % 2 */
            float acc[NA];
#pragma unroll
            for (int i = 0; i < NA; i++) acc[i] = 0.f;
            int prev = -1;
            for (int kt = kb; kt < ke; kt++) {
                mbar_wait(&full[s], phase);
                /* K-major: this warpgroup's 64 rows of 128 bytes, k16 step kk 32 bytes on; MN-major: its 64-column panel
                 * (A) or the tile's panels (B), k16 step kk 16 rows on */
                constexpr bool TA = LAYOUT == LAYOUT_TN, TB = LAYOUT != LAYOUT_NT;
                const uint32_t a_addr = smem_addr(sA + s * BM * BK) + cw * 64 * 128, b_addr = smem_addr(sB + s * BN * BK);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BK / 16; kk++)
                    wgmma_sst<BN, T>::template run<TA, TB>(acc, TA ? desc_sw128(a_addr + kk * 16 * 128, BK * 128, 1024) : desc_sw128(a_addr + 32 * kk, 16, 1024),
                                                           TB ? desc_sw128(b_addr + kk * 16 * 128, BK * 128, 1024) : desc_sw128(b_addr + 32 * kk, 16, 1024), 1);
                wgmma_commit();
                wgmma_wait<1>(); /* the previous step's group is done: its stage may be refilled */
                if (prev >= 0 && lane == 0) mbar_arrive(&empty[prev]);
                prev = s;
                if (++s == STAGES) { s = 0; phase ^= 1; }
            }
            wgmma_wait<0>();
            if (lane == 0) mbar_arrive(&empty[prev]);
            if (bias) { /* widen this thread's share of the bias and release the copy */
                const unsigned char *raw = sBias + parity * OUT_BN * 4;
#pragma unroll
                for (int c = threadIdx.x & 127; c < OUT_BN; c += 128) bias[c] = gemm_bias_value(raw, p.bias_dtype, c);
                mbar_arrive(&bias_empty[parity]);
            }
            const bool leader = (threadIdx.x & 127) == 0;
            if (!act_warps && a.tma_store && leader) bulk_wait_read(); /* the staging tile's previous store has read it */
            warpgroup_sync(cw); /* the float bias written; unconditional, as above */
            if (LAYOUT != LAYOUT_NT && chunk >= 0 && !split_chunk90(a, acc, t, chunk, cw, split_flag + cw)) continue;
            if (act_warps) {
                /* the staging tile once the activation warps have stored the previous one; x W^T + bias into it, for
                 * them to finish and store */
                unsigned char *tile = reinterpret_cast<unsigned char *>(sC + cw * 64 * OUT_BN);
                mbar_wait(&stored[cw], tile_count & 1); /* parity 1 on the first tile: passes */
                stage90<NA, false, T, BOX>::template run<FS_ACT_NONE>(acc, warp, g, t4, bias ? bias + 2 * t4 : nullptr, tile);
                if (p.pre) fence_proxy_async(); /* the activation warps store the tile to pre as it is */
                mbar_arrive(&staged[cw]);
            } else if (a.tma_store) {
                /* through the warpgroup's staging tile (its previous TMA store has read it: above): fill it, make the
                 * writes visible to the async proxy, and one thread stores its boxes (waited on a tile later) */
                unsigned char *tile = reinterpret_cast<unsigned char *>(sC + cw * 64 * OUT_BN);
                if (SWIGLU) stage90<NA, true, T, BOX>::template run<FS_ACT_SILU>(acc, warp, g, t4, nullptr, tile);
                else if (LAYOUT != LAYOUT_NT) stage90<NA, false, T, BOX>::template run<FS_ACT_NONE>(acc, warp, g, t4, nullptr, tile);
                else gemm_epilogue_dispatch<stage90<NA, false, T, BOX>>(p.act, acc, warp, g, t4, bias ? bias + 2 * t4 : nullptr, tile);
                fence_proxy_async();
                warpgroup_sync(cw);
                if (leader) store_staging90<OUT_BN, BOX>(&map_y, tile, tm, tn, cw);
            } else if (SWIGLU) {
                epilogue90<NA, true>::template run<FS_ACT_SILU>(p, acc, row0, col0, nullptr);
            } else if (LAYOUT != LAYOUT_NT) {
                epilogue90<NA, false>::template run<FS_ACT_NONE>(p, acc, row0, col0, nullptr);
            } else {
                gemm_epilogue_dispatch<epilogue90<NA, false>>(p.act, p, acc, row0, col0, bias ? bias + 2 * t4 : nullptr);
            }
        }
        if (a.tma_store && !act_warps && (threadIdx.x & 127) == 0)
            bulk_wait(); /* the last stores done before the block exits */
    }
#endif
}

/* ---- host: tensor maps and launch ---- */

/* A 2-D tensor map over rows x cols elements (row stride ld), read or written in boxes of box_rows x box_cols
 * (64: 128-byte swizzle, 32: 64-byte swizzle). */
static cudaError_t make_map(CUtensorMap *map, const void *base, fs_dtype dt, int rows, int cols, int64_t ld, int box_rows,
                            int box_cols)
{
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ld * 2};
    const cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows};
    return fs_make_tensor_map(map, base, dt == FS_BF16, 2, dims, strides, box);
}

/* K chunks for each tile of a last, partial round of tiles over the SMs (1: no split): as many as give every SM one
 * work item, each chunk at least 4 K steps, at most 16. */
static int tail_split(long long tiles, int sm_count, int nk)
{
    const long long tail = tiles % sm_count;
    if (tail == 0) return 1;
    long long split = sm_count / tail;
    if (split > 16) split = 16;
    if (split > nk / 4) split = nk / 4;
    return split >= 2 ? (int)split : 1;
}

template <int BN, typename T, bool SWIGLU, int LAYOUT>
static cudaError_t launch(const fs_gemm_params *p, int device, int sm_count, cudaStream_t stream, fs_gemm_plan *plan)
{
    constexpr int SMEM = fs_gemm90_tile<BN, SWIGLU>::SMEM, OUT_BN = SWIGLU ? BN / 2 : BN;
    static_assert(LAYOUT == LAYOUT_NT || (BN % 64 == 0 && !SWIGLU), "transposed operands come in 64-column boxes");
    static fs_kernel handle;
    const void *kernel = (const void *)gemm_sm90<BN, T, SWIGLU, LAYOUT>;
    fs_gemm90_args a;
    memset(&a, 0, sizeof a);
    a.p = *p;
    /* paired: a SwiGLU forward keeping its pre-activation (fs_gemm_sm90 sends it here with SWIGLU false), each tile
     * BN / 2 columns of y */
    a.paired = !SWIGLU && p->swiglu;
    const int tile_cols = a.paired ? BN / 2 : OUT_BN;
    a.tiles_m = (p->M + BM - 1) / BM;
    a.tiles_n = (p->N + tile_cols - 1) / tile_cols;
    const long long tiles = (long long)a.tiles_m * a.tiles_n;
    if (tiles > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    a.tiles = (int)tiles;
    a.tma_store = p->out_dtype == p->dtype && (uintptr_t)p->y % 16 == 0 && p->ldy % 8 == 0;
    /* the backward's products: the last round's tiles split along K (fs_gemm90_args) */
    const int nk = LAYOUT == LAYOUT_NN && p->w2 ? 2 * ((p->K / 2 + BK - 1) / BK) : (p->K + BK - 1) / BK;
    a.split = LAYOUT == LAYOUT_NT ? 1 : tail_split(tiles, sm_count, nk);
    a.main_tiles = a.split > 1 ? (int)(tiles - tiles % sm_count) : a.tiles;
    const long long items = a.main_tiles + (tiles - a.main_tiles) * a.split;
    if (items > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    a.items = (int)items;
    const int grid = items < sm_count ? (int)items : sm_count;
    /* ReLU costs one instruction per value: the consumers apply it; the others move to the producer warpgroup. With
     * one tile per CTA there is no next tile to overlap, and the consumers' eight warps finish sooner than three
     * (M = 256, N = 10240, GELU: 31.9 -> 29.6 us on an H100) */
    a.act_warps = LAYOUT == LAYOUT_NT && a.tma_store && !SWIGLU && tiles > grid &&
                  (a.paired || p->act == FS_ACT_GELU || p->act == FS_ACT_GELU_TANH || p->act == FS_ACT_SILU);
    if (plan) {
        *plan = fs_gemm_plan{BM, tile_cols, BK, fs_gemm90_tile<BN, SWIGLU>::STAGES, THREADS, SMEM, grid, tiles, a.split,
                             p->pre && a.act_warps};
        return cudaSuccess;
    }
    /* a kept pre-activation is stored from the activation warps' staging tiles (so that no other epilogue carries the
     * code); without them plan.keeps_pre is 0 and the caller runs the two steps */
    if (p->pre && !a.act_warps) return FS_GEMM_PRE_DECLINED;
    CUtensorMap mx, mw, mw2, my, mpre, mpre2;
    cudaError_t err = LAYOUT == LAYOUT_TN ? make_map(&mx, p->x, p->dtype, p->K, p->M, p->ldx, BK, 64)
                                          : make_map(&mx, p->x, p->dtype, p->M, p->K, p->ldx, BM, BK);
    const int w_rows = LAYOUT == LAYOUT_NN && p->w2 ? p->K / 2 : p->K; /* W^T's rows per map: halves, or all */
    if (err == cudaSuccess)
        err = LAYOUT != LAYOUT_NT ? make_map(&mw, p->w, p->dtype, w_rows, p->N, p->ldw, BK, 64)
                                  : make_map(&mw, p->w, p->dtype, p->N, p->K, p->ldw, BN / 2, BK);
    if (err == cudaSuccess)
        err = SWIGLU || a.paired ? make_map(&mw2, p->w2, p->dtype, p->N, p->K, p->ldw2, BN / 2, BK)
            : LAYOUT == LAYOUT_NN && p->w2 ? make_map(&mw2, p->w2, p->dtype, w_rows, p->N, p->ldw2, BK, 64)
                                           : (mw2 = mw, cudaSuccess);
    if (err == cudaSuccess)
        err = a.tma_store ? make_map(&my, p->y, p->dtype, p->M, p->N, p->ldy, 64, fs_gemm90_tile<BN, SWIGLU>::BOX) : (my = mx, cudaSuccess);
    /* the kept pre-activation, stored by TMA from the staging tiles of the activation warps (paired: its halves g
     * and u through a map each, so that neither runs into the other past N) */
    if (err == cudaSuccess)
        err = p->pre ? make_map(&mpre, p->pre, p->dtype, p->M, p->N, p->ldpre, 64, fs_gemm90_tile<BN, SWIGLU>::BOX)
                     : (mpre = mx, cudaSuccess);
    if (err == cudaSuccess)
        err = a.paired ? make_map(&mpre2, static_cast<char *>(p->pre) + (size_t)p->N * sizeof(T), p->dtype, p->M, p->N,
                                  p->ldpre, 64, 64)
                       : (mpre2 = mx, cudaSuccess);
    if (err == cudaSuccess) err = fs_kernel_prepare(kernel, &handle, SMEM, device);
    if (err != cudaSuccess) return err;
    /* split tiles: their chunks' partial sums past the workspace's counters, their arrival counts among them */
    void *ws = NULL;
    if (a.split > 1) {
        const long long tail = tiles - a.main_tiles;
        if ((err = fs_workspace_get(device, stream, FS_COUNTER_BYTES + (size_t)tail * a.split * BM * BN * 4, &ws)) != cudaSuccess)
            return err;
        a.arrivals = static_cast<unsigned *>(ws);
        a.partials = reinterpret_cast<float *>(static_cast<unsigned char *>(ws) + FS_COUNTER_BYTES);
    }
    void *args[] = {&mx, &mw, &mw2, &my, &mpre, &mpre2, &a};
    err = fs_launch(&handle, device, grid, THREADS, SMEM, stream, args);
    if (ws) {
        const cudaError_t e2 = fs_workspace_release(stream, ws);
        if (err == cudaSuccess) err = e2;
    }
    return err;
}

/* The tile width (256, 192, 160 or 128 W rows; SwiGLU not 160) with the least time per CTA: rounds of tiles over
 * the SMs times a tile's time, BN columns per K step of 64 plus a per-tile cost worth 512 such column-steps
 * (H100, K = 2560: a round of 128 x BN tiles took 0.0285 us per column-step and about 1.5 us more; each round
 * measured for every width at M = 256 ... 2048); the transposed products' tiles cost about 2,800 column-steps more
 * and each of their K steps TRANS_STEP columns more than its width (H200, dX = dh W at 16k x 10240 -> 2560: 108 us
 * a round of 256-wide tiles, 57.5 of 128-wide ones, about 18 columns; H100, dX and dW at 16k x 12800 -> 1600: 1,972
 * us with 256-wide tiles against 2,462 with 128-wide, about 85), and their split last round costs one chunk plus the
 * partial sums' traffic; ties go to the wider tile. tile_n, when nonzero, is taken instead (tests and benchmarks;
 * SwiGLU and the transposed products ignore 160). A SwiGLU forward keeping its pre-activation (p->swiglu with SWIGLU
 * false: paired tiles) takes 256 or 128, whose halves are whole TMA boxes. */
template <typename T, bool SWIGLU, int LAYOUT = LAYOUT_NT>
static cudaError_t launch_tiles(const fs_gemm_params *p, int device, int sm_count, int tile_n, cudaStream_t stream,
                                fs_gemm_plan *plan)
{
    static const int widths[4] = {256, 192, 160, 128};
    constexpr int TRANS_STEP = 32;
    constexpr bool NO_160 = SWIGLU || LAYOUT != LAYOUT_NT; /* 160 is no whole number of 64-column panels */
    const bool paired = !SWIGLU && p->swiglu;
    int best = 0;
    long long best_cost = 0;
    for (int i = 0; i < 4; i++) {
        if ((NO_160 && widths[i] == 160) || (paired && widths[i] % 128)) continue;
        const int out_bn = SWIGLU || paired ? widths[i] / 2 : widths[i];
        const long long tiles = (long long)((p->M + BM - 1) / BM) * ((p->N + out_bn - 1) / out_bn);
        const int nk = (p->K + BK - 1) / BK, split = LAYOUT == LAYOUT_NT ? 1 : tail_split(tiles, sm_count, nk);
        const int step_cols = widths[i] + (LAYOUT == LAYOUT_NT ? 0 : TRANS_STEP);
        const long long tile_cost = (long long)step_cols * nk + (LAYOUT == LAYOUT_NT ? 512 : 2800);
        /* a split last round: one chunk of a tile, plus writing and summing the chunks' partial sums (2 per column) */
        const long long cost = split > 1 ? tiles / sm_count * tile_cost + (long long)step_cols * nk / split + 512 + 2LL * split * widths[i]
                                         : (tiles + sm_count - 1) / sm_count * tile_cost;
        if (i == 0 || cost < best_cost) {
            best = i;
            best_cost = cost;
        }
    }
    for (int i = 0; i < 4; i++)
        if (tile_n == widths[i] && !(NO_160 && tile_n == 160) && !(paired && tile_n % 128)) best = i;
    if (best == 2 && !NO_160) return launch<160, T, false, LAYOUT_NT>(p, device, sm_count, stream, plan);
    return best == 0 ? launch<256, T, SWIGLU, LAYOUT>(p, device, sm_count, stream, plan)
         : best == 1 ? launch<192, T, SWIGLU, LAYOUT>(p, device, sm_count, stream, plan)
                     : launch<128, T, SWIGLU, LAYOUT>(p, device, sm_count, stream, plan);
}

/* The backward's products: X W with W^T given, or X^T W with both given transposed. */
template <typename T>
static cudaError_t launch_transposed(const fs_gemm_params *p, int device, int sm_count, int tile_n, cudaStream_t stream,
                                     fs_gemm_plan *plan)
{
    return p->trans_x ? launch_tiles<T, false, LAYOUT_TN>(p, device, sm_count, tile_n, stream, plan)
                      : launch_tiles<T, false, LAYOUT_NN>(p, device, sm_count, tile_n, stream, plan);
}

extern "C" int fs_gemm_sm90_built(void)
{
#ifdef FLASHSCI_SM90A
    return 1;
#else
    return 0;
#endif
}

extern "C" cudaError_t fs_gemm_sm90(const fs_gemm_params *p, int device, int sm_count, int tile_n, cudaStream_t stream,
                                    fs_gemm_plan *plan)
{
    if ((p->trans_x && !p->trans_w) || (p->trans_w && p->w2 && (p->trans_x || p->K % 2))) return cudaErrorInvalidValue;
    if (p->trans_w) return p->dtype == FS_F16 ? launch_transposed<__half>(p, device, sm_count, tile_n, stream, plan)
                                              : launch_transposed<__nv_bfloat16>(p, device, sm_count, tile_n, stream, plan);
    /* a SwiGLU forward keeping (g | u) runs the plain kernel on paired tiles (launch) */
    const bool swiglu_kernel = p->swiglu && !p->pre;
    if (p->dtype == FS_F16)
        return swiglu_kernel ? launch_tiles<__half, true>(p, device, sm_count, tile_n, stream, plan)
                             : launch_tiles<__half, false>(p, device, sm_count, tile_n, stream, plan);
    return swiglu_kernel ? launch_tiles<__nv_bfloat16, true>(p, device, sm_count, tile_n, stream, plan)
                         : launch_tiles<__nv_bfloat16, false>(p, device, sm_count, tile_n, stream, plan);
}
