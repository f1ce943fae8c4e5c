/* Hopper attention forward: the tile configuration in one place (consumer warpgroups per head dim; per head dim, key
 * tile and warpgroup count the K/V ring's stages and the registers setmaxnreg gives a consumer thread), the T5 table
 * layout, the constants of one instantiation and the launch arguments. Host and device code include it. */
#ifndef FLASHSCI_ATTENTION_SM90_TILE_CUH
#define FLASHSCI_ATTENTION_SM90_TILE_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "attention/params.h"

/* Consumer warpgroups: three (Br = 192) at D = 64 (plain S = 4096, 8192: 8-12% faster than two warpgroups with
 * Bc = 128 or 192; packed UniProt batches 4-28%), two at D = 128, where O alone takes 64 of the 160 registers per
 * thread that three consumer warpgroups leave. */
static constexpr int sm90_nwg(int d)
{
    return d == 64 ? 3 : 2;
}

/* ---- tile configuration, one place: per (D, Bc, consumer warpgroups NWG; Br = 64 NWG) the K/V ring stages and
 * the registers setmaxnreg gives each consumer thread (the producer warpgroup keeps 24). NWG: sm90_nwg, or 2 at D = 64
 * below one item per SM (sm90_two_wg64); Bc = 128, or 64 for the protein options on short key ranges
 * (sm90_narrow_keys) ---- */
template <int D, int BC, int NWG> struct fs_sm90_tile;
/*                                                 STAGES  REGS */
template <> struct fs_sm90_tile<64, 64, 3>   { enum { STAGES = 6, REGS = 160 }; };
template <> struct fs_sm90_tile<64, 128, 3>  { enum { STAGES = 4, REGS = 160 }; };
template <> struct fs_sm90_tile<64, 128, 2>  { enum { STAGES = 4, REGS = 240 }; };
template <> struct fs_sm90_tile<128, 128, 2> { enum { STAGES = 2, REGS = 240 }; };

#define FS_SM90_T5_MAX 2048 /* T5 bias entries of a table (FEAT) */
#define FS_SM90_T5_PAD 192   /* entries each side of a T5 table repeating its end values (sm90_softmax, sm90_t5_init) */
#define FS_SM90_T5_STRIDE (FS_SM90_T5_MAX + 2 * FS_SM90_T5_PAD) /* floats; a multiple of 4 (16-byte bulk copies) */
#define FS_SM90_T5_MIN_SCALE 1e-6 /* |scale| at least for the T5 kernels, whose tables hold bias / scale */
#define FS_SM90_WORK_BYTES 64 /* the work item the producer hands to the consumers (sm90_work) */

/* How a kernel adds the T5 bias: not at all; in the softmax, from t5 where the item has a table (FEAT); as S's
 * initial value on tiles where it varies and as one shift elsewhere (T5: sm90_t5_init). */
enum { SM90_NO_T5, SM90_T5_IF_SET, SM90_T5_ALWAYS };

/* One instantiation of the kernel: its template arguments and the constants its producer, consumers and epilogue
 * share (FEAT: packed sequences, seqlens and the T5 bias; KPM: a key padding mask too; T5: the plain kernel with the
 * T5 bias). */
template <int D_, int BC_, int NWG_, typename T_, bool FEAT_, bool KPM_, bool T5_> struct sm90_config {
    using T = T_;
    using tile = fs_sm90_tile<D_, BC_, NWG_>;
    static constexpr int D = D_, BC = BC_, NWG = NWG_;
    static constexpr bool FEAT = FEAT_, KPM = KPM_, T5 = T5_;
    static constexpr int THREADS = (NWG + 1) * 128, STAGES = tile::STAGES, BR = 64 * NWG, NS = BC / 8, NO = D / 8,
                         HALVES = D / 64, ARRIVALS = 4 * NWG;
    /* D = 128: the consumers hold Q_i in registers for the item (S = Q K^T then reads only K from shared memory) */
    static constexpr bool Q_REGS = D == 128 && !FEAT;
    /* the T5 bias: FEAT kernels add it where p.t5_table is set, T5 ones (the plain kernel and the bias) always */
    static constexpr int BIAS = T5 ? SM90_T5_ALWAYS : FEAT ? SM90_T5_IF_SET : SM90_NO_T5;
};

typedef struct {
    fs_attn_params p;
    float scale_log2; /* scale * log2(e) */
    int n_qtiles, items;
    int section; /* causal: heads per section of the item order (sm90_section) */
    int late_heads; /* plain, non-causal, light last tiles: the last late_heads heads' light tiles end the order (0: none) */
    int *claims; /* NULL: block b takes items b, b + grid, ...; else [next, blocks done], zero between launches:
                    after its first item a block claims the next unclaimed one */
    int t5_lneg, t5_n; /* FEAT, T5: bias of relative positions -t5_lneg .. t5_n - 1 - t5_lneg (fs_t5_span) */
    int t5_row;        /* FEAT, T5: floats per head in t5_rows, a multiple of 4 */
    const float *t5_rows; /* FEAT, T5: each head's table as shared memory holds it (sm90_t5_expand) */
    /* FEAT, key padding (sm90_kpm_prepare): a batch's key tiles start at its first kept key f, tile t at f + t Bc, and
     * those that keep a key, in order, are its list; per batch f, then per tile t the count of the list's tiles
     * before t (t = 0 .. kpm_tiles); per (batch, list entry, lane % 4) the keys of the entry's tile the mask drops
     * and its first key */
    const int *kpm_count;
    const uint2 *kpm_list; /* {dropped keys, first key} */
    int kpm_tiles;         /* key tiles per batch, at most */
} fs_sm90_args;

#endif
