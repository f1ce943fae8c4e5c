/* Fork-join pool for the C CPU kernels (attention/cpu, gemm/cpu). */
#include "common/cpu_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

typedef struct {
    fs_cpu_task fn;
    void *ctx;
    size_t scratch_bytes;
    int64_t num_tasks;
    atomic_llong next;
    atomic_int failed, ran, stopped;
    fs_cpu_poll poll; /* asked by the calling thread only */
    void *poll_ctx;
} fs_cpu_job;

/* Monotonic nanoseconds. */
static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Take tasks off the shared counter until none are left or the run is stopped; with poll (the calling thread),
 * ask it every FS_CPU_POLL_NS between tasks. */
static void work(fs_cpu_job *job, fs_cpu_poll poll)
{
    void *scratch = malloc(job->scratch_bytes ? job->scratch_bytes : 1);
    if (!scratch) {
        atomic_store(&job->failed, 1);
        return;
    }
    atomic_store(&job->ran, 1);
    int64_t next_poll = poll ? now_ns() + FS_CPU_POLL_NS : 0;
    while (!atomic_load_explicit(&job->stopped, memory_order_relaxed)) {
        const int64_t t = atomic_fetch_add(&job->next, 1);
        if (t >= job->num_tasks) break;
        job->fn(job->ctx, t, scratch);
        if (poll && now_ns() >= next_poll) {
            if (poll(job->poll_ctx)) atomic_store(&job->stopped, 1);
            next_poll = now_ns() + FS_CPU_POLL_NS;
        }
    }
    free(scratch);
}

/* Worker thread. */
static void *pool_worker(void *arg)
{
    work((fs_cpu_job *)arg, NULL);
    return NULL;
}

int fs_cpu_parallel(int64_t num_tasks, int threads, size_t scratch_bytes, fs_cpu_task fn, void *ctx, fs_cpu_poll poll,
                    void *poll_ctx)
{
    fs_cpu_job job;
    job.fn = fn;
    job.ctx = ctx;
    job.scratch_bytes = scratch_bytes;
    job.num_tasks = num_tasks;
    job.poll = poll;
    job.poll_ctx = poll_ctx;
    atomic_init(&job.next, 0);
    atomic_init(&job.failed, 0);
    atomic_init(&job.ran, 0);
    atomic_init(&job.stopped, 0);
    int64_t want = threads < num_tasks ? threads : num_tasks;
    if (want > 256) want = 256;
    pthread_t tids[256];
    int started = 0;
    for (int64_t i = 1; i < want; i++) {
        if (pthread_create(&tids[started], NULL, pool_worker, &job) != 0) break;
        started++;
    }
    work(&job, poll); /* the calling thread works too, and polls */
    for (int i = 0; i < started; i++) pthread_join(tids[i], NULL);
    if (atomic_load(&job.stopped)) return -2;
    return atomic_load(&job.ran) && atomic_load(&job.next) >= num_tasks ? 0 : -1;
}

int fs_cpu_threads_for(double flops, int max_threads)
{
    const double want = flops / 4e6;
    return want < 1.0 ? 1 : want > max_threads ? max_threads : (int)want;
}
