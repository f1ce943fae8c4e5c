/* mbarriers and TMA (the Hopper tensor memory accelerator) shared by the sm_90a kernel families
 * (attention/sm90, gemm/sm90): barrier init / arrive / wait in device code, bulk tensor loads of 2-D and
 * 4-D boxes and stores of 2-D and 4-D ones, and on the host cuTensorMapEncodeTiled fetched from the driver through the
 * runtime. */
#ifndef FLASHSCI_TMA_CUH
#define FLASHSCI_TMA_CUH

#include <cuda.h>

#include "common/launch.cuh"
#include "common/wgmma.cuh"

#ifdef FS_WGMMA
FS_DEV void mbar_init(uint64_t *bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
/* The initialised barriers made visible to the async proxy (TMA) and the other threads (after a barrier). */
FS_DEV void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
/* Arrive once and add tx bytes the phase must also see land. */
FS_DEV void mbar_expect_tx(uint64_t *bar, uint32_t tx)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(tx) : "memory");
}
/* Add tx bytes the current phase must also see land, without arriving (before the phase's last arrival). */
FS_DEV void mbar_add_tx(uint64_t *bar, uint32_t tx)
{
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(tx) : "memory");
}
FS_DEV void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
/* Wait until the phase of the given parity has completed. */
FS_DEV void mbar_wait(uint64_t *bar, int parity)
{
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    } while (!done);
}
/* TMA: the box at (c0, c1) of a 2-D tensor map into shared memory, completing on bar. */
FS_DEV void tma_load_2d(void *dst, const CUtensorMap *map, int c0, int c1, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar)) : "memory");
}
/* TMA: the box at (c0, c1, c2, c3) of a 4-D tensor map into shared memory, completing on bar. */
FS_DEV void tma_load_4d(void *dst, const CUtensorMap *map, int c0, int c1, int c2, int c3, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 ::"r"(smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar)) : "memory");
}
/* Bulk copy (no tensor map) of bytes (a multiple of 16; both addresses 16-byte aligned) from global into shared
 * memory, completing on bar. */
FS_DEV void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}
/* Fetch a __grid_constant__ tensor map into the descriptor cache ahead of its first use. */
FS_DEV void tma_prefetch_map(const CUtensorMap *map) { asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory"); }
/* TMA: a box of shared memory to (c0, c1) of a 2-D tensor map (rows and columns past the map's ends are not
 * written), in this thread's current bulk group; bulk_commit closes the group. */
FS_DEV void tma_store_2d(const CUtensorMap *map, const void *src, int c0, int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
                 ::"l"(map), "r"(c0), "r"(c1), "r"(smem_addr(src)) : "memory");
}
/* The same for a box at (c0, c1, c2) of a 3-D tensor map ... */
FS_DEV void tma_store_3d(const CUtensorMap *map, const void *src, int c0, int c1, int c2)
{
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n"
                 ::"l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(src)) : "memory");
}
/* ... and at (c0, c1, c2, c3) of a 4-D one. */
FS_DEV void tma_store_4d(const CUtensorMap *map, const void *src, int c0, int c1, int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n"
                 ::"l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(src)) : "memory");
}
/* TMA: a box of float32 in shared memory added element-wise into (c0, c1) of a 2-D float32 tensor map (the adds done
 * in L2 like atomics; rows and columns past the map's ends dropped), in this thread's current bulk group. */
FS_DEV void tma_reduce_add_2d(const CUtensorMap *map, const void *src, int c0, int c1)
{
    asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.bulk_group [%0, {%1, %2}], [%3];\n"
                 ::"l"(map), "r"(c0), "r"(c1), "r"(smem_addr(src)) : "memory");
}
/* The same add at (c0, c1, c2) of a 3-D float32 tensor map. */
FS_DEV void tma_reduce_add_3d(const CUtensorMap *map, const void *src, int c0, int c1, int c2)
{
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.bulk_group [%0, {%1, %2, %3}], [%4];\n"
                 ::"l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(src)) : "memory");
}
FS_DEV void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* Wait until this thread's bulk groups have read their shared memory (the buffer may be rewritten) ... */
FS_DEV void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
/* ... or have completed. */
FS_DEV void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
#endif

typedef CUresult (*fs_encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                       const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                       CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* cuTensorMapEncodeTiled through the runtime's driver entry point (launch.cuh), fetched once; NULL if missing. */
static inline fs_encode_tiled_fn fs_encode_tiled(void)
{
    static fs_encode_tiled_fn fn;
    if (!fn) fn = (fs_encode_tiled_fn)fs_driver_fn("cuTensorMapEncodeTiled");
    return fn;
}

/* A tensor map of rank dims (innermost first; strides of the outer dims in bytes) over `type` elements, read in boxes
 * of box[] elements with the given swizzle; rows past the ends read as zeros. */
static inline cudaError_t fs_encode_tensor_map(CUtensorMap *map, CUtensorMapDataType type, const void *base, int rank,
                                               const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                                               CUtensorMapSwizzle swizzle)
{
    static const cuuint32_t ones[5] = {1, 1, 1, 1, 1};
    fs_encode_tiled_fn encode = fs_encode_tiled();
    if (!encode) return cudaErrorNotSupported;
    CUresult r = encode(map, type, (cuuint32_t)rank, const_cast<void *>(base), dims, strides, box, ones,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

/* ... over fp16 / bf16 data, swizzled by the box's row width (box[0] = 64: the 128-byte swizzle, 32: the 64-byte
 * one). */
static inline cudaError_t fs_make_tensor_map(CUtensorMap *map, const void *base, int bf16, int rank,
                                             const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box)
{
    CUtensorMapDataType type = bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    CUtensorMapSwizzle swizzle = box[0] == 32 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B;
    return fs_encode_tensor_map(map, type, base, rank, dims, strides, box, swizzle);
}

/* ... over float32 rows (cols columns, rows rows, row_bytes apart) in unswizzled boxes of box_cols x box_rows; with
 * planes (not 0) a 3-D map of that many such blocks of rows, plane_bytes apart, in boxes of one plane (rows past a
 * plane's end are not written). */
static inline cudaError_t fs_make_tensor_map_f32(CUtensorMap *map, const void *base, cuuint64_t cols, cuuint64_t rows,
                                                 cuuint64_t row_bytes, cuuint32_t box_cols, cuuint32_t box_rows,
                                                 cuuint64_t planes = 0, cuuint64_t plane_bytes = 0)
{
    const cuuint64_t dims[3] = {cols, rows, planes}, strides[2] = {row_bytes, plane_bytes};
    const cuuint32_t box[3] = {box_cols, box_rows, 1};
    return fs_encode_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, base, planes ? 3 : 2, dims, strides, box,
                                CU_TENSOR_MAP_SWIZZLE_NONE);
}

#endif
