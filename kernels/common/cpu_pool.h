/* A fork-join pool for the C CPU kernels: tasks 0 .. n-1 taken off a shared counter by up to `threads`
 * threads (the caller is one of them), each thread with its own scratch buffer. */
#ifndef FLASHSCI_CPU_POOL_H
#define FLASHSCI_CPU_POOL_H

#include <stddef.h>
#include <stdint.h>

/* Run one task with this thread's scratch. */
typedef void (*fs_cpu_task)(void *ctx, int64_t task, void *scratch);

/* Asked by the calling thread every FS_CPU_POLL_NS while tasks run; nonzero stops the run (no new task starts). */
typedef int (*fs_cpu_poll)(void *ctx);
#define FS_CPU_POLL_NS 20000000 /* 20 ms */

/* Run num_tasks tasks on min(threads, num_tasks) threads; returns 0, -1 when a scratch buffer could not be
 * allocated (every task still ran on the threads that had one, unless none did), or -2 when poll (may be NULL)
 * stopped the run. */
int fs_cpu_parallel(int64_t num_tasks, int threads, size_t scratch_bytes, fs_cpu_task fn, void *ctx, fs_cpu_poll poll,
                    void *poll_ctx);

/* Threads worth starting for `flops` of work (a thread costs tens of microseconds to start: each gets at
 * least ~4 MFLOP), at most max_threads. */
int fs_cpu_threads_for(double flops, int max_threads);

#endif
