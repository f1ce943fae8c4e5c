/* wgmma (warpgroup MMA, sm_90a) wrappers shared by the Hopper kernel families (attention/sm90,
 * gemm/sm90): shared-memory descriptors, fences, and the m64nNk16 shapes they use, for fp16 and bf16.
 * Defines FS_WGMMA in sm_90a device code; other targets see none of it. */
#ifndef FLASHSCI_WGMMA_CUH
#define FLASHSCI_WGMMA_CUH

#include "common/cuda_ptx.cuh"

/* wgmma exists only in the sm_90a target; other targets compile the launchers and empty kernels */
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FS_WGMMA 1
#endif

#ifdef FS_WGMMA

/* Shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride byte offsets
 * (all in 16-byte units), swizzle mode 1 in bits 62-63. */
FS_DEV uint64_t desc_sw128(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((addr & 0x3ffff) >> 4) | (uint64_t)((lbo >> 4) & 0x3fff) << 16 |
           (uint64_t)((sbo >> 4) & 0x3fff) << 32 | 1ull << 62;
}
/* The first 1024-byte boundary (TMA's 128-byte swizzle and the descriptors address 1024-byte atoms) at or after p in
 * shared memory, computed through redux.sync so that it lands in a uniform register (otherwise ptxas keeps it in an
 * ordinary one and moves it over (R2UR) next to the wgmmas). */
FS_DEV unsigned char *smem_align1024(unsigned char *p)
{
    return p + __reduce_max_sync(0xffffffffu, (1024 - (smem_addr(p) & 1023)) & 1023);
}
FS_DEV void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
FS_DEV void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> FS_DEV_T void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
/* generic-proxy shared-memory writes (cp.async, st.shared) made visible to the async proxy (wgmma, TMA stores) */
FS_DEV void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* A warpgroup's m64 accumulator (8 NO columns: x[4 n + 2 r + c] is row 16 warp + gr + 8 r, column 8 n + 2 t4 + c),
 * times mul[r], as T into a tile of 128-byte rows in 64-column halves half_bytes apart at tile, 128-byte swizzle
 * (16-byte chunk k of row y at k ^ (y % 8)). Column groups n, n + 1 by one stmatrix: matrix i = lane / 8 holds rows
 * 8 (i & 1) .. + 7 of the warp's 16 and chunk n % 8 + i / 2 of half n / 8. */
template <int NO, typename T>
FS_DEV_T void stmatrix_rows_sw128(uint32_t tile, int half_bytes, const float (&x)[NO * 4], const float (&mul)[2], int warp,
                                  int lane)
{
    const uint32_t row_addr = tile + (warp * 16 + 8 * ((lane >> 3) & 1) + (lane & 7)) * 128;
#pragma unroll
    for (int n = 0; n < NO; n += 2)
        stmatrix_x4(row_addr + (n / 8) * half_bytes + (((n % 8 + (lane >> 4)) ^ (lane & 7)) << 4),
                    pack2<T>(x[4 * n] * mul[0], x[4 * n + 1] * mul[0]), pack2<T>(x[4 * n + 2] * mul[1], x[4 * n + 3] * mul[1]),
                    pack2<T>(x[4 * n + 4] * mul[0], x[4 * n + 5] * mul[0]), pack2<T>(x[4 * n + 6] * mul[1], x[4 * n + 7] * mul[1]));
}

/* D (64 x N, fp32) (+)= A (64 x 16, shared, K-major) B (16 x N, shared, K-major); acc = 0 overwrites D. */
template <int N, typename T> FS_DEV_T void wgmma_ss(float d[N / 2], uint64_t da, uint64_t db, int acc);
/* D (64 x N, fp32) (+)= A (64 x 16, shared, MN-major) B (16 x N, shared, MN-major); acc = 0 overwrites D. */
template <int N, typename T> FS_DEV_T void wgmma_ss_mn(float d[N / 2], uint64_t da, uint64_t db, int acc);
/* D (64 x N, fp32) (+)= A (64 x 16, shared) B (16 x N, shared), each K-major or, with TA / TB, MN-major. */
template <int N, typename T> struct wgmma_sst;
/* D (64 x N, fp32) += A (64 x 16, registers) B (16 x N, shared, MN-major). */
template <int N, typename T> FS_DEV_T void wgmma_rs(float d[N / 2], const uint32_t a[4], uint64_t db);
/* D (64 x N, fp32) (+)= A (64 x 16, registers) B (16 x N, shared, K-major); acc = 0 overwrites D. */
template <int N, typename T> FS_DEV_T void wgmma_rs_kmajor(float d[N / 2], const uint32_t a[4], uint64_t db, int acc);

/* Operand lists: "+f" accumulators d[i .. i + 7] and d[i .. i + 31]; register names %0 .. %127, 16 a row (an asm
 * template cannot count) */
#define FS_D8(i) \
    "+f"(d[i]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define FS_D32(i) FS_D8(i), FS_D8((i) + 8), FS_D8((i) + 16), FS_D8((i) + 24)
#define FS_R0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define FS_R16 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FS_R32 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define FS_R48 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FS_R64 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define FS_R80 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define FS_R96 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111"
#define FS_R112 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

/* One definition per shape: REGS names the N / 2 accumulators, the operands after them are named explicitly */
/* NAME: wgmma_ss (both operands K-major) or wgmma_ss_mn (both MN-major: TR "1, 1") */
#define FS_WGMMA_SS_AS(NAME, TR, N, TY, TN, REGS, DA, DB, ACC, ...) \
template <> FS_DEV_T void NAME<N, TY>(float d[N / 2], uint64_t da, uint64_t db, int acc) \
{ \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TN "." TN " {" REGS "}, " DA ", " DB ", p, 1, 1, " TR ";\n}\n" \
                 : __VA_ARGS__ : "l"(da), "l"(db), "r"(acc)); \
}
#define FS_WGMMA_SS(...) FS_WGMMA_SS_AS(wgmma_ss, "0, 0", __VA_ARGS__)
#define FS_WGMMA_SS_MN(...) FS_WGMMA_SS_AS(wgmma_ss_mn, "1, 1", __VA_ARGS__)
/* wgmma_sst<N, TY>::run<TA, TB>: the transpose flags as immediates */
#define FS_WGMMA_SST(N, TY, TN, REGS, DA, DB, ACC, TA, TB, ...) \
template <> struct wgmma_sst<N, TY> { \
    template <int TRA, int TRB> static __device__ __forceinline__ void run(float d[N / 2], uint64_t da, uint64_t db, int acc) \
    { \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\n" \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TN "." TN " {" REGS "}, " DA ", " DB ", p, 1, 1, " TA ", " TB ";\n}\n" \
                     : __VA_ARGS__ : "l"(da), "l"(db), "r"(acc), "n"(TRA), "n"(TRB)); \
    } \
};
#define FS_WGMMA_RS(N, TY, TN, REGS, A, DB, ...) \
template <> FS_DEV_T void wgmma_rs<N, TY>(float d[N / 2], const uint32_t a[4], uint64_t db) \
{ \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TN "." TN " {" REGS "}, {" A "}, " DB ", p, 1, 1, 1;\n}\n" \
                 : __VA_ARGS__ : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)); \
}
#define FS_WGMMA_RSK(N, TY, TN, REGS, A, DB, ACC, ...) \
template <> FS_DEV_T void wgmma_rs_kmajor<N, TY>(float d[N / 2], const uint32_t a[4], uint64_t db, int acc) \
{ \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TN "." TN " {" REGS "}, {" A "}, " DB ", p, 1, 1, 0;\n}\n" \
                 : __VA_ARGS__ : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc)); \
}
/* the shapes the kernels use, for fp16 and bf16 (TN: the PTX type name) */
#define FS_WGMMA_SHAPES(TY, TN) \
    FS_WGMMA_SS(64, TY, TN, FS_R0 ", " FS_R16, "%32", "%33", "%34", FS_D32(0)) \
    FS_WGMMA_SS(128, TY, TN, FS_R0 ", " FS_R16 ", " FS_R32 ", " FS_R48, "%64", "%65", "%66", FS_D32(0), FS_D32(32)) \
    FS_WGMMA_SS_MN(16, TY, TN, "%0, %1, %2, %3, %4, %5, %6, %7", "%8", "%9", "%10", FS_D8(0)) \
    FS_WGMMA_SS_MN(64, TY, TN, FS_R0 ", " FS_R16, "%32", "%33", "%34", FS_D32(0)) \
    FS_WGMMA_SST(128, TY, TN, FS_R0 ", " FS_R16 ", " FS_R32 ", " FS_R48, "%64", "%65", "%66", "%67", "%68", FS_D32(0), FS_D32(32)) \
    FS_WGMMA_SST(160, TY, TN, FS_R0 ", " FS_R16 ", " FS_R32 ", " FS_R48 ", " FS_R64, "%80", "%81", "%82", "%83", "%84", FS_D32(0), FS_D32(32), FS_D8(64), FS_D8(72)) \
    FS_WGMMA_SST(192, TY, TN, FS_R0 ", " FS_R16 ", " FS_R32 ", " FS_R48 ", " FS_R64 ", " FS_R80, "%96", "%97", "%98", "%99", "%100", FS_D32(0), FS_D32(32), FS_D32(64)) \
    FS_WGMMA_SST(256, TY, TN, FS_R0 ", " FS_R16 ", " FS_R32 ", " FS_R48 ", " FS_R64 ", " FS_R80 ", " FS_R96 ", " FS_R112, "%128", "%129", "%130", "%131", "%132", FS_D32(0), FS_D32(32), FS_D32(64), FS_D32(96)) \
    FS_WGMMA_RS(64, TY, TN, FS_R0 ", " FS_R16, "%32, %33, %34, %35", "%36", FS_D32(0)) \
    FS_WGMMA_RS(80, TY, TN, FS_R0 ", " FS_R16 ", %32, %33, %34, %35, %36, %37, %38, %39", "%40, %41, %42, %43", "%44", FS_D32(0), FS_D8(32)) \
    FS_WGMMA_RS(128, TY, TN, FS_R0 ", " FS_R16 ", " FS_R32 ", " FS_R48, "%64, %65, %66, %67", "%68", FS_D32(0), FS_D32(32)) \
    FS_WGMMA_RSK(128, TY, TN, FS_R0 ", " FS_R16 ", " FS_R32 ", " FS_R48, "%64, %65, %66, %67", "%68", "%69", FS_D32(0), FS_D32(32))
FS_WGMMA_SHAPES(__half, "f16")
FS_WGMMA_SHAPES(__nv_bfloat16, "bf16")
#endif

#endif
