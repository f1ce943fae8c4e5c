/* PTX wrappers and small helpers shared by the CUDA kernel families (attention_sm80/90.cu, gemm_sm80/90.cu):
 * async copies, ldmatrix, mma.sync, the swizzled tile layout, fp16/bf16 packing, the exp2 unit, and the
 * host-side shared-memory opt-in. */
#ifndef FLASHSCI_CUDA_PTX_CUH
#define FLASHSCI_CUDA_PTX_CUH

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define FS_DEV static __device__ __forceinline__
#define FS_DEV_T __device__ __forceinline__ /* templates and their specialisations: no storage class */

#if __CUDA_ARCH__ >= 900
/* Every thread of the thread-block cluster waits for all of them: shared-memory writes before it are visible to the
 * cluster's blocks after it. */
FS_DEV void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
/* The generic address of *p (this block's shared memory) in the shared memory of the cluster's block `rank`. */
FS_DEV const float *cluster_peer(const float *p, int rank)
{
    uint64_t out;
    asm("mapa.u64 %0, %1, %2;\n" : "=l"(out) : "l"(p), "r"(rank));
    return reinterpret_cast<const float *>(out);
}
#endif

/* Shared-memory address (32-bit) of a generic pointer into shared memory. */
FS_DEV uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* Four floats to a 16-byte aligned shared-memory address. */
FS_DEV void st_shared_v4(uint32_t addr, float x, float y, float z, float w)
{
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
}

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

/* 1 / x on the special-function unit (relative error about 1 ulp; 1 / inf = 0). */
FS_DEV float rcp_approx(float x)
{
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* A packed pair of T widened to two floats. */
template <typename T> FS_DEV_T float2 unpack2(uint32_t w);
template <> FS_DEV_T float2 unpack2<__half>(uint32_t w) { return __half22float2(*reinterpret_cast<__half2 *>(&w)); }
template <> FS_DEV_T float2 unpack2<__nv_bfloat16>(uint32_t w) { return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&w)); }

/* Four 8x8 b16 matrices from shared memory, lane l giving the row address of matrix l / 8 (trans: transposed). */
FS_DEV void ldmatrix_x4(uint32_t addr, uint32_t r[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
FS_DEV void ldmatrix_x4_trans(uint32_t addr, uint32_t r[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
/* Four 8x8 b16 matrices to shared memory (sm_90+): lane l gives the row address of matrix l / 8, and r[i] holds its
 * pair of matrix i (row l / 4, columns 2 (l % 4), + 1): the m16n8 accumulator layout, packed. */
FS_DEV void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1), "r"(r2),
                 "r"(r3) : "memory");
}
#endif

/* C += A B for one m16n8k16 tile (A row-major 16x16, B column-major 16x8, C fp32). */
template <typename T> FS_DEV_T void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
template <> FS_DEV_T void mma16816<__half>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> FS_DEV_T void mma16816<__nv_bfloat16>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Element offset of (row, col) in a swizzled tile: 16-byte chunk index XOR (row mod 8), so the eight
 * rows one ldmatrix reads hit eight different bank groups. */
template <int PITCH> FS_DEV int swz(int row, int col)
{
    return row * PITCH + ((((col >> 3) ^ (row & 7)) << 3) | (col & 7));
}

#endif
