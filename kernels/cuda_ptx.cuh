/* PTX wrappers and small device helpers shared by the CUDA kernel families (attention_sm80.cu,
 * attention_sm90.cu): async copies, fp16/bf16 packing, the exp2 unit. */
#ifndef FLASHSCI_CUDA_PTX_CUH
#define FLASHSCI_CUDA_PTX_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define FS_DEV static __device__ __forceinline__
#define FS_DEV_T __device__ __forceinline__ /* templates and their specialisations: no storage class */

/* Shared-memory address (32-bit) of a generic pointer into shared memory. */
FS_DEV uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16-byte async copy global -> shared; zero-fills when !valid (src is then not read). */
FS_DEV void cp_async16(uint32_t dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
FS_DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> FS_DEV_T void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

/* Two floats rounded to a packed pair of T (lo in the low half). */
template <typename T> FS_DEV_T uint32_t pack2(float lo, float hi);
template <> FS_DEV_T uint32_t pack2<__half>(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}
template <> FS_DEV_T uint32_t pack2<__nv_bfloat16>(float lo, float hi)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* 2^x on the special-function unit (flushes denormals; exact enough for softmax weights). */
FS_DEV float exp2_approx(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* A packed pair of T widened to two floats. */
template <typename T> FS_DEV_T float2 unpack2(uint32_t w);
template <> FS_DEV_T float2 unpack2<__half>(uint32_t w) { return __half22float2(*reinterpret_cast<__half2 *>(&w)); }
template <> FS_DEV_T float2 unpack2<__nv_bfloat16>(uint32_t w) { return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&w)); }

#endif
