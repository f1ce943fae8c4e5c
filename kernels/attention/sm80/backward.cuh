/* Tensor-core flash attention backward for sm_80+ (mma.sync), fp16/bf16 in, fp32 accumulation: the main kernel, by
 * key block (FlashAttention-2's order). Passes around it (backward_passes.cu): Delta = rowsum(dO o O) and dQ's float32
 * accumulator zeroed before, dQ scaled, rotated back and converted after. Versions and measurements:
 * docs/notes/attention_sm80.md.
 *
 * Notation: a block owns the key tile K_j, V_j of Bc = 16 * WARPS keys (16 rows per warp, for the whole kernel) and
 * visits the query tiles Q_i, dO_i of Br rows of every query head that reads this K/V head (grouped-query attention
 * sums there), with the forward's logsumexp L_i and D_i = rowsum(dO_i o O_i). In log2 units (c = scale log2 e):
 *   S^T  = K_j Q_i^T                              (per warp: its 16 keys x Br queries, registers)
 *   P^T  = exp2(S^T c + bias log2 e - L_i log2 e)  masked entries 0; a row with L = -inf (no key) gives 0
 *   dV_j += P^T dO_i
 *   dP^T = V_j dO_i^T
 *   dS^T = P^T o (dP^T - D_i)                     (the gradient of the scaled scores: the bias's gradient)
 *   dK_j += dS^T Q_i                              (scaled by `scale` in the epilogue)
 *   dQ_i += dS K_j                                (dS^T through shared memory; float32 atomics into the accumulator)
 * P^T and dS^T are fed to the next products straight from the accumulators (two n8 tiles are one k16 A fragment).
 * Q_i, dO_i, L_i, D_i are double-buffered with cp.async; K_j and V_j are loaded once. Keys past the length are
 * zero rows of K and V: they add nothing to dQ, and their dK, dV rows are not stored (zeros in a padded batch).
 */
#ifndef FLASHSCI_ATTENTION_SM80_BACKWARD_CUH
#define FLASHSCI_ATTENTION_SM80_BACKWARD_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "attention/launchers.h"
#include "attention/rotary/rotary.cuh"
#include "attention/sequence.cuh"
#include "common/cuda_ptx.cuh"

/* ---- tile configuration, one place: warps (Bc = 16 * WARPS keys per block) and Br query rows per step ---- */
template <int W, int R> struct fs_bwd_cfg {
    enum { WARPS = W, BR = R, BC = 16 * W, THREADS = 32 * W };
};
template <int D> struct fs_bwd_tile;
/*                                     WARPS BR */
template <> struct fs_bwd_tile<32>  : fs_bwd_cfg<8, 64> {};
template <> struct fs_bwd_tile<64>  : fs_bwd_cfg<8, 64> {};
template <> struct fs_bwd_tile<96>  : fs_bwd_cfg<8, 64> {};
template <> struct fs_bwd_tile<128> : fs_bwd_cfg<8, 64> {};

/* Shared-memory row pitch in elements: a multiple of 64 so the 16-byte-chunk XOR swizzle stays in-row. */
template <int D> struct fs_bwd_pitch { enum { VALUE = D < 64 ? 64 : (D + 63) / 64 * 64 }; };

/* Shared memory of the main kernel: K, V, two buffers of Q and dO, dS^T, two buffers of L and D, then the T5 table. */
template <int D, typename T> struct fs_bwd_smem {
    typedef fs_bwd_tile<D> tile;
    enum {
        P = fs_bwd_pitch<D>::VALUE, PS = fs_bwd_pitch<tile::BR>::VALUE,
        K = 0, V = K + tile::BC * P * (int)sizeof(T), Q = V + tile::BC * P * (int)sizeof(T),
        DO = Q + 2 * tile::BR * P * (int)sizeof(T), DS = DO + 2 * tile::BR * P * (int)sizeof(T),
        L = DS + tile::BC * PS * (int)sizeof(T), DELTA = L + 2 * tile::BR * 4, T5 = DELTA + 2 * tile::BR * 4,
        BYTES = T5
    };
};

/* Everything the main kernel needs beyond the problem. */
typedef struct {
    fs_attn_bwd_params g;  /* g.p: q and k as the kernel reads them (the rotary pre-pass's copies, rotary off) */
    float scale_log2;      /* scale * log2(e) */
    float scale;
    float *dq_acc;         /* float32 [rows][D], row = fs_bwd_row(...) */
    const float *delta;    /* [rows] */
    int n_kblocks;
    int rotary;            /* dK is rotated back in the epilogue (the forward rotated k by rotary_base) */
    float rotary_base;
    int t5_n, t5_lneg;     /* T5 bias (log2 units) of rel = -t5_lneg .. t5_n - 1 - t5_lneg in shared memory */
} fs_bwd_args;

/* Row of (b, h, i) in the float32 workspaces (Delta, dQ's accumulator): (B, H, Sq) padded, (H, total_q) packed. */
FS_DEV int64_t fs_bwd_row(const fs_attn_params &p, int b, int h, int64_t qo, int i)
{
    return p.cu_seqlens_q ? (int64_t)h * p.total_q + qo + i : ((int64_t)b * p.H + h) * p.Sq + i;
}

/* Async-copy ROWS x D elements (row stride in elements) into a swizzled tile; rows >= valid are zeroed. */
template <int ROWS, int D, int THREADS, typename T>
FS_DEV_T void bwd_load_tile(T *tile, const T *g, int64_t stride, int valid, int tid)
{
    constexpr int CH = D / 8, P = fs_bwd_pitch<D>::VALUE;
#pragma unroll
    for (int i = tid; i < ROWS * CH; i += THREADS) {
        const int r = i / CH, c = i % CH;
        const bool ok = r < valid;
        cp_async16(smem_addr(tile + swz<P>(r, c * 8)), g + (ok ? r * stride + c * 8 : 0), ok);
    }
}

/* ldmatrix lane offsets (elements) into a swizzled tile: off[j] addresses 16-byte chunk 2j + x of row `row` (row & 7 ==
 * lane & 7). The XOR touches only the low 3 bits of the chunk index, so chunk 2k + x of row row + 16m is
 * off[k & 3] + 64 (k >> 2) + 16 m P: four registers per operand, the rest compile-time constants. */
template <int P> FS_DEV_T void lane_offsets(int (&off)[4], int row, int x)
{
#pragma unroll
    for (int j = 0; j < 4; j++) off[j] = row * P + 8 * ((2 * j + x) ^ (row & 7));
}

/* acc[16 x 8N] += A[16 x 16 KS] B, A from a swizzled row-major tile (k contiguous; lane offsets a_off: rows
 * lane & 15, x = lane >> 4), B from rows 0.. of a swizzled tile holding B^T (n rows, k contiguous; b_off: rows
 * lane & 7 + 8 (lane >> 4), x = (lane >> 3) & 1): the S = X Y^T shape. */
template <int KS, int N, int PB, typename T>
FS_DEV_T void mma_abt(float (&acc)[N][4], uint32_t sA, const int (&a_off)[4], uint32_t sB, const int (&b_off)[4])
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t af[4];
        ldmatrix_x4(sA + 2 * (a_off[kk & 3] + 64 * (kk >> 2)), af);
#pragma unroll
        for (int np = 0; np < N / 2; np++) {
            uint32_t bf[4];
            ldmatrix_x4(sB + 2 * (b_off[kk & 3] + 64 * (kk >> 2) + np * 16 * PB), bf);
            mma16816<T>(acc[2 * np], af, bf[0], bf[1]);
            mma16816<T>(acc[2 * np + 1], af, bf[2], bf[3]);
        }
    }
}

/* acc[16 x 8N] += A[16 x 16 KS] B with A in registers (a[kk]: the packed k16 fragments) and B from the swizzled rows
 * 0.. of a tile (k rows, n contiguous; transposed loads, t_off: rows lane & 7 + 8 ((lane >> 3) & 1), x = lane >> 4):
 * the P V shape. */
template <int KS, int N, int PB, typename T>
FS_DEV_T void mma_reg_b(float (&acc)[N][4], const uint32_t (&a)[KS][4], uint32_t sB, const int (&t_off)[4])
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
#pragma unroll
        for (int np = 0; np < N / 2; np++) {
            uint32_t bf[4];
            ldmatrix_x4_trans(sB + 2 * (t_off[np & 3] + 64 * (np >> 2) + kk * 16 * PB), bf);
            mma16816<T>(acc[2 * np], a[kk], bf[0], bf[1]);
            mma16816<T>(acc[2 * np + 1], a[kk], bf[2], bf[3]);
        }
}

/* The accumulators of 16 x 8N scores as k16 A fragments of T: x[n][2r .. 2r + 1] is row g + 8r, n8 tile n. */
template <int N, typename T> FS_DEV_T void pack_a(const float (&x)[N][4], uint32_t (&a)[N / 2][4])
{
#pragma unroll
    for (int kk = 0; kk < N / 2; kk++) {
        a[kk][0] = pack2<T>(x[2 * kk][0], x[2 * kk][1]);
        a[kk][1] = pack2<T>(x[2 * kk][2], x[2 * kk][3]);
        a[kk][2] = pack2<T>(x[2 * kk + 1][0], x[2 * kk + 1][1]);
        a[kk][3] = pack2<T>(x[2 * kk + 1][2], x[2 * kk + 1][3]);
    }
}

/* Float atomics of a pair into the float32 accumulator (one vector atomic on sm_90). */
FS_DEV void atomic_add2(float *dst, float x, float y)
{
#if __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2 *>(dst), make_float2(x, y));
#else
    atomicAdd(dst, x);
    atomicAdd(dst + 1, y);
#endif
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

template <int D, typename T, bool FEAT>
__global__ void __launch_bounds__(fs_bwd_tile<D>::THREADS) attention_bwd_sm80(const fs_bwd_args a)
{
    using tile = fs_bwd_tile<D>;
    using sm = fs_bwd_smem<D, T>;
    constexpr int WARPS = tile::WARPS, BR = tile::BR, BC = tile::BC, THREADS = tile::THREADS;
    constexpr int P = sm::P, PS = sm::PS, KD = D / 16, NQ = BR / 8, NO = D / 8;
    constexpr int QG = BR / 16, DPARTS = WARPS / QG, NDQ = NO / DPARTS; /* dQ: warps as QG row groups x DPARTS column parts */
    static_assert(WARPS % QG == 0 && NO % (2 * DPARTS) == 0, "dQ warp split");
    extern __shared__ __align__(128) unsigned char smem[];
    T *sK = reinterpret_cast<T *>(smem + sm::K), *sV = reinterpret_cast<T *>(smem + sm::V);
    T *sQ = reinterpret_cast<T *>(smem + sm::Q), *sdO = reinterpret_cast<T *>(smem + sm::DO);
    T *sdS = reinterpret_cast<T *>(smem + sm::DS);
    float *sL = reinterpret_cast<float *>(smem + sm::L), *sD = reinterpret_cast<float *>(smem + sm::DELTA);
    float *s_t5 = reinterpret_cast<float *>(smem + sm::T5);

    const fs_attn_bwd_params &g = a.g;
    const fs_attn_params &p = g.p;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gr = lane >> 2, t4 = lane & 3;
    const int hkv_count = p.H / p.kv_group;
    const int kt = blockIdx.x % a.n_kblocks, hkv = blockIdx.x / a.n_kblocks % hkv_count, b = blockIdx.x / a.n_kblocks / hkv_count;
    const int k0 = kt * BC;
    const fs_seq seq = FEAT ? seq_geometry(p, b) : fs_seq{0, 0, p.Sq, p.Sk};
    const bool packed = FEAT && p.cu_seqlens_q;
    if (packed && k0 >= seq.k_len) return; /* these rows belong to the next sequence */
    const int k_rows = min(BC, (packed ? seq.k_len : p.Sk) - k0); /* rows of dK, dV this block writes */
    const int k_valid = max(0, min(BC, seq.k_len - k0));         /* ... of which inside the sequence */

    const T *gK = static_cast<const T *>(p.k) + b * p.k_sb + hkv * p.k_sh + (seq.ko + k0) * p.k_ss;
    const T *gV = static_cast<const T *>(p.v) + b * p.v_sb + hkv * p.v_sh + (seq.ko + k0) * p.v_ss;
    bwd_load_tile<BC, D, THREADS>(sK, gK, p.k_ss, k_valid, tid);
    bwd_load_tile<BC, D, THREADS>(sV, gV, p.v_ss, k_valid, tid);
    cp_async_commit();

    /* this thread's two key rows (g, g + 8 of its warp's 16): kept by the key padding mask? */
    const int key0 = k0 + warp * 16 + gr;
    bool kept[2] = {true, true};
    if (FEAT && p.kpm)
        for (int r = 0; r < 2; r++)
            kept[r] = key0 + 8 * r < seq.k_len && p.kpm[b * p.kpm_sb + (int64_t)(key0 + 8 * r) * p.kpm_sk];
    int n_qb = 0, q_begin = 0;
    if (k_valid > 0) {
        q_begin = p.causal ? k0 / BR * BR : 0; /* causal (top-left): queries before k0 see no key of this block */
        n_qb = seq.q_len > q_begin ? (seq.q_len - q_begin + BR - 1) / BR : 0;
        if (FEAT && p.kpm && !__syncthreads_or(kept[0] || kept[1])) n_qb = 0; /* every key padded: zero gradients */
    }
    const int n_iter = p.kv_group * n_qb; /* (head of the group, query tile) steps, head outer */

    /* issue step it's Q_i, dO_i, L_i, D_i into buffer it & 1 (the cp.async group is committed regardless) */
    auto load_step = [&](int it) {
        if (it < n_iter) {
            const int h = hkv * p.kv_group + it / n_qb, q0 = q_begin + it % n_qb * BR, rows = min(BR, seq.q_len - q0);
            const int buf = it & 1;
            const T *gQ = static_cast<const T *>(p.q) + b * p.q_sb + h * p.q_sh + (seq.qo + q0) * p.q_ss;
            const T *gdO = static_cast<const T *>(g.dout) + b * g.do_sb + h * g.do_sh + (seq.qo + q0) * g.do_ss;
            bwd_load_tile<BR, D, THREADS>(sQ + buf * BR * P, gQ, p.q_ss, rows, tid);
            bwd_load_tile<BR, D, THREADS>(sdO + buf * BR * P, gdO, g.do_ss, rows, tid);
            if (tid < BR / 4 * 2) { /* L and D, 4 floats per copy; rows past the length read as 0 */
                const int part = tid / (BR / 4), c = tid % (BR / 4), r = c * 4;
                const float *src = part == 0 ? static_cast<const float *>(p.lse) + b * p.lse_sb + h * p.lse_sh + seq.qo + q0
                                             : a.delta + fs_bwd_row(p, b, h, seq.qo, q0);
                float *dst = (part == 0 ? sL : sD) + buf * BR + r;
                /* 16-byte copies need 16-byte aligned rows: lse's may not be; copy 4-byte pieces then */
                for (int e = 0; e < 4; e++) {
                    const bool ok = r + e < rows;
                    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst + e)),
                                 "l"(src + (ok ? r + e : 0)), "r"(ok ? 4 : 0));
                }
            }
        }
        cp_async_commit();
    };
    load_step(0);

    float acc_dk[NO][4], acc_dv[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc_dk[n][e] = acc_dv[n][e] = 0.f;
    const uint32_t sK_a = smem_addr(sK), sV_a = smem_addr(sV), sdS_a = smem_addr(sdS);
    const int qg = warp % QG, dpart = warp / QG; /* this warp's share of dQ_i */
    const int l7 = lane & 7, mi = lane >> 3;
    int a_off[4], b_off[4], t_off[4], k_off[NDQ / 2];
    lane_offsets<P>(a_off, warp * 16 + (lane & 15), lane >> 4);  /* K_j, V_j rows of this warp (A) */
    lane_offsets<P>(b_off, l7 + (mi >> 1) * 8, mi & 1);           /* Q_i, dO_i as B^T */
    lane_offsets<P>(t_off, l7 + (mi & 1) * 8, mi >> 1);           /* Q_i, dO_i as B (transposed loads) */
#pragma unroll
    for (int np = 0; np < NDQ / 2; np++) {                        /* K_j as B of dQ: this warp's columns */
        const int row = l7 + (mi & 1) * 8, chunk = dpart * NDQ + 2 * np + (mi >> 1);
        k_off[np] = row * P + 64 * (chunk >> 3) + 8 * ((chunk & 7) ^ l7);
    }
    /* dS^T as A of dQ (transposed loads): keys l7 + 8 (mi >> 1), query chunk 2 qg + (mi & 1) */
    const int ds_off = (l7 + (mi >> 1) * 8) * PS + 8 * ((2 * qg + (mi & 1)) ^ l7);

    for (int it = 0; it < n_iter; it++) {
        const int hi = it / n_qb, h = hkv * p.kv_group + hi, q0 = q_begin + it % n_qb * BR, buf = it & 1;
        cp_async_wait<0>();
        __syncthreads(); /* step it has landed; every warp is done with step it - 1 (its buffers, dS^T, T5 table) */
        load_step(it + 1);
        if (FEAT && p.t5_table && it % n_qb == 0) { /* this head's T5 bias by clamped relative position, log2 units */
            for (int i = tid; i < a.t5_n; i += THREADS) {
                const int bucket = fs_t5_bucket(i - a.t5_lneg, p.t5_buckets, p.t5_max_distance, p.t5_bidirectional);
                s_t5[i] = load_float(p.t5_table, h * p.t5_sh + bucket * p.t5_sn, p.t5_dtype) * FS_LOG2E;
            }
            __syncthreads();
        }
        const uint32_t sQ_a = smem_addr(sQ + buf * BR * P), sdO_a = smem_addr(sdO + buf * BR * P);
        const float *L = sL + buf * BR, *Dl = sD + buf * BR;

        /* S^T = K_j Q_i^T */
        float s[NQ][4];
#pragma unroll
        for (int n = 0; n < NQ; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
        mma_abt<KD, NQ, P, T>(s, sK_a, a_off, sQ_a, b_off);

        /* P^T = exp2(S^T c [+ bias + T5] - L log2 e); masked: causal (query < key), padded keys */
        const bool diag = p.causal && q0 < k0 + warp * 16 + 15;
#pragma unroll
        for (int n = 0; n < NQ; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int col = n * 8 + 2 * t4 + c;
                const float lse = L[col], lse2 = lse == -INFINITY ? INFINITY : lse * FS_LOG2E;
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    float x = s[n][2 * r + c] * a.scale_log2;
                    const int key = key0 + 8 * r, query = q0 + col;
                    if (FEAT && p.t5_table)
                        x += s_t5[min(max(key - query, -a.t5_lneg), a.t5_n - 1 - a.t5_lneg) + a.t5_lneg];
                    if (FEAT && p.bias && key < seq.k_len && query < seq.q_len)
                        x += load_float(p.bias, b * p.bias_sb + h * p.bias_sh + (int64_t)query * p.bias_sq +
                                        (int64_t)key * p.bias_sk, p.bias_dtype) * FS_LOG2E;
                    const bool masked = (diag && query < key) || (FEAT && p.kpm && !kept[r]);
                    s[n][2 * r + c] = masked ? 0.f : exp2_approx(x - lse2);
                }
            }

        /* dV_j += P^T dO_i */
        {
            uint32_t pa[NQ / 2][4];
            pack_a<NQ, T>(s, pa);
            mma_reg_b<NQ / 2, NO, P, T>(acc_dv, pa, sdO_a, t_off);
        }
        /* dP^T = V_j dO_i^T;  dS^T = P^T o (dP^T - D_i) */
        float dp[NQ][4];
#pragma unroll
        for (int n = 0; n < NQ; n++) dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.f;
        mma_abt<KD, NQ, P, T>(dp, sV_a, a_off, sdO_a, b_off);
#pragma unroll
        for (int n = 0; n < NQ; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const float di = Dl[n * 8 + 2 * t4 + c];
                dp[n][c] = s[n][c] * (dp[n][c] - di);
                dp[n][2 + c] = s[n][2 + c] * (dp[n][2 + c] - di);
            }
        /* dK_j += dS^T Q_i; dS^T to shared memory for dQ */
        {
            uint32_t da[NQ / 2][4];
            pack_a<NQ, T>(dp, da);
            mma_reg_b<NQ / 2, NO, P, T>(acc_dk, da, sQ_a, t_off);
#pragma unroll
            for (int kk = 0; kk < NQ / 2; kk++)
#pragma unroll
                for (int e = 0; e < 4; e++) /* e: (row half e & 1, n8 tile 2 kk + e / 2) */
                    *reinterpret_cast<uint32_t *>(sdS + swz<PS>(warp * 16 + gr + 8 * (e & 1), (2 * kk + (e >> 1)) * 8 + 2 * t4)) = da[kk][e];
        }
        __syncthreads(); /* dS^T complete */

        /* dQ_i += dS K_j: this warp's 16 query rows x NDQ n8 tiles, A = dS from dS^T (transposed loads) */
        {
            float acc[NDQ][4];
#pragma unroll
            for (int n = 0; n < NDQ; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
                uint32_t af[4];
                ldmatrix_x4_trans(sdS_a + 2 * (ds_off + kk * 16 * PS), af);
#pragma unroll
                for (int np = 0; np < NDQ / 2; np++) {
                    uint32_t bf[4];
                    ldmatrix_x4_trans(sK_a + 2 * (k_off[np] + kk * 16 * P), bf);
                    mma16816<T>(acc[2 * np], af, bf[0], bf[1]);
                    mma16816<T>(acc[2 * np + 1], af, bf[2], bf[3]);
                }
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int i = q0 + qg * 16 + gr + 8 * r;
                if (i < seq.q_len) {
                    float *dst = a.dq_acc + fs_bwd_row(p, b, h, seq.qo, i) * D + dpart * NDQ * 8 + 2 * t4;
#pragma unroll
                    for (int n = 0; n < NDQ; n++) atomic_add2(dst + n * 8, acc[n][2 * r], acc[n][2 * r + 1]);
                }
            }
        }
    }
    cp_async_wait<0>();

    /* epilogue: dK scaled (and rotated back), dV; staged through the K and V tiles for 16-byte stores. Rows of a
     * padded batch past the sequence's length are zeros. */
    __syncthreads(); /* every warp is done reading K_j and V_j */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = warp * 16 + gr + 8 * r;
        const bool in = row < k_valid;
#pragma unroll
        for (int n = 0; n < NO; n++) {
            acc_dk[n][2 * r] *= a.scale;
            acc_dk[n][2 * r + 1] *= a.scale;
        }
        if (FEAT && a.rotary) {
#pragma unroll
            for (int n = 0; n < NO / 2; n++)
#pragma unroll
                for (int c = 0; c < 2; c++)
                    unrotate_pair(acc_dk[n][2 * r + c], acc_dk[n + NO / 2][2 * r + c], (float)(k0 + row),
                                  rotary_inv_freq(n * 8 + 2 * t4 + c, D, a.rotary_base));
        }
#pragma unroll
        for (int n = 0; n < NO; n++) {
            *reinterpret_cast<uint32_t *>(sK + swz<P>(row, n * 8 + 2 * t4)) =
                in ? pack2<T>(acc_dk[n][2 * r], acc_dk[n][2 * r + 1]) : 0u;
            *reinterpret_cast<uint32_t *>(sV + swz<P>(row, n * 8 + 2 * t4)) =
                in ? pack2<T>(acc_dv[n][2 * r], acc_dv[n][2 * r + 1]) : 0u;
        }
    }
    __syncthreads();
    T *gdK = static_cast<T *>(g.dk) + b * g.dk_sb + hkv * g.dk_sh + (seq.ko + k0) * g.dk_ss;
    T *gdV = static_cast<T *>(g.dv) + b * g.dv_sb + hkv * g.dv_sh + (seq.ko + k0) * g.dv_ss;
    for (int i = tid; i < k_rows * (D / 8); i += THREADS) {
        const int r = i / (D / 8), c = i % (D / 8);
        *reinterpret_cast<uint4 *>(gdK + (int64_t)r * g.dk_ss + c * 8) = *reinterpret_cast<const uint4 *>(sK + swz<P>(r, c * 8));
        *reinterpret_cast<uint4 *>(gdV + (int64_t)r * g.dv_ss + c * 8) = *reinterpret_cast<const uint4 *>(sV + swz<P>(r, c * 8));
    }
}

#endif
