/* Tensor-core flash attention forward for sm_80+ (Ampere, Ada, Hopper through mma.sync): fp16/bf16 in, fp32
 * accumulation, online softmax, one pass over K/V, no S x S buffer. The portable CUDA path: every option, every
 * supported head dim. Versions and measurements: docs/notes/attention_sm80.md.
 *
 * Notation (FlashAttention-2): a block owns a query tile Q_i of Br = 16 * WARPS rows (16 per warp) and
 * streams key/value tiles K_j, V_j of Bc rows through shared memory, keeping per row the running max
 * m_i, the running denominator l_i and the unnormalised output O_i in registers. Scores are kept in
 * log2 units (scale * log2 e folded in) so the exponentials are single ex2 instructions.
 *
 * Pipeline per KV tile (single K and V buffers, cp.async):
 *   wait K_j; sync; issue V_j; S = Q K_j^T; mask; softmax; wait V_j; sync; issue K_{j+1}; O += P V_j
 * Small problems: 64-row query tiles; at D <= 64, when every block has an SM to itself, 4 KV groups of 4 warps
 * per block each take every 4th key tile and merge through shared memory at the end; on Hopper, query tiles of
 * 16-32 key tiles split their keys over the blocks of a thread-block cluster, merged through distributed shared
 * memory; longer key ranges on few blocks split the KV range over blocks, the last block of a query tile merging the
 * partial results by their logsumexp.
 *
 * Protein options (FEAT): a key padding mask is scanned once per block into a shared list of the KV tiles
 * that hold a kept key (with a "partly padded" bit), so all-padding tiles are never loaded; the T5 bias
 * lives in shared memory indexed by relative position (a warp tile that clamps to one entry only shifts the
 * exponent); rotary (below 512 queries or keys) rotates Q once and each K tile in place, every thread rotating the
 * 16-byte chunk pairs it copied itself, right after its own cp.async wait, so no extra barrier is needed.
 */
#ifndef FLASHSCI_ATTENTION_SM80_KERNEL_CUH
#define FLASHSCI_ATTENTION_SM80_KERNEL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "attention/launchers.h"
#include "attention/sm80/dispatch.h"
#include "attention/sm80/tiles.cuh"
#include "attention/rotary/rotary.cuh"
#include "attention/sequence.cuh"
#include "common/cuda_ptx.cuh"

/* ---- tile configuration, one place: warps per query-row group, m16 row tiles per warp (Br = 16 * MT * WARPS),
 * Bc, cp.async ring depth, whether Q fragments stay in registers (else reloaded per KV tile), and KV groups G:
 * G groups of WARPS warps share the block's query rows, group g taking key tiles g, g + G, ... of each step
 * of G * Bc keys (more independent warps per SM on short problems; merged through shared memory) ---- */
template <int W, int M, int B, int S, int Q, int G = 1> struct fs_cfg {
    enum { WARPS = W, MT = M, BC = B, STAGES = S, Q_IN_REGS = Q, KVG = G };
};
/* variants: big tiles; small (64-row) tiles for problems whose big tiles leave SMs idle; small tiles with 4 KV
 * groups (one 512-thread block per SM, D <= 64) for problems that leave most SMs idle */
enum { FS_BIG, FS_SMALL, FS_SMALL_G4 };
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
    template <> struct fs_tile<d, FS_BIG> : fs_cfg<FS_PICK(d, W, w), FS_PICK(d, MT, mt), FS_PICK(d, BC, bc), 3, FS_PICK(d, Q, q)> {}
#define FS_TILE_SMALL(d, w, mt, bc, q) template <> struct fs_tile<d, FS_SMALL> : fs_cfg<w, mt, bc, 3, q> {}
template <int D, int V> struct fs_tile;
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
/* 4 KV groups: 512 threads leave 128 registers each, so Q is reloaded per tile */
template <> struct fs_tile<32, FS_SMALL_G4> : fs_cfg<4, 1, 64, 3, 0, 4> {};
template <> struct fs_tile<64, FS_SMALL_G4> : fs_cfg<4, 1, 64, 3, 0, 4> {};
/* FEAT kernels (protein options) carry more state: at D <= 64 the 128-key tile spills, 64 keys do not */
template <int D, int V, bool FEAT> struct fs_tile_for : fs_tile<D, V> {};
template <> struct fs_tile_for<32, FS_BIG, true> : fs_cfg<4, 2, 64, 3, 0> {};
template <> struct fs_tile_for<64, FS_BIG, true> : fs_cfg<4, 2, 64, 3, 0> {};

#define FS_LIST_MAX 4096 /* KV tiles a key padding mask can compact in shared memory */
#define FS_EXT_MAX (4 * FS_CUDA_T5_MAX + 4 * FS_LIST_MAX + 4 * 128 + 64) /* FEAT extras, bytes */

/* Everything a launch needs beyond the problem: KV splits and their fp32 workspace. */
typedef struct {
    fs_attn_params p;
    float scale_log2;  /* scale * log2(e) */
    int n_qtiles, n_splits;
    int cluster;       /* 1: the n_splits blocks of a query tile are a thread-block cluster (consecutive blocks), split 0
                          merging through distributed shared memory; 0: the last split to finish merges through o_part */
    float *o_part;     /* [splits][B*H][Sq][D], each split normalised by its own l */
    float *lse_part;   /* [splits][B*H][Sq], natural log */
    int *counters;     /* [B*H][n_qtiles] finished splits per query tile, zero between launches */
    /* protein options (FEAT kernels): extras in shared memory after the K/V ring, at these byte offsets */
    int ext_freq;      /* rotary inv_freq_i, D/2 floats */
    int ext_t5, t5_n, t5_lneg; /* T5 bias (log2 units) of rel = -t5_lneg .. t5_n - 1 - t5_lneg, clamped beyond
                                  (buckets saturate from |rel| = max_distance on) */
    int ext_list, list_tiles;  /* key padding mask: visited KV tiles compacted here (and per-tile padded-key
                                  flags after them); 0 = visit all, mask per key */
} fs_sm80_args;

/* ---- protein options (FEAT kernels only) ---- */

/* The same copy with chunk c of a row and its rotate_half partner c + D/16 in one thread, so that the
 * thread can rotate what it copied right after its own cp.async wait, with no extra barrier. */
template <int ROWS, int D, int THREADS, typename T>
FS_DEV void load_tile_pairs(T *tile, const T *g, int64_t stride, int valid, int tid)
{
    constexpr int HALF = D / 16, P = fs_pitch<D>::VALUE;
#pragma unroll
    for (int i = tid; i < ROWS * HALF; i += THREADS) {
        const int r = i / HALF, c = i % HALF;
        const bool ok = r < valid;
        const T *src = g + (ok ? r * stride + c * 8 : 0);
        cp_async16(smem_addr(tile + swz<P>(r, c * 8)), src, ok);
        cp_async16(smem_addr(tile + swz<P>(r, (c + HALF) * 8)), src + (ok ? D / 2 : 0), ok);
    }
}

/* Rotary embedding (rotary.cuh), in place, of the chunk pairs this thread copied with load_tile_pairs; row r has
 * position pos0 + r. */
template <int ROWS, int D, int THREADS, typename T>
FS_DEV void rotate_tile_pairs(T *tile, int pos0, int valid, const float *inv_freq, int tid)
{
    constexpr int HALF = D / 16, P = fs_pitch<D>::VALUE;
#pragma unroll
    for (int i = tid; i < ROWS * HALF; i += THREADS) {
        const int r = i / HALF, c = i % HALF;
        if (r < valid) {
            uint4 *p1 = reinterpret_cast<uint4 *>(tile + swz<P>(r, c * 8));
            uint4 *p2 = reinterpret_cast<uint4 *>(tile + swz<P>(r, (c + HALF) * 8));
            uint32_t w1[4], w2[4];
            float cs[8], sn[8];
            *reinterpret_cast<uint4 *>(w1) = *p1;
            *reinterpret_cast<uint4 *>(w2) = *p2;
            chunk_angles((float)(pos0 + r), inv_freq + c * 8, cs, sn);
            rotate_chunk<T>(w1, w2, cs, sn);
            *p1 = *reinterpret_cast<uint4 *>(w1);
            *p2 = *reinterpret_cast<uint4 *>(w2);
        }
    }
}

/* Partial results of the same query rows over disjoint keys (a block's KV groups, a cluster's splits) merge thread by
 * thread in fragment order, through parts of FR = 4 MT NO + 4 MT floats per thread (O, then m, then l), GT threads
 * apart:  m = max_g m_g;  l = sum_g exp2(m_g - m) l_g;  O = sum_g exp2(m_g - m) O_g.  l and O are still per-thread
 * partial sums over the thread's columns, which the merge keeps. This thread's (O, m, l) into the part at dst: */
template <int MT, int NO, int GT>
FS_DEV_T void store_part(float *dst, const float (&acc_o)[MT][NO][4], const float (&m_i)[MT][2], const float (&l_i)[MT][2])
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int n = 0; n < NO; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) dst[((mt * NO + n) * 4 + e) * GT] = acc_o[mt][n][e];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            dst[(4 * MT * NO + 2 * mt + r) * GT] = m_i[mt][r];
            dst[(4 * MT * NO + 2 * MT + 2 * mt + r) * GT] = l_i[mt][r];
        }
    }
}
/* ... and the part at src merged into this thread's (O, m, l). */
template <int MT, int NO, int GT>
FS_DEV_T void merge_part(const float *src, float (&acc_o)[MT][NO][4], float (&m_i)[MT][2], float (&l_i)[MT][2])
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float m_o = src[(4 * MT * NO + 2 * mt + r) * GT], l_o = src[(4 * MT * NO + 2 * MT + 2 * mt + r) * GT];
            const float m_new = fmaxf(m_i[mt][r], m_o), m_use = m_new == -INFINITY ? 0.f : m_new;
            const float w_self = exp2_approx(m_i[mt][r] - m_use), w_o = exp2_approx(m_o - m_use);
            m_i[mt][r] = m_new;
            l_i[mt][r] = l_i[mt][r] * w_self + l_o * w_o;
#pragma unroll
            for (int n = 0; n < NO; n++)
#pragma unroll
                for (int c = 0; c < 2; c++)
                    acc_o[mt][n][2 * r + c] = acc_o[mt][n][2 * r + c] * w_self + src[((mt * NO + n) * 4 + 2 * r + c) * GT] * w_o;
        }
}

/* threads per block of a variant: WARPS per KV group */
template <int D, int V, bool FEAT> struct fs_block {
    enum { THREADS = 32 * fs_tile_for<D, V, FEAT>::WARPS * fs_tile_for<D, V, FEAT>::KVG };
};

template <int D, typename T, int V, bool FEAT>
__global__ void __launch_bounds__(fs_block<D, V, FEAT>::THREADS) attention_fwd_sm80(const fs_sm80_args a)
{
    using tile = fs_tile_for<D, V, FEAT>;
    constexpr int WARPS = tile::WARPS, MT = tile::MT, BC = tile::BC, STAGES = tile::STAGES, G = tile::KVG;
    constexpr int BR = 16 * MT * WARPS, THREADS = fs_block<D, V, FEAT>::THREADS, WR = 16 * MT; /* WR: rows per warp */
    constexpr int BCS = G * BC; /* keys per step: one Bc tile per KV group */
    static_assert(!FEAT || G == 1, "the protein options run with one KV group");
    constexpr int PITCH = fs_pitch<D>::VALUE, KD = D / 16, NS = BC / 8, NO = D / 8;
    constexpr bool Q_IN_REGS = tile::Q_IN_REGS;
    constexpr bool CLUSTER = V == FS_SMALL && !FEAT; /* the variant launched in clusters (launch, choose_cluster) */
    extern __shared__ __align__(128) unsigned char smem[];
    T *sQ = reinterpret_cast<T *>(smem), *sKV = sQ + BR * PITCH; /* ring: stage s holds BCS keys of K, then of V */
    unsigned char *ext = reinterpret_cast<unsigned char *>(sKV + 2 * BCS * PITCH * STAGES); /* FEAT extras */

    const fs_attn_params &p = a.p;
    const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int warp = G == 1 ? tid >> 5 : (tid >> 5) % WARPS, kg = G == 1 ? 0 : (tid >> 5) / WARPS; /* row warp; KV group */

    /* block -> (query tile, split, batch*head); query tile fastest so one head's blocks share K/V in L2 (a
     * cluster's splits before it), heaviest causal tiles first */
    const bool in_cluster = CLUSTER && a.cluster;
    int bid = blockIdx.x, split = 0;
    if (in_cluster) {
        split = bid % a.n_splits;
        bid /= a.n_splits;
    }
    int qt = bid % a.n_qtiles;
    bid /= a.n_qtiles;
    if (!in_cluster) {
        split = bid % a.n_splits;
        bid /= a.n_splits;
    }
    const int bh = bid, b = bh / p.H, h = bh % p.H;
    if (p.causal) qt = a.n_qtiles - 1 - qt;
    const int q0 = qt * BR;

    /* this block's sequence (FEAT: packed, seqlens); rows q_len.. of a padded batch are written as zeros,
     * those of a packed one belong to the next sequence and are not touched */
    const fs_seq seq = FEAT ? seq_geometry(p, b) : fs_seq{0, 0, p.Sq, p.Sk};
    if (FEAT && p.cu_seqlens_q && q0 >= seq.q_len) return;
    const int q_rows = min(BR, (FEAT && p.cu_seqlens_q ? seq.q_len : p.Sq) - q0), k_len = seq.k_len;

    const T *gQ = static_cast<const T *>(p.q) + b * p.q_sb + h * p.q_sh + (seq.qo + q0) * p.q_ss;
    /* the K/V head of query head h (grouped-query attention); unsigned: a signed division here made the FEAT kernels
     * spill up to 40 bytes more */
    const int hkv = (int)((unsigned)h / (unsigned)p.kv_group);
    const T *gK = static_cast<const T *>(p.k) + b * p.k_sb + hkv * p.k_sh + seq.ko * p.k_ss;
    const T *gV = static_cast<const T *>(p.v) + b * p.v_sb + hkv * p.v_sh + seq.ko * p.v_ss;

    /* KV tiles this block visits: causal (top-left) rows q0.. see keys below q0 + BR; none past k_len, and
     * none for a query tile wholly past q_len */
    const int kv_end = q0 >= seq.q_len ? 0 : p.causal ? min(k_len, min(q0 + BR, seq.q_len)) : k_len;
    int n_kv = (kv_end + BCS - 1) / BCS;

    /* FEAT extras in shared memory: inv_freq_i for rotary, the T5 bias by clamped relative position
     * (log2 units), and the list of KV tiles holding a kept key */
    float *s_freq = reinterpret_cast<float *>(ext + a.ext_freq), *s_t5 = reinterpret_cast<float *>(ext + a.ext_t5);
    unsigned short *s_list = reinterpret_cast<unsigned short *>(ext + a.ext_list); /* tile | partly padded << 15 */
    const bool use_list = FEAT && a.list_tiles;
    if (FEAT) {
        if (p.rotary)
            for (int i = tid; i < D / 2; i += THREADS) s_freq[i] = rotary_inv_freq(i, D, p.rotary_base);
        for (int i = tid; i < a.t5_n; i += THREADS) {
            const int bucket = fs_t5_bucket(i - a.t5_lneg, p.t5_buckets, p.t5_max_distance, p.t5_bidirectional);
            s_t5[i] = load_float(p.t5_table, h * p.t5_sh + bucket * p.t5_sn, p.t5_dtype) * FS_LOG2E;
        }
        if (use_list) {
            /* flag tiles with a kept key (bit 0) and with a padded one (bit 1, the tail past k_len does not
             * count), then compact in place into tile indices with the partial bit (warp 0, ballots) */
            __shared__ int s_count;
            unsigned short *s_pad = s_list + a.list_tiles;
            for (int t = tid; t < n_kv; t += THREADS) s_list[t] = s_pad[t] = 0;
            __syncthreads();
            for (int j = tid; j < kv_end; j += THREADS) {
                if (p.kpm[b * p.kpm_sb + j * p.kpm_sk]) s_list[j / BC] = 1;
                else s_pad[j / BC] = 1;
            }
            __syncthreads();
            if (warp == 0) {
                int count = 0;
                for (int base = 0; base < n_kv; base += 32) {
                    const bool keep = base + lane < n_kv && s_list[base + lane];
                    const int partial = keep ? s_pad[base + lane] : 0;
                    const unsigned ballot = __ballot_sync(0xffffffff, keep);
                    if (keep) s_list[count + __popc(ballot & ((1u << lane) - 1))] = (unsigned short)(base + lane | partial << 15);
                    count += __popc(ballot);
                }
                if (lane == 0) s_count = count;
            }
            __syncthreads();
            n_kv = s_count;
        }
        __syncthreads(); /* extras visible to every thread (rotation reads s_freq before the loop's barrier) */
    }
    const int per_split = (n_kv + a.n_splits - 1) / a.n_splits;
    const int t_begin = split * per_split, t_end = min(n_kv, t_begin + per_split);
    auto kv_entry = [&](int t) { return use_list ? (int)s_list[t] : t; }; /* visit index -> tile (| partial << 15) */
    auto kv_tile = [&](int t) { return kv_entry(t) & 0x7fff; };

    /* issue step t's K and V (BCS keys) into ring stage t % STAGES (nothing past t_end; the cp.async group is
     * committed regardless) */
    auto load_kv = [&](int t) {
        if (t < t_end) {
            T *st = sKV + (t % STAGES) * 2 * BCS * PITCH;
            const int k0 = kv_tile(t) * BCS, rows = min(BCS, k_len - k0);
            if (FEAT) load_tile_pairs<BCS, D, THREADS>(st, gK + (int64_t)k0 * p.k_ss, p.k_ss, rows, tid);
            else load_tile<BCS, D, THREADS>(st, gK + (int64_t)k0 * p.k_ss, p.k_ss, rows, tid);
            load_tile<BCS, D, THREADS>(st + BCS * PITCH, gV + (int64_t)k0 * p.v_ss, p.v_ss, rows, tid);
        }
        cp_async_commit();
    };
    if (FEAT) load_tile_pairs<BR, D, THREADS>(sQ, gQ, p.q_ss, q_rows, tid);
    else load_tile<BR, D, THREADS>(sQ, gQ, p.q_ss, q_rows, tid);
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
        const int k0 = kv_tile(j) * BCS + kg * BC; /* this group's tile of the step */
        if (FEAT && p.rotary) { /* this thread's own chunks of Q (first tile) and K_j have landed: rotate them */
            if (j == t_begin) rotate_tile_pairs<BR, D, THREADS>(sQ, q0, q_rows, s_freq, tid);
            rotate_tile_pairs<BC, D, THREADS>(sKV + (j % STAGES) * 2 * BC * PITCH, k0, min(BC, k_len - k0), s_freq, tid);
        }
        __syncthreads(); /* step j has landed for all threads; every warp is done with step j - 1's stage */
        load_kv(j + STAGES - 1);
        if (G > 1 && k0 >= kv_end) continue; /* the step ends before this group's tile */
        const uint32_t sK_addr = smem_addr(sKV + ((j % STAGES) * 2 * BCS + kg * BC) * PITCH), sV_addr = sK_addr + 2 * BCS * PITCH;

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
        /* scores in log2 units are x = S * tile_mul + tile_add; additive terms that vary inside the tile are
         * folded into S here (tile_mul becomes 1) */
        float tile_mul = mul, tile_add = 0.f;
        if (FEAT && (p.t5_table || p.bias)) {
            /* T5: t5(j - i) is one value for the whole warp tile when every relative position of it clamps to
             * the same entry (buckets saturate past max_distance): then it only shifts the exponent */
            const int lo = min(max(k0 - (warp_row + WR - 1), -a.t5_lneg), a.t5_n - 1 - a.t5_lneg);
            const int hi = min(max(k0 + BC - 1 - warp_row, -a.t5_lneg), a.t5_n - 1 - a.t5_lneg);
            if (p.t5_table && lo == hi && !p.bias) {
                tile_add = s_t5[lo + a.t5_lneg];
            } else {
                /* S_ij = S_ij c + t5(j - i): j - i = base + 8 dd + c over dd = n - 2 mt - r, one shared load
                 * per distinct offset */
                const int base = k0 + 2 * t4 - warp_row - g;
#pragma unroll
                for (int dd = -(2 * MT - 1); dd < NS; dd++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const float t5v = p.t5_table ? s_t5[min(max(base + 8 * dd + c, -a.t5_lneg), a.t5_n - 1 - a.t5_lneg) +
                                                            a.t5_lneg] : 0.f;
#pragma unroll
                        for (int mt = 0; mt < MT; mt++)
#pragma unroll
                            for (int r = 0; r < 2; r++) {
                                const int n = dd + 2 * mt + r;
                                if (n >= 0 && n < NS) s[mt][n][2 * r + c] = fmaf(s[mt][n][2 * r + c], mul, t5v);
                            }
                    }
                tile_mul = 1.f;
                if (p.bias) { /* S_ij += bias_ij log2 e (rows and keys inside the sequence) */
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int n = 0; n < NS; n++)
#pragma unroll
                            for (int e = 0; e < 4; e++) {
                                const int col = k0 + n * 8 + 2 * t4 + (e & 1), row = warp_row + mt * 16 + g + (e >> 1) * 8;
                                if (col < k_len && row < seq.q_len)
                                    s[mt][n][e] += load_float(p.bias, b * p.bias_sb + h * p.bias_sh + (int64_t)row * p.bias_sq +
                                                              (int64_t)col * p.bias_sk, p.bias_dtype) * FS_LOG2E;
                            }
                }
            }
        }
        /* mask keys past the length and, for causal, keys after the query (col > row); FEAT: padded keys of a
         * tile the key padding mask keeps only partly */
        const bool kpm_partial = FEAT && p.kpm && (!use_list || (kv_entry(j) >> 15));
        if (!FEAT && (k0 + BC > p.Sk || (p.causal && k0 + BC - 1 > warp_row))) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int n = 0; n < NS; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int col = k0 + n * 8 + 2 * t4 + (e & 1), row = warp_row + mt * 16 + g + (e >> 1) * 8;
                        if (col >= p.Sk || (p.causal && col > row)) s[mt][n][e] = -INFINITY;
                    }
        } else if (FEAT && (kpm_partial || k0 + BC > k_len || (p.causal && k0 + BC - 1 > warp_row))) {
#pragma unroll
            for (int n = 0; n < NS; n++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int col = k0 + n * 8 + 2 * t4 + c;
                    const bool kept = col < k_len && (!kpm_partial || p.kpm[b * p.kpm_sb + (int64_t)col * p.kpm_sk]);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int r = 0; r < 2; r++)
                            if (!kept || (p.causal && col > warp_row + mt * 16 + g + r * 8)) s[mt][n][2 * r + c] = -INFINITY;
                }
        }

        /* m_new = max(m_i, rowmax(S) c + a), c = scale log2e (tile_mul), a = tile_add;  P = exp2(S c + a - m_new);
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
                const float m_new = fmaxf(m_i[mt][r], FEAT ? fmaf(mx, tile_mul, tile_add) : mx * mul), m_use = m_new == -INFINITY ? 0.f : m_new;
                const float alpha = exp2_approx(m_i[mt][r] - m_use);
                m_i[mt][r] = m_new;
                float sum = 0.f;
#pragma unroll
                for (int n = 0; n < NS; n++) {
                    const float p0 = exp2_approx(fmaf(s[mt][n][2 * r], tile_mul, FEAT ? tile_add - m_use : -m_use));
                    const float p1 = exp2_approx(fmaf(s[mt][n][2 * r + 1], tile_mul, FEAT ? tile_add - m_use : -m_use));
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
    if (FEAT && t_begin >= t_end) __syncthreads(); /* no tile visited: other warps' Q copies into our rows landed */

    constexpr int GT = WARPS * 32, FR = 4 * MT * NO + 4 * MT; /* threads per group; floats per thread (store_part) */
    constexpr size_t RING_BYTES = (size_t)2 * BCS * PITCH * STAGES * sizeof(T);
    if (G > 1) { /* the groups' rows merge into group 0 through the idle ring */
        static_assert((size_t)(G - 1) * GT * FR * 4 <= RING_BYTES, "merge fits the ring");
        float *part = reinterpret_cast<float *>(sKV) + tid % GT;
        __syncthreads(); /* every group is done with the ring */
        if (kg > 0) store_part<MT, NO, GT>(part + (kg - 1) * GT * FR, acc_o, m_i, l_i);
        __syncthreads();
        if (kg == 0)
            for (int og = 0; og < G - 1; og++) merge_part<MT, NO, GT>(part + og * GT * FR, acc_o, m_i, l_i);
    }
#if __CUDA_ARCH__ >= 900
    if constexpr (CLUSTER) {
        static_assert(G == 1 && (size_t)GT * FR * 4 <= RING_BYTES, "a cluster's part fits the ring");
        if (in_cluster) { /* the cluster's splits merge into split 0, which reads their parts from their idle rings */
            float *part = reinterpret_cast<float *>(sKV) + tid;
            __syncthreads(); /* every warp is done with the ring */
            store_part<MT, NO, GT>(part, acc_o, m_i, l_i);
            cluster_sync();
            if (split == 0) /* in turn: measured 1.1-1.3 us faster than all splits' loads of a fragment at once */
                for (int peer = 1; peer < a.n_splits; peer++) merge_part<MT, NO, GT>(cluster_peer(part, peer), acc_o, m_i, l_i);
            cluster_sync(); /* the other splits' shared memory stays until split 0 has read it */
            if (split != 0) return;
        }
    }
#else
    if (in_cluster) __trap(); /* never launched so: clusters are used with this build's sm_90a code only */
#endif

    /* l_i is summed over the four lanes that share a row; O_i / l_i; lse = (m_i + log2 l_i) ln 2. A row with
     * no kept key (l = 0), or past its sequence's length, is written as zeros with lse -inf. */
    float inv[MT][2], lse[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = l_i[mt][r];
            l += __shfl_xor_sync(0xffffffff, l, 1);
            l += __shfl_xor_sync(0xffffffff, l, 2);
            if (FEAT && warp_row + mt * 16 + g + r * 8 >= seq.q_len) l = 0.f;
            inv[mt][r] = l > 0.f ? 1.f / l : 0.f;
            lse[mt][r] = l == 0.f ? -INFINITY : (m_i[mt][r] + __log2f(l)) * 0.69314718055994531f; /* NaN l: NaN */
        }
    const int64_t bh_row = (int64_t)bh * p.Sq;
    T *gO = static_cast<T *>(p.o) + b * p.o_sb + h * p.o_sh + seq.qo * p.o_ss;
    float *gL = p.lse ? static_cast<float *>(p.lse) + b * p.lse_sb + h * p.lse_sh + seq.qo : NULL;

    if (a.n_splits > 1 && !in_cluster) {
        /* partial result of this split, fp32 from group 0's registers, normalised by its own l */
        const int64_t rows_all = (int64_t)p.B * p.H * p.Sq;
        float *op = a.o_part + ((int64_t)split * rows_all + bh_row) * D;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = warp_row + mt * 16 + g + r * 8;
                if (kg > 0 || row >= q0 + q_rows) continue;
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
                    /* a split whose rows met a NaN has lse NaN (fmaxf left it out of mx): its weight stays NaN */
                    const float w = ls[sp] != ls[sp] ? ls[sp] : mx == -INFINITY ? 0.f : __expf(ls[sp] - mx);
                    sum += w;
                    o.x += w * x[sp].x; o.y += w * x[sp].y; o.z += w * x[sp].z; o.w += w * x[sp].w;
                }
            const float invs = sum > 0.f ? 1.f / sum : 0.f;
            const uint2 packed = make_uint2(pack2<T>(o.x * invs, o.y * invs), pack2<T>(o.z * invs, o.w * invs));
            *reinterpret_cast<uint2 *>(gO + (int64_t)(q0 + r) * p.o_ss + c * 4) = packed;
            if (gL && c == 0) gL[q0 + r] = sum == 0.f ? -INFINITY : mx + __logf(sum);
        }
        return;
    }

    if (kg > 0) return; /* merged into group 0 */
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
#pragma unroll
    for (int i = lane; i < WR * (D / 8); i += 32) {
        const int r = i / (D / 8), c = i % (D / 8), row = warp_row + r;
        if (row < q0 + q_rows)
            *reinterpret_cast<uint4 *>(gO + (int64_t)row * p.o_ss + c * 8) =
                *reinterpret_cast<const uint4 *>(sQ + swz<PITCH>(warp * WR + r, c * 8));
    }
    if (gL && t4 == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int row = warp_row + mt * 16 + g + r * 8;
                if (row < q0 + q_rows) gL[row] = lse[mt][r];
            }
    }
}

#endif
