/* Element types shared by the host (csrc/) and every kernel family (kernels/): the enum, their names and sizes.
 * Plain C. */
#ifndef FLASHSCI_DTYPE_H
#define FLASHSCI_DTYPE_H

#include <stddef.h>

typedef enum { FS_F16 = 0, FS_BF16 = 1, FS_F32 = 2, FS_F64 = 3, FS_BOOL = 4, FS_I32 = 5, FS_I64 = 6, FS_NUM_DTYPES } fs_dtype;
#define FS_FLOATS ((1u << FS_F16) | (1u << FS_BF16) | (1u << FS_F32) | (1u << FS_F64))

/* The dtype's name as NumPy and torch spell it ("unknown" outside the enum). */
static inline const char *fs_dtype_name(fs_dtype dt)
{
    static const char *const names[FS_NUM_DTYPES] = {"float16", "bfloat16", "float32", "float64", "bool", "int32", "int64"};
    return (unsigned)dt < FS_NUM_DTYPES ? names[dt] : "unknown";
}

/* Bytes per element. */
static inline size_t fs_dtype_itemsize(fs_dtype dt)
{
    static const size_t sizes[FS_NUM_DTYPES] = {2, 2, 4, 8, 1, 4, 8};
    return (unsigned)dt < FS_NUM_DTYPES ? sizes[dt] : 0;
}

#endif
