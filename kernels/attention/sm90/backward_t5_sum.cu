/* Hopper attention backward: the T5 table's gradient from the main kernel's per-block sums by relative position
 * (backward_t5.cuh: part[((b H + h) key blocks + key block) t5_n + e] for position e - t5_lneg). One block per head
 * adds each position's sums over batches and key blocks, then each bucket's positions; fixed orders throughout. */
#include "attention/sm90/backward.h"
#include "common/launch.cuh"

#define FS_T5_SUM_THREADS 256

/* dtable[h][bucket] = sum over the positions in the bucket of the sums over batches and key blocks (block h). */
__global__ void sm90_bwd_t5_sum(const float *part, float *dtable, int64_t dtable_sh, const fs_attn_params p, int lneg,
                                int n, int parts)
{
    extern __shared__ float tot[]; /* n position sums, then n bucket indices */
    int *bucket = reinterpret_cast<int *>(tot + n);
    const int h = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int e = threadIdx.x; e < n; e += FS_T5_SUM_THREADS) {
        float v = 0.f;
        for (int b = 0; b < p.B; b++) {
            const float *row = part + ((int64_t)b * p.H + h) * parts * n + e;
#pragma unroll 8
            for (int t = 0; t < parts; t++) v += row[(int64_t)t * n];
        }
        tot[e] = v;
        bucket[e] = fs_t5_bucket(e - lneg, p.t5_buckets, p.t5_max_distance, p.t5_bidirectional);
    }
    __syncthreads();
    for (int bk = warp; bk < p.t5_buckets; bk += FS_T5_SUM_THREADS / 32) {
        float v = 0.f;
        for (int e = lane; e < n; e += 32)
            if (bucket[e] == bk) v += tot[e];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) dtable[h * dtable_sh + bk] = v;
    }
}

cudaError_t fs_sm90_backward_t5_sum(const fs_attn_bwd_params *g, const float *part, int device, cudaStream_t stream)
{
    static fs_kernel handle;
    fs_attn_params p = g->p;
    int lneg, n, parts = fs_sm90_bwd_kblocks(&p);
    fs_t5_span(&p, &lneg, &n);
    float *dtable = g->dtable;
    int64_t sh = g->dtable_sh;
    const int smem = 8 * n;
    if (p.H == 0) return cudaSuccess;
    cudaError_t err = fs_kernel_prepare((const void *)sm90_bwd_t5_sum, &handle, smem, device);
    void *args[] = {(void *)&part, &dtable, &sh, &p, &lneg, &n, &parts};
    return err != cudaSuccess ? err : fs_launch(&handle, device, (unsigned)p.H, FS_T5_SUM_THREADS, smem, stream, args);
}
