/* Hopper attention backward: the tile configuration in one place, the launch arguments and the kernel's shared memory
 * (its size for the launch, its layout in device code). Host and device code include it. */
#ifndef FLASHSCI_ATTENTION_SM90_BACKWARD_TILE_CUH
#define FLASHSCI_ATTENTION_SM90_BACKWARD_TILE_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "attention/params.h"
#include "attention/sm90/tile.cuh"
#include "common/wgmma.cuh"

/* ---- tile configuration, one place: per head dim the query tile Br a step streams, the key block Bc a block owns
 * (two consumer warpgroups of 64 keys), the Q/dO ring's stages, the registers setmaxnreg gives a consumer thread (the
 * producer warpgroup keeps 24) and whether dQ_i is staged in shared memory for a writer warp's TMA reductions (else
 * float4 atomics from the consumers' registers; deterministic runs' ordered writers need it; 2: causal runs only, as
 * D = 80 non-causal staged had ptxas serialize its wgmmas for want of registers: 1,160 -> 1,490 us). D = 128 takes
 * Br = 64: dV and dK alone hold 128 of a thread's registers; D = 80 (the 2.7B LM's head dim) keeps D = 128's tiles and
 * shared memory, its products spanning 80 columns ---- */
template <int D> struct fs_sm90_bwd_tile;
/*                                        BR   BC   STAGES  REGS  DQ_STAGED */
template <> struct fs_sm90_bwd_tile<64>  { enum { BR = 128, BC = 128, STAGES = 2, REGS = 240, DQ_STAGED = 1 }; };
template <> struct fs_sm90_bwd_tile<80>  { enum { BR = 64, BC = 128, STAGES = 2, REGS = 240, DQ_STAGED = 2 }; };
template <> struct fs_sm90_bwd_tile<128> { enum { BR = 64, BC = 128, STAGES = 2, REGS = 240, DQ_STAGED = 1 }; };

/* The T5 bias (non-causal kernels without grouped heads, fs_sm90_backward_covers): each block holds its head's table
 * of relative positions -t5_lneg .. t5_n - 1 - t5_lneg (t5_n <= FS_SM90_BWD_T5_MAX) in log2 units, FS_SM90_T5_PAD
 * entries each side repeating the ends (a row of t5_row floats, as the forward's: sm90_t5_expand), and its gradient
 * by relative position in four copies of such a row, one per lane of a row's quad (no two lanes of a warp add into
 * one address; rows FS_SM90_BWD_T5_GRAD_STRIDE apart), plus two floats (the paddings' sums). */
#define FS_SM90_BWD_T5_MAX 1024
#define FS_SM90_BWD_T5_ROW ((FS_SM90_BWD_T5_MAX + 2 * FS_SM90_T5_PAD + 3) / 4 * 4)
#define FS_SM90_BWD_T5_GRAD_STRIDE (FS_SM90_BWD_T5_ROW + 10) /* = 10 mod 32: a warp's adds hit 32 banks */
#define FS_SM90_BWD_T5_FLOATS (FS_SM90_BWD_T5_ROW + 4 * FS_SM90_BWD_T5_GRAD_STRIDE + 4)

/* The columns a tile row holds in shared memory: boxes of 64 (D = 80 reads zeros past its columns into the second). */
constexpr int sm90_bwd_stored_dim(int d) { return (d + 63) / 64 * 64; }

/* The constants of one instantiation: the products span D columns, shared memory holds DS a row (ORDERED: deterministic
 * runs, each warpgroup's dQ share added to a query tile after the key blocks before its own in the tile's order, by
 * per-tile counters: sm90_bwd_tile, sm90_bwd_dq_writer_ordered; T5: the T5 bias, backward_t5.cuh). */
template <int D_, typename T_, bool CAUSAL_, bool ORDERED_, bool T5_, bool DELTA_> struct sm90_bwd_config {
    using T = T_;
    using tile = fs_sm90_bwd_tile<D_>;
    static constexpr int D = D_, DS = sm90_bwd_stored_dim(D_), BR = tile::BR, BC = tile::BC, STAGES = tile::STAGES;
    static constexpr int NWG = 2, THREADS = 384;
    /* DELTA: the delta pass of the T5 gradient's runs, D_i = rowsum(P o dP) and nothing else (backward_t5.cuh) */
    static constexpr bool CAUSAL = CAUSAL_, ORDERED = ORDERED_, T5 = T5_, DELTA = DELTA_;
    static constexpr bool STAGED = !DELTA_ && (tile::DQ_STAGED == 1 || (tile::DQ_STAGED == 2 && CAUSAL_));
    static_assert(!ORDERED_ || STAGED, "deterministic runs add dQ by the ordered writers (no D = 80 instantiation)");
    /* ordered causal runs where Br = Bc (D = 64): the CTAs take key blocks lightest first, each from its first tile up,
     * a tile's adds from its last key block down (sm90_bwd_tile; H200 bf16: 1.16-1.18x -> 1.02-1.04x the default's
     * time at 4,096-8,192 tokens); at D = 128 last tile first as before (there it measured 1.08-1.12x -> 1.13-1.14x,
     * together with a read-ahead of the counters that cost other shapes 1-4%) */
    static constexpr bool LIGHT_FIRST = ORDERED_ && CAUSAL_ && BR == BC;
    /* ordered non-causal runs: a CTA takes its block from a counter (sm90_bwd_ticket), so the blocks start in the order
     * of their index, which rotated blocks wait on (sm90_bwd_tile) */
    static constexpr bool TICKET = ORDERED_ && !CAUSAL_;
    static constexpr int NQ = BR / 8; /* n8 column groups of S^T, dP^T (queries) */
    static constexpr int NO = D / 8;  /* ... of dV, dK (head dim) */
    /* the exponentials' L_i, D_i read ahead and unmasked tiles on a loop of their own: causal D = 128 only (H200, bf16,
     * 4 x 16 x 4096 x 128: 1,750 -> 1,640 us); elsewhere it cost 1-4% (the loop apart alone: no gain anywhere) */
    static constexpr bool EXP_AHEAD = CAUSAL_ && D_ == 128;
    /* setmaxnreg: a consumer thread's registers and the producer warpgroup's, which share the 168 a thread of the
     * block starts with: REGS and 24, but 232 and 40 for non-causal D = 64 outside deterministic runs, whose producer
     * warpgroup spilled at 24 (H200, bf16: 2-4% faster; deterministic runs 1-3% slower at 232, causal ones 1-2%) */
    static constexpr int CONSUMER_REGS = D_ == 64 && !CAUSAL_ && !ORDERED_ ? 232 : tile::REGS;
    static constexpr int PRODUCER_REGS = (168 * 384 - 256 * CONSUMER_REGS) / 128;
    /* a persistent grid (one CTA per SM taking the blocks by stride) for the instantiation whose blocks are alike in
     * work and that measured faster: non-causal D = 64 (H200, bf16, 4 x 32 x 4096 x 64 3,042 -> 2,942 us, ESM2-3B's
     * 8 x 40 x 1024 x 64 596 -> 584); by stride causal D = 128 ran 1.4x slower (its busiest CTA far above the mean) and
     * non-causal D = 128 at 1,024 tokens 3% slower. Elsewhere one CTA per block (deterministic runs always: a block
     * waiting for the key blocks before its own then never waits for a block no CTA has started) */
    static constexpr bool PERSIST = D_ == 64 && !CAUSAL_ && !ORDERED_ && !T5_;
    /* the T5 region's floats in shared memory */
    static constexpr int T5_FLOATS = T5_ ? FS_SM90_BWD_T5_FLOATS : 0;
    /* dQ converted in the kernel (launches that pass a.dq_done): the CTAs count each query tile's completed adds and
     * the key block that owns a tile converts it once they are all in (sm90_bwd_dq_counter, sm90_bwd_dq_converter),
     * so no pass reads the accumulator back from memory after the kernel. The persistent instantiation only: where a
     * CTA takes one block, the counts of its last steps came after its products, before the next CTA could start
     * (H200, bf16: 4 x 16 x 4096 x 128 and causal D = 64 at 1,024 tokens, counts alone, no faster than the post-pass) */
    static constexpr bool CONVERT = PERSIST && STAGED;
    /* dQ's accumulator zeroed in the kernel (launches that pass a.dq_zeroed: padded batches): warp 2 of the first CTA
     * of a head to claim it zeroes the head's rows tile by tile while the products run, and the writer waits for a
     * tile's zeros before its first reduction into it (sm90_bwd_dq_zero), so no pass writes the accumulator before the
     * kernel. The instantiations whose warp 2 is idle (staged, not ordered: warps 1 and 2 write, not persistent: warp 2
     * counts) and non-causal: a head's blocks all start at its first tile, as the zeroing does. Causal blocks start at
     * their diagonal tile, which one warp zeroing the head tile by tile reached late (H200, bf16, D = 128 4 x 16 x
     * 4096: 1,460 -> 1,600 us; causal D = 80's wgmmas ptxas serialized, C7511, with the zeroing or with the writer's
     * wait) */
    static constexpr bool ZERO_AHEAD = STAGED && !ORDERED_ && !PERSIST && !CAUSAL_;
    /* ... and causal at D = 128, where each query tile is zeroed by the first writer to claim it, a step ahead of its
     * first add (bwd_dq_claim_tile; padded batches without seqlens, whose every tile some block reaches). Causal D = 64
     * (Br = 128, about half the step time) ran 5-7% slower with it from 4,096 tokens (H200, bf16: the writer's claim,
     * a load and often a compare-and-swap to L2, between a step's adds and the next share: 393 / 421 TF/s against 415
     * / 454 at 4,096 / 8,192), 1,024 tokens unchanged */
    static constexpr bool ZERO_TILES = STAGED && !ORDERED_ && CAUSAL_ && D_ == 128;
    static constexpr int CONVERT_FLOATS = CONVERT ? 64 * 64 : 0;
};


typedef struct {
    fs_attn_bwd_params g; /* g.p: q and k as the kernel reads them (rotated by the dispatcher's pre-pass, rotary off) */
    float scale_log2;    /* scale * log2(e) */
    float scale;
    float *dq_acc;       /* float32 rows of g.p.D at fs_bwd_row: ((b H + h) Sq + i) padded, (h total_q + qo + i) packed;
                          * zeroed by the pre-pass; columns at fs_dq_slot(j) */
    const float *delta;  /* rowsum(dO o O), one float per row as above */
    int n_kblocks;
    int blocks;          /* (key block, K/V head, batch) blocks in all (sm90_bwd_block_of), taken by the CTAs in turn */
    int section;         /* causal: K/V heads per section of the block order (sm90_bwd_block_of) */
    int rotary;          /* rotate dK back (the forward rotated k by rotary_base over all D columns) */
    float rotary_base;
    int dkv_tma;         /* dV, dK stored by TMA through the kernel's dk / dv tensor maps (sm90_bwd_epilogue) */
    int *dq_order;       /* deterministic runs: per (batch, query head, query tile of Br, consumer warpgroup) the key
                          * blocks whose dQ share has been added, ((b H + h) order_tiles + tile) 2 + cw; zeroed */
    int order_tiles;     /* tiles of 64 queries per head (>= the tiles of Br) */
    /* T5 kernels: each head's table in log2 units as shared memory holds it (t5_row floats a head, sm90_t5_expand) of
     * relative positions -t5_lneg .. t5_n - 1 - t5_lneg; t5_part (NULL: no gradient) receives each block's gradient
     * by position at ((b H + h) n_kblocks + key block) t5_n */
    const float *t5_rows;
    int t5_row, t5_lneg, t5_n;
    float *t5_part;
    float *delta_out;    /* the delta pass: rowsum(P o dP) added here, rows as delta's (zeroed) */
    int resident;        /* ordered non-causal runs: the CTAs resident at once (one per SM), the most key blocks of a
                          * sequence that rotate (sm90_bwd_rotated) */
    int *ticket;         /* deterministic runs: the CTAs' block counter (sm90_bwd_ticket), after dq_order's counters
                          * (fs_sm90_order_ticket); zeroed */
    int *dq_done;        /* K::CONVERT kernels that convert dQ themselves: per (batch, query head, query tile of Br) the
                          * key blocks whose adds to the tile have completed, ((b H + h) order_tiles + tile); zeroed.
                          * NULL: the post-pass converts the accumulator */
    int *dq_zeroed;      /* K::ZERO_AHEAD kernels that zero the accumulator themselves: per (batch, K/V head) the tiles
                          * of Br rows zeroed so far (the group's query heads in turn) and the claim of the zeroing,
                          * 2 (b Hkv + hkv) + 0, 1; K::ZERO_TILES: per (batch, query head, query tile of Br) its
                          * flag (0, 1 claimed, 2 zeroed), (b H + h) order_tiles + tile; zeroed. NULL: the pre-pass
                          * zeroed the accumulator */
    int dq_planes;       /* ordered runs on padded batches without seqlens: map_dq has a plane of Sq rows per (batch,
                          * query head), and each tile's first share in the order is stored (sm90_bwd_dq_writer_ordered),
                          * the accumulator not zeroed before */
} fs_sm90_bwd_args;

/* shared memory: K_j, V_j (64-column halves of Bc rows), STAGES buffers of Q_i and of dO_i (halves of Br rows), two
 * buffers of dS^T (64-query panels of Bc rows, as dQ's MN-major A), dQ_i's float32 staging where the tile stages it
 * (boxes of 16 columns by 64 rows, unswizzled), the conversion buffer (K::CONVERT: one share of the staging's shape),
 * STAGES buffers of L_i log2 e and D_i, the T5 region (T5 kernels), the mbarriers (K_j, V_j full and empty, the ring's
 * full and empty, the conversion buffer's), the CTA's block (K::TICKET), and (K::CONVERT) the steps the dQ writer has
 * seen complete; plus 1 KiB alignment slack */
template <class K> constexpr int sm90_bwd_smem()
{
    using t = typename K::tile;
    constexpr int DS = K::DS;
    return (2 * t::BC * DS + 2 * t::STAGES * t::BR * DS + 2 * t::BC * t::BR) * 2 + (t::DQ_STAGED > 0) * t::BR * DS * 4 +
           4 * K::CONVERT_FLOATS + 2 * t::STAGES * t::BR * 4 + 4 * K::T5_FLOATS + (3 + 2 * t::STAGES) * 8 + 16 + 1024;
}

#ifdef FS_WGMMA
template <typename T> struct sm90_bwd_shared {
    T *sK, *sV, *sQ, *sdO, *sdS;
    float *sdQ, *sL, *sD;
    float *t5_bias, *t5_grad; /* T5 kernels: the head's table, its gradient's four rows and the paddings' sums */
    float *sConv; /* K::CONVERT: the conversion buffer */
    uint64_t *kv_full, *kv_empty, *full, *empty, *conv_full;
    int *ticket;     /* K::TICKET: the CTA's block, as thread 0 took it (sm90_bwd_ticket) */
    int *steps_done; /* K::CONVERT: the CTA's steps whose dQ reductions the writer has seen complete */
};

/* The layout of instantiation K in smem_raw, from its first 1024-byte boundary (smem_align1024). */
template <class K> FS_DEV_T sm90_bwd_shared<typename K::T> sm90_bwd_carve(unsigned char *smem_raw)
{
    using T = typename K::T;
    constexpr int D = K::DS, BR = K::BR, BC = K::BC, STAGES = K::STAGES;
    sm90_bwd_shared<T> sh;
    sh.sK = reinterpret_cast<T *>(smem_align1024(smem_raw));
    sh.sV = sh.sK + BC * D;
    sh.sQ = sh.sV + BC * D;
    sh.sdO = sh.sQ + STAGES * BR * D;
    sh.sdS = sh.sdO + STAGES * BR * D;
    sh.sdQ = reinterpret_cast<float *>(sh.sdS + 2 * BC * BR); /* 1024-byte aligned: every buffer before is */
    sh.sConv = sh.sdQ + (K::tile::DQ_STAGED > 0) * BR * D; /* 1024-byte aligned: the staging is 32 KiB */
    sh.sL = sh.sConv + K::CONVERT_FLOATS;
    sh.sD = sh.sL + STAGES * BR;
    sh.t5_bias = sh.sD + STAGES * BR; /* 16-byte aligned (bulk copies): Br is a multiple of 4 */
    sh.t5_grad = sh.t5_bias + FS_SM90_BWD_T5_ROW;
    sh.kv_full = reinterpret_cast<uint64_t *>(sh.t5_bias + K::T5_FLOATS);
    sh.kv_empty = sh.kv_full + 1;
    sh.full = sh.kv_full + 2;
    sh.empty = sh.full + STAGES;
    sh.conv_full = sh.empty + STAGES;
    sh.ticket = reinterpret_cast<int *>(sh.conv_full + 1);
    sh.steps_done = sh.ticket + 1;
    return sh;
}
#endif

#endif
