/* The elementwise passes of a differentiable linear layer (gemm/activation.h): y = act(h) or silu(g) u forward;
 * dh = dy act'(h) with the bias gradient's column sums, or (dg, du) for SwiGLU, backward. fp16/bf16, math in fp32.
 *
 * Build: part of the extension (CMakeLists.txt); alone:
 *   nvcc -O3 -std=c++17 -arch=sm_80 -Ikernels -c kernels/gemm/activation.cu
 * Run:   bash benchmarks/gpu_check.sh   (tests/test_linear_backward_gpu.py; CPU reference gemm/cpu/activation_cpu.c)
 *
 * A block of 16 x 16 threads covers 128 columns (a thread 8 of them: 16-byte loads and stores) and walks rows 16
 * apart; with the bias gradient each thread sums its columns over its rows, the block folds its 16 row lanes in
 * shared memory and adds the 128 sums to an fp32 accumulator with atomics, then one more launch converts it.
 * The forward uses the GEMM epilogue's activations (gemm/epilogue.cuh), so the values are the fused kernel's.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common/cuda_ptx.cuh"
#include "common/workspace.h"
#include "gemm/activation_launch.h"
#include "gemm/epilogue.cuh"

#define COLS_PER_THREAD 8
#define LANES_X 16 /* column chunks per block: 128 columns */
#define LANES_Y 16 /* row lanes */

enum { MODE_FORWARD, MODE_SWIGLU_FORWARD, MODE_BACKWARD, MODE_SWIGLU_BACKWARD };

/* d act(h) / dh in fp32, torch's formulas in few instructions (the pass moves three arrays, and erff, tanhf and the
 * IEEE division made it compute-bound: ESM2-3B fc1 305 -> 254 us on an H200): relu passes the gradient where h > 0 is
 * not false, as torch lets a NaN through;
 *   gelu:      Phi(h) + h phi(h), Phi from the forward's erfc polynomial (gemm/epilogue.cuh), phi(h) = e^(-h^2/2) / sqrt(2 pi);
 *   gelu_tanh: 0.5 (1 + t) + 0.5 h (1 - t^2) k (1 + 3 c h^2), t = tanh(u) = 1 - 2 / (1 + e^(2u)), u = k (h + c h^3);
 *   silu:      s (1 + h (1 - s)), s = sigmoid(h). */
template <fs_activation ACT> FS_DEV float act_grad(float h)
{
    constexpr float LOG2E = 1.4426950408889634f;
    switch (ACT) {
    case FS_ACT_RELU: return h <= 0.f ? 0.f : 1.f;
    case FS_ACT_GELU: {
        const float half_erfc = gelu_half_erfc(h), phi = 0.39894228040143268f * exp2_approx(-0.5f * LOG2E * h * h);
        return (h >= 0.f ? 1.f - half_erfc : half_erfc) + h * phi;
    }
    case FS_ACT_GELU_TANH: {
        const float k = 0.79788456080286536f, c = 0.044715f;
        const float t = 1.f - 2.f * rcp_approx(1.f + exp2_approx(2.f * LOG2E * k * (h + c * h * h * h)));
        return 0.5f * (1.f + t) + 0.5f * h * (1.f - t * t) * k * (1.f + 3.f * c * h * h);
    }
    case FS_ACT_SILU: {
        const float s = rcp_approx(1.f + exp2_approx(-LOG2E * h));
        return s * (1.f + h * (1.f - s));
    }
    default: return 1.f;
    }
}

/* Eight values of T from 16 bytes at p, widened. */
template <typename T> FS_DEV void load8(const T *p, float (&v)[8])
{
    const uint4 raw = *reinterpret_cast<const uint4 *>(p);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 f = unpack2<T>(w[i]);
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
    }
}

/* Eight floats rounded to T, 16 bytes to p. */
template <typename T> FS_DEV void store8(T *p, const float (&v)[8])
{
    *reinterpret_cast<uint4 *>(p) = make_uint4(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]), pack2<T>(v[4], v[5]), pack2<T>(v[6], v[7]));
}

template <typename T, fs_activation ACT, int MODE>
__global__ void __launch_bounds__(LANES_X *LANES_Y) activation_kernel(const fs_act_params p, float *dbias_acc)
{
    __shared__ float sums[LANES_Y][LANES_X * COLS_PER_THREAD];
    const int tx = threadIdx.x % LANES_X, ty = threadIdx.x / LANES_X;
    const int col = (blockIdx.x * LANES_X + tx) * COLS_PER_THREAD;
    const T *h = static_cast<const T *>(p.h), *dy = static_cast<const T *>(p.dy);
    T *out = static_cast<T *>(p.out);
    float acc[COLS_PER_THREAD] = {};
    if (col < p.N) {
        for (int r = blockIdx.y * LANES_Y + ty; r < p.M; r += gridDim.y * LANES_Y) {
            float a[8] = {}, b[8], d[8], o[8];
            if (MODE != MODE_BACKWARD || ACT != FS_ACT_NONE) load8(h + (int64_t)r * p.ldh + col, a); /* none: no h */
            if (MODE == MODE_SWIGLU_FORWARD || MODE == MODE_SWIGLU_BACKWARD) load8(h + (int64_t)r * p.ldh + p.N + col, b);
            if (MODE == MODE_BACKWARD || MODE == MODE_SWIGLU_BACKWARD) load8(dy + (int64_t)r * p.lddy + col, d);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                if (MODE == MODE_FORWARD) o[i] = gemm_activate<ACT>(a[i]);
                else if (MODE == MODE_SWIGLU_FORWARD) o[i] = gemm_activate<FS_ACT_SILU>(a[i]) * b[i];
                else if (MODE == MODE_BACKWARD) o[i] = d[i] * act_grad<ACT>(a[i]);
                else { /* dg = dy u silu'(g) into o, du = dy silu(g) into b */
                    o[i] = d[i] * b[i] * act_grad<FS_ACT_SILU>(a[i]);
                    b[i] = d[i] * gemm_activate<FS_ACT_SILU>(a[i]);
                }
                acc[i] += o[i];
            }
            if (out) store8(out + (int64_t)r * p.ldo + col, o);
            if (MODE == MODE_SWIGLU_BACKWARD) store8(out + (int64_t)r * p.ldo + p.N + col, b);
        }
    }
    if constexpr (MODE == MODE_BACKWARD) {
        if (!dbias_acc) return;
        /* the bias gradient: fold the 16 row lanes, one atomic per column */
#pragma unroll
        for (int i = 0; i < 8; i++) sums[ty][tx * COLS_PER_THREAD + i] = acc[i];
        __syncthreads();
        if (threadIdx.x < LANES_X * COLS_PER_THREAD) {
            const int c = blockIdx.x * LANES_X * COLS_PER_THREAD + threadIdx.x;
            float s = 0.f;
#pragma unroll
            for (int y = 0; y < LANES_Y; y++) s += sums[y][threadIdx.x];
            if (c < p.N) atomicAdd(dbias_acc + c, s);
        }
    }
}

/* The fp32 column sums to the bias gradient's dtype. */
__global__ void convert_bias_grad(const float *acc, void *dbias, fs_dtype dt, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (dt == FS_F16) static_cast<__half *>(dbias)[i] = __float2half_rn(acc[i]);
    else if (dt == FS_BF16) static_cast<__nv_bfloat16 *>(dbias)[i] = __float2bfloat16_rn(acc[i]);
    else static_cast<float *>(dbias)[i] = acc[i];
}

template <typename T, fs_activation ACT>
static cudaError_t launch_mode(const fs_act_params *p, float *dbias_acc, dim3 grid, cudaStream_t stream)
{
    const int threads = LANES_X * LANES_Y;
    if (!p->backward && !p->swiglu) activation_kernel<T, ACT, MODE_FORWARD><<<grid, threads, 0, stream>>>(*p, dbias_acc);
    else if (!p->backward) activation_kernel<T, FS_ACT_SILU, MODE_SWIGLU_FORWARD><<<grid, threads, 0, stream>>>(*p, dbias_acc);
    else if (!p->swiglu) activation_kernel<T, ACT, MODE_BACKWARD><<<grid, threads, 0, stream>>>(*p, dbias_acc);
    else activation_kernel<T, FS_ACT_SILU, MODE_SWIGLU_BACKWARD><<<grid, threads, 0, stream>>>(*p, dbias_acc);
    return cudaGetLastError();
}

template <typename T> static cudaError_t launch_act(const fs_act_params *p, float *dbias_acc, dim3 grid, cudaStream_t stream)
{
    switch (p->swiglu ? FS_ACT_SILU : p->act) {
    case FS_ACT_RELU: return launch_mode<T, FS_ACT_RELU>(p, dbias_acc, grid, stream);
    case FS_ACT_GELU: return launch_mode<T, FS_ACT_GELU>(p, dbias_acc, grid, stream);
    case FS_ACT_GELU_TANH: return launch_mode<T, FS_ACT_GELU_TANH>(p, dbias_acc, grid, stream);
    case FS_ACT_SILU: return launch_mode<T, FS_ACT_SILU>(p, dbias_acc, grid, stream);
    default: return launch_mode<T, FS_ACT_NONE>(p, dbias_acc, grid, stream);
    }
}

extern "C" cudaError_t fs_activation_gpu(const fs_act_params *p, int device, cudaStream_t stream)
{
    if (p->M == 0 || p->N == 0) {
        /* no rows: the bias gradient is zero */
        return p->dbias && p->N ? cudaMemsetAsync(p->dbias, 0, (size_t)p->N * (p->dbias_dtype == FS_F32 ? 4 : 2), stream)
                                : cudaSuccess;
    }
    const int cols_per_block = LANES_X * COLS_PER_THREAD;
    const int gx = (p->N + cols_per_block - 1) / cols_per_block, rows_y = (p->M + LANES_Y - 1) / LANES_Y;
    const int gy = rows_y < 2048 / gx ? rows_y : (2048 / gx > 0 ? 2048 / gx : 1); /* about 2048 blocks */
    const dim3 grid(gx, gy > 65535 ? 65535 : gy);
    float *acc = NULL;
    void *ws = NULL;
    cudaError_t err = cudaSuccess;
    if (p->backward && !p->swiglu && p->dbias) {
        if (p->dbias_dtype == FS_F32) acc = static_cast<float *>(p->dbias);
        else if ((err = fs_workspace_get(device, stream, FS_COUNTER_BYTES + (size_t)p->N * 4, &ws)) != cudaSuccess) return err;
        else acc = reinterpret_cast<float *>(static_cast<unsigned char *>(ws) + FS_COUNTER_BYTES); /* past the counters */
        err = cudaMemsetAsync(acc, 0, (size_t)p->N * 4, stream);
    }
    if (err == cudaSuccess) err = p->dtype == FS_F16 ? launch_act<__half>(p, acc, grid, stream) : launch_act<__nv_bfloat16>(p, acc, grid, stream);
    if (err == cudaSuccess && ws) {
        convert_bias_grad<<<(p->N + 255) / 256, 256, 0, stream>>>(acc, p->dbias, p->dbias_dtype, p->N);
        err = cudaGetLastError();
    }
    if (ws) {
        const cudaError_t e2 = fs_workspace_release(stream, ws);
        if (err == cudaSuccess) err = e2;
    }
    return err;
}
