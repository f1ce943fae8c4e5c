/* Attention over no key at all (Sk = 0, or every packed sequence empty): every query row is fully masked, so the
 * result is zeros with lse -inf, as the CPU kernel and torch's math SDPA give. The kernels have nothing to load
 * there (TMA maps cannot describe an empty tensor), so this small kernel writes the rows instead.
 * Build: part of the extension. */
#include <math.h>
#include <stdint.h>

#include "attention/launchers.h"
#include "common/launch.cuh"

#define FS_FILL_THREADS 256

/* Row r of rows = (B or 1) H Sq: o's D elements zero, lse -inf (element size es). */
__global__ void __launch_bounds__(FS_FILL_THREADS) attention_zero_rows(const fs_attn_params p, int64_t rows, int es)
{
    for (int64_t r = blockIdx.x * (int64_t)FS_FILL_THREADS + threadIdx.x; r < rows; r += (int64_t)gridDim.x * FS_FILL_THREADS) {
        int64_t b, h, i;
        if (p.cu_seqlens_q) {
            b = 0;
            h = r % p.H;
            i = r / p.H;
        } else {
            i = r % p.Sq;
            h = r / p.Sq % p.H;
            b = r / ((int64_t)p.Sq * p.H);
        }
        unsigned char *o = static_cast<unsigned char *>(p.o) + (b * p.o_sb + h * p.o_sh + i * p.o_ss) * es;
        for (int d = 0; d < p.D * es; d++) o[d] = 0;
        if (p.lse) static_cast<float *>(p.lse)[b * p.lse_sb + h * p.lse_sh + i] = -INFINITY;
    }
}

extern "C" cudaError_t fs_attention_no_keys(const fs_attn_params *p, cudaStream_t stream)
{
    const int64_t rows = p->cu_seqlens_q ? p->total_q * p->H : (int64_t)p->B * p->H * p->Sq;
    const int es = p->dtype == FS_F64 ? 8 : p->dtype == FS_F32 ? 4 : 2;
    const int64_t blocks = (rows + FS_FILL_THREADS - 1) / FS_FILL_THREADS;
    attention_zero_rows<<<(unsigned)(blocks < 4096 ? blocks : 4096), FS_FILL_THREADS, 0, stream>>>(*p, rows, es);
    return cudaGetLastError();
}
