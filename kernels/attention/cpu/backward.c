/* CPU attention backward in C: the reference gradients for every option (causal, grouped K/V heads, packed
 * sequences, seqlens, key padding masks, additive bias and its gradient, the T5 bias and its table's gradient,
 * rotary), float32 accumulation for fp16/bf16/fp32 inputs and float64 for fp64, no S x S buffer.
 *
 * Reference beside the CUDA kernels: tests compare it with float64 finite differences and torch autograd.
 * Run: pytest tests/test_attention_backward_cpu.py.
 *
 * Design: four passes of independent tasks on the thread pool, each recomputing the scores of the tiles it needs
 * (backward_block.h): dq by query block, dk and dv by key block (over the query heads sharing the K/V head), dbias by
 * the bias's own elements, dtable by head. Every output element has one writer, so the results do not depend on the
 * thread count. Versions and measurements: docs/notes/attention_cpu.md.
 */
#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/common.h"
#include "common/cpu_pool.h"

#include <math.h>

/* What every task reads: the problem and its rotary table (fs_rotary_table, or NULL). */
typedef struct {
    const fs_attn_bwd_params *g;
    const float *rot;
} backward_job;

/* The block kernels in 16-byte and (x86-64) 32-byte AVX2 + FMA vectors */
#define FS_BLOCK_HEADER "attention/cpu/backward_block.h"
#include "attention/cpu/instantiate.h"

/* A task of pass name for the run's dtype, in the widest build this CPU runs. */
#if FS_CPU_AVX2
#define TASK(name) (fs_cpu_avx2() ? (f64 ? name##_d_32 : name##_f_32) : (f64 ? name##_d_16 : name##_f_16))
#else
#define TASK(name) (f64 ? name##_d_16 : name##_f_16)
#endif

/* Elements of REAL scratch every task needs: its query and key blocks (carve) and the two [Br][Bc] tiles. */
static size_t base_scratch(int D)
{
    return (size_t)2 * FS_CPU_BR * D + (size_t)3 * FS_CPU_BC * D + (size_t)2 * FS_CPU_BR * FS_CPU_BC + (size_t)D + 8;
}

int fs_attention_backward_cpu(const fs_attn_bwd_params *g, int num_threads, fs_cpu_poll poll, void *poll_ctx)
{
    const fs_attn_params *p = &g->p;
    const int f64 = p->dtype == FS_F64, D = p->D;
    const size_t real = f64 ? sizeof(double) : sizeof(float);
    const double flops = 4.0 * p->B * p->H * (double)p->Sq * p->Sk * D;
    const int threads = fs_cpu_threads_for(flops, num_threads);
    backward_job job = {g, fs_rotary_table(p)};
    void *ctx = &job;
    /* dq: blocks of query rows */
    int rc = fs_cpu_parallel((int64_t)p->B * p->H * ((p->Sq + FS_CPU_BR - 1) / FS_CPU_BR), threads,
                             (base_scratch(D) + (size_t)FS_CPU_BR * D) * real, TASK(dq_task), ctx, poll,
                             poll_ctx);
    /* dk, dv: blocks of keys of each K/V head */
    if (rc == 0)
        rc = fs_cpu_parallel((int64_t)p->B * (p->H / p->kv_group) * ((p->Sk + FS_CPU_BC - 1) / FS_CPU_BC), threads,
                             (base_scratch(D) + (size_t)2 * FS_CPU_BC * D + (size_t)2 * FS_CPU_BC * FS_CPU_BR) * real,
                             TASK(dkv_task), ctx,
                             poll, poll_ctx);
    /* dbias: the bias's own elements, by (batch, head, query block) where the bias has those dims */
    if (rc == 0 && g->dbias) {
        const int64_t *dims = g->dbias_dims, q_blocks = dims[2] == 1 ? 1 : (p->Sq + FS_CPU_BR - 1) / FS_CPU_BR;
        const size_t acc = (size_t)(dims[2] == 1 ? 1 : FS_CPU_BR) * (size_t)dims[3];
        rc = fs_cpu_parallel(dims[0] * dims[1] * q_blocks, threads, (base_scratch(D) + acc) * real,
                             TASK(dbias_task), ctx, poll, poll_ctx);
    }
    /* dtable: one task per head */
    if (rc == 0 && g->dtable)
        rc = fs_cpu_parallel(p->H, threads, base_scratch(D) * real + (size_t)p->t5_buckets * sizeof(double) + 16,
                             TASK(dtable_task), ctx, poll, poll_ctx);
    free((void *)job.rot);
    return rc;
}
