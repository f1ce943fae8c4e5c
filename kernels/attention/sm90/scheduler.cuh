/* Hopper attention forward: the tile scheduler. Work items (batch, head, query tile) in the order blocks take them
 * (sm90_item, device), and the host's choices of that order (sm90_claims: by stride or claimed on demand;
 * sm90_section: causal heads in sections that share L2). */
#ifndef FLASHSCI_ATTENTION_SM90_SCHEDULER_CUH
#define FLASHSCI_ATTENTION_SM90_SCHEDULER_CUH

#include "attention/sequence.cuh"
#include "attention/sm90/tile.cuh"
#include "common/wgmma.cuh"

#ifdef FS_WGMMA
/* Work item t: (b, h, query tile from row q0 of its sequence), reading n_kv K/V tiles of Bc rows. Non-causal:
 * the tiles of one head adjacent (K/V shared in L2); causal: sections of a.section heads whose K and V fit in
 * about half of L2, each section's heaviest tiles (last rows) first. FEAT: the sequence's rows start at qo / ko
 * of the packed tensors (tb = 0 names their one batch) and hold q_len / k_len rows; a packed item past its
 * sequence is skipped, a padded one (seqlens) has no tiles and writes zeros. Key padding: n_kv counts the tiles with a
 * kept key, which the item visits in order (a.kpm_list), the others skipped. n_kv = -1 marks the end of a block's
 * items. */
typedef struct {
    int b, h, q0, n_kv, tb, skip;
    fs_seq seq;
} sm90_work;
static_assert(sizeof(sm90_work) <= FS_SM90_WORK_BYTES, "the work item fits its shared-memory slot");
template <bool FEAT, bool KPM> FS_DEV sm90_work sm90_item(const fs_sm90_args &a, int t, int br, int bc)
{
    const fs_attn_params &p = a.p;
    if (!FEAT && a.late_heads) { /* the last late_heads heads: their full tiles head by head, then their light ones */
        const int nq = a.n_qtiles, late0 = p.B * p.H - a.late_heads, u = t - late0 * nq;
        const int light = u - a.late_heads * (nq - 1); /* >= 0: the light tile of head late0 + light */
        if (u >= 0) {
            const int bh = late0 + (light >= 0 ? light : u / (nq - 1)), b = bh / p.H, tile = light >= 0 ? nq - 1 : u % (nq - 1);
            return sm90_work{b, bh % p.H, tile * br, (p.Sk + bc - 1) / bc, b, 0, fs_seq{0, 0, p.Sq, p.Sk}};
        }
    }
    const int bh_count = p.B * p.H, first = t / (a.section * a.n_qtiles) * a.section; /* causal: the section's */
    const int heads = min(a.section, bh_count - first), r = t - first * a.n_qtiles;   /* first head, its heads */
    const int bh = p.causal ? first + r % heads : t / a.n_qtiles, b = bh / p.H;
    const int q0 = (p.causal ? a.n_qtiles - 1 - r / heads : t % a.n_qtiles) * br;
    fs_seq seq = FEAT ? seq_geometry(p, b) : fs_seq{0, 0, p.Sq, p.Sk};
    const int kv_end = q0 >= seq.q_len ? 0 : p.causal ? min(seq.k_len, min(q0 + br, seq.q_len)) : seq.k_len;
    const int tiles = (kv_end + bc - 1) / bc;
    int n_kv = tiles;
    if (KPM) { /* the listed tiles that start before kv_end */
        const int *count = a.kpm_count + b * (a.kpm_tiles + 2), ahead = (kv_end - count[0] + bc - 1) / bc;
        n_kv = count[1 + min(max(ahead, 0), a.kpm_tiles)];
    }
    return sm90_work{b, bh % p.H, q0, n_kv, FEAT && p.cu_seqlens_q ? 0 : b,
                     FEAT && p.cu_seqlens_q && q0 >= seq.q_len, seq};
}
#endif

/* Whether blocks claim their items as they go (a.claims) rather than by stride: where items differ in cost,
 * causal ones (1 to Sk / Bc key tiles; by stride the busiest block gets 3-6% above the mean on the causal sweep),
 * packed sequences of mixed lengths and padding masks, and heads whose last query tile leaves warpgroups idle (Br
 * not dividing Sq; at NWG = 3 each block of a stride takes the same query tile of every head it visits: S = 1024
 * with Br = 192, 8-12% faster claimed). */
static int sm90_claims(const fs_attn_params *p, int br)
{
    return p->causal || p->cu_seqlens_q || p->kpm || p->Sq % br;
}

/* Heads per section of the causal item order, and at most the late heads of v6.7: as many as have their K and V in
 * 24 MiB, about half the L2 of an H100 or H200. Heaviest-first over all heads at once (v5.3) streamed every head's K/V
 * from memory for each of its query tiles: 16 x 16 x 1024 x 128 took 260 us on the H100 against cuDNN's 190. */
static int sm90_section(const fs_attn_params *p)
{
    const long long fit = (24LL << 20) / (4LL * p->Sk * p->D), heads = (long long)p->B * p->H;
    return fit < 1 ? 1 : fit < heads ? (int)fit : (int)heads;
}

#endif
