/* CPU flash attention in C: blocked online softmax (no S x S buffer), float32 accumulation for
 * fp16/bf16/fp32 inputs and float64 for fp64, threads across (batch, head, query block).
 *
 * Reference beside the CUDA kernels: tests compare it with a float64 NumPy reference and with the GPU.
 * Run: python -m flashsci.bench --cpu (against NumPy) or pytest tests/test_attention_cpu.py.
 *
 * Versions and measurements: docs/notes/attention_cpu.md.
 */
#include "attention/cpu/attention_cpu.h"
#include "attention/cpu/common.h"
#include "common/cpu_pool.h"

#include <math.h>

/* The block kernels in 16-byte and (x86-64) 32-byte AVX2 + FMA vectors */
#define FS_BLOCK_HEADER "attention/cpu/forward_block.h"
#include "attention/cpu/instantiate.h"

/* What every task reads: the problem and its rotary table. */
typedef struct {
    const fs_attn_params *p;
    const float *rot;
} attention_job;

/* One task: query block (b * H + h) * q_blocks + qb, by the widest build this CPU runs. */
static void attention_task(void *ctx, int64_t t, void *scratch)
{
    const attention_job *job = (const attention_job *)ctx;
    const fs_attn_params *p = job->p;
    const int64_t q_blocks = (p->Sq + FS_CPU_BR - 1) / FS_CPU_BR;
    const int64_t bh = t / q_blocks, b = bh / p->H, h = bh % p->H, i0 = (t % q_blocks) * FS_CPU_BR;
#if FS_CPU_AVX2
    if (fs_cpu_avx2()) {
        if (p->dtype == FS_F64) attention_block_d_32(p, job->rot, b, h, i0, (double *)scratch);
        else attention_block_f_32(p, job->rot, b, h, i0, (float *)scratch);
        return;
    }
#endif
    if (p->dtype == FS_F64) attention_block_d_16(p, job->rot, b, h, i0, (double *)scratch);
    else attention_block_f_16(p, job->rot, b, h, i0, (float *)scratch);
}

int fs_attention_cpu(const fs_attn_params *p, int num_threads, fs_cpu_poll poll, void *poll_ctx)
{
    const size_t real = p->dtype == FS_F64 ? sizeof(double) : sizeof(float);
    const size_t n = (size_t)2 * FS_CPU_BR * p->D + (size_t)2 * FS_CPU_BC * p->D + (size_t)FS_CPU_BR * FS_CPU_BC;
    const int64_t tasks = (int64_t)p->B * p->H * ((p->Sq + FS_CPU_BR - 1) / FS_CPU_BR);
    const double flops = 4.0 * p->B * p->H * (double)p->Sq * p->Sk * p->D;
    attention_job job = {p, fs_rotary_table(p)};
    const int rc = fs_cpu_parallel(tasks, fs_cpu_threads_for(flops, num_threads), n * real, attention_task, &job, poll,
                                   poll_ctx);
    free((void *)job.rot);
    return rc;
}
