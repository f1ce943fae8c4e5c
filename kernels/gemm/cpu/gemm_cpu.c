/* CPU GEMM in C with the bias / activation / SwiGLU epilogue, float64 accumulation for every dtype.
 *
 * Reference beside the CUDA kernels (gemm/sm80, gemm/sm90): tests compare it with a float64 NumPy
 * reference and with the GPU. Run: pytest tests/test_linear_cpu.py.
 *
 * Tasks are (32-row block of X) x (64-row block of W); each task walks K in 256-wide chunks, widening the
 * chunk of X and W to double in its scratch (either stored transposed for the backward's products), and keeps the
 * 32 x 64 accumulators there too.
 *
 * History (2-core CI machine):
 *   v1  blocked dot products, 4 partial sums per dot (vectorisable without -ffast-math)
 */
#include "gemm/cpu/gemm_cpu.h"
#include "common/cpu_pool.h"
#include "common/half.h"

#include <math.h>

#define FS_GEMM_MB 32  /* rows of X per task  */
#define FS_GEMM_NB 64  /* rows of W per task  */
#define FS_GEMM_KC 256 /* K chunk widened at once */

double fs_activate(fs_activation act, double v)
{
    switch (act) {
    case FS_ACT_RELU: return v < 0.0 ? 0.0 : v; /* NaN stays NaN, as torch.relu */
    case FS_ACT_GELU: return 0.5 * v * (1.0 + erf(v * 0.70710678118654752440));
    case FS_ACT_GELU_TANH: return 0.5 * v * (1.0 + tanh(0.79788456080286535588 * (v + 0.044715 * v * v * v)));
    case FS_ACT_SILU: return v / (1.0 + exp(-v));
    default: return v;
    }
}

/* Dot product of two double rows with four partial sums. */
static double dot(const double *a, const double *b, int n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

/* Widen rows [r0, r0 + rows) x columns [k0, k0 + kc) of a row-major matrix into dst (kc doubles per row). */
static void widen(const void *base, int64_t ld, fs_dtype dt, int r0, int rows, int k0, int kc, double *dst)
{
    const size_t item = dt == FS_F64 ? 8 : dt == FS_F32 ? 4 : 2;
    for (int r = 0; r < rows; r++)
        fs_load_row_d((const char *)base + ((int64_t)(r0 + r) * ld + k0) * item, dt, dst + (size_t)r * kc, kc);
}

/* The same block of a matrix stored transposed (element (r, k) at base[k ld + r]), into dst as above. */
static void widen_t(const void *base, int64_t ld, fs_dtype dt, int r0, int rows, int k0, int kc, double *dst)
{
    const size_t item = dt == FS_F64 ? 8 : dt == FS_F32 ? 4 : 2;
    double line[FS_GEMM_NB];
    for (int k = 0; k < kc; k++) {
        fs_load_row_d((const char *)base + ((int64_t)(k0 + k) * ld + r0) * item, dt, line, rows);
        for (int r = 0; r < rows; r++) dst[(size_t)r * kc + k] = line[r];
    }
}

/* Scratch doubles per task: X chunk, W chunk (and W2 chunk), accumulators (two sets for SwiGLU), one row. */
static size_t scratch_doubles(void)
{
    return (size_t)FS_GEMM_MB * FS_GEMM_KC + 2 * (size_t)FS_GEMM_NB * FS_GEMM_KC + 2 * (size_t)FS_GEMM_MB * FS_GEMM_NB +
           FS_GEMM_NB;
}

/* One task: output block (mb, nb) = (t / n_blocks, t % n_blocks). */
static void gemm_task(void *ctx, int64_t t, void *scratch)
{
    const fs_gemm_params *p = (const fs_gemm_params *)ctx;
    const int n_blocks = (p->N + FS_GEMM_NB - 1) / FS_GEMM_NB;
    const int m0 = (int)(t / n_blocks) * FS_GEMM_MB, n0 = (int)(t % n_blocks) * FS_GEMM_NB;
    const int mb = p->M - m0 < FS_GEMM_MB ? p->M - m0 : FS_GEMM_MB, nb = p->N - n0 < FS_GEMM_NB ? p->N - n0 : FS_GEMM_NB;
    double *xs = (double *)scratch, *ws = xs + FS_GEMM_MB * FS_GEMM_KC, *w2s = ws + FS_GEMM_NB * FS_GEMM_KC;
    double *acc = w2s + FS_GEMM_NB * FS_GEMM_KC, *acc2 = acc + FS_GEMM_MB * FS_GEMM_NB, *row = acc2 + FS_GEMM_MB * FS_GEMM_NB;
    for (int i = 0; i < 2 * FS_GEMM_MB * FS_GEMM_NB; i++) acc[i] = 0.0;

    /* W^T in two halves (trans_w with w2): X's columns k against w's rows k, then w2's rows k - K / 2 */
    const int halves = p->trans_w && p->w2, k_half = halves ? p->K / 2 : p->K;
    for (int k0 = 0, kc; k0 < p->K; k0 += kc) {
        const int second = halves && k0 >= k_half, end = second || !halves ? p->K : k_half;
        kc = end - k0 < FS_GEMM_KC ? end - k0 : FS_GEMM_KC;
        (p->trans_x ? widen_t : widen)(p->x, p->ldx, p->dtype, m0, mb, k0, kc, xs);
        if (second) widen_t(p->w2, p->ldw2, p->dtype, n0, nb, k0 - k_half, kc, ws);
        else (p->trans_w ? widen_t : widen)(p->w, p->ldw, p->dtype, n0, nb, k0, kc, ws);
        if (p->swiglu) widen(p->w2, p->ldw2, p->dtype, n0, nb, k0, kc, w2s);
        for (int i = 0; i < mb; i++)
            for (int j = 0; j < nb; j++) {
                acc[i * FS_GEMM_NB + j] += dot(xs + (size_t)i * kc, ws + (size_t)j * kc, kc);
                if (p->swiglu) acc2[i * FS_GEMM_NB + j] += dot(xs + (size_t)i * kc, w2s + (size_t)j * kc, kc);
            }
    }

    /* epilogue: y = act(acc + bias), or silu(acc) * acc2 */
    double bias[FS_GEMM_NB];
    if (p->bias) widen(p->bias, 0, p->bias_dtype, 0, 1, n0, nb, bias);
    const size_t out_item = p->out_dtype == FS_F64 ? 8 : p->out_dtype == FS_F32 ? 4 : 2;
    for (int i = 0; i < mb; i++) {
        for (int j = 0; j < nb; j++) {
            const double v = acc[i * FS_GEMM_NB + j] + (p->bias ? bias[j] : 0.0);
            row[j] = p->swiglu ? fs_activate(FS_ACT_SILU, v) * acc2[i * FS_GEMM_NB + j] : fs_activate(p->act, v);
        }
        fs_store_row_d(row, p->out_dtype, (char *)p->y + ((int64_t)(m0 + i) * p->ldy + n0) * out_item, nb);
    }
}

int fs_gemm_cpu(const fs_gemm_params *p, int num_threads, fs_cpu_poll poll, void *poll_ctx)
{
    const int64_t tasks = (int64_t)((p->M + FS_GEMM_MB - 1) / FS_GEMM_MB) * ((p->N + FS_GEMM_NB - 1) / FS_GEMM_NB);
    const double flops = 2.0 * p->M * (double)p->N * p->K * (p->swiglu ? 2 : 1);
    return fs_cpu_parallel(tasks, fs_cpu_threads_for(flops, num_threads), scratch_doubles() * sizeof(double), gemm_task,
                           (void *)p, poll, poll_ctx);
}
