/* Element types shared by the host (csrc/) and every kernel family (kernels/). Plain C. */
#ifndef FLASHSCI_DTYPE_H
#define FLASHSCI_DTYPE_H

typedef enum { FS_F16 = 0, FS_BF16 = 1, FS_F32 = 2, FS_F64 = 3, FS_BOOL = 4, FS_I32 = 5, FS_I64 = 6, FS_NUM_DTYPES } fs_dtype;
#define FS_FLOATS ((1u << FS_F16) | (1u << FS_BF16) | (1u << FS_F32) | (1u << FS_F64))

#endif
