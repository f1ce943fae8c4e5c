/* Hopper attention backward: dQ_i's way into the float32 accumulator (rows permuted: fs_dq_slot). The consumers' side,
 * sm90_bwd_dq_out: where the tile stages dQ (K::STAGED) each warpgroup writes its share into shared memory for the
 * writer warp (warp 1 of the producer warpgroup), which adds it by TMA reductions, so no consumer register waits on L2;
 * else float4 atomics from the consumers' registers. Deterministic runs (K::ORDERED, always staged) have one ordered
 * writer per warpgroup (warps 1 and 2), which adds a share after the key blocks before its own have added theirs. The
 * persistent kernel (K::CONVERT) also takes dQ out of the accumulator: warp 2 counts each tile's completed adds, warp 3
 * converts the tiles its blocks own once their counts are full. */
#ifndef FLASHSCI_ATTENTION_SM90_BACKWARD_DQ_CUH
#define FLASHSCI_ATTENTION_SM90_BACKWARD_DQ_CUH

#include "attention/sm90/backward_barriers.cuh"
#include "attention/sm90/backward_producer.cuh"
#include "attention/sm90/backward_tile.cuh"
#include "common/tma.cuh"

#ifdef FS_WGMMA
/* Where the kernel converts dQ (K::CONVERT): the steps the writer's count of completed steps trails its last issued */
#define SM90_BWD_DQ_LAG 2

/* dQ share c (0-3) of consumer warpgroup cw in the staging: boxes of 16 columns x 64 rows (4 KiB), the warpgroup's
 * four after each other; its origin in the tile: D = 64 rows 64 cw, columns 16 c; D = 128 rows 0, columns 64 cw + 16 c. */
template <int D> FS_DEV_T int bwd_dq_box_row(int cw) { return D == 64 ? 64 * cw : 0; }
template <int D> FS_DEV_T int bwd_dq_box_col(int cw, int c) { return (D == 64 ? 0 : 64 * cw) + 16 * c; }

/* Consumer warpgroup cw's staged share into the accumulator by TMA (one thread; columns past D skipped, rows past the
 * map dropped), waited for until they have read the staging: added from row `row` on (the tile's first row plus
 * bwd_dq_box_row); PLANES, where the accumulator's map has a plane per (batch, query head) (a.dq_planes: ordered runs
 * on padded batches without seqlens): at row `row` of plane `plane`, stored rather than added where it is the tile's
 * first (store). */
template <class K, bool PLANES>
FS_DEV_T void bwd_dq_share(const sm90_bwd_shared<typename K::T> &sh, const CUtensorMap &map_dq, const fs_attn_params &p,
                           int cw, int row, int plane = 0, bool store = false)
{
#pragma unroll
    for (int c = 0; c < 4; c++)
        if (bwd_dq_box_col<K::D>(cw, c) < p.D) {
            const float *box = sh.sdQ + (4 * cw + c) * 64 * 16;
            if (!PLANES) tma_reduce_add_2d(&map_dq, box, bwd_dq_box_col<K::D>(cw, c), row);
            else if (store) tma_store_3d(&map_dq, box, bwd_dq_box_col<K::D>(cw, c), row, plane);
            else tma_reduce_add_3d(&map_dq, box, bwd_dq_box_col<K::D>(cw, c), row, plane);
        }
    bulk_commit();
    bulk_wait_read();
}

/* The writer's reductions complete but for the last PENDING bulk groups (its lane 0), and the steps they close counted
 * in shared memory for the counter warp (K::CONVERT), which publishes them (sm90_bwd_dq_counter). */
template <int PENDING> FS_DEV_T void bwd_dq_completed(const int *steps_done, int steps)
{
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(PENDING) : "memory");
    asm volatile("fence.proxy.async.global;\n" ::: "memory"); /* the reductions, for the generic proxy */
    asm volatile("fence.acq_rel.cta;\n" ::: "memory");        /* ... before the count the converter reads */
    asm volatile("st.relaxed.cta.shared.b32 [%0], %1;\n" ::"r"(smem_addr(steps_done)), "r"(steps) : "memory");
}

/* The accumulator's rows of the query heads of block blk's batch and K/V head zeroed ahead of the adds (K::ZERO_AHEAD,
 * launches with a.dq_zeroed, padded batches: warp 2 of the producer warpgroup; lane: its lane). The first of the
 * head's CTAs to claim the work (a compare-and-swap on the head's claim; usually its key block 0, which starts first)
 * zeroes every row 0 .. Sq - 1 of each query head of the group, a tile of Br rows at a time, and counts the tile once
 * its zeros are visible (a release after the warp's stores); the writers wait for a tile's count before their first
 * reduction into it (bwd_dq_zeroed_wait). A CTA that claims has started, so no writer waits for a CTA the hardware has
 * not started, whatever order it starts them in. Rows past Sq are the next head's, which its own CTAs zero: a last
 * partial tile stores only its rows. */
template <class K>
FS_DEV_T void sm90_bwd_dq_zero(const fs_sm90_bwd_args &a, const sm90_bwd_block &blk, int lane)
{
    const fs_attn_params &p = a.g.p;
    int *head = a.dq_zeroed + 2 * ((int64_t)blk.b * (p.H / p.kv_group) + blk.hkv); /* the tiles zeroed, the claim */
    int claimed = 0;
    if (lane == 0) claimed = atomicCAS(head + 1, 0, 1) == 0;
    if (!__shfl_sync(0xffffffffu, claimed, 0)) return;
    const int tiles = (p.Sq + K::BR - 1) / K::BR, chunks = K::BR * p.D / 4; /* float4s of a whole tile */
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int g = 0; g < p.kv_group; g++) {
        float4 *rows = reinterpret_cast<float4 *>(a.dq_acc + ((int64_t)blk.b * p.H + blk.hkv * p.kv_group + g) * p.Sq * p.D);
        for (int t = 0; t < tiles; t++, rows += chunks) {
            const int n = t + 1 < tiles ? chunks : (p.Sq - t * K::BR) * p.D / 4;
            for (int x = lane; x < n; x += 32) rows[x] = zero;
            __syncwarp(); /* every lane's stores before lane 0's release */
            if (lane == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(head) : "memory");
        }
    }
}

/* The writer's wait for the zeros of tile t of the group's g-th query head (K::ZERO_AHEAD, a.dq_zeroed; lane 0): until
 * the zeroing warp has counted the tile (seen: the count last read), then the zeros ordered before the reductions
 * (the async proxy's). */
template <class K>
FS_DEV_T void bwd_dq_zeroed_wait(const fs_sm90_bwd_args &a, const sm90_bwd_block &blk, int g, int t, int &seen)
{
    const fs_attn_params &p = a.g.p;
    const int need = g * ((p.Sq + K::BR - 1) / K::BR) + t + 1;
    if (seen >= need) return;
    const int *count = a.dq_zeroed + 2 * ((int64_t)blk.b * (p.H / p.kv_group) + blk.hkv);
    do asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(count) : "memory");
    while (seen < need);
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

/* Causal (K::ZERO_TILES, launches with a.dq_zeroed, padded batches without seqlens): query tile t of head h of batch b
 * zeroed by the first writer warp to claim it (flag 0 -> 1, a compare-and-swap), which zeroes its rows below Sq and
 * then releases the flag as 2, while the others wait for the 2; whole warp, converged (lane: its lane). The writers
 * claim each step's tile a step ahead, while the consumers compute, so neither the zeroing nor the wait is on their
 * path. A claimer has started and waits on nothing before its release, so no writer waits on a CTA the hardware has
 * not started. */
template <class K>
FS_DEV_T void bwd_dq_claim_tile(const fs_sm90_bwd_args &a, int b, int h, int t, int lane)
{
    const fs_attn_params &p = a.g.p;
    int *flag = a.dq_zeroed + ((int64_t)b * p.H + h) * a.order_tiles + t;
    int won = 0;
    if (lane == 0) {
        int seen;
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(flag) : "memory");
        won = seen == 0 && atomicCAS(flag, 0, 1) == 0;
        if (!won) { /* another writer's zeros, ordered before this one's reductions (the async proxy's) */
            while (seen != 2) asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(flag) : "memory");
            asm volatile("fence.proxy.async.global;\n" ::: "memory");
        }
    }
    if (!__shfl_sync(0xffffffffu, won, 0)) return;
    float4 *rows = reinterpret_cast<float4 *>(a.dq_acc + (((int64_t)b * p.H + h) * p.Sq + t * K::BR) * p.D);
    const int n = min(K::BR, p.Sq - t * K::BR) * p.D / 4;
    for (int x = lane; x < n; x += 32) rows[x] = make_float4(0.f, 0.f, 0.f, 0.f);
    __syncwarp(); /* every lane's stores before lane 0's release */
    if (lane == 0) {
        asm volatile("st.release.gpu.global.b32 [%0], 2;\n" ::"l"(flag) : "memory");
        asm volatile("fence.proxy.async.global;\n" ::: "memory"); /* the zeros before this warp's reductions */
    }
}

/* The dQ writer (K::STAGED) for block blk: per step and consumer warpgroup, once its share is staged, lane 0 adds the
 * share's boxes into the accumulator (rows at fs_bwd_row; a tile's rows past its head or sequence add zeros, rows past
 * the accumulator and columns past D are dropped) and frees the staging once the reductions have read it (but for the
 * block's last step of a single block; persistent CTAs' consumers take the last free after their last block). Where
 * the kernel converts dQ (a.dq_done), after each step's adds are issued the step before's have completed: counted in
 * sh.steps_done (steps: the CTA's steps so far). */
template <class K>
FS_DEV_T void sm90_bwd_dq_writer_block(const sm90_bwd_shared<typename K::T> &sh, const CUtensorMap &map_dq,
                                       const fs_sm90_bwd_args &a, const sm90_bwd_block &blk, int lane, int &steps)
{
    /* the consumers' steps (sm90_bwd_head, sm90_bwd_q0; not ORDERED) as two loops over rows that fit
     * an int (the launch checks the accumulator's), in the registers of the producer warpgroup */
    const fs_attn_params &p = a.g.p;
    const int head_rows = p.cu_seqlens_q ? p.total_q : p.Sq, last = blk.n_iter - 1;
    int row = (int)fs_bwd_row(p, blk.b, blk.hkv * p.kv_group, blk.seq.qo, blk.q_tile0 * K::BR), zeroed = 0;
    const int h0 = blk.hkv * p.kv_group;
    if (K::ZERO_TILES && a.dq_zeroed && blk.n_q > 0) bwd_dq_claim_tile<K>(a, blk.b, h0, blk.q_tile0, lane);
    for (int g = 0, it = 0; g < p.kv_group; g++, row += head_rows - blk.n_q * K::BR)
        for (int i = 0; i < blk.n_q; i++, it++, row += K::BR) {
            if (K::ZERO_AHEAD && a.dq_zeroed) {
                if (lane == 0) bwd_dq_zeroed_wait<K>(a, blk, g, blk.q_tile0 + i, zeroed);
                __syncwarp(); /* the warp converged again before the named barriers */
            }
#pragma unroll
            for (int cw = 0; cw < 2; cw++) {
                bwd_dq_staged_wait(cw);
                if (lane == 0) bwd_dq_share<K, false>(sh, map_dq, p, cw, row + bwd_dq_box_row<K::D>(cw));
                __syncwarp();
                if (K::PERSIST || it < last) bwd_dq_free(cw);
            }
            if (K::ZERO_TILES && a.dq_zeroed && it < last) /* the next step's tile, claimed ahead */
                bwd_dq_claim_tile<K>(a, blk.b, i + 1 < blk.n_q ? h0 + g : h0 + g + 1,
                                     i + 1 < blk.n_q ? blk.q_tile0 + i + 1 : blk.q_tile0, lane);
            /* the last SM90_BWD_DQ_LAG steps' bulk groups (two a step, one a share) may still be pending, whose
             * completion a wait would put on the consumers' path; those before have completed */
            if (K::CONVERT && a.dq_done && lane == 0 && steps >= SM90_BWD_DQ_LAG)
                bwd_dq_completed<2 * SM90_BWD_DQ_LAG>(sh.steps_done, steps + 1 - SM90_BWD_DQ_LAG);
            steps++;
        }
}

/* The dQ writer's whole work: the CTA's blocks in turn. */
template <class K>
FS_DEV_T void sm90_bwd_dq_writer(const sm90_bwd_shared<typename K::T> &sh, const CUtensorMap &map_dq, const fs_sm90_bwd_args &a,
                                 const sm90_bwd_block &first, int lane)
{
    int steps = 0;
    if constexpr (K::PERSIST) {
        SM90_BWD_FOR_EACH_BLOCK(blk, n) sm90_bwd_dq_writer_block<K>(sh, map_dq, a, blk, lane, steps);
    } else {
        sm90_bwd_dq_writer_block<K>(sh, map_dq, a, first, lane, steps);
    }
    if (lane == 0) {
        if (K::CONVERT && a.dq_done) bwd_dq_completed<0>(sh.steps_done, steps);
        else bulk_wait();
    }
}

/* Query tile q0 of head h in batch b converted (K::CONVERT: padded batches without seqlens): each consumer warpgroup's
 * share of the accumulator by TMA into the conversion buffer (phase: its mbarrier's), then by the converter warp's
 * lanes,
 *   dq = scale * accumulator,
 * in dq's dtype and strides, rows up to Sq. Lane l takes rows 8 k + l / 4 of the share and, of each box of 16
 * columns, the 16-byte chunk c = l % 4 (8 rows of 64 bytes a load: no bank conflict), which holds columns 2c, 2c + 1,
 * 8 + 2c, 9 + 2c (fs_dq_slot). About 3.5 us a tile. */
template <class K>
FS_DEV_T void bwd_dq_convert(const sm90_bwd_shared<typename K::T> &sh, const CUtensorMap &map_dq, const fs_sm90_bwd_args &a,
                             int b, int h, int q0, int lane, int &phase)
{
    using T = typename K::T;
    const fs_attn_bwd_params &g = a.g;
#pragma unroll 1
    for (int cw = 0; cw < 2; cw++) {
        const int q1 = q0 + bwd_dq_box_row<K::D>(cw);
        if (lane == 0) {
            asm volatile("fence.proxy.async.global;\n" ::: "memory"); /* the adds counted, for the TMA */
            mbar_expect_tx(sh.conv_full, 4 * 64 * 16 * 4);
            const int row = (b * g.p.H + h) * g.p.Sq + q1; /* fs_bwd_row; the accumulator's rows fit an int */
#pragma unroll
            for (int c = 0; c < 4; c++)
                tma_load_2d(sh.sConv + c * 64 * 16, &map_dq, bwd_dq_box_col<K::D>(cw, c), row, sh.conv_full);
        }
        mbar_wait(sh.conv_full, phase);
        phase ^= 1;
        int q = q1 + (lane >> 2);
        T *dst = static_cast<T *>(g.dq) + b * g.dq_sb + h * g.dq_sh + q * g.dq_ss + bwd_dq_box_col<K::D>(cw, 0) + 2 * (lane & 3);
        uint32_t src = smem_addr(sh.sConv) + (lane >> 2) * 64 + (lane & 3) * 16;
#pragma unroll 1
        for (int k = 0; k < 8 && q < g.p.Sq; k++, q += 8, dst += 8 * g.dq_ss, src += 8 * 64) {
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float x, y, z, w;
                asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                             : "=f"(x), "=f"(y), "=f"(z), "=f"(w) : "r"(src + c * 64 * 64));
                *reinterpret_cast<uint32_t *>(dst + 16 * c) = pack2<T>(x * a.scale, y * a.scale);
                *reinterpret_cast<uint32_t *>(dst + 16 * c + 8) = pack2<T>(z * a.scale, w * a.scale);
            }
        }
        __syncwarp(); /* the buffer read before the next share's TMA writes it */
    }
}

/* Batch, query head and tile of the persistent CTA's s-th step (K::CONVERT: its blocks, non-causal on a padded batch
 * without seqlens, have n_iter steps each). */
template <class K>
FS_DEV_T void bwd_dq_step_tile(const fs_sm90_bwd_args &a, int s, int n_iter, int &b, int &h, int &t)
{
    const sm90_bwd_block blk = sm90_bwd_block_of<K>(a, (int)blockIdx.x + s / n_iter * (int)gridDim.x);
    const int it = s % n_iter;
    b = blk.b;
    h = sm90_bwd_head(a.g.p, blk, it);
    t = blk.q_tile0 + it % blk.n_q;
}

/* The dQ tile counter (K::CONVERT, launches with a.dq_done: warp 2 of the producer warpgroup). Each time the writer
 * has seen more of the CTA's steps complete (sh.steps_done), the lanes count those steps' tiles in a.dq_done, a step a
 * lane: one fence, then relaxed adds that need no answer. */
template <class K>
FS_DEV_T void sm90_bwd_dq_counter(const sm90_bwd_shared<typename K::T> &sh, const fs_sm90_bwd_args &a)
{
    const int lane = threadIdx.x & 31, n_iter = sm90_bwd_block_of<K>(a, (int)blockIdx.x).n_iter;
    const int total = ((int)a.blocks - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x * n_iter;
    for (int cur = 0, seen; cur < total; cur = seen) {
        for (;;) {
            asm volatile("ld.relaxed.cta.shared.b32 %0, [%1];\n" : "=r"(seen) : "r"(smem_addr(sh.steps_done)) : "memory");
            if (seen > cur) break;
            __nanosleep(64);
        }
        /* the writer's count read; its completed reductions published with these counts */
        asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
        for (int s = cur + lane; s < seen; s += 32) {
            int b, h, t;
            bwd_dq_step_tile<K>(a, s, n_iter, b, h, t);
            asm volatile("red.relaxed.gpu.global.add.s32 [%0], 1;\n"
                         ::"l"(a.dq_done + ((int64_t)b * a.g.p.H + h) * a.order_tiles + t) : "memory");
        }
    }
}

/* The dQ converter (K::CONVERT, launches with a.dq_done: warp 3 of the producer warpgroup). Key block kt of a head
 * converts its tiles kt, kt + n_k, ... (bwd_dq_convert) once their counts show every key block's adds complete, the
 * blocks in the CTA's order, while the consumers go on. Tiles are owned, not converted by the block whose count comes
 * last: in a head's blocks, which run side by side, one block tends to stay the last for every tile, and its converter
 * fell behind with them (a queue between counter and converter filled, the counts waited, the block was last again).
 * So dQ needs no pass over the accumulator after the kernel, and the conversion overlaps the consumers' products. */
template <class K>
FS_DEV_T void sm90_bwd_dq_converter(const sm90_bwd_shared<typename K::T> &sh, const CUtensorMap &map_dq,
                                    const fs_sm90_bwd_args &a)
{
    const fs_attn_params &p = a.g.p;
    const int lane = threadIdx.x & 31;
    int phase = 0;
    for (int x = (int)blockIdx.x; x < a.blocks; x += (int)gridDim.x) {
        const sm90_bwd_block blk = sm90_bwd_block_of<K>(a, x);
        for (int g = 0; g < p.kv_group; g++) {
            const int h = blk.hkv * p.kv_group + g;
            for (int t = blk.k0 / K::BC; t < blk.n_q; t += a.n_kblocks) {
                if (lane == 0) {
                    const int *count = a.dq_done + ((int64_t)blk.b * p.H + h) * a.order_tiles + t;
                    for (;;) {
                        int c;
                        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(c) : "l"(count) : "memory");
                        if (c >= a.n_kblocks) break;
                        __nanosleep(256);
                    }
                }
                __syncwarp();
                bwd_dq_convert<K>(sh, map_dq, a, blk.b, h, t * K::BR, lane, phase);
            }
        }
    }
}

/* The ordered dQ writer of consumer warpgroup cw (K::ORDERED, deterministic runs: warp 1 + cw of the producer
 * warpgroup; lane: its lane) for the CTA's one block. Per step, lane 0 polls the tile's counter until the key blocks
 * before this one in the tile's order (sm90_bwd_tile, sm90_bwd_turn) have counted themselves, adds the warpgroup's
 * staged share by TMA reductions as the writer warp does, frees the staging once they have read it and, once they
 * have completed, counts this block. So every element's sum has one order. Where the accumulator's map has a plane
 * per head (a.dq_planes), the tile's first block in that order stores its share instead, so nothing zeroes the
 * accumulator before the kernel. The poll runs ahead of the consumers'
 * share, the wait for the reductions after the staging is free: neither is on the consumers' path. (Polling for the
 * next step before counting this one made each count wait for the block before's count at the next step, a convoy
 * again: 1.23-1.47x the default's time; reading the next step's counter while the reductions complete held each count
 * back by that read: 1-4% slower.) */
template <class K>
FS_DEV_T void sm90_bwd_dq_writer_ordered(const sm90_bwd_shared<typename K::T> &sh, const CUtensorMap &map_dq,
                                         const fs_sm90_bwd_args &a, const sm90_bwd_block &blk, int cw, int lane)
{
    /* the consumers' steps (sm90_bwd_head, sm90_bwd_q0) as two loops, in the registers of the producer warpgroup;
     * deterministic runs have one CTA per block (never PERSIST) */
    const fs_attn_params &p = a.g.p;
    const int n_q = blk.n_q, group = p.kv_group, last = blk.n_iter - 1;
    const int head_rows = p.cu_seqlens_q ? p.total_q : p.Sq;
    const int64_t per_head = 2 * (int64_t)a.order_tiles;
    int *count0 = a.dq_order + ((int64_t)blk.b * p.H + blk.hkv * group) * per_head + 2 * blk.q_tile0 + cw;
    int row0 = (int)fs_bwd_row(p, blk.b, blk.hkv * group, blk.seq.qo, blk.q_tile0 * K::BR) + bwd_dq_box_row<K::D>(cw);
    for (int g = 0, it = 0; g < group; g++, count0 += per_head, row0 += head_rows)
        for (int i = 0; i < n_q; i++, it++) {
            const int t = sm90_bwd_tile<K>(blk, i);
            int *count = count0 + 2 * t, turn = 0;
            if (lane == 0) {
                turn = sm90_bwd_turn<K>(a, blk, t);
                int seen;
                do asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(count) : "memory");
                while (seen != turn);
                asm volatile("fence.proxy.async.global;\n" ::: "memory"); /* the adds before, for the reductions */
            }
            bwd_dq_staged_wait(cw);
            if (lane == 0) {
                if (a.dq_planes) /* the share's row in its head's plane */
                    bwd_dq_share<K, true>(sh, map_dq, p, cw, (blk.q_tile0 + t) * K::BR + bwd_dq_box_row<K::D>(cw),
                                          blk.b * p.H + blk.hkv * group + g, turn == 0);
                else bwd_dq_share<K, false>(sh, map_dq, p, cw, row0 + t * K::BR);
            }
            __syncwarp();
            if (it < last) bwd_dq_free(cw);
            if (lane == 0) {
                bulk_wait();
                asm volatile("fence.proxy.async.global;\n" ::: "memory"); /* the reductions, before the count */
                asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(count) : "memory");
            }
        }
}

/* A consumer thread's dQ_i (64 rows x 64 columns of the tile at query q0 of head h: D = 64 query panel cw, D = 128
 * head-dim half cw, D = 80 warpgroup 1 16 columns; step: the CTA's steps so far) out: staged for the writer warp, or
 * added by atomics. */
template <class K>
FS_DEV_T void sm90_bwd_dq_out(const sm90_bwd_shared<typename K::T> &sh, const fs_sm90_bwd_args &a, const sm90_bwd_block &blk,
                              const float (&dq)[32], int h, int q0, int step, int cw, int warp, int gr, int t4)
{
    constexpr int D = K::D;
    if constexpr (K::STAGED) {
        /* this thread's float4s (column groups 2m, 2m + 1 of its rows; D = 80: warpgroup 1's 16 columns, m = 0)
         * into its warpgroup's boxes of 16 columns (64-byte rows, unswizzled): box m, row y = 16 warp + gr + 8 r,
         * 16-byte chunk t4. The eight lanes of a store's wavefront (gr = 2k, 2k + 1) fill two whole rows, 128
         * contiguous bytes (with 128-byte rows of 32 columns they took the same four chunks of two rows, twice the
         * wavefronts): one base address, the rest immediates */
        if (step > 0) bwd_dq_free_wait(cw);
        const uint32_t st_row = smem_addr(sh.sdQ) + cw * 4 * 64 * 64 + (warp * 16 + gr) * 64 + t4 * 16;
        const int groups = D == 80 && cw ? 1 : 4;
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int m = 0; m < 4; m++)
                if (m < groups)
                    st_shared_v4(st_row + m * 64 * 64 + r * 8 * 64, dq[8 * m + 2 * r], dq[8 * m + 2 * r + 1],
                                 dq[8 * m + 4 + 2 * r], dq[8 * m + 5 + 2 * r]);
        fence_proxy_async();
        bwd_dq_staged(cw);
    } else {
        /* dQ_i added into the accumulator: float4 atomics (red.global.add.v4.f32), this thread's rows, each add the
         * pairs of column groups 2m and 2m + 1, adjacent in the accumulator's permuted rows (fs_dq_slot). All 64
         * columns without a branch per add (a branch each recomputed the address, waiting for the add before to read
         * it) */
        const fs_attn_params &p = a.g.p;
        const int dq_col = D == 64 ? 0 : cw * 64, dq_cols = D == 64 ? 64 : min(64, p.D - dq_col);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int q = q0 + (D == 64 ? cw * 64 : 0) + warp * 16 + gr + 8 * r;
            if (q < blk.seq.q_len) {
                float4 *dst = reinterpret_cast<float4 *>(a.dq_acc + fs_bwd_row(p, blk.b, h, blk.seq.qo, q) * p.D + dq_col + 4 * t4);
                auto add = [&](int m) {
                    atomicAdd(dst + 4 * m, make_float4(dq[8 * m + 2 * r], dq[8 * m + 2 * r + 1], dq[8 * m + 4 + 2 * r],
                                                       dq[8 * m + 5 + 2 * r]));
                };
                if (dq_cols == 64) {
#pragma unroll
                    for (int m = 0; m < 4; m++) add(m);
                } else {
#pragma unroll
                    for (int m = 0; m < 4; m++)
                        if (16 * m < dq_cols) add(m);
                }
            }
        }
    }
}

#endif

#endif
