/* Tensor-core flash attention backward for sm_80+ (mma.sync), fp16/bf16 in, fp32 accumulation: the main kernel, by
 * key block (FlashAttention-2's order). Passes around it (backward_passes.cu): Delta = rowsum(dO o O) and dQ's float32
 * accumulator zeroed before, dQ scaled, rotated back and converted after. Versions and measurements:
 * docs/notes/attention_backward_sm80.md.
 *
 * Notation: a block owns the key tile K_j, V_j of Bc keys and visits the query tiles Q_i, dO_i of Br rows of every
 * query head that reads this K/V head (grouped-query attention sums there), with the forward's logsumexp L_i and
 * D_i = rowsum(dO_i o O_i). In log2 units (c = scale log2 e):
 *   S^T  = K_j Q_i^T               P^T  = exp2(S^T c + bias log2 e - L_i log2 e)  (masked: 0; L = -inf: 0)
 *   dP^T = V_j dO_i^T              dS^T = P^T o (dP^T - D_i)  (the scaled scores' gradient)
 *   dV_j += P^T dO_i               dK_j += dS^T Q_i  (scaled by `scale` in the epilogue)
 *   dQ_i += dS K_j                 (float32 atomics into the accumulator)
 * Warps work in groups of G on 32 keys (two m16 tiles; G = 2, 4 at D = 256). Each warp of a group computes S^T, P^T,
 * dP^T, dS^T for its 1/G of the Br queries and writes P^T and dS^T to shared memory; after the barrier each
 * accumulates dV and dK for the group's 32 keys and its 1/G of the head dim over all Br queries: the A fragments of its
 * own queries come straight from its registers, the others' from shared memory. Then all warps take a share of dQ_i
 * from dS^T. Against one warp per 16 keys over all queries (the first version), the tiles are twice as tall, so each
 * Q_i / dO_i fragment loaded from shared memory feeds twice the MMAs (shared-memory bandwidth bounds this kernel).
 * Q_i, dO_i, L_i, D_i are double-buffered with cp.async where shared memory allows (a runtime choice: single-buffered
 * on parts with less of it); K_j and V_j are loaded once. Keys past the length are zero rows of K and V: they add
 * nothing to dQ, and their dK, dV rows are not stored (zeros in a padded batch).
 */
#ifndef FLASHSCI_ATTENTION_SM80_BACKWARD_CUH
#define FLASHSCI_ATTENTION_SM80_BACKWARD_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "attention/launchers.h"
#include "attention/rotary/rotary.cuh"
#include "attention/sequence.cuh"
#include "attention/sm80/tiles.cuh"
#include "common/cuda_ptx.cuh"

/* ---- tile configuration, one place: warps, Br query rows per step, G warps per group of 32 keys (each taking 1/G of
 * the queries for S and dP, 1/G of the head dim for dV and dK: Bc = 32 WARPS / G) ---- */
template <int W, int R, int G_> struct fs_bwd_cfg {
    enum { WARPS = W, BR = R, G = G_, BC = 32 * W / G_, THREADS = 32 * W, MT = 2 /* m16 key tiles per warp */ };
};
/* TALL: the unmasked kernels' tile (MASK off: plain non-causal runs, and non-causal runs of sequences of their own
 * lengths), taller where that is faster: 128 queries a step at D = 64, as FlashAttention-2 takes, so each step's
 * barriers, loads and address arithmetic are spread over twice the products (3% faster at 1k-8k tokens; packed UniProt
 * batches 2-6%; causal runs were 3% slower with it, the every-option kernel spills). Parts with less shared memory per
 * block than it needs run the masked kernel's tile instead (backward_launch.cuh). */
template <int D, bool TALL> struct fs_bwd_tile;
/*                                                  WARPS BR  G */
template <bool TALL> struct fs_bwd_tile<32, TALL>  : fs_bwd_cfg<8, 64, 2> {};
template <> struct fs_bwd_tile<64, false>          : fs_bwd_cfg<8, 64, 2> {};
template <> struct fs_bwd_tile<64, true>           : fs_bwd_cfg<8, 128, 2> {};
template <bool TALL> struct fs_bwd_tile<96, TALL>  : fs_bwd_cfg<8, 64, 2> {};
template <bool TALL> struct fs_bwd_tile<128, TALL> : fs_bwd_cfg<8, 64, 2> {};
/* D = 256: G = 4, as dV + dK of 32 keys x D/2 would take 256 registers */
template <bool TALL> struct fs_bwd_tile<256, TALL> : fs_bwd_cfg<8, 64, 4> {};

/* Shared memory of the main kernel (byte offsets): K, V, P^T, dS^T, two buffers of L and D, then `stages` buffers of
 * Q and of dO, then the T5 table. */
template <int D, typename T, bool TALL> struct fs_bwd_smem {
    typedef fs_bwd_tile<D, TALL> tile;
    enum {
        P = fs_pitch<D>::VALUE, PS = fs_pitch<tile::BR>::VALUE,
        K = 0, V = K + tile::BC * P * (int)sizeof(T), PT = V + tile::BC * P * (int)sizeof(T),
        DS = PT + tile::BC * PS * (int)sizeof(T), L = DS + tile::BC * PS * (int)sizeof(T), DELTA = L + 2 * tile::BR * 4,
        Q = DELTA + 2 * tile::BR * 4, STAGE = tile::BR * P * (int)sizeof(T) /* one buffer of Q or dO */
    };
    /* bytes with `stages` buffers and t5_n T5 entries */
    static int bytes(int stages, int t5_n) { return Q + 2 * stages * STAGE + 4 * t5_n; }
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
    int rotary_dim;        /* ... over columns 0 .. rotary_dim - 1: the problem's own head dim (D, or less in padded runs) */
    float rotary_base;
    int t5_n, t5_lneg;     /* T5 bias (log2 units) of rel = -t5_lneg .. t5_n - 1 - t5_lneg in shared memory */
    int stages;            /* buffers of Q_i and dO_i: 2 (the next step's copies overlap this one) or 1 */
    int dq_kernel;         /* dQ by the query-block kernel (deterministic, T5 gradient) instead of atomics here */
    float *t5_part;        /* T5 gradient: per (b, h, query tile) bucket sums of the dQ kernel, [B H n_qtiles][buckets] */
    int dq_smem_ds;        /* the dQ kernel's byte offset of its dS tile (then diagonal sums, buckets, bucket sums) */
    int delta_pass;        /* the dQ kernel computes D_i = rowsum(P o dP) into delta_out instead of dQ */
    float *delta_out;
} fs_bwd_args;

/* ldmatrix lane offsets (elements) into a swizzled tile: off[j] addresses 16-byte chunk 2j + x of row `row` (row & 7 ==
 * lane & 7). The XOR touches only the low 3 bits of the chunk index, so chunk 2k + x of row row + 16m is
 * off[k & 3] + 64 (k >> 2) + 16 m P: four registers per operand, the rest compile-time constants. */
template <int P> FS_DEV_T void lane_offsets(int (&off)[4], int row, int x)
{
#pragma unroll
    for (int j = 0; j < 4; j++) off[j] = row * P + 8 * ((2 * j + x) ^ (row & 7));
}

/* ldmatrix lane offset (elements) of 16-byte chunk `chunk` of row `row` in a swizzled tile (row & 7 == lane & 7). */
template <int P> FS_DEV_T int chunk_off(int row, int chunk)
{
    return row * P + 64 * (chunk >> 3) + 8 * ((chunk & 7) ^ (row & 7));
}

/* acc[16 MT x 8N] += A[16 MT x 16 KS] B, A from a swizzled row-major tile (k contiguous; lane offsets a_off: rows
 * lane & 15, x = lane >> 4; m16 tile mt 16 rows further), B from a swizzled tile holding B^T (n rows, k contiguous;
 * b_off: rows lane & 7 + 8 (lane >> 4), x = (lane >> 3) & 1, from the first of the N / 8 rows): the S = X Y^T shape. */
template <int MT, int KS, int N, int PA, int PB, typename T>
FS_DEV_T void mma_abt(float (&acc)[MT][N][4], uint32_t sA, const int (&a_off)[4], uint32_t sB, const int (&b_off)[4])
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) ldmatrix_x4(sA + 2 * (a_off[kk & 3] + 64 * (kk >> 2) + mt * 16 * PA), af[mt]);
#pragma unroll
        for (int np = 0; np < N / 2; np++) {
            uint32_t bf[4];
            ldmatrix_x4(sB + 2 * (b_off[kk & 3] + 64 * (kk >> 2) + np * 16 * PB), bf);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma16816<T>(acc[mt][2 * np], af[mt], bf[0], bf[1]);
                mma16816<T>(acc[mt][2 * np + 1], af[mt], bf[2], bf[3]);
            }
        }
    }
}

/* Two n8 tiles of score accumulators (x0: columns 0-7, x1: 8-15; [2r .. 2r + 1] is row g + 8r) as one k16 A fragment of T. */
template <typename T> FS_DEV_T void pack_a(const float (&x0)[4], const float (&x1)[4], uint32_t (&a)[4])
{
    a[0] = pack2<T>(x0[0], x0[1]);
    a[1] = pack2<T>(x0[2], x0[3]);
    a[2] = pack2<T>(x1[0], x1[1]);
    a[3] = pack2<T>(x1[2], x1[3]);
}

/* acc[16 MT x 8N] += A[16 MT x 16 KS] B for the dV / dK shape: A = this group's P^T or dS^T (keys x queries), the
 * k16 steps of this warp's own part of the queries (part KS / G ..) from its registers (mine: [mt][KS / G][4]), the
 * others' from the swizzled tile sA (other_off: their lane offsets in the order taken); B from the swizzled rows 0.. of
 * a (queries x head dim) tile, transposed loads, one lane offset per x4 load of this warp's columns (t_off). The own
 * steps come first, so which steps load A is known at compile time and the loads may be issued ahead of the products
 * before them (taken in order, a step's A came from registers or shared memory by a test of the warp's part). */
template <int MT, int KS, int G, int N, int PA, int PB, typename T>
FS_DEV_T void mma_part_b(float (&acc)[MT][N][4], const uint32_t (&mine)[MT][KS / G][4], int part, uint32_t sA,
                         const int (&other_off)[KS - KS / G], uint32_t sB, const int (&t_off)[N / 2])
{
    static_assert((KS & (KS - 1)) == 0, "k16 steps wrap by a mask");
#pragma unroll
    for (int j = 0; j < KS; j++) {
        const int kk = (j + part * (KS / G)) & (KS - 1);
        uint32_t af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            if (j < KS / G) {
#pragma unroll
                for (int e = 0; e < 4; e++) af[mt][e] = mine[mt][j][e];
            } else {
                ldmatrix_x4(sA + 2 * (other_off[j - KS / G] + mt * 16 * PA), af[mt]);
            }
        }
#pragma unroll
        for (int np = 0; np < N / 2; np++) {
            uint32_t bf[4];
            ldmatrix_x4_trans(sB + 2 * (t_off[np] + kk * 16 * PB), bf);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma16816<T>(acc[mt][2 * np], af[mt], bf[0], bf[1]);
                mma16816<T>(acc[mt][2 * np + 1], af[mt], bf[2], bf[3]);
            }
        }
    }
}

/* Float atomics of four adjacent values into the float32 accumulator (one vector atomic on sm_90). */
FS_DEV void atomic_add4(float *dst, float x, float y, float z, float w)
{
#if __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4 *>(dst), make_float4(x, y, z, w));
#else
    atomicAdd(dst, x);
    atomicAdd(dst + 1, y);
    atomicAdd(dst + 2, z);
    atomicAdd(dst + 3, w);
#endif
}

/* P of one score s (raw, unscaled): exp2(s c [+ T5(key - query)] [+ bias] - lse2), lse2 = L log2 e (+inf for a row with
 * no key); 0 where masked. */
template <bool FEAT>
FS_DEV_T float bwd_prob(const fs_bwd_args &a, const fs_seq &seq, const float *s_t5, int b, int h, int query, int key,
                        float s, float lse2, bool masked)
{
    const fs_attn_params &p = a.g.p;
    float v = s * a.scale_log2;
    if (FEAT && p.t5_table) v += s_t5[min(max(key - query, -a.t5_lneg), a.t5_n - 1 - a.t5_lneg) + a.t5_lneg];
    if (FEAT && p.bias && key < seq.k_len && query < seq.q_len)
        v += load_float(p.bias, b * p.bias_sb + h * p.bias_sh + (int64_t)query * p.bias_sq + (int64_t)key * p.bias_sk,
                        p.bias_dtype) * FS_LOG2E;
    return masked ? 0.f : exp2_approx(v - lse2);
}

/* The T5 bias of head h by clamped relative position, log2 units, into s_t5 (all threads of the block). */
FS_DEV void bwd_t5_table(const fs_bwd_args &a, float *s_t5, int h, int tid, int threads)
{
    const fs_attn_params &p = a.g.p;
    for (int i = tid; i < a.t5_n; i += threads) {
        const int bucket = fs_t5_bucket(i - a.t5_lneg, p.t5_buckets, p.t5_max_distance, p.t5_bidirectional);
        s_t5[i] = load_float(p.t5_table, h * p.t5_sh + bucket * p.t5_sn, p.t5_dtype) * FS_LOG2E;
    }
}

/* FEAT: 0 the plain kernels, 1 sequences of their own lengths only (packed, seqlens), 2 every protein option (also key
 * padding masks, biases, the T5 bias, rotary); MASK: scores may be masked (causal, the key padding mask), tested per
 * score (a non-causal plain run's steps compared every score's query and key); the kernel without it takes the tall
 * tile. */
template <int D, typename T, int FEAT, bool MASK>
__global__ void __launch_bounds__(fs_bwd_tile<D, !MASK>::THREADS) attention_bwd_sm80(const fs_bwd_args a)
{
    static_assert(MASK || FEAT < 2, "the protein options' kernel tests the key padding mask");
    using tile = fs_bwd_tile<D, !MASK>;
    using sm = fs_bwd_smem<D, T, !MASK>;
    constexpr int WARPS = tile::WARPS, BR = tile::BR, BC = tile::BC, THREADS = tile::THREADS, MT = tile::MT, G = tile::G;
    constexpr int P = sm::P, PS = sm::PS, KD = D / 16, NQ = BR / 8, NO = D / 8;
    constexpr int NH = NQ / G, NOH = NO / G;                            /* n8 tiles of a warp's part: queries, head dim */
    /* dQ: warps as QG row groups of DQM m16 tiles x 2 column parts of NDQ n8 tiles */
    constexpr int QG = WARPS / 2, DQM = BR / (16 * QG), NDQ = NO / 2;
    static_assert(BR % (16 * QG) == 0 && NO % 4 == 0 && NOH % 2 == 0 && NH % 2 == 0 && BC % 64 == 0, "warp splits");
    extern __shared__ __align__(128) unsigned char smem[];
    T *sK = reinterpret_cast<T *>(smem + sm::K), *sV = reinterpret_cast<T *>(smem + sm::V);
    T *sPT = reinterpret_cast<T *>(smem + sm::PT), *sdS = reinterpret_cast<T *>(smem + sm::DS);
    float *sL = reinterpret_cast<float *>(smem + sm::L), *sD = reinterpret_cast<float *>(smem + sm::DELTA);
    T *sQ = reinterpret_cast<T *>(smem + sm::Q), *sdO = reinterpret_cast<T *>(smem + sm::Q + a.stages * sm::STAGE);
    float *s_t5 = reinterpret_cast<float *>(smem + sm::Q + 2 * a.stages * sm::STAGE);

    const fs_attn_bwd_params &g = a.g;
    const fs_attn_params &p = g.p;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gr = lane >> 2, t4 = lane & 3;
    const int group = warp / G, part = warp % G; /* 32 keys per group; each warp 1/G of the queries, then of the head dim */
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
    load_tile<BC, D, THREADS>(sK, gK, p.k_ss, k_valid, tid);
    load_tile<BC, D, THREADS>(sV, gV, p.v_ss, k_valid, tid);
    cp_async_commit();

    /* this thread's key rows: row0 + 16 mt + 8 r of the block; kept by the key padding mask? */
    const int row0 = group * 32 + gr, key0 = k0 + row0;
    bool kept[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int key = key0 + 16 * mt + 8 * r;
            kept[mt][r] = !(FEAT == 2 && p.kpm) || (key < seq.k_len && p.kpm[b * p.kpm_sb + (int64_t)key * p.kpm_sk]);
        }
    int n_qb = 0, q_begin = 0;
    if (k_valid > 0) {
        q_begin = p.causal ? k0 / BR * BR : 0; /* causal (top-left): queries before k0 see no key of this block */
        n_qb = seq.q_len > q_begin ? (seq.q_len - q_begin + BR - 1) / BR : 0;
        if (FEAT == 2 && p.kpm && !__syncthreads_or(kept[0][0] || kept[0][1] || kept[1][0] || kept[1][1]))
            n_qb = 0; /* every key padded: zero gradients */
    }
    const int n_iter = p.kv_group * n_qb; /* (head of the group, query tile) steps, head outer */

    /* issue step it's Q_i, dO_i, L_i, D_i (head hi of the group, query tile qi) into its buffers (the cp.async group is
     * committed regardless) */
    auto load_step = [&](int it, int hi, int qi) {
        if (it < n_iter) {
            const int h = hkv * p.kv_group + hi, q0 = q_begin + qi * BR, rows = min(BR, seq.q_len - q0);
            const int buf = a.stages == 2 ? it & 1 : 0;
            const T *gQ = static_cast<const T *>(p.q) + b * p.q_sb + h * p.q_sh + (seq.qo + q0) * p.q_ss;
            const T *gdO = static_cast<const T *>(g.dout) + b * g.do_sb + h * g.do_sh + (seq.qo + q0) * g.do_ss;
            load_tile<BR, D, THREADS>(sQ + buf * BR * P, gQ, p.q_ss, rows, tid);
            load_tile<BR, D, THREADS>(sdO + buf * BR * P, gdO, g.do_ss, rows, tid);
            if (tid < 2 * BR) { /* L and D, one float per thread (lse rows need not be 16-byte aligned); past the length: 0 */
                const int part = tid / BR, r = tid % BR;
                const float *src = part == 0 ? static_cast<const float *>(p.lse) + b * p.lse_sb + h * p.lse_sh + seq.qo + q0
                                             : a.delta + fs_bwd_row(p, b, h, seq.qo, q0);
                const bool ok = r < rows;
                asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr((part == 0 ? sL : sD) + (it & 1) * BR + r)),
                             "l"(src + (ok ? r : 0)), "r"(ok ? 4 : 0));
            }
        }
        cp_async_commit();
    };
    if (a.stages == 2) load_step(0, 0, 0);

    float acc_dv[MT][NOH][4], acc_dk[MT][NOH][4]; /* the group's 32 keys x this warp's part of the head dim */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < NOH; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc_dv[mt][n][e] = acc_dk[mt][n][e] = 0.f;
    const uint32_t sK_a = smem_addr(sK), sV_a = smem_addr(sV), sPT_a = smem_addr(sPT), sdS_a = smem_addr(sdS);
    const int qg = warp % QG, dpart = warp / QG; /* this warp's share of dQ_i: rows 16 DQM qg .., columns 8 NDQ dpart .. */
    const int l7 = lane & 7, mi = lane >> 3;
    constexpr int KQ = BR / 16, KOWN = KQ / G; /* k16 steps over a tile's queries, of them this warp's own */
    int a_off[4], b_off[4], po_off[KQ - KOWN], t_off[NOH / 2], k_off[NDQ / 2];
    lane_offsets<P>(a_off, group * 32 + (lane & 15), lane >> 4);          /* K_j, V_j rows of the group (A) */
    lane_offsets<P>(b_off, part * (BR / G) + l7 + (mi >> 1) * 8, mi & 1); /* this warp's part of Q_i, dO_i as B^T */
#pragma unroll
    for (int j = 0; j < KQ - KOWN; j++) /* P^T, dS^T rows of the group (A): others' k16 steps, mma_part_b's order */
        po_off[j] = chunk_off<PS>(group * 32 + (lane & 15), 2 * ((part * KOWN + KOWN + j) % KQ) + (lane >> 4));
#pragma unroll
    for (int np = 0; np < NOH / 2; np++) /* Q_i, dO_i as B (transposed loads): this warp's part of the head dim */
        t_off[np] = chunk_off<P>(l7 + (mi & 1) * 8, part * NOH + 2 * np + (mi >> 1));
#pragma unroll
    for (int np = 0; np < NDQ / 2; np++) /* K_j as B of dQ: this warp's columns */
        k_off[np] = chunk_off<P>(l7 + (mi & 1) * 8, dpart * NDQ + 2 * np + (mi >> 1));
    /* dS^T as A of dQ (transposed loads): keys l7 + 8 (mi >> 1), query chunk 2 (DQM qg + m) + (mi & 1) of m16 tile m */
    int ds_off[DQM];
#pragma unroll
    for (int m = 0; m < DQM; m++) ds_off[m] = chunk_off<PS>(l7 + (mi >> 1) * 8, 2 * (DQM * qg + m) + (mi & 1));

    /* steps run head hi (outer) by query tile qi, counted rather than divided out of it */
    for (int it = 0, hi = 0, qi = 0; it < n_iter; it++) {
        const int h = hkv * p.kv_group + hi, q0 = q_begin + qi * BR;
        const int qn = qi + 1 == n_qb ? 0 : qi + 1, hn = qn == 0 ? hi + 1 : hi; /* step it + 1 */
        const int buf = a.stages == 2 ? it & 1 : 0;
        if (a.stages == 2) {
            cp_async_wait<0>();
            __syncthreads(); /* step it has landed; every warp is done with step it - 1 (its buffers, P^T, dS^T, T5) */
            load_step(it + 1, hn, qn);
        } else {
            __syncthreads(); /* every warp is done with step it - 1 */
            load_step(it, hi, qi);
            cp_async_wait<0>();
            __syncthreads();
        }
        if (FEAT == 2 && p.t5_table && qi == 0) { /* this head's T5 bias */
            bwd_t5_table(a, s_t5, h, tid, THREADS);
            __syncthreads();
        }
        const uint32_t sQ_a = smem_addr(sQ + buf * BR * P), sdO_a = smem_addr(sdO + buf * BR * P);
        const float *L = sL + (it & 1) * BR + part * (BR / G), *Dl = sD + (it & 1) * BR + part * (BR / G);
        const int qh = q0 + part * (BR / G); /* this warp's first query */

        /* S^T = K_j Q_i^T and dP^T = V_j dO_i^T for the group's keys x this warp's queries */
        float s[MT][NH][4], dp[MT][NH][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int n = 0; n < NH; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[mt][n][e] = dp[mt][n][e] = 0.f;
        mma_abt<MT, KD, NH, P, P, T>(s, sK_a, a_off, sQ_a, b_off);
        mma_abt<MT, KD, NH, P, P, T>(dp, sV_a, a_off, sdO_a, b_off);

        /* P^T = exp2(S^T c [+ bias + T5] - L log2 e), masked: causal (query < key), padded keys;
         * dS^T = P^T o (dP^T - D_i). Both packed to T: the own half of the next products' A fragments. The bias and
         * T5 terms on a loop of their own (additive): per element they test their pointers and load the bias by its
         * dtype, code that had made the option kernel's step, run without them (packed sequences, masks), about
         * 2,000 instructions long. Masks are tested per element only where a step may mask: in the plain kernels by
         * MASK (causal runs), in the option kernels on a loop of its own for steps on the causal diagonal or with a
         * key padding mask (packed batches without either ran 18-20% faster). */
        const bool diag = p.causal && qh < k0 + group * 32 + 31;
        auto probabilities = [&](auto additive, auto mask) {
#pragma unroll
            for (int n = 0; n < NH; n++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int col = n * 8 + 2 * t4 + c, query = qh + col;
                    const float lse = L[col], lse2 = lse == -INFINITY ? INFINITY : lse * FS_LOG2E, di = Dl[col];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int r = 0; r < 2; r++) {
                            const int key = key0 + 16 * mt + 8 * r;
                            const bool masked = decltype(mask)::value && ((diag && query < key) || !kept[mt][r]);
                            const float pv = bwd_prob<decltype(additive)::value>(a, seq, s_t5, b, h, query, key,
                                                                                 s[mt][n][2 * r + c], lse2, masked);
                            s[mt][n][2 * r + c] = pv;
                            dp[mt][n][2 * r + c] = pv * (dp[mt][n][2 * r + c] - di);
                        }
                }
        };
        auto masks = [&](auto additive) {
            if (!FEAT || !MASK) probabilities(additive, std::integral_constant<bool, MASK>{});
            else if (diag || (FEAT == 2 && p.kpm)) probabilities(additive, std::true_type{});
            else probabilities(additive, std::false_type{});
        };
        if (FEAT == 2 && (p.t5_table || p.bias)) masks(std::true_type{});
        else masks(std::false_type{});
        uint32_t pa[MT][NH / 2][4], da[MT][NH / 2][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int kk = 0; kk < NH / 2; kk++) {
                pack_a<T>(s[mt][2 * kk], s[mt][2 * kk + 1], pa[mt][kk]);
                pack_a<T>(dp[mt][2 * kk], dp[mt][2 * kk + 1], da[mt][kk]);
            }
        /* to shared memory for the group's other warps (P^T, dS^T) and for dQ (dS^T). sm_90: an m16 x k16 fragment by
         * one stmatrix (matrix m = lane / 8: rows 8 (m & 1) .., chunk m / 2 of the k16 step; 4x fewer store
         * instructions than 32-bit stores: D = 128 3-4% faster, causal D = 64 5%); else 32-bit stores, e = (row half
         * e & 1, n8 tile e / 2) */
#if __CUDA_ARCH__ >= 900
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int kk = 0; kk < NH / 2; kk++) {
                const int m = lane >> 3, row = group * 32 + 16 * mt + 8 * (m & 1) + l7;
                const int off = chunk_off<PS>(row, part * (BR / G) / 8 + 2 * kk + (m >> 1));
                stmatrix_x4(sPT_a + 2 * off, pa[mt][kk][0], pa[mt][kk][1], pa[mt][kk][2], pa[mt][kk][3]);
                stmatrix_x4(sdS_a + 2 * off, da[mt][kk][0], da[mt][kk][1], da[mt][kk][2], da[mt][kk][3]);
            }
#else
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int kk = 0; kk < NH / 2; kk++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int off = swz<PS>(row0 + 16 * mt + 8 * (e & 1), part * (BR / G) + (2 * kk + (e >> 1)) * 8 + 2 * t4);
                    *reinterpret_cast<uint32_t *>(sPT + off) = pa[mt][kk][e];
                    *reinterpret_cast<uint32_t *>(sdS + off) = da[mt][kk][e];
                }
#endif
        __syncthreads(); /* P^T and dS^T complete */

        /* dV_j += P^T dO_i and dK_j += dS^T Q_i: the group's keys x this warp's part of the head dim, all Br queries */
        mma_part_b<MT, KQ, G, NOH, PS, P, T>(acc_dv, pa, part, sPT_a, po_off, sdO_a, t_off);
        mma_part_b<MT, KQ, G, NOH, PS, P, T>(acc_dk, da, part, sdS_a, po_off, sQ_a, t_off);

        /* dQ_i += dS K_j: this warp's 16 DQM query rows x NDQ n8 tiles, A = dS from dS^T (transposed loads);
         * deterministic runs leave dQ to its own kernel (backward_dq.cuh) */
        if (!a.dq_kernel) {
            /* two sets of accumulators, even and odd k16 steps, so that twice the products are independent (up to
             * D = 128: at 256 the second set does not fit beside dV and dK) */
            constexpr bool SPLIT = DQM * NDQ <= 8;
            float dq[DQM][NDQ][4], dq2[DQM][NDQ][4];
#pragma unroll
            for (int mt = 0; mt < DQM; mt++)
#pragma unroll
                for (int n = 0; n < NDQ; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) dq[mt][n][e] = dq2[mt][n][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
                float (&acc)[DQM][NDQ][4] = SPLIT && kk & 1 ? dq2 : dq;
                uint32_t af[DQM][4];
#pragma unroll
                for (int mt = 0; mt < DQM; mt++) ldmatrix_x4_trans(sdS_a + 2 * (ds_off[mt] + kk * 16 * PS), af[mt]);
#pragma unroll
                for (int np = 0; np < NDQ / 2; np++) {
                    uint32_t bf[4];
                    ldmatrix_x4_trans(sK_a + 2 * (k_off[np] + kk * 16 * P), bf);
#pragma unroll
                    for (int mt = 0; mt < DQM; mt++) {
                        mma16816<T>(acc[mt][2 * np], af[mt], bf[0], bf[1]);
                        mma16816<T>(acc[mt][2 * np + 1], af[mt], bf[2], bf[3]);
                    }
                }
            }
#pragma unroll
            for (int mt = 0; mt < DQM; mt++) {
                if (SPLIT)
#pragma unroll
                    for (int n = 0; n < NDQ; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) dq[mt][n][e] += dq2[mt][n][e];
                /* rows i and i + 8; n8 groups 2m and 2m + 1 side by side in the accumulator's row (fs_dq_slot) */
                const int i = q0 + (DQM * qg + mt) * 16 + gr;
                float *dst = a.dq_acc + fs_bwd_row(p, b, h, seq.qo, i) * D + dpart * NDQ * 8 + 4 * t4;
#pragma unroll
                for (int r = 0; r < 2; r++)
                    if (i + 8 * r < seq.q_len)
#pragma unroll
                        for (int m = 0; m < NDQ / 2; m++)
                            atomic_add4(dst + 8 * r * D + 16 * m, dq[mt][2 * m][2 * r], dq[mt][2 * m][2 * r + 1],
                                        dq[mt][2 * m + 1][2 * r], dq[mt][2 * m + 1][2 * r + 1]);
            }
        }
        hi = hn;
        qi = qn;
    }
    cp_async_wait<0>();

    /* epilogue: dK scaled (and rotated back), dV; staged through the K and V tiles for 16-byte stores. Rows of a
     * padded batch past the sequence's length are zeros. Rotation pairs column c with c + D/2: the other warp's half,
     * so dK goes through shared memory in float32 first (over the P^T, dS^T and Q tiles, idle now). */
    __syncthreads(); /* every warp is done reading K_j, V_j, P^T, dS^T */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = row0 + 16 * mt + 8 * r;
#pragma unroll
            for (int n = 0; n < NOH; n++) {
                const int col = (part * NOH + n) * 8 + 2 * t4;
                *reinterpret_cast<uint32_t *>(sV + swz<P>(row, col)) =
                    row < k_valid ? pack2<T>(acc_dv[mt][n][2 * r], acc_dv[mt][n][2 * r + 1]) : 0u;
                if (!(FEAT == 2 && a.rotary))
                    *reinterpret_cast<uint32_t *>(sK + swz<P>(row, col)) =
                        row < k_valid ? pack2<T>(acc_dk[mt][n][2 * r] * a.scale, acc_dk[mt][n][2 * r + 1] * a.scale) : 0u;
            }
        }
    if (FEAT == 2 && a.rotary) { /* dK in float32 rows of D + 4 (against bank conflicts) from P^T on, 64 rows (two groups) a pass */
        float *fk = reinterpret_cast<float *>(smem + sm::PT);
        static_assert((size_t)64 * (D + 4) * 4 <= (size_t)sm::Q - sm::PT + 2 * sm::STAGE, "dK staging fits");
        for (int pass = 0; pass < BC / 64; pass++) {
            if (row0 / 64 == pass)
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int r = 0; r < 2; r++)
#pragma unroll
                        for (int n = 0; n < NOH; n++) {
                            float *dst = fk + (row0 % 64 + 16 * mt + 8 * r) * (D + 4) + (part * NOH + n) * 8 + 2 * t4;
                            dst[0] = acc_dk[mt][n][2 * r] * a.scale;
                            dst[1] = acc_dk[mt][n][2 * r + 1] * a.scale;
                        }
            __syncthreads();
            for (int i = tid; i < 64 * D; i += THREADS) { /* one element per item, its rotation partner read beside it */
                const int rr = i / D, c = i % D, row = pass * 64 + rr, rh = a.rotary_dim / 2;
                float x = fk[rr * (D + 4) + c];
                if (c < a.rotary_dim) {
                    float lo = c < rh ? x : fk[rr * (D + 4) + c - rh], hi = c < rh ? fk[rr * (D + 4) + c + rh] : x;
                    unrotate_pair(lo, hi, (float)(k0 + row), rotary_inv_freq(c % rh, a.rotary_dim, a.rotary_base));
                    x = c < rh ? lo : hi;
                }
                sK[swz<P>(row, c)] = row < k_valid ? T(x) : T(0.f);
            }
            __syncthreads();
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
