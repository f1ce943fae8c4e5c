/* Hopper attention backward: the work of one block (key block, K/V head, batch), the blocks a CTA takes, and the
 * producer. For each of its blocks one warp loads K_j and V_j once, then streams each step's Q_i and dO_i by TMA and
 * L_i log2 e and D_i by its lanes into the ring of mbarrier-guarded stages, which runs on from block to block. */
#ifndef FLASHSCI_ATTENTION_SM90_BACKWARD_PRODUCER_CUH
#define FLASHSCI_ATTENTION_SM90_BACKWARD_PRODUCER_CUH

#include <math.h>

#include "attention/sequence.cuh"
#include "attention/sm90/backward_tile.cuh"
#include "common/tma.cuh"

#ifdef FS_WGMMA
/* A block's work: keys k0 .. k0 + Bc - 1 of K/V head hkv in batch b, and n_iter steps (query head of the group outer,
 * query tile inner) over the n_q query tiles from tile q_tile0 on (causal, top-left: the tiles before the key block's
 * first key see none of its keys). Non-causal blocks take one head's key blocks in turn (its Q, dO and dQ accumulator
 * stay in L2); causal ones go in sections of a.section heads whose data fits in about half of L2, each section's key
 * blocks heaviest (first) first. Packed sequences and seqlens: the batch's own lengths (a key block past them has no
 * step). Deterministic non-causal runs rotate each block's tiles by rot (sm90_bwd_tile). */
typedef struct {
    int b, hkv, k0, q_tile0, n_q, n_iter;
    int rot;   /* ordered non-causal: step i takes tile i - rot (mod n_q); 0 elsewhere (sm90_bwd_tile) */
    int tb;    /* the batch coordinate of the tensor maps: b, or 0 for packed rows */
    fs_seq seq; /* the sequence's rows (packed: from qo / ko of the packed tensors) and lengths */
} sm90_bwd_block;
/* The key blocks of blk's sequence. */
template <class K> FS_DEV_T int sm90_bwd_key_blocks(const sm90_bwd_block &blk)
{
    return (blk.seq.k_len + K::BC - 1) / K::BC;
}
/* Whether an ordered non-causal block's sequence rotates its key blocks' tiles (sm90_bwd_tile): each key block j
 * starts C j tiles back (C = Bc / Br, the tiles a block's keys span) while every C j < n_q, and all of them fit the
 * CTAs resident at once (a block may wait for any other of its sequence, which then has been started or will be as
 * soon as a CTA is free). */
template <class K> FS_DEV_T bool sm90_bwd_rotated(const fs_sm90_bwd_args &a, int n_k, int n_q)
{
    return K::ORDERED && !K::CAUSAL && (K::BC / K::BR) * (n_k - 1) < n_q && n_k <= a.resident;
}
template <class K> FS_DEV_T sm90_bwd_block sm90_bwd_block_of(const fs_sm90_bwd_args &a, int t)
{
    const fs_attn_params &p = a.g.p;
    const int hkv_count = p.H / p.kv_group, heads = hkv_count * p.B;
    int kt, head;
    if (K::CAUSAL) {
        const int first = t / (a.section * a.n_kblocks) * a.section, in = min(a.section, heads - first);
        const int r = t - first * a.n_kblocks;
        kt = r / in;
        if (K::LIGHT_FIRST) kt = a.n_kblocks - 1 - kt; /* lightest first (sm90_bwd_tile) */
        head = first + r % in;
    } else {
        kt = t % a.n_kblocks;
        head = t / a.n_kblocks;
    }
    sm90_bwd_block blk;
    blk.hkv = head % hkv_count;
    blk.b = head / hkv_count;
    blk.k0 = kt * K::BC;
    blk.seq = seq_geometry(p, blk.b);
    blk.tb = p.cu_seqlens_q ? 0 : blk.b;
    const int n_tiles = blk.k0 < blk.seq.k_len ? (blk.seq.q_len + K::BR - 1) / K::BR : 0;
    blk.q_tile0 = K::CAUSAL ? min(blk.k0 / K::BR, n_tiles) : 0;
    blk.n_q = n_tiles - blk.q_tile0;
    blk.n_iter = p.kv_group * blk.n_q;
    const int n_k = sm90_bwd_key_blocks<K>(blk);
    blk.rot = sm90_bwd_rotated<K>(a, n_k, blk.n_q) ? K::BC / K::BR * kt : 0;
    return blk;
}

/* The index of the CTA's first block (sm90_bwd_block_of) where the blocks wait on blocks of higher index (K::TICKET),
 * the next of a counter, thread 0's atomic through shared memory: the CTAs take the blocks in the order they start,
 * which the hardware's order of blockIdx does not promise. Elsewhere blockIdx.x. */
template <class K>
FS_DEV_T int sm90_bwd_ticket(const fs_sm90_bwd_args &a, const sm90_bwd_shared<typename K::T> &sh)
{
    if (threadIdx.x == 0) *sh.ticket = atomicAdd(a.ticket, 1);
    __syncthreads();
    return *sh.ticket;
}

/* Whether block blk is empty: packed rows past its sequence's keys (n_kblocks counts the longest sequence's key
 * blocks), where there is nothing to compute or store. */
FS_DEV bool sm90_bwd_block_empty(const fs_attn_params &p, const sm90_bwd_block &blk)
{
    return p.cu_seqlens_q && blk.k0 >= blk.seq.k_len;
}

/* The blocks a CTA takes, every role alike, each as blk, the n-th of the CTA's: blockIdx.x, + gridDim.x, ... where
 * the instantiation runs persistent (K::PERSIST; each block computed in its turn: the first one kept from the kernel's
 * start held its registers through every step), else the first alone, as the kernel computed it (the loop then
 * compiles to that one block). */
#define SM90_BWD_FOR_EACH_BLOCK(blk, n)                                                                                 \
    for (int t_ = blockIdx.x, n = 0; t_ < a.blocks && (K::PERSIST || n == 0); t_ += (int)gridDim.x, n++)             \
        if (const sm90_bwd_block blk = K::PERSIST ? sm90_bwd_block_of<K>(a, t_) : first; true)

/* Step it of a block: its query head (head of the group outer) and first query row (query tile inner). */
FS_DEV int sm90_bwd_head(const fs_attn_params &p, const sm90_bwd_block &blk, int it)
{
    return blk.hkv * p.kv_group + it / blk.n_q;
}
/* The tile (from q_tile0) of a block's i-th step of a head. Ordered non-causal blocks j = 0, 1, .. of a rotated
 * sequence (sm90_bwd_rotated) start C j tiles back (rot): block j reaches tile t at step t + C j, or where that wrapped
 * (j >= w, w = ceil((n_q - t) / C)) at t + C j - n_q, and a tile's adds go in that order (sm90_bwd_turn): each block
 * comes to a tile C steps after the one before it, whose add it waits for (at least one step after where the order
 * turns from the wrapped blocks to block 0). Ordered causal blocks at D = 64 (K::LIGHT_FIRST) go from their first
 * tile up, as the default's, but the CTAs take them lightest first (sm90_bwd_block_of) and a tile's adds go from its
 * last key block down: block j reaches tile t at step t - j, a step after block j + 1. Other ordered causal blocks go
 * last tile first: every key block reaches a tile at the same step, in key-block order; so do unrotated non-causal
 * ones, from tile 0. */
template <class K> FS_DEV_T int sm90_bwd_tile(const sm90_bwd_block &blk, int i)
{
    if constexpr (K::ORDERED && K::CAUSAL && !K::LIGHT_FIRST) return blk.n_q - 1 - i;
    if constexpr (K::ORDERED && !K::CAUSAL) return i < blk.rot ? i - blk.rot + blk.n_q : i - blk.rot;
    return i;
}
template <class K> FS_DEV_T int sm90_bwd_q0(const sm90_bwd_block &blk, int it)
{
    /* i itself outside ordered runs, spelled out: through sm90_bwd_tile the same arithmetic had ptxas serialize the
     * D = 80 kernels' wgmmas (C7511) */
    const int i = it % blk.n_q;
    return (blk.q_tile0 + (K::ORDERED ? sm90_bwd_tile<K>(blk, i) : i)) * K::BR;
}
/* How many key blocks add their dQ share to tile t (from q_tile0) before block blk (sm90_bwd_tile's order). */
template <class K> FS_DEV_T int sm90_bwd_turn(const fs_sm90_bwd_args &a, const sm90_bwd_block &blk, int t)
{
    constexpr int C = K::BC / K::BR;
    const int j = blk.k0 / K::BC, n_k = sm90_bwd_key_blocks<K>(blk);
    /* the tile's last key block (the sequence's, or its diagonal one) down */
    if constexpr (K::LIGHT_FIRST) return min(blk.q_tile0 + t, n_k - 1) - j;
    if (!sm90_bwd_rotated<K>(a, n_k, blk.n_q)) return j;
    const int w = (blk.n_q - t + C - 1) / C; /* the first block that wrapped (n_k: none) */
    return j >= w ? j - w : j + max(n_k - w, 0);
}

/* The producer warp's whole work (lane: its lane). Per block, K_j, V_j (and the T5 table) land on kv_full: persistent
 * CTAs load them once the consumers have released the block before's (kv_empty), after the block's first Q_i, dO_i so
 * that these come in while the consumers finish the block before. Stage s of the ring, which runs on from block to
 * block, is full once the TMA bytes of Q_i and dO_i have landed and the 32 lanes have written L_i log2 e (+inf past the
 * sequence and for rows with no key: P = 0) and D_i (0 past the sequence). */
template <class K>
FS_DEV_T void sm90_bwd_producer(const sm90_bwd_shared<typename K::T> &sh, const CUtensorMap &map_q, const CUtensorMap &map_k,
                                const CUtensorMap &map_v, const CUtensorMap &map_do, const fs_sm90_bwd_args &a,
                                const sm90_bwd_block &first, int lane)
{
    constexpr int D = K::DS, BR = K::BR, BC = K::BC, STAGES = K::STAGES, HALVES = D / 64;
    const fs_attn_params &p = a.g.p;
    int s = 0, phase = 0;
    SM90_BWD_FOR_EACH_BLOCK(blk, n) {
        auto load_kv = [&]() {
            if (n > 0) mbar_wait(sh.kv_empty, (n - 1) & 1);
            if (lane == 0) {
                mbar_expect_tx(sh.kv_full, 2 * BC * D * 2 + (K::T5 ? 4 * a.t5_row : 0));
                for (int c = 0; c < HALVES; c++) {
                    tma_load_4d(sh.sK + c * BC * 64, &map_k, c * 64, (int)blk.seq.ko + blk.k0, blk.hkv, blk.tb, sh.kv_full);
                    tma_load_4d(sh.sV + c * BC * 64, &map_v, c * 64, (int)blk.seq.ko + blk.k0, blk.hkv, blk.tb, sh.kv_full);
                }
                /* T5 kernels: the head's table with them (no grouped heads: the block's query head is hkv) */
                if (K::T5) bulk_load(sh.t5_bias, a.t5_rows + (int64_t)blk.hkv * a.t5_row, 4 * a.t5_row, sh.kv_full);
            }
        };
        /* step it's L_i log2 e and D_i, this lane's rows lane + 32 e, loaded into registers a step ahead of their
         * stores (their latency hidden behind the wait for the stage) */
        constexpr int PER = BR / 32;
        float l2[PER], di[PER];
        auto load_stats = [&](int it) {
            const int h = sm90_bwd_head(p, blk, it), q0 = sm90_bwd_q0<K>(blk, it);
            const float *lse = static_cast<const float *>(p.lse) + blk.b * p.lse_sb + h * p.lse_sh + blk.seq.qo;
            const float *delta = a.delta + fs_bwd_row(p, blk.b, h, blk.seq.qo, 0);
#pragma unroll
            for (int e = 0; e < PER; e++) {
                const int q = q0 + lane + 32 * e;
                const float l = q < blk.seq.q_len ? __ldg(lse + q) : -INFINITY;
                l2[e] = l == -INFINITY ? INFINITY : l * FS_LOG2E;
                di[e] = q < blk.seq.q_len && !K::DELTA ? __ldg(delta + q) : 0.f; /* the delta pass computes it */
            }
        };
        if (!K::PERSIST) load_kv(); /* a single block: K_j, V_j first */
        if (blk.n_iter > 0) load_stats(0);
        else if (K::PERSIST) load_kv(); /* no step: K_j, V_j still land (the consumers wait for them, store dK_j, dV_j) */
        for (int it = 0; it < blk.n_iter; it++) {
            const int h = sm90_bwd_head(p, blk, it), q0 = sm90_bwd_q0<K>(blk, it);
            mbar_wait(&sh.empty[s], phase ^ 1);
            if (lane == 0) {
                mbar_expect_tx(&sh.full[s], 2 * BR * D * 2);
                for (int c = 0; c < HALVES; c++) {
                    const int row = (int)blk.seq.qo + q0;
                    tma_load_4d(sh.sQ + (s * BR * D + c * BR * 64), &map_q, c * 64, row, h, blk.tb, &sh.full[s]);
                    tma_load_4d(sh.sdO + (s * BR * D + c * BR * 64), &map_do, c * 64, row, h, blk.tb, &sh.full[s]);
                }
            }
#pragma unroll
            for (int e = 0; e < PER; e++) {
                sh.sL[s * BR + lane + 32 * e] = l2[e];
                sh.sD[s * BR + lane + 32 * e] = di[e];
            }
            mbar_arrive(&sh.full[s]);
            if (K::PERSIST && it == 0) load_kv();
            if (it + 1 < blk.n_iter) load_stats(it + 1);
            if (++s == STAGES) { s = 0; phase ^= 1; }
        }
    }
}
#endif

#endif
