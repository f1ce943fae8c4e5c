/* Hopper attention forward, host side: which problems the Hopper kernel takes (fs_attention_sm90_covers: what it
 * supports and where it beats the sm80 kernel) and which instantiation runs them (sm90_variant). Heuristics only: the
 * kernels are in kernel.cuh, their launch in launch.cuh. */
#include <math.h>
#include <stdint.h>

#include "attention/launchers.h"
#include "attention/sm90/tile.cuh"
#include "attention/sm90/tensor_map.h"
#include "attention/sm90/variants.h"

/* The protein options: packed sequences, seqlens, key padding, the T5 bias (the FEAT kernels). */
static bool sm90_feat(const fs_attn_params *p)
{
    return p->cu_seqlens_q || p->seqlens || p->kpm || p->t5_table;
}

/* The T5 bias without the other options at D = 128 (ProtT5) runs on the plain kernel with the bias added (T5): Q in
 * registers and the early hand-over, which the FEAT kernel cannot hold without spilling (docs/notes/attention_sm90.md). */
static bool sm90_t5_plain(const fs_attn_params *p)
{
    return p->t5_table && p->D == 128 && !p->cu_seqlens_q && !p->seqlens && !p->kpm && fabs(p->scale) >= FS_SM90_T5_MIN_SCALE;
}

/* Work items of a launch with Br = br: B H query tiles (packed sequences aside). */
static long long sm90_items(const fs_attn_params *p, int br)
{
    return (long long)p->B * p->H * ((p->Sq + br - 1) / br);
}

/* The plain D = 64 kernel on two consumer warpgroups (Br = 128) where three leave SMs idle and two still give every
 * item an SM of its own: the problem takes one item's time either way, and a 128-row item is the shorter. */
static bool sm90_two_wg64(const fs_attn_params *p, int sm_count)
{
    return sm90_items(p, 192) < sm_count && sm90_items(p, 128) <= sm_count;
}

/* Bc = 64 for the protein options at D = 64 where 128-key tiles would visit a quarter more keys than 64-key
 * ones: at most 64 keys, or 129-192 (the ESM2 length buckets of 170 or so). */
static int sm90_narrow_keys(const fs_attn_params *p)
{
    const long long pad64 = ((long long)p->Sk + 63) / 64 * 64, pad128 = ((long long)p->Sk + 127) / 128 * 128;
    return p->D == 64 && (pad128 - pad64) * 4 >= pad64;
}

/* The protein options take Bc = 128, or 64 (above); a key padding mask its own instantiations (Bc = 128), which keep
 * its per-tile load and selects out of the others (in them, measured on the packed UniProt batches, 1-3% slower). */
static fs_sm90_variant sm90_variant(const fs_attn_params *p, int sm_count)
{
    const bool feat = sm90_feat(p);
    const bool d128 = sm90_kernel_dim(p->D) == 128;
    if (p->kpm) return d128 ? FS_SM90_D128_KPM : FS_SM90_D64_KPM;
    if (sm90_t5_plain(p)) return FS_SM90_D128_T5;
    if (d128) return feat ? FS_SM90_D128_FEAT : FS_SM90_D128;
    if (!feat) return sm90_two_wg64(p, sm_count) ? FS_SM90_D64_2WG : FS_SM90_D64;
    return sm90_narrow_keys(p) ? FS_SM90_D64_FEAT_BC64 : FS_SM90_D64_FEAT;
}

#ifdef FLASHSCI_SM90A
/* Whether the Hopper kernel beats the sm80 one on a problem of `items` work items. With one item per SM or more it
 * does. With fewer, it runs each item's keys on one SM, where the sm80 kernel splits long key ranges over SMs, so
 * it is taken only for self-attention-like shapes (Sq >= Sk / 2, Sk <= 4096: what was measured). There, at D = 128,
 * it wins on every size measured from one head of 256 keys up (1.4-2.6x on the H100: the sm80 kernel's D = 128
 * tiles are register-bound). At D = 64, plain and non-causal, on two consumer warpgroups (sm90_two_wg64) it wins from
 * 256 keys (H100: 1 x 1 x 512 8.9 -> 8.1 us, 8 x 8 x 256 9.7 -> 8.1, 1 x 20 x 512 14.4 -> 9.4), except where few
 * query tiles (under a quarter of the SMs) see more than 512 keys, which the sm80 kernel splits over a cluster
 * (1 x 2 x 1024: 13.0 against 11.9); on a single key tile the sm80 kernel wins (1 x 1 x 64: 5.4 against 3.7).
 * Causal and protein-option problems at D = 64 keep the earlier rule: from two thirds of an item per SM (Br = 192)
 * and 512 keys. */
static int sm90_pays(const fs_attn_params *p, long long items, int sm_count)
{
    if (items >= sm_count) return 1;
    if (2LL * p->Sq < p->Sk || p->Sk > 4096) return 0;
    if (sm90_kernel_dim(p->D) == 128) return 1;
    if (!p->causal && !sm90_feat(p) && !p->rotary && p->Sk >= 256) /* Br = 128 items: sm90_two_wg64 */
        return p->Sk <= 512 || 4 * sm90_items(p, 128) >= sm_count;
    return 3 * items >= 2LL * sm_count && p->Sk >= 512;
}
#endif

extern "C" int fs_attention_sm90_covers(const fs_attn_params *p, int sm_count)
{
#ifdef FLASHSCI_SM90A
    const int dk = sm90_kernel_dim(p->D), br = 64 * sm90_nwg(dk), hkv = fs_kv_heads(p);
    int sq, sk, nb, lneg = 0, t5_n = 0;
    sm90_extent(p, 1, &sq, &nb);
    sm90_extent(p, 0, &sk, &nb);
    if (p->t5_table) fs_t5_span(p, &lneg, &t5_n);
    return (p->dtype == FS_F16 || p->dtype == FS_BF16) && dk && p->Sq > 0 && p->Sk > 0 &&
           !p->bias && t5_n <= FS_SM90_T5_MAX && sq > 0 && sk > 0 &&
           (!p->cu_seqlens_q || (p->total_q < INT32_MAX && p->total_k < INT32_MAX)) &&
           sm90_strides_ok(sq, p->H, nb, p->q_ss, p->q_sh, p->q_sb) && sm90_strides_ok(sk, hkv, nb, p->k_ss, p->k_sh, p->k_sb) &&
           sm90_strides_ok(sk, hkv, nb, p->v_ss, p->v_sh, p->v_sb) && sm90_strides_ok(sq, p->H, nb, p->o_ss, p->o_sh, p->o_sb) &&
           sm90_pays(p, sm90_items(p, br), sm_count);
#else
    (void)p; (void)sm_count;
    return 0;
#endif
}

extern "C" cudaError_t fs_attention_sm90(const fs_attn_params *p, int device, int sm_count, cudaStream_t stream, fs_sm80_plan *plan)
{
    const fs_sm90_variant v = sm90_variant(p, sm_count);
    return p->dtype == FS_F16 ? fs_sm90_forward_fp16(v, p, device, sm_count, stream, plan)
                              : fs_sm90_forward_bf16(v, p, device, sm_count, stream, plan);
}
