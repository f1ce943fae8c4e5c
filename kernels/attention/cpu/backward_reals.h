/* backward_block.h for REAL = float and REAL = double at one vector width (FS_VEC_BYTES): backward.c includes this
 * once per width. SUF(name) is name_<f|d>_<width>. */
#define REAL float
#define SUF(name) FS_V(name##_f)
#define LOAD_ROW fs_load_row_f
#define STORE_ROW fs_store_row_f
#define ROTATE_ROW fs_rotate_row_f
#define ROTATE_POS fs_rotate_f
#define MATMUL FS_V(fs_matmul_f)
#define EXP_ROW FS_V(fs_exp_row_f)
#define EXP expf
#include "attention/cpu/backward_block.h"
#undef REAL
#undef SUF
#undef LOAD_ROW
#undef STORE_ROW
#undef ROTATE_ROW
#undef ROTATE_POS
#undef MATMUL
#undef EXP_ROW
#undef EXP

#define REAL double
#define SUF(name) FS_V(name##_d)
#define LOAD_ROW fs_load_row_d
#define STORE_ROW fs_store_row_d
#define ROTATE_ROW fs_rotate_row_d
#define ROTATE_POS fs_rotate_d
#define MATMUL FS_V(fs_matmul_d)
#define EXP_ROW FS_V(fs_exp_row_d)
#define EXP exp
#include "attention/cpu/backward_block.h"
#undef REAL
#undef SUF
#undef LOAD_ROW
#undef STORE_ROW
#undef ROTATE_ROW
#undef ROTATE_POS
#undef MATMUL
#undef EXP_ROW
#undef EXP
