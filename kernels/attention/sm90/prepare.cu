/* Hopper attention forward: the small kernels launched ahead of the attention kernel, and their launchers. sm90_t5_expand writes each
 * head's T5 table as shared memory holds it (the producer copies a row per work item); sm90_kpm_prepare turns a key
 * padding mask into each batch's list of key tiles that keep a key, with the keys each tile drops. */
#include "attention/sequence.cuh"
#include "attention/sm90/tile.cuh"
#include "attention/sm90/variants.h"
#include "common/launch.cuh"

/* Each head's T5 table as the attention kernel reads it from shared memory (sm90_softmax, sm90_t5_init), into out (row
 * floats per head): entry i is the bias times mul (FEAT: log2 e; T5: 1 / scale) of relative position
 * clamp(i - FS_SM90_T5_PAD, 0, t5_n - 1) - t5_lneg. One block per head, launched ahead of the attention kernel, whose
 * producer copies a row per work item. */
__global__ void sm90_t5_expand(const fs_attn_params p, int t5_lneg, int t5_n, int row, float mul, float *out)
{
    const int h = blockIdx.x;
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        const int pos = min(max(i - FS_SM90_T5_PAD, 0), t5_n - 1);
        const int bucket = fs_t5_bucket(pos - t5_lneg, p.t5_buckets, p.t5_max_distance, p.t5_bidirectional);
        out[(int64_t)h * row + i] = load_float(p.t5_table, h * p.t5_sh + bucket * p.t5_sn, p.t5_dtype) * mul;
    }
}

#define FS_KPM_THREADS 256 /* sm90_kpm_prepare's block */

/* The keys the tile of BC keys from key f + t BC drops, bit 2 n + c for column 8 n + 2 t4 + c; any: it keeps one. */
template <int BC>
FS_DEV uint32_t sm90_kpm_word(const fs_attn_params &p, const uint8_t *row, int f, int t, int tiles, int t4, bool &any)
{
    uint32_t word = 0;
    any = false;
#pragma unroll
    for (int bit = 0; bit < BC / 4; bit++) {
        const int col = f + t * BC + 8 * (bit >> 1) + 2 * t4 + (bit & 1);
        const bool in = t < tiles && col < p.Sk, keep = in && row[(int64_t)col * p.kpm_sk];
        any |= keep;
        if (in && !keep) word |= 1u << bit;
    }
    return word;
}

/* Each batch's key padding mask as the attention kernel reads it (sm90_item, the producer, sm90_softmax), one block
 * of FS_KPM_THREADS threads per batch b, launched ahead of it. b's key tiles (BC keys) start at its first kept key f
 * (Sk if none), so that padding before it costs no tile, and those that keep a key form b's list, in order:
 * count[b (tiles + 2)] = f, count[b (tiles + 2) + 1 + t] = the list's tiles before tile t (t = tiles: all of them);
 * list[(b tiles + i) 4 + t4] = {the keys of entry i's tile the mask drops, bit 2 n + c for column 8 n + 2 t4 + c
 * (lane t4 of a row's quad), the tile's first key}. A thread takes one (tile, t4) word of each chunk of
 * FS_KPM_THREADS / 4 tiles. */
template <int BC>
__global__ void sm90_kpm_prepare(const fs_attn_params p, int tiles, int *count, uint2 *list)
{
    __shared__ int warp_kept[FS_KPM_THREADS / 32], base, first;
    const uint8_t *row = p.kpm + blockIdx.x * p.kpm_sb;
    int *cnt = count + blockIdx.x * (tiles + 2);
    uint2 *out = list + (int64_t)blockIdx.x * tiles * 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t4 = lane & 3;
    if (threadIdx.x == 0) {
        base = 0;
        first = p.Sk;
    }
    __syncthreads();
    /* the first chunk's word for f = 0 (key 0 kept: right padding, no padding), loaded while f is found */
    bool any0;
    const uint32_t word0 = sm90_kpm_word<BC>(p, row, 0, threadIdx.x / 4, tiles, t4, any0);
    /* f: each thread's first kept key among keys j = threadIdx.x mod FS_KPM_THREADS, eight loads in flight at a time */
    for (int j0 = threadIdx.x; j0 < p.Sk; j0 += 8 * FS_KPM_THREADS) {
        bool keep[8];
#pragma unroll
        for (int u = 0; u < 8; u++) keep[u] = j0 + u * FS_KPM_THREADS < p.Sk && row[(int64_t)(j0 + u * FS_KPM_THREADS) * p.kpm_sk];
        int f = p.Sk;
#pragma unroll
        for (int u = 7; u >= 0; u--)
            if (keep[u]) f = j0 + u * FS_KPM_THREADS;
        if (f < p.Sk) {
            atomicMin(&first, f);
            break;
        }
    }
    __syncthreads();
    const int f = first;
    for (int i0 = 0; i0 < tiles * 4; i0 += FS_KPM_THREADS) {
        const int t = (i0 + (int)threadIdx.x) / 4;
        bool any = any0;
        const uint32_t word = i0 == 0 && f == 0 ? word0 : sm90_kpm_word<BC>(p, row, f, t, tiles, t4, any);
        /* the tile is kept if any of its quad's lanes keeps a key; its list entry follows the kept tiles before it */
        const bool kept = (__ballot_sync(0xffffffffu, any) >> (lane & ~3)) & 15u;
        const unsigned firsts = __ballot_sync(0xffffffffu, kept && t4 == 0);
        __syncthreads(); /* base as the last chunk left it, warp_kept read */
        if (lane == 0) warp_kept[warp] = __popc(firsts);
        __syncthreads();
        int pos = base + __popc(firsts & ((1u << (lane & ~3)) - 1));
        for (int w = 0; w < warp; w++) pos += warp_kept[w];
        if (t < tiles) {
            if (t4 == 0) cnt[1 + t] = pos;
            if (kept) out[pos * 4 + t4] = make_uint2(word, (unsigned)(f + t * BC));
        }
        __syncthreads(); /* every thread has read base */
        if (threadIdx.x == FS_KPM_THREADS - 1) base = pos + kept;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        cnt[0] = f;
        cnt[1 + tiles] = base;
    }
}

cudaError_t fs_sm90_t5_expand(const fs_attn_params *p, int t5_lneg, int t5_n, int row, float mul, float *out, int device,
                              cudaStream_t stream)
{
    static fs_kernel expand;
    fs_attn_params pt = *p;
    void *args[] = {&pt, &t5_lneg, &t5_n, &row, &mul, &out};
    cudaError_t err = fs_kernel_prepare((const void *)sm90_t5_expand, &expand, 0, device);
    return err != cudaSuccess ? err : fs_launch(&expand, device, (unsigned)p->H, 256, 0, stream, args);
}

cudaError_t fs_sm90_kpm_prepare(const fs_attn_params *p, int bc, int tiles, int *count, uint2 *list, int device,
                                cudaStream_t stream)
{
    static fs_kernel prepare64, prepare128;
    fs_attn_params pk = *p;
    void *args[] = {&pk, &tiles, &count, &list};
    fs_kernel *k = bc == 64 ? &prepare64 : &prepare128;
    cudaError_t err = fs_kernel_prepare(bc == 64 ? (const void *)sm90_kpm_prepare<64> : (const void *)sm90_kpm_prepare<128>,
                                        k, 0, device);
    return err != cudaSuccess ? err : fs_launch(k, device, (unsigned)p->B, FS_KPM_THREADS, 0, stream, args);
}
