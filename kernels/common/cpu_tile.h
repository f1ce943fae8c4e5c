/* Register-blocked tile products for the C CPU kernels, in GCC / Clang vector extensions of FS_VEC_BYTES bytes (16:
 * SSE2, NEON; 32: AVX2 + FMA). No include guard: a kernel file includes it once per width it builds, with
 * FS_VEC_BYTES defined, and gets the functions below with the width as a suffix (fs_matmul_f_32, ...):
 *
 *   fs_matmul_f / _d(rows, N, K, A, lda, B, ldb, C, ldc, add)   C[rows][N] (+)= A[rows][K] B[K][N]
 *
 * in float / double: 4-row by two-vector tiles whose accumulators stay in registers for the whole K loop (each step
 * loads two vectors of B once for four rows), one-vector tiles and single rows for what is left, scalar loops for the
 * last columns.
 * Rows lda, ldb, ldc elements apart; loads and stores are unaligned; add = 0 writes A B, add = 1 adds it to C.
 * Everything is always inlined, so it compiles for the calling function's target. */
#include <stdint.h>

#ifndef FS_VEC_BYTES
#error "define FS_VEC_BYTES (16 or 32) before including common/cpu_tile.h"
#endif

#define FS_VNAME_(name, bytes) name##_##bytes
#define FS_VNAME(name, bytes) FS_VNAME_(name, bytes)
#define FS_V(name) FS_VNAME(name, FS_VEC_BYTES) /* name_<FS_VEC_BYTES> */

typedef float FS_V(fs_vf) __attribute__((vector_size(FS_VEC_BYTES), aligned(4)));
typedef double FS_V(fs_vd) __attribute__((vector_size(FS_VEC_BYTES), aligned(8)));
typedef int32_t FS_V(fs_vi) __attribute__((vector_size(FS_VEC_BYTES), aligned(4)));

#ifndef FS_TILE_BODY
/* The tile body for a compile-time MR and NV: MR rows by NV VEC vectors (VL lanes each) of accumulators. */
#define FS_TILE_BODY(VEC, VL, MR, NV)                                                                                   \
    do {                                                                                                              \
        VEC acc[MR][NV];                                                                                              \
        for (int r = 0; r < MR; r++)                                                                                  \
            for (int v = 0; v < NV; v++) acc[r][v] = add ? *(const VEC *)(C + r * ldc + v * VL) : (VEC){0};           \
        for (int k = 0; k < K; k++) {                                                                                 \
            VEC b[NV];                                                                                                \
            for (int v = 0; v < NV; v++) b[v] = *(const VEC *)(B + k * ldb + v * VL);                                 \
            for (int r = 0; r < MR; r++) {                                                                            \
                const VEC a = (VEC){0} + A[r * lda + k];                                                              \
                for (int v = 0; v < NV; v++) acc[r][v] += a * b[v];                                                   \
            }                                                                                                         \
        }                                                                                                             \
        for (int r = 0; r < MR; r++)                                                                                  \
            for (int v = 0; v < NV; v++) *(VEC *)(C + r * ldc + v * VL) = acc[r][v];                                  \
    } while (0)

/* C[rows][N] (+)= A[rows][K] B[K][N]: mr = 4 or 1 row tiles of two vectors (2 VL columns), then of one, then a
 * scalar tail. */
#define FS_MATMUL_BODY(TILE, VL)                                                                                      \
    do {                                                                                                              \
        const int n2 = N / (2 * (VL)) * (2 * (VL)), n1 = N / (VL) * (VL);                                             \
        for (int r = 0; r < rows;) {                                                                                  \
            const int mr = rows - r >= 4 ? 4 : 1;                                                                     \
            for (int c = 0; c < n1; c += (c < n2 ? 2 : 1) * (VL))                                                     \
                TILE(mr, c < n2 ? 2 : 1, K, A + r * lda, lda, B + c, ldb, C + r * ldc + c, ldc, add);                 \
            for (int i = r; i < r + mr; i++)                                                                          \
                for (int c = n1; c < N; c++) {                                                                        \
                    __typeof__(C[0]) sum = add ? C[i * ldc + c] : 0;                                                  \
                    for (int k = 0; k < K; k++) sum += A[i * lda + k] * B[k * ldb + c];                               \
                    C[i * ldc + c] = sum;                                                                             \
                }                                                                                                     \
            r += mr;                                                                                                  \
        }                                                                                                             \
    } while (0)
#endif

/* C[mr][nv vectors] (+)= A[mr][K] B[K][nv vectors] in float; mr is 4 or 1, nv 2 or 1. */
static inline __attribute__((always_inline)) void FS_V(fs_tile_f)(int mr, int nv, int K, const float *A, int64_t lda,
                                                                  const float *B, int64_t ldb, float *C, int64_t ldc,
                                                                  int add)
{
    enum { VL = FS_VEC_BYTES / 4 };
    if (mr == 4 && nv == 2) FS_TILE_BODY(FS_V(fs_vf), VL, 4, 2);
    else if (mr == 4) FS_TILE_BODY(FS_V(fs_vf), VL, 4, 1);
    else if (nv == 2) FS_TILE_BODY(FS_V(fs_vf), VL, 1, 2);
    else FS_TILE_BODY(FS_V(fs_vf), VL, 1, 1);
}

/* The same in double. */
static inline __attribute__((always_inline)) void FS_V(fs_tile_d)(int mr, int nv, int K, const double *A, int64_t lda,
                                                                  const double *B, int64_t ldb, double *C, int64_t ldc,
                                                                  int add)
{
    enum { VL = FS_VEC_BYTES / 8 };
    if (mr == 4 && nv == 2) FS_TILE_BODY(FS_V(fs_vd), VL, 4, 2);
    else if (mr == 4) FS_TILE_BODY(FS_V(fs_vd), VL, 4, 1);
    else if (nv == 2) FS_TILE_BODY(FS_V(fs_vd), VL, 1, 2);
    else FS_TILE_BODY(FS_V(fs_vd), VL, 1, 1);
}

/* C[rows][N] (+)= A[rows][K] B[K][N] in float. */
static inline __attribute__((always_inline)) void FS_V(fs_matmul_f)(int rows, int N, int K, const float *A,
                                                                    int64_t lda, const float *B, int64_t ldb, float *C,
                                                                    int64_t ldc, int add)
{
    FS_MATMUL_BODY(FS_V(fs_tile_f), FS_VEC_BYTES / 4);
}

/* C[rows][N] (+)= A[rows][K] B[K][N] in double. */
static inline __attribute__((always_inline)) void FS_V(fs_matmul_d)(int rows, int N, int K, const double *A,
                                                                    int64_t lda, const double *B, int64_t ldb,
                                                                    double *C, int64_t ldc, int add)
{
    FS_MATMUL_BODY(FS_V(fs_tile_d), FS_VEC_BYTES / 8);
}
