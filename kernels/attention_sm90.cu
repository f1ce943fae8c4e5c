/* Tensor-core flash attention forward for Hopper (sm_90a): wgmma with both Q K^T and P V on the
 * warpgroup MMA unit, fp16/bf16 in, fp32 accumulation, online softmax, one pass over K/V.
 *
 * Build: part of the extension when the architecture list holds 90a (CMakeLists.txt); alone:
 *   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -c kernels/attention_sm90.cu
 * Run:   bash benchmarks/gpu_check.sh
 *
 * Notation (FlashAttention-2/3): a block of NWG warpgroups owns a query tile Q_i of Br = 64 NWG rows, 64 per
 * warpgroup (the M of one wgmma), and streams K_j, V_j tiles of Bc rows through a cp.async ring in
 * shared memory. Per tile and warpgroup:
 *   S = Q_i K_j^T      wgmma m64 n(Bc) k16, A = Q and B = K from shared memory (both K-major)
 *   softmax            on the S accumulators in registers (m_i, l_i per row, exp2 with the scale folded in)
 *   O_i += P V_j       wgmma m64 n(D) k16, A = P from registers (the S accumulator layout is exactly the
 *                      A fragment layout), B = V from shared memory (MN-major: the transpose bit)
 * Tiles are stored as 64-column halves of 128-byte rows with the 128-byte swizzle (16-byte chunk XOR
 * row mod 8), the canonical layout wgmma descriptors name.
 *
 * Scope of this version: D = 64 and 128 (the dispatcher sends only D = 128 here for now), no protein
 * options, no KV split; everything else runs on the sm80 kernel.
 *
 * History (H200 fp16, TF/s at D=64 / D=128 on the S = 512 ... 16384 sweep; FA2 = 250-296 / 272-332):
 *   v1  2 warpgroups (Br = 128), Bc = 128, cp.async ring shared by all threads, wgmma waits after each
 *       GEMM                                                               213-274 / 272-363
 *       D = 128 beats FA2 (0.85-1.00x) and is dispatched here; D = 64 stays on sm80 (0.97-1.02x FA2).
 *       Next: overlap the softmax of one tile with the GEMMs of the next (two S buffers, deferred waits),
 *       TMA loads from a producer warp, three warpgroups at D = 64.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "attention_cuda.h"
#include "cuda_ptx.cuh"
#include "wgmma.cuh"

/* ---- tile configuration, one place ---- */
template <int D> struct fs_sm90_tile;
/*                                         NWG  BC   STAGES */
template <> struct fs_sm90_tile<64>  { enum { NWG = 2, BC = 128, STAGES = 3 }; };
template <> struct fs_sm90_tile<128> { enum { NWG = 2, BC = 128, STAGES = 2 }; };

typedef struct {
    fs_attn_params p;
    float scale_log2; /* scale * log2(e) */
    int n_qtiles;
} fs_sm90_args;

/* Element offset of (row, col) in a tile of ROWS rows kept as 64-column halves of 128-byte rows with the
 * 128-byte swizzle (16-byte chunk index XOR row mod 8 inside each 8-row, 1024-byte atom). */
template <int ROWS> FS_DEV int sw128(int row, int col)
{
    return (col >> 6) * ROWS * 64 + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

/* Async-copy ROWS x D elements (row stride in elements) into such a tile; rows >= valid are zeroed. */
template <int ROWS, int D, int THREADS, typename T>
FS_DEV void load_tile_sw128(T *tile, const T *g, int64_t stride, int valid, int tid)
{
    constexpr int CH = D / 8;
#pragma unroll
    for (int i = tid; i < ROWS * CH; i += THREADS) {
        const int r = i / CH, c = i % CH;
        const bool ok = r < valid;
        cp_async16(smem_addr(tile + sw128<ROWS>(r, c * 8)), g + (ok ? r * stride + c * 8 : 0), ok);
    }
}

template <int D, typename T>
__global__ void __launch_bounds__(fs_sm90_tile<D>::NWG * 128) attention_fwd_sm90(const fs_sm90_args a)
{
#ifdef FS_WGMMA
    using tile = fs_sm90_tile<D>;
    constexpr int NWG = tile::NWG, BC = tile::BC, STAGES = tile::STAGES;
    constexpr int BR = 64 * NWG, THREADS = 128 * NWG, NS = BC / 8, NO = D / 8;
    extern __shared__ unsigned char smem_raw[];
    /* descriptors address 1024-byte swizzle atoms: align the base (the launch adds 1 KiB of slack) */
    T *sQ = reinterpret_cast<T *>(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));
    T *sKV = sQ + BR * D; /* ring: stage s holds K at 2s, V at 2s+1 (BC x D each) */

    const fs_attn_params &p = a.p;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    int qt = blockIdx.x % a.n_qtiles;
    const int bh = blockIdx.x / a.n_qtiles, b = bh / p.H, h = bh % p.H;
    if (p.causal) qt = a.n_qtiles - 1 - qt; /* heaviest causal tiles first */
    const int q0 = qt * BR, q_rows = min(BR, p.Sq - q0);
    const T *gQ = static_cast<const T *>(p.q) + b * p.q_sb + h * p.q_sh + (int64_t)q0 * p.q_ss;
    const T *gK = static_cast<const T *>(p.k) + b * p.k_sb + h * p.k_sh;
    const T *gV = static_cast<const T *>(p.v) + b * p.v_sb + h * p.v_sh;
    const int kv_end = p.causal ? min(p.Sk, q0 + BR) : p.Sk, n_kv = (kv_end + BC - 1) / BC;

    /* issue K_t, V_t into ring stage t % STAGES (the group is committed regardless) */
    auto load_kv = [&](int t) {
        if (t < n_kv) {
            T *st = sKV + (t % STAGES) * 2 * BC * D;
            const int rows = min(BC, p.Sk - t * BC);
            load_tile_sw128<BC, D, THREADS>(st, gK + (int64_t)t * BC * p.k_ss, p.k_ss, rows, tid);
            load_tile_sw128<BC, D, THREADS>(st + BC * D, gV + (int64_t)t * BC * p.v_ss, p.v_ss, rows, tid);
        }
        cp_async_commit();
    };
    load_tile_sw128<BR, D, THREADS>(sQ, gQ, p.q_ss, q_rows, tid);
    for (int s = 0; s < STAGES - 1; s++) load_kv(s);

    float o[NO * 4], m_i[2] = {-INFINITY, -INFINITY}, l_i[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < NO * 4; i++) o[i] = 0.f;
    const int warp_row = q0 + wg * 64 + warp * 16; /* this thread's rows: warp_row + g and + g + 8 */
    const uint32_t sQ_addr = smem_addr(sQ) + wg * 64 * 128;
    const bool prescale = a.scale_log2 <= 0.f;
    const float mul = prescale ? 1.f : a.scale_log2;

    for (int j = 0; j < n_kv; j++) {
        cp_async_wait<STAGES - 2>();
        fence_proxy_async(); /* this thread's copies of tile j, visible to wgmma after the barrier */
        __syncthreads();     /* tile j landed for all threads; every warpgroup is done with tile j - 1's stage */
        load_kv(j + STAGES - 1);
        const uint32_t sK_addr = smem_addr(sKV + (j % STAGES) * 2 * BC * D), sV_addr = sK_addr + BC * D * 2;
        const int k0 = j * BC;

        /* S = Q_i K_j^T: D/16 k-steps, each advancing 32 bytes inside a 128-byte row (next half at kk = 4) */
        float s[NS * 4];
#pragma unroll
        for (int i = 0; i < NS * 4; i++) s[i] = 0.f;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
            wgmma_ss<BC, T>(s, desc_sw128(sQ_addr + (kk >> 2) * BR * 128 + 32 * (kk & 3), 16, 1024),
                            desc_sw128(sK_addr + (kk >> 2) * BC * 128 + 32 * (kk & 3), 16, 1024), kk > 0);
        wgmma_commit();
        wgmma_wait<0>();

        if (prescale)
#pragma unroll
            for (int i = 0; i < NS * 4; i++) s[i] *= a.scale_log2;
        /* mask keys past Sk and, for causal, keys after the query (col > row) */
        if (k0 + BC > p.Sk || (p.causal && k0 + BC - 1 > warp_row)) {
#pragma unroll
            for (int i = 0; i < NS * 4; i++) {
                const int col = k0 + (i >> 2) * 8 + 2 * t4 + (i & 1), row = warp_row + g + ((i >> 1) & 1) * 8;
                if (col >= p.Sk || (p.causal && col > row)) s[i] = -INFINITY;
            }
        }

        /* m_new = max(m_i, rowmax(S) c);  P = exp2(S c - m_new);  l_i = exp2(m_i - m_new) l_i + rowsum(P);
         * O_i = exp2(m_i - m_new) O_i. P packed to T pairs (pk[n][r]: row g + 8r) */
        uint32_t pk[NS][2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < NS; n++) mx = fmaxf(mx, fmaxf(s[4 * n + 2 * r], s[4 * n + 2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
            const float m_new = fmaxf(m_i[r], mx * mul), m_use = m_new == -INFINITY ? 0.f : m_new;
            const float alpha = exp2_approx(m_i[r] - m_use);
            m_i[r] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int n = 0; n < NS; n++) {
                const float p0 = exp2_approx(fmaf(s[4 * n + 2 * r], mul, -m_use));
                const float p1 = exp2_approx(fmaf(s[4 * n + 2 * r + 1], mul, -m_use));
                sum += p0 + p1;
                pk[n][r] = pack2<T>(p0, p1);
            }
            l_i[r] = l_i[r] * alpha + sum;
#pragma unroll
            for (int n = 0; n < NO; n++) {
                o[4 * n + 2 * r] *= alpha;
                o[4 * n + 2 * r + 1] *= alpha;
            }
        }

        /* O_i += P V_j: BC/16 k-steps of 16 V rows (2 KiB) each; V's two 64-column halves are BC rows apart */
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
            const uint32_t af[4] = {pk[2 * kk][0], pk[2 * kk][1], pk[2 * kk + 1][0], pk[2 * kk + 1][1]};
            wgmma_rs<D, T>(o, af, desc_sw128(sV_addr + kk * 16 * 128, BC * 128, 1024));
        }
        wgmma_commit();
        wgmma_wait<0>();
    }
    cp_async_wait<0>();

    /* O_i / l_i (l summed over the four lanes of a row), lse = (m_i + log2 l_i) ln 2; rows with no key: zeros */
    T *gO = static_cast<T *>(p.o) + b * p.o_sb + h * p.o_sh;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = l_i[r];
        l += __shfl_xor_sync(0xffffffff, l, 1);
        l += __shfl_xor_sync(0xffffffff, l, 2);
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const int row = warp_row + g + 8 * r;
        if (row >= p.Sq) continue;
#pragma unroll
        for (int n = 0; n < NO; n++)
            *reinterpret_cast<uint32_t *>(gO + (int64_t)row * p.o_ss + n * 8 + 2 * t4) =
                pack2<T>(o[4 * n + 2 * r] * inv, o[4 * n + 2 * r + 1] * inv);
        if (p.lse && t4 == 0)
            static_cast<float *>(p.lse)[b * p.lse_sb + h * p.lse_sh + row] =
                l > 0.f ? (m_i[r] + __log2f(l)) * 0.69314718055994531f : -INFINITY;
    }
#endif
}

/* Launch one head dim (grid = query tiles x batch*heads), or only describe it. */
template <int D, typename T>
static cudaError_t launch(const fs_attn_params *p, int device, cudaStream_t stream, fs_sm80_plan *plan)
{
    using tile = fs_sm90_tile<D>;
    constexpr int BR = 64 * tile::NWG, THREADS = 128 * tile::NWG;
    constexpr int SMEM = (BR + 2 * tile::BC * tile::STAGES) * D * (int)sizeof(T) + 1024;
    static unsigned long long prepared;
    const void *kernel = (const void *)attention_fwd_sm90<D, T>;
    if (device >= 64 || !((prepared >> device) & 1ULL)) {
        cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
        if (err != cudaSuccess) return err;
        if (device < 64) prepared |= 1ULL << device;
    }
    fs_sm90_args a;
    a.p = *p;
    a.scale_log2 = (float)(p->scale * 1.4426950408889634);
    a.n_qtiles = (p->Sq + BR - 1) / BR;
    const long long blocks = (long long)p->B * p->H * a.n_qtiles;
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    if (plan) {
        plan->small = 0;
        plan->br = BR;
        plan->bc = tile::BC;
        plan->threads = THREADS;
        plan->smem = SMEM;
        plan->n_qtiles = a.n_qtiles;
        plan->n_splits = 1;
        plan->blocks = blocks;
        return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&plan->blocks_per_sm, kernel, THREADS, SMEM);
    }
    void *args[] = {&a};
    return cudaLaunchKernel(kernel, dim3((unsigned)blocks), dim3(THREADS), args, SMEM, stream);
}

template <typename T>
static cudaError_t launch_dtype(const fs_attn_params *p, int device, cudaStream_t stream, fs_sm80_plan *plan)
{
    return p->D == 64 ? launch<64, T>(p, device, stream, plan) : launch<128, T>(p, device, stream, plan);
}

extern "C" int fs_attention_sm90_covers(const fs_attn_params *p, int sm_count)
{
#ifdef FLASHSCI_SM90A
    const int br = 64 * 2;
    /* D = 64 stays on the sm80 kernel: v1 here runs it at 213-276 TF/s against sm80's 264-296 */
    return (p->dtype == FS_F16 || p->dtype == FS_BF16) && p->D == 128 && !p->cu_seqlens_q && !p->kpm &&
           !p->seqlens && !p->bias && !p->t5_table && !p->rotary && (long long)p->B * p->H * ((p->Sq + br - 1) / br) >= sm_count;
#else
    (void)p; (void)sm_count;
    return 0;
#endif
}

extern "C" cudaError_t fs_attention_sm90(const fs_attn_params *p, int device, cudaStream_t stream, fs_sm80_plan *plan)
{
    return p->dtype == FS_F16 ? launch_dtype<__half>(p, device, stream, plan) : launch_dtype<__nv_bfloat16>(p, device, stream, plan);
}
