/* Hopper attention backward, host side: which problems its kernel takes (heuristics only: the kernel is in
 * backward_kernel.cuh, its launch in backward_launch.cuh). */
#include "attention/sm90/backward.h"
#include "attention/sm90/tensor_map.h"

int fs_sm90_backward_covers(const fs_attn_bwd_params *g, int rotary, int rotary_dim)
{
#ifdef FLASHSCI_SM90A
    const fs_attn_params *p = &g->p;
    const int hkv = fs_kv_heads(p), packed = p->cu_seqlens_q != NULL;
    const int64_t sq = packed ? p->total_q : p->Sq, sk = packed ? p->total_k : p->Sk, nb = packed ? 1 : p->B;
    return (p->dtype == FS_F16 || p->dtype == FS_BF16) && (p->D == 64 || p->D == 128) && p->Sq > 0 && p->Sk > 0 &&
           sq > 0 && sk > 0 && sq < INT32_MAX && sk < INT32_MAX && !p->bias && !p->t5_table && !p->rotary &&
           (!rotary || rotary_dim == p->D) && !g->dtable && !g->dbias &&
           sm90_strides_ok((int)sq, p->H, (int)nb, p->q_ss, p->q_sh, p->q_sb) &&
           sm90_strides_ok((int)sk, hkv, (int)nb, p->k_ss, p->k_sh, p->k_sb) &&
           sm90_strides_ok((int)sk, hkv, (int)nb, p->v_ss, p->v_sh, p->v_sb) &&
           sm90_strides_ok((int)sq, p->H, (int)nb, g->do_ss, g->do_sh, g->do_sb);
#else
    (void)g;
    (void)rotary;
    (void)rotary_dim;
    return 0;
#endif
}
