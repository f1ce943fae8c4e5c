/* Hopper attention forward: the producer. One thread claims the work items (scheduler.cuh), hands each to the consumer
 * warpgroups through the shared slot and issues every TMA load: the item's Q tile with its head's T5 table, then its
 * K and V tiles into the ring of mbarrier-guarded stages. */
#ifndef FLASHSCI_ATTENTION_SM90_PRODUCER_CUH
#define FLASHSCI_ATTENTION_SM90_PRODUCER_CUH

#include "attention/sm90/smem.cuh"
#include "attention/sm90/tile.cuh"
#include "common/tma.cuh"

#ifdef FS_WGMMA
/* The producer thread's whole work for its block; t5_on: the items carry a T5 table. */
template <class K>
FS_DEV_T void sm90_producer(const sm90_shared<typename K::T> &sh, const CUtensorMap &map_q, const CUtensorMap &map_k,
                            const CUtensorMap &map_v, const fs_sm90_args &a, bool t5_on)
{
    using T = typename K::T;
    constexpr int D = K::D, BC = K::BC, STAGES = K::STAGES, BR = K::BR, HALVES = K::HALVES;
    constexpr bool FEAT = K::FEAT, KPM = K::KPM, Q_REGS = K::Q_REGS;
    const fs_attn_params &p = a.p;
    T *const sQ = sh.sQ, *const sK = sh.sK, *const sV = sh.sV;
    float *const s_t5 = sh.s_t5;
    uint64_t *const q_full = sh.q_full, *const q_empty = sh.q_empty, *const k_full = sh.k_full, *const k_empty = sh.k_empty;
    uint64_t *const v_full = sh.v_full, *const v_empty = sh.v_empty, *const item_full = sh.item_full,
                    *const item_read = sh.item_read;
    sm90_work *const s_work = sh.s_work;
    int s = 0, phase = 0, q_phase = 0, item_phase = 0;
    /* rows row0.. of (b, h) into a tile of `rows` rows once `empty` has completed the phase of the given
     * parity, completing on `full`: one box per 64-column half */
    auto load = [&](T *tile, const CUtensorMap *map, int rows, int row0, int b, int h, uint64_t *full,
                    uint64_t *empty, int parity) {
        mbar_wait(empty, parity);
        mbar_expect_tx(full, rows * D * 2);
        for (int c = 0; c < HALVES; c++) tma_load_4d(tile + c * rows * 64, map, c * 64, row0, h, b, full);
    };
    /* the block's first item is blockIdx.x, the next ones the following by stride or (claims) the next
     * unclaimed ones: causal items come heaviest first, so claiming on demand is longest-first list scheduling
     * (static stride: up to 6% above the mean load) */
    auto next = [&](int t) { return a.claims ? (int)gridDim.x + atomicAdd(a.claims, 1) : t + (int)gridDim.x; };
    /* item t, or the first one from t on that is not past its packed sequence (n_kv = -1: past the last) */
    auto claim = [&](int &t) {
        for (;; t = next(t)) {
            sm90_work w = sm90_work{};
            w.n_kv = -1;
            if (t < a.items) {
                w = sm90_item<FEAT, KPM>(a, t, BR, BC);
                if (FEAT && w.skip) continue;
            }
            return w;
        }
    };
    /* w into the slot once the consumers have read the last item, then its Q once the consumers are done with
     * the last item's (its last Q K^T; at D = 128 once it is in their registers) */
    auto hand_over = [&](const sm90_work &w) {
        mbar_wait(item_read, item_phase ^ 1);
        *s_work = w;
        mbar_arrive(item_full);
        item_phase ^= 1;
        if (w.n_kv <= 0) return; /* the end, or no key to read (O = 0): nothing to load */
        if (t5_on) { /* the head's T5 table lands with Q: the consumers were done with the one in
                                   * its slot, two Q tiles back, when they released the last Q tile; its bytes
                                   * are added before the Q load's arrival can complete the phase */
            mbar_wait(q_empty, q_phase ^ 1);
            mbar_add_tx(q_full, a.t5_row * 4);
            bulk_load(s_t5 + q_phase * FS_SM90_T5_STRIDE, a.t5_rows + (int64_t)w.h * a.t5_row, a.t5_row * 4, q_full);
        }
        load(sQ, &map_q, BR, (int)w.seq.qo + w.q0, w.tb, w.h, q_full, q_empty, q_phase ^ 1);
        q_phase ^= 1;
    };
    /* tile j of an item's K/V (KPM: listed tile j), K/V head hkv */
    auto load_kv = [&](const sm90_work &w, int hkv, int j) {
        const int k0 = (int)w.seq.ko + (KPM ? (int)a.kpm_list[(w.b * a.kpm_tiles + j) * 4].y : j * BC);
        load(sK + s * BC * D, &map_k, BC, k0, w.tb, hkv, &k_full[s], &k_empty[s], phase ^ 1);
        load(sV + s * BC * D, &map_v, BC, k0, w.tb, hkv, &v_full[s], &v_empty[s], phase ^ 1);
        if (++s == STAGES) { s = 0; phase ^= 1; }
    };
    int t = blockIdx.x;
    if constexpr (Q_REGS) {
        /* Q's tile is free from the start of an item: the next item is handed over, and its Q loaded, once this
         * item's tile `ahead` is loaded. Stride: a whole item ahead, after tile STAGES - 1, whose load waited
         * for the last item's last V to empty (the consumers are taking this item by then, and the hand-over
         * holds back no load they wait for). Claims: after the last tile, as below, so that an item goes to
         * the block free soonest. Claimed a whole item ahead, causal S = 2048-8192 ran 2-4% slower (traced: the
         * blocks ended 40 us apart, against 20); 2 tiles before the last, as slow (the steps there 7% longer,
         * likely the claim's atomic holding back the next loads) */
        sm90_work w = sm90_work{}; /* the item whose tiles load (none ahead of the first); one hand-over site:
                                    * with it inside the tile loop the producer took 261 more instructions */
        for (bool first = true;; first = false) {
            const int hkv = w.h / p.kv_group, ahead = a.claims ? w.n_kv - 1 : min(STAGES - 1, w.n_kv - 1);
            int j = 0;
            for (; j <= ahead; j++) load_kv(w, hkv, j);
            if (!first) t = next(t);
            hand_over(claim(t));
            for (; j < w.n_kv; j++) load_kv(w, hkv, j);
            w = *s_work; /* the item handed over */
            if (w.n_kv < 0) break;
        }
    } else { /* the next item once this one's tiles are loaded, when the consumers are about done with Q (claim's
              * body written out: calling claim here made the FEAT producers spill 20 bytes) */
        for (;; t = next(t)) {
            sm90_work w = sm90_work{};
            w.n_kv = -1;
            if (t < a.items) {
                w = sm90_item<FEAT, KPM>(a, t, BR, BC);
                if (FEAT && w.skip) continue; /* past its packed sequence: not handed over */
            }
            hand_over(w);
            if (w.n_kv < 0) break;
            const int hkv = w.h / p.kv_group;
            for (int j = 0; j < w.n_kv; j++) load_kv(w, hkv, j);
        }
    }
    if (a.claims) { /* the last block done leaves the counters at zero for the next launch */
        __threadfence();
        if (atomicAdd(a.claims + 1, 1) == (int)gridDim.x - 1) {
            a.claims[0] = 0;
            a.claims[1] = 0;
        }
    }
}
#endif

#endif
