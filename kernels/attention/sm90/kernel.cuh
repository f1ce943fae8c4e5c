/* Hopper attention forward: the kernel. Warpgroup 0 is the producer (producer.cuh: one thread issues every TMA load),
 * warpgroups 1 .. NWG the consumers (mainloop.cuh: wgmma, online softmax, epilogue). launch.cuh launches it; the design
 * and its versions: docs/notes/attention_sm90.md. */
#ifndef FLASHSCI_ATTENTION_SM90_KERNEL_CUH
#define FLASHSCI_ATTENTION_SM90_KERNEL_CUH

#include "attention/sm90/mainloop.cuh"
#include "attention/sm90/producer.cuh"
#include "attention/sm90/smem.cuh"
#include "attention/sm90/tile.cuh"
#include "common/tma.cuh"

#ifndef FS_SM90_TRACE_BLOCK_START
#define FS_SM90_TRACE_BLOCK_START() do {} while (0) /* a trace hook (mainloop.cuh) */
#endif

template <int D, int BC, int NWG, typename T, bool FEAT, bool KPM, bool T5>
__global__ void __launch_bounds__((NWG + 1) * 128, 1)
attention_fwd_sm90(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                   const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_o, const fs_sm90_args a)
{
#ifdef FS_WGMMA
    using K = sm90_config<D, BC, NWG, T, FEAT, KPM, T5>;
    /* setmaxnreg moves registers within the block's launch allocation: its threads times the per-thread count, at most
     * 64 Ki / threads rounded down to 8 (168 at 384 threads). A consumer's .inc past it never returns */
    static_assert(128 * 24 + 128 * NWG * K::tile::REGS <= K::THREADS * (65536 / K::THREADS / 8 * 8),
                  "setmaxnreg: the warpgroups' registers fit the block's allocation");
    extern __shared__ unsigned char smem_raw[];
    const sm90_shared<T> sh = sm90_carve<K>(smem_raw);
    const bool t5_on = K::BIAS == SM90_T5_ALWAYS || (K::BIAS == SM90_T5_IF_SET && a.p.t5_table);
    const int wg = threadIdx.x >> 7;
    FS_SM90_TRACE_BLOCK_START();
    if (threadIdx.x == 0) {
        mbar_init(sh.q_full, 1);
        mbar_init(sh.q_empty, K::ARRIVALS); /* lane 0 of each consumer warp */
        mbar_init(sh.item_full, 1);
        mbar_init(sh.item_read, 128 * NWG);
        for (int s = 0; s < K::STAGES; s++) {
            mbar_init(&sh.k_full[s], 1);
            mbar_init(&sh.k_empty[s], K::ARRIVALS);
            mbar_init(&sh.v_full[s], 1);
            mbar_init(&sh.v_empty[s], K::ARRIVALS);
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) { /* producer: one thread claims the items and issues every TMA load */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (threadIdx.x == 0) sm90_producer<K>(sh, map_q, map_k, map_v, a, t5_on);
    } else { /* consumers */
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"((int)K::tile::REGS));
        sm90_consumer<K>(sh, map_o, a, t5_on, wg);
    }
#endif
}

#endif
