/* Hopper attention backward (sm_90a, wgmma + TMA): the kernel, one CTA per block (key block of Bc keys, K/V head and
 * batch) or, for the instantiations that run persistent (K::PERSIST), one per SM taking blocks in turn. Warpgroup 0 is
 * the producer (backward_producer.cuh: one warp streams Q_i, dO_i, L_i, D_i), warpgroups 1 and 2 the consumers
 * (backward_mainloop.cuh: 64 keys each; dV, dK in registers, dQ into the float32 accumulator); warp 1 of warpgroup 0
 * adds the consumers' staged dQ by TMA reductions, in deterministic runs its warps 1 and 2 in order of key block,
 * and where the kernel converts dQ itself its warps 2 and 3 count each query tile's completed adds and convert
 * the tiles the CTA's key blocks own; where the kernel zeroes the accumulator itself, warp 2 zeroes the rows of a
 * head whose zeroing it claimed first (non-causal) or the writer each query tile it claimed first (causal)
 * (backward_dq.cuh); the consumers store dV, dK (backward_epilogue.cuh). The passes around it are the portable
 * backward's (Delta, and the zeroed accumulator where the kernel neither zeroes it nor stores each tile's first share,
 * before; dQ's conversion after where the kernel does not convert it).
 * Design and measurements: docs/notes/attention_backward_sm90.md. */
#ifndef FLASHSCI_ATTENTION_SM90_BACKWARD_KERNEL_CUH
#define FLASHSCI_ATTENTION_SM90_BACKWARD_KERNEL_CUH

#include "attention/sm90/backward_dq.cuh"
#include "attention/sm90/backward_mainloop.cuh"
#include "attention/sm90/backward_producer.cuh"
#include "attention/sm90/backward_tile.cuh"
#include "common/tma.cuh"

template <int D, typename T, bool CAUSAL, bool ORDERED, bool T5, bool DELTA>
__global__ void __launch_bounds__(384, 1)
attention_bwd_sm90(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                   const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_do,
                   const __grid_constant__ CUtensorMap map_dq, const __grid_constant__ CUtensorMap map_dk,
                   const __grid_constant__ CUtensorMap map_dv, const fs_sm90_bwd_args a)
{
#ifdef FS_WGMMA
    using K = sm90_bwd_config<D, T, CAUSAL, ORDERED, T5, DELTA>;
    static_assert(128 * K::PRODUCER_REGS + 256 * K::CONSUMER_REGS <= 168 * 384 && K::PRODUCER_REGS % 8 == 0,
                  "setmaxnreg: the warpgroups' registers fit the block's allocation");
    extern __shared__ unsigned char smem_raw[];
    const sm90_bwd_shared<T> sh = sm90_bwd_carve<K>(smem_raw);
    /* the CTA's first block */
    const sm90_bwd_block first = sm90_bwd_block_of<K>(a, K::TICKET ? sm90_bwd_ticket<K>(a, sh) : blockIdx.x);
    if (threadIdx.x == 0) {
        mbar_init(sh.kv_full, 1);
        mbar_init(sh.kv_empty, 256); /* every consumer thread, after its block's last products */
        for (int s = 0; s < K::STAGES; s++) {
            mbar_init(&sh.full[s], 1 + 32); /* the TMA's expect_tx and the producer warp's lanes */
            mbar_init(&sh.empty[s], 256);   /* every consumer thread */
        }
        if (K::CONVERT) {
            mbar_init(sh.conv_full, 1); /* the converter's expect_tx */
            *sh.steps_done = 0;
        }
        mbar_init_fence();
    }
    __syncthreads();
    /* an empty packed block (one CTA per block: packed sequences never run persistent) ends at once, before its K_j,
     * V_j load (T5 kernels store each block's table gradient, zeros too) */
    if (!K::T5 && sm90_bwd_block_empty(a.g.p, first)) return;
    if (threadIdx.x < 128) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(K::PRODUCER_REGS));
        if (threadIdx.x < 32) sm90_bwd_producer<K>(sh, map_q, map_k, map_v, map_do, a, first, threadIdx.x);
        else if (K::STAGED && !K::ORDERED && threadIdx.x < 64)
            sm90_bwd_dq_writer<K>(sh, map_dq, a, first, threadIdx.x & 31);
        else if (K::ORDERED && threadIdx.x < 96)
            sm90_bwd_dq_writer_ordered<K>(sh, map_dq, a, first, (threadIdx.x >> 5) - 1, threadIdx.x & 31);
        else if (K::CONVERT && threadIdx.x < 96 && a.dq_done) sm90_bwd_dq_counter<K>(sh, a);
        else if (K::CONVERT && a.dq_done) sm90_bwd_dq_converter<K>(sh, map_dq, a);
        else if (K::ZERO_AHEAD && threadIdx.x < 96 && a.dq_zeroed) sm90_bwd_dq_zero<K>(a, first, threadIdx.x & 31);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(K::CONSUMER_REGS));
        sm90_bwd_consumer<K>(sh, a, &map_dk, &map_dv, first, (threadIdx.x >> 7) - 1);
    }
#endif
}

#endif
