/* Builds FS_BLOCK_HEADER (forward_block.h or backward_block.h; forward.c and backward.c define it and include this)
 * for float and double in 16-byte vectors (SSE2, NEON: every machine) and, on x86-64, in 32-byte ones under
 * target("avx2,fma"), which the kernels take where fs_cpu_avx2() says the CPU has them. The block header names its
 * functions name_<f|d>_<width>: attention_block_f_16, dq_task_d_32, ... */
#define FS_VEC_BYTES 16
#define BLOCK_TARGET
#include "attention/cpu/instantiate_width.h"
#undef BLOCK_TARGET
#undef FS_VEC_BYTES

#if FS_CPU_AVX2
#define FS_VEC_BYTES 32
#define BLOCK_TARGET __attribute__((target("avx2,fma")))
#include "attention/cpu/instantiate_width.h"
#undef BLOCK_TARGET
#undef FS_VEC_BYTES
#endif
