/* Hopper attention backward, host side: which problems its kernel takes (heuristics only: the kernel is in
 * backward_kernel.cuh, its launch in backward_launch.cuh). */
#include "attention/sm90/backward.h"
#include "attention/sm90/backward_tile.cuh"
#include "attention/sm90/tensor_map.h"
#include "attention/sm90/variants.h"

/* Query tiles of 64 rows over all batches and heads: the unit of the per-tile counters (kernel: a.order_tiles a head). */
static size_t query_tiles64(const fs_attn_params *p)
{
    return (size_t)p->B * p->H * ((p->Sq + 63) / 64);
}

size_t fs_sm90_order_ticket(const fs_attn_params *p)
{
    return 2 * query_tiles64(p);
}

size_t fs_sm90_order_ints(const fs_attn_params *p)
{
    return fs_sm90_order_ticket(p) + 4;
}

int fs_sm90_backward_converts(const fs_attn_bwd_params *g, int rotary)
{
    const fs_attn_params *p = &g->p;
    return p->D == 64 && !p->causal && !p->cu_seqlens_q && !p->seqlens && !g->deterministic && !p->t5_table && !rotary;
}

size_t fs_sm90_dq_done_ints(const fs_attn_params *p)
{
    return query_tiles64(p);
}

int fs_sm90_backward_zeroes(const fs_attn_bwd_params *g)
{
    const fs_attn_params *p = &g->p;
    const int dim = sm90_kernel_dim(p->D), t5 = p->t5_table != NULL;
    const int persistent = dim == 64 && !p->causal && !t5, d80 = p->D == 80 && !t5; /* D = 80's own kernel */
    if (g->deterministic) return !p->cu_seqlens_q && !p->seqlens; /* the tiles' first shares stored */
    if (p->causal) return dim == 128 && !p->cu_seqlens_q && !p->seqlens && !d80; /* each tile by its first writer */
    return !p->cu_seqlens_q && !persistent && !d80;
}

size_t fs_sm90_dq_zeroed_ints(const fs_attn_params *p)
{
    /* causal: a flag per query tile of 64 (a.order_tiles a head); else the tiles zeroed and the claim per K/V head */
    return p->causal ? query_tiles64(p) : 2 * (size_t)p->B * fs_kv_heads(p);
}

int fs_sm90_bwd_t5_row(const fs_attn_params *p)
{
    int lneg, n;
    fs_t5_span(p, &lneg, &n);
    return (n + 2 * FS_SM90_T5_PAD + 3) / 4 * 4;
}

int fs_sm90_bwd_kblocks(const fs_attn_params *p)
{
    static_assert(fs_sm90_bwd_tile<64>::BC == 128 && fs_sm90_bwd_tile<80>::BC == 128 &&
                  fs_sm90_bwd_tile<128>::BC == 128, "one key-block count for every head dim");
    return (p->Sk + 127) / 128;
}

size_t fs_sm90_bwd_t5_part_floats(const fs_attn_params *p)
{
    int lneg, n;
    fs_t5_span(p, &lneg, &n);
    return (size_t)p->B * p->H * fs_sm90_bwd_kblocks(p) * n;
}

/* Whether the kernel takes g's T5 bias: the instantiation with it is non-causal and keeps dQ's atomics, its blocks
 * load one head's table and gradient rows (no grouped heads) of at most FS_SM90_BWD_T5_MAX positions. */
static int t5_covered(const fs_attn_bwd_params *g)
{
    const fs_attn_params *p = &g->p;
    int lneg, n;
    fs_t5_span(p, &lneg, &n);
    return !p->causal && !g->deterministic && p->kv_group == 1 && n <= FS_SM90_BWD_T5_MAX;
}

int fs_sm90_backward_covers(const fs_attn_bwd_params *g, int rotary, int rotary_dim)
{
#ifdef FLASHSCI_SM90A
    const fs_attn_params *p = &g->p;
    const int hkv = fs_kv_heads(p);
    if (p->cu_seqlens_q && (p->total_q >= INT32_MAX || p->total_k >= INT32_MAX)) return 0;
    int sq, sk, nb;
    sm90_extent(p, 1, &sq, &nb);
    sm90_extent(p, 0, &sk, &nb);
    return (p->dtype == FS_F16 || p->dtype == FS_BF16) && sm90_kernel_dim(p->D) && p->Sq > 0 && p->Sk > 0 &&
           sq > 0 && sk > 0 && sq < INT32_MAX && sk < INT32_MAX && !p->bias && (!p->t5_table || t5_covered(g)) &&
           !p->rotary && (!rotary || rotary_dim == p->D) && !g->dbias &&
           sm90_strides_ok(sq, p->H, nb, p->q_ss, p->q_sh, p->q_sb) && sm90_strides_ok(sk, hkv, nb, p->k_ss, p->k_sh, p->k_sb) &&
           sm90_strides_ok(sk, hkv, nb, p->v_ss, p->v_sh, p->v_sb) && sm90_strides_ok(sq, p->H, nb, g->do_ss, g->do_sh, g->do_sb);
#else
    (void)g;
    (void)rotary;
    (void)rotary_dim;
    return 0;
#endif
}
