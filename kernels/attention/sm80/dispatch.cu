/* Attention forward on sm_80+, host side: the heuristics that shape a launch (KV splits, clusters, the rotary
 * pre-pass) and the entry point by dtype. The kernel is in kernel.cuh, its launch in launch.cuh. */
#include "attention/sm80/dispatch.h"
#include "common/workspace.h"

/* KV splits: only when the query tiles leave at least half the SMs idle and the key range is long
 * (16+ tiles: below that the merge costs more than the parallelism saves, measured on the H200);
 * each split keeps two KV tiles, and the split counters fit FS_COUNTER_BYTES. */
int fs_sm80_choose_splits(long long blocks, int n_kv, int sm_count)
{
    if (2 * blocks > sm_count || n_kv < 16 || blocks > FS_COUNTER_BYTES / (long long)sizeof(int)) return 1;
    int s = (int)((sm_count + blocks - 1) / blocks);
    s = s < n_kv / 2 ? s : n_kv / 2;
    return s < FS_MAX_SPLITS ? s : FS_MAX_SPLITS;
}

/* Keys the longest query tile visits, the query tiles covering rows 0 .. q_end - 1: causal (top-left) row i sees
 * keys 0 .. i. */
int fs_sm80_visited_keys(const fs_attn_params *p, long long q_end)
{
    return p->causal && q_end < p->Sk ? (int)q_end : p->Sk;
}

/* Thread-block clusters (Hopper, with this build's sm_90a code): when the query tiles leave at least half the SMs
 * idle and span 16-32 key tiles each, up to FS_MAX_CLUSTER blocks split each tile's keys (two tiles each at least) and
 * merge through distributed shared memory. H100, D = 64, us: 1x1x1024 14.5 -> 11.3, 1x1x2048 25.8 -> 17.5; on fewer
 * key tiles the cluster's cost outweighs the split (1x1x512 9.0 -> 8.7-8.9, 1x1x128 4.4 -> 5.3, 4x8x128 4.9 -> 6.2,
 * 1x4x512 at D = 32 6.4 -> 7.2); longer key ranges keep the splits merged through global memory (choose_splits).
 * Returns the cluster size, or 0. */
#define FS_CLUSTER_TILES_MIN 16
#define FS_CLUSTER_TILES_MAX 32
int fs_sm80_choose_cluster(long long blocks, int n_kv, int sm_count, int major)
{
#ifdef FLASHSCI_SM90A
    if (major != 9 || blocks < 1 || 2 * blocks > sm_count || n_kv < FS_CLUSTER_TILES_MIN || n_kv > FS_CLUSTER_TILES_MAX) return 0;
    const long long c = sm_count / blocks < FS_MAX_CLUSTER ? sm_count / blocks : FS_MAX_CLUSTER;
    return (int)(c < n_kv / 2 ? c : n_kv / 2);
#else
    (void)blocks; (void)n_kv; (void)sm_count; (void)major;
    return 0;
#endif
}

/* Rotary by the pre-pass (rotary.cu: q and k rotated once into the workspace, then the kernel without it, the plain
 * one if rotary was the only option) rather than in the FEAT kernel, where every query tile's block rotates each K
 * tile again: from 512 queries and keys on. H100, fp16, D = 64 unless given, us, in the kernel -> pre-pass:
 * 8x40x1024 470 -> 374, 1x40x4096 887 -> 636, 1x1x512 16.7 -> 12.0, 2x3x700 23.6 -> 16.1, at D = 128 35.3 -> 29.9;
 * below, the extra launch and round trip cost more than they save: 8x8x256 13.3 -> 15.3, 4x8x128 7.2 -> 9.8. */
bool fs_sm80_rotary_prepass(const fs_attn_params *p)
{
    return p->Sq >= 512 && p->Sk >= 512;
}

extern "C" cudaError_t fs_attention_sm80(const fs_attn_params *p, int device, int sm_count, int major, cudaStream_t stream,
                                         fs_sm80_plan *plan)
{
    if (p->dtype == FS_F16) return fs_sm80_forward_fp16(p, device, sm_count, major, stream, plan);
    if (p->dtype == FS_BF16) return fs_sm80_forward_bf16(p, device, sm_count, major, stream, plan);
    return cudaErrorInvalidValue;
}
