/* What every CUDA GEMM kernel does around its main loop (gemm/sm80, gemm/sm90): the order output
 * tiles are visited in, and the epilogue that turns fp32 accumulators into y = act(acc + bias) (or
 * silu(gate) * up) in the output dtype with a single store. */
#ifndef FLASHSCI_GEMM_EPILOGUE_CUH
#define FLASHSCI_GEMM_EPILOGUE_CUH

#include <math.h>

#include "common/cuda_ptx.cuh"
#include "gemm/params.h"

#define FS_GEMM_GROUP 8 /* output tiles are visited in column sweeps over groups of this many row tiles */

/* Output tile t of tiles_m x tiles_n in grouped order: consecutive tiles share W columns and x rows in L2. */
FS_DEV void gemm_tile_coords(int t, int tiles_m, int tiles_n, int *tm, int *tn)
{
    const int per_group = FS_GEMM_GROUP * tiles_n, first = t / per_group * FS_GEMM_GROUP;
    const int rows = min(tiles_m - first, FS_GEMM_GROUP), r = t % per_group;
    *tm = first + r % rows;
    *tn = r / rows;
}

/* erfc(|v| / sqrt2) / 2 by the polynomial of gemm_activate's gelu (Phi(v) is 1 minus it for v >= 0, it otherwise). */
FS_DEV float gelu_half_erfc(float v)
{
    const float z = fabsf(v);
    float t = fmaf(5.38297490e-06f, z, 4.88906371e-05f);
    t = fmaf(t, z, 3.80035744e-05f);
    t = fmaf(t, z, 3.27762635e-03f);
    t = fmaf(t, z, 2.11410057e-02f);
    t = fmaf(t, z, 4.98673469e-02f);
    float q = fmaf(t, z, 1.f);
    q *= q;
    q *= q;
    q *= q;
    q *= q;
    return 0.5f * rcp_approx(q);
}

/* The activation in fp32, as torch defines it (gelu: erf form; gelu_tanh: the tanh approximation), in few
 * instructions: an epilogue pays them per output value while the tensor cores wait (erff alone is ~27).
 *   gelu:      v Phi(v), Phi from erfc(z) = (1 + a1 z + ... + a6 z^6)^-16 at z = |v| / sqrt2 (Abramowitz & Stegun
 *              7.1.28, |error| <= 3e-7; the a_i below are theirs times 2^(-i/2), so the polynomial takes |v|):
 *              v >= 0: v - v erfc / 2, else v erfc / 2.
 *   gelu_tanh: 0.5 v (1 + tanh u) = v / (1 + e^(-2u)), u = sqrt(2/pi) (v + 0.044715 v^3).
 *   silu:      v / (1 + e^(-v)).
 * Max |error| against the exact functions in fp32 (numpy emulation, v in [-12, 12], silu [-30, 30]): 7e-7, 5e-7
 * and 1.3e-6 (at v = 14), each within 4e-7 max(1, |v|).
 * Large |v| saturate correctly: the polynomial's 16th power or the exponential overflows to inf, 1 / inf = 0. */
template <fs_activation ACT> FS_DEV float gemm_activate(float v)
{
    constexpr float LOG2E = 1.4426950408889634f, TANH_K = -2.f * 0.79788456080286536f * LOG2E;
    switch (ACT) {
    case FS_ACT_RELU: return v < 0.f ? 0.f : v; /* NaN stays NaN, as torch.relu (fmaxf would give 0) */
    case FS_ACT_GELU: {
        const float half_erfc_v = v * gelu_half_erfc(v);
        return v >= 0.f ? v - half_erfc_v : half_erfc_v;
    }
    case FS_ACT_GELU_TANH: return v * rcp_approx(1.f + exp2_approx(v * fmaf(0.044715f * TANH_K, v * v, TANH_K)));
    case FS_ACT_SILU: return v * rcp_approx(1.f + exp2_approx(-LOG2E * v));
    default: return v;
    }
}

/* Element i of a bias array (global or shared memory) of dtype dt (fp16, bf16 or fp32), widened to float. */
FS_DEV float gemm_bias_value(const void *bias, fs_dtype dt, int i)
{
    if (dt == FS_F32) return static_cast<const float *>(bias)[i];
    const uint16_t b = static_cast<const uint16_t *>(bias)[i];
    return dt == FS_F16 ? __half2float(__ushort_as_half(b)) : __bfloat162float(__ushort_as_bfloat16(b));
}

/* The bias of output column col as float, or 0 without a bias or past N: the sm80 kernel starts its accumulators
 * from it. (The sm90 kernel copies the tile's bias into shared memory with the tile's first K step instead: wgmma
 * accumulators must not be written by loads inside the pipeline, or ptxas serialises the wgmmas.) */
FS_DEV float gemm_acc_init(const fs_gemm_params &p, int col)
{
    return p.bias && col < p.N ? gemm_bias_value(p.bias, p.bias_dtype, col) : 0.f;
}

/* Two output values from accumulators v0, v1 (bias included; with SwiGLU: gate values, u0, u1 the up values). */
template <bool SWIGLU, fs_activation ACT> FS_DEV float2 gemm_finish_pair(float v0, float v1, float u0, float u1)
{
    if (SWIGLU) return make_float2(gemm_activate<FS_ACT_SILU>(v0) * u0, gemm_activate<FS_ACT_SILU>(v1) * u1);
    return make_float2(gemm_activate<ACT>(v0), gemm_activate<ACT>(v1));
}

/* Finish output elements (row, col) and (row, col + 1) (gemm_finish_pair) and store them; col is even and N is
 * a multiple of 8, so both exist when col < N. */
template <bool SWIGLU, fs_activation ACT>
FS_DEV void gemm_store_pair(const fs_gemm_params &p, int row, int col, float v0, float v1, float u0, float u1)
{
    if (row >= p.M || col >= p.N) return;
    const float2 v = gemm_finish_pair<SWIGLU, ACT>(v0, v1, u0, u1);
    v0 = v.x;
    v1 = v.y;
    const int64_t i = (int64_t)row * p.ldy + col;
    if (p.out_dtype == FS_F32) *reinterpret_cast<float2 *>(static_cast<float *>(p.y) + i) = make_float2(v0, v1);
    else if (p.out_dtype == FS_F16) *reinterpret_cast<uint32_t *>(static_cast<__half *>(p.y) + i) = pack2<__half>(v0, v1);
    else *reinterpret_cast<uint32_t *>(static_cast<__nv_bfloat16 *>(p.y) + i) = pack2<__nv_bfloat16>(v0, v1);
}

/* Run EPI::template run<ACT>(args...) for the runtime activation: each activation gets its own fully
 * unrolled epilogue loop (one loop with a switch inside does not unroll, and the accumulators it indexes
 * go to local memory). */
template <typename EPI, typename... Args> FS_DEV void gemm_epilogue_dispatch(fs_activation act, Args &&...args)
{
    switch (act) {
    case FS_ACT_RELU: EPI::template run<FS_ACT_RELU>(args...); break;
    case FS_ACT_GELU: EPI::template run<FS_ACT_GELU>(args...); break;
    case FS_ACT_GELU_TANH: EPI::template run<FS_ACT_GELU_TANH>(args...); break;
    case FS_ACT_SILU: EPI::template run<FS_ACT_SILU>(args...); break;
    default: EPI::template run<FS_ACT_NONE>(args...); break;
    }
}

#endif
