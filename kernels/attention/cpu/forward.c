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

#define REAL float
#define BLOCK_FN attention_block_f
#define ROTATE_FN fs_rotate_f
#define LOAD_ROW fs_load_row_f
#define STORE_ROW fs_store_row_f
#define EXP expf
#define LOG logf
#include "attention/cpu/forward_block.h"
#undef REAL
#undef BLOCK_FN
#undef ROTATE_FN
#undef LOAD_ROW
#undef STORE_ROW
#undef EXP
#undef LOG

#define REAL double
#define BLOCK_FN attention_block_d
#define ROTATE_FN fs_rotate_d
#define LOAD_ROW fs_load_row_d
#define STORE_ROW fs_store_row_d
#define EXP exp
#define LOG log
#include "attention/cpu/forward_block.h"

/* One task: query block (b * H + h) * q_blocks + qb. */
static void attention_task(void *ctx, int64_t t, void *scratch)
{
    const fs_attn_params *p = (const fs_attn_params *)ctx;
    const int64_t q_blocks = (p->Sq + FS_CPU_BR - 1) / FS_CPU_BR;
    const int64_t bh = t / q_blocks, i0 = (t % q_blocks) * FS_CPU_BR;
    if (p->dtype == FS_F64) attention_block_d(p, bh / p->H, bh % p->H, i0, (double *)scratch);
    else attention_block_f(p, bh / p->H, bh % p->H, i0, (float *)scratch);
}

int fs_attention_cpu(const fs_attn_params *p, int num_threads, fs_cpu_poll poll, void *poll_ctx)
{
    const size_t real = p->dtype == FS_F64 ? sizeof(double) : sizeof(float);
    const size_t n = (size_t)2 * FS_CPU_BR * p->D + (size_t)2 * FS_CPU_BC * p->D + (size_t)FS_CPU_BR * FS_CPU_BC;
    const int64_t tasks = (int64_t)p->B * p->H * ((p->Sq + FS_CPU_BR - 1) / FS_CPU_BR);
    const double flops = 4.0 * p->B * p->H * (double)p->Sq * p->Sk * p->D;
    return fs_cpu_parallel(tasks, fs_cpu_threads_for(flops, num_threads), n * real, attention_task, (void *)p, poll,
                           poll_ctx);
}
