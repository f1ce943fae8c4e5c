/* Hopper attention backward: the named barriers its warps meet at (0 is __syncthreads). 1: both consumer warpgroups;
 * 2, 3: their turns at the tensor cores; 8-11: staged dQ's writer warp(s); 12, 13: each consumer warpgroup by itself. */
#ifndef FLASHSCI_ATTENTION_SM90_BACKWARD_BARRIERS_CUH
#define FLASHSCI_ATTENTION_SM90_BACKWARD_BARRIERS_CUH

#include "common/wgmma.cuh"

#ifdef FS_WGMMA
/* Both consumer warpgroups (256 threads) at named barrier 1: each one's dS^T is in shared memory. */
FS_DEV void bwd_consumers_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }
/* Consumer warpgroup cw's 128 threads at named barrier 12 + cw. */
FS_DEV void bwd_warpgroup_sync(int cw) { asm volatile("bar.sync %0, 128;\n" ::"r"(12 + cw) : "memory"); }
/* Named barriers 2, 3 order the warpgroups' S^T and dP^T issues (warpgroup cw waits at 2 + cw for the other's pass): the
 * tensor cores run the first warpgroup's pair ahead of the second's, so one's P^T and dS^T overlap the other's GEMMs
 * rather than both waiting on products issued together. */
FS_DEV void bwd_turn_wait(int cw) { asm volatile("bar.sync %0, 256;\n" ::"r"(2 + cw) : "memory"); }
FS_DEV void bwd_turn_pass(int cw) { asm volatile("bar.arrive %0, 256;\n" ::"r"(2 + (cw ^ 1)) : "memory"); }
/* Named barrier ID + cw for consumer warpgroup cw (0, 1) and one of the producer warpgroup's warps (160 threads), to
 * wait at or to arrive at: the ids as immediates, so that no register holds one across the step. */
template <int ID> FS_DEV_T void bwd_pair_sync(int cw)
{
    if (cw) asm volatile("bar.sync %0, 160;\n" ::"n"(ID + 1) : "memory");
    else asm volatile("bar.sync %0, 160;\n" ::"n"(ID) : "memory");
}
template <int ID> FS_DEV_T void bwd_pair_arrive(int cw)
{
    if (cw) asm volatile("bar.arrive %0, 160;\n" ::"n"(ID + 1) : "memory");
    else asm volatile("bar.arrive %0, 160;\n" ::"n"(ID) : "memory");
}

/* Staged dQ: consumer warpgroup cw and the writer warp (warp 1 of the producer warpgroup; deterministic runs: the
 * ordered writer, warp 1 + cw) meet at named barrier 8 + cw once the warpgroup's share is in shared memory (it
 * arrives, the writer waits) and at 10 + cw once the writer's reductions have read it (the writer arrives, the
 * warpgroup waits before its next share). */
FS_DEV void bwd_dq_staged(int cw) { bwd_pair_arrive<8>(cw); }
FS_DEV void bwd_dq_free_wait(int cw) { bwd_pair_sync<10>(cw); }
/* ... and the writer's side of the same two barriers. */
FS_DEV void bwd_dq_staged_wait(int cw) { bwd_pair_sync<8>(cw); }
FS_DEV void bwd_dq_free(int cw) { bwd_pair_arrive<10>(cw); }
#endif

#endif
