/* FS_BLOCK_HEADER for REAL = float (FS_REAL_DOUBLE 0: fp16 / bf16 / fp32 inputs) and REAL = double (1: fp64 inputs)
 * at the vector width FS_VEC_BYTES, BLOCK_TARGET its target attribute. No include guard: instantiate.h includes it
 * once per width. */
#include "common/cpu_tile.h"
#include "attention/cpu/softmax_row.h"

#define FS_REAL_DOUBLE 0
#include FS_BLOCK_HEADER
#undef FS_REAL_DOUBLE
#define FS_REAL_DOUBLE 1
#include FS_BLOCK_HEADER
#undef FS_REAL_DOUBLE
