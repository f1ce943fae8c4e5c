/* CPU flash attention in C: blocked online softmax (no S x S buffer), float32 accumulation for
 * fp16/bf16/fp32 inputs and float64 for fp64, threads across (batch, head, query block).
 *
 * Reference beside the CUDA kernels: tests compare it with a float64 NumPy reference and with the GPU.
 * Run: python -m flashsci.bench (CPU table) or pytest tests/test_attention_cpu.py.
 *
 * History (2-core CI machine, 2 threads, GFLOP/s on (1,8,512,128) / (2,8,512,64) fp32; python -m flashsci.bench):
 *   v1  Br=32, Bc=64 blocks, K_j transposed so both products vectorise over a contiguous row: 20 / 19
 *   v2  compile-time-width accumulators (score row, 64-column output chunks) + AVX2/FMA clone: 33 / 26
 *       (a vectorisable polynomial exp was tried: no gain, libm expf is ~5% of the time)
 */
#include "attention_cpu.h"
#include "half.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define FS_CPU_BR 32 /* query rows per block                          */
#define FS_CPU_BC 64 /* key rows per block                            */
#define FS_CPU_DW 64 /* output columns kept in registers in O += P V  */

/* x86-64 with GCC: an AVX2/FMA clone of the block kernel beside the portable one, picked at load time */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FS_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define FS_CPU_CLONES
#endif

/* Bytes per element of a float dtype. */
static size_t fs_dtype_size(fs_dtype dt)
{
    return dt == FS_F64 ? 8 : dt == FS_F32 ? 4 : 2;
}

/* One element of a float dtype, widened to double (bias and T5 table values). */
static double fs_load_scalar(const void *src, fs_dtype dt)
{
    switch (dt) {
    case FS_F16: return fs_half_to_float(*(const uint16_t *)src);
    case FS_BF16: return fs_bf16_to_float(*(const uint16_t *)src);
    case FS_F32: return *(const float *)src;
    default: return *(const double *)src;
    }
}

/* Load n elements of dtype dt into floats. */
static void load_row_f(const void *src, fs_dtype dt, float *dst, int n)
{
    const uint16_t *h = (const uint16_t *)src;
    switch (dt) {
    case FS_F16: for (int i = 0; i < n; i++) dst[i] = fs_half_to_float(h[i]); break;
    case FS_BF16: for (int i = 0; i < n; i++) dst[i] = fs_bf16_to_float(h[i]); break;
    case FS_F32: for (int i = 0; i < n; i++) dst[i] = ((const float *)src)[i]; break;
    default: for (int i = 0; i < n; i++) dst[i] = (float)((const double *)src)[i]; break;
    }
}

/* Store n floats as dtype dt. */
static void store_row_f(const float *src, fs_dtype dt, void *dst, int n)
{
    uint16_t *h = (uint16_t *)dst;
    switch (dt) {
    case FS_F16: for (int i = 0; i < n; i++) h[i] = fs_float_to_half(src[i]); break;
    case FS_BF16: for (int i = 0; i < n; i++) h[i] = fs_float_to_bf16(src[i]); break;
    case FS_F32: for (int i = 0; i < n; i++) ((float *)dst)[i] = src[i]; break;
    default: for (int i = 0; i < n; i++) ((double *)dst)[i] = src[i]; break;
    }
}

/* Load n float64 elements (the only dtype the double instantiation sees). */
static void load_row_d(const void *src, fs_dtype dt, double *dst, int n)
{
    (void)dt;
    for (int i = 0; i < n; i++) dst[i] = ((const double *)src)[i];
}

/* Store n doubles as float64. */
static void store_row_d(const double *src, fs_dtype dt, void *dst, int n)
{
    (void)dt;
    for (int i = 0; i < n; i++) ((double *)dst)[i] = src[i];
}

#define REAL float
#define BLOCK_FN attention_block_f
#define ROTATE_FN rotate_f
#define LOAD_ROW load_row_f
#define STORE_ROW store_row_f
#define EXP expf
#define LOG logf
#include "attention_cpu_block.h"
#undef REAL
#undef BLOCK_FN
#undef ROTATE_FN
#undef LOAD_ROW
#undef STORE_ROW
#undef EXP
#undef LOG

#define REAL double
#define BLOCK_FN attention_block_d
#define ROTATE_FN rotate_d
#define LOAD_ROW load_row_d
#define STORE_ROW store_row_d
#define EXP exp
#define LOG log
#include "attention_cpu_block.h"

typedef struct {
    const fs_attn_params *p;
    atomic_llong next;   /* next task: (b * H + h) * q_blocks + qb */
    int64_t num_tasks, q_blocks;
    atomic_int failed;
} fs_cpu_job;

/* Worker: take tasks off the shared counter until none are left. */
static void *attention_worker(void *arg)
{
    fs_cpu_job *job = (fs_cpu_job *)arg;
    const fs_attn_params *p = job->p;
    const int wide = p->dtype == FS_F64;
    const size_t real = wide ? sizeof(double) : sizeof(float);
    const size_t n = (size_t)2 * FS_CPU_BR * p->D + (size_t)2 * FS_CPU_BC * p->D + (size_t)FS_CPU_BR * FS_CPU_BC;
    void *scratch = malloc(n * real);
    if (!scratch) {
        atomic_store(&job->failed, 1);
        return NULL;
    }
    for (;;) {
        const int64_t t = atomic_fetch_add(&job->next, 1);
        if (t >= job->num_tasks) break;
        const int64_t bh = t / job->q_blocks, i0 = (t % job->q_blocks) * FS_CPU_BR;
        if (wide) attention_block_d(p, bh / p->H, bh % p->H, i0, (double *)scratch);
        else attention_block_f(p, bh / p->H, bh % p->H, i0, (float *)scratch);
    }
    free(scratch);
    return NULL;
}

int fs_attention_cpu(const fs_attn_params *p, int num_threads)
{
    fs_cpu_job job;
    job.p = p;
    job.q_blocks = (p->Sq + FS_CPU_BR - 1) / FS_CPU_BR;
    job.num_tasks = (int64_t)p->B * p->H * job.q_blocks;
    atomic_init(&job.next, 0);
    atomic_init(&job.failed, 0);

    /* a thread costs tens of microseconds to start: give each at least ~4 MFLOP of work */
    const double flops = 4.0 * p->B * p->H * (double)p->Sq * p->Sk * p->D;
    int64_t want = (int64_t)(flops / 4e6);
    if (want > num_threads) want = num_threads;
    if (want > job.num_tasks) want = job.num_tasks;
    if (want < 1) want = 1;

    pthread_t threads[256];
    int started = 0;
    for (int64_t i = 1; i < want && i < 256; i++) {
        if (pthread_create(&threads[started], NULL, attention_worker, &job) != 0) break;
        started++;
    }
    attention_worker(&job); /* the calling thread works too */
    for (int i = 0; i < started; i++) pthread_join(threads[i], NULL);
    return atomic_load(&job.failed) ? -1 : 0;
}
