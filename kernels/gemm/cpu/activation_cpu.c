/* CPU reference of the elementwise passes around a differentiable linear layer (gemm/activation.h): y = act(h) or
 * silu(g) u forward; dh = dy act'(h) with the bias gradient's column sums, or (dg, du) for SwiGLU, backward. Math in
 * double for every dtype. Run: pytest tests/test_linear_backward_cpu.py (against NumPy in float64).
 *
 * Tasks are 64-column blocks walking every row, so each bias-gradient column is summed by one task in row order.
 */
#include "gemm/cpu/activation_cpu.h"
#include "gemm/cpu/gemm_cpu.h"
#include "common/half.h"

#include <math.h>

#define FS_ACT_CB 64 /* columns per task */

/* d act(h) / dh in double (relu: the gradient passes where h <= 0 is false, as torch lets a NaN through). */
double fs_activate_grad(fs_activation act, double h)
{
    switch (act) {
    case FS_ACT_RELU: return h <= 0.0 ? 0.0 : 1.0;
    case FS_ACT_GELU: return 0.5 * (1.0 + erf(h * 0.70710678118654752440)) + h * 0.39894228040143267794 * exp(-0.5 * h * h);
    case FS_ACT_GELU_TANH: {
        const double k = 0.79788456080286535588, c = 0.044715, t = tanh(k * (h + c * h * h * h));
        return 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * k * (1.0 + 3.0 * c * h * h);
    }
    case FS_ACT_SILU: {
        const double s = 1.0 / (1.0 + exp(-h));
        return s * (1.0 + h * (1.0 - s));
    }
    default: return 1.0;
    }
}

static size_t item(fs_dtype dt) { return dt == FS_F64 ? 8 : dt == FS_F32 ? 4 : 2; }

/* Load cols values of row r, column c0 of a [rows, ld] matrix into dst. */
static void load(const void *base, int64_t ld, fs_dtype dt, int r, int c0, int cols, double *dst)
{
    fs_load_row_d((const char *)base + ((int64_t)r * ld + c0) * item(dt), dt, dst, cols);
}

/* Store cols values from src to row r, column c0. */
static void store(const double *src, void *base, int64_t ld, fs_dtype dt, int r, int c0, int cols)
{
    fs_store_row_d(src, dt, (char *)base + ((int64_t)r * ld + c0) * item(dt), cols);
}

/* One task: columns [64 t, 64 t + 64) over every row. */
static void act_task(void *ctx, int64_t t, void *scratch)
{
    const fs_act_params *p = (const fs_act_params *)ctx;
    const int c0 = (int)t * FS_ACT_CB, n = p->N - c0 < FS_ACT_CB ? p->N - c0 : FS_ACT_CB;
    double *a = (double *)scratch, *b = a + FS_ACT_CB, *d = b + FS_ACT_CB, *o = d + FS_ACT_CB, *sum = o + FS_ACT_CB;
    for (int j = 0; j < n; j++) sum[j] = 0.0;
    for (int r = 0; r < p->M; r++) {
        if (p->h) load(p->h, p->ldh, p->dtype, r, c0, n, a);
        else for (int j = 0; j < n; j++) a[j] = 0.0; /* backward without an activation: no h */
        if (p->swiglu) load(p->h, p->ldh, p->dtype, r, p->N + c0, n, b);
        if (p->backward) load(p->dy, p->lddy, p->dtype, r, c0, n, d);
        for (int j = 0; j < n; j++) {
            if (!p->backward) {
                o[j] = p->swiglu ? fs_activate(FS_ACT_SILU, a[j]) * b[j] : fs_activate(p->act, a[j]);
            } else if (!p->swiglu) {
                o[j] = d[j] * fs_activate_grad(p->act, a[j]);
                sum[j] += o[j];
            } else { /* dg = dy u silu'(g), du = dy silu(g) */
                o[j] = d[j] * b[j] * fs_activate_grad(FS_ACT_SILU, a[j]);
                b[j] = d[j] * fs_activate(FS_ACT_SILU, a[j]);
            }
        }
        if (p->out) store(o, p->out, p->ldo, p->dtype, r, c0, n);
        if (p->backward && p->swiglu) store(b, p->out, p->ldo, p->dtype, r, p->N + c0, n);
    }
    if (p->backward && !p->swiglu && p->dbias) fs_store_row_d(sum, p->dbias_dtype, (char *)p->dbias + c0 * item(p->dbias_dtype), n);
}

int fs_activation_cpu(const fs_act_params *p, int num_threads, fs_cpu_poll poll, void *poll_ctx)
{
    const int64_t tasks = (p->N + FS_ACT_CB - 1) / FS_ACT_CB;
    return fs_cpu_parallel(tasks, fs_cpu_threads_for(20.0 * p->M * (double)p->N, num_threads), 5 * FS_ACT_CB * sizeof(double),
                           act_task, (void *)p, poll, poll_ctx);
}
