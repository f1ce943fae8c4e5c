/* Attention backward for sm_80+, the dQ kernel of deterministic runs and of runs that want the T5 table's gradient: by
 * query block, so that each dQ row is summed in one fixed order (the main kernel then skips its float32 atomics). A block owns the query tile Q_i of Br = 16 WARPS
 * rows (16 per warp, as the forward kernel) and streams K_j, V_j of Bc rows through double-buffered shared memory:
 *   S = Q_i K_j^T,  P = exp2(S c [+ bias + T5] - L_i log2 e),  dP = dO_i V_j^T,  dS = P o (dP - D_i),  dQ_i += dS K_j
 * with P and dS in registers (dS feeds the last product straight from the accumulators). dQ_i is stored unscaled into
 * the float32 accumulator, which the post-pass scales, rotates back and converts as after the atomics. Three products
 * per tile against the main kernel's five: deterministic runs cost about 60% more than the default.
 * The T5 table's gradient (t5_grad): dtable[h][n] = sum of dS over the (b, i, j) whose j - i falls in bucket n. Each
 * tile's dS goes through shared memory, thread d sums diagonal d (j - i = k0 - q0 + d - (Br - 1)) in row order, and
 * thread n adds the diagonals of bucket n in diagonal order: per block one partial per bucket, summed over the query
 * blocks and batches by a last small kernel (backward_passes.cu), every sum in a fixed order.
 * Delta pass (before the other kernels, for the T5 and bias gradients): the same loop computes D_i = rowsum(P o dP) in
 * float32 instead of rowsum(dO o O) from the rounded output. The two agree to the output's rounding, but the T5 and
 * bias gradients sum dS over whole rows, where that rounding no longer averages out (a bias broadcast over the keys has
 * the gradient sum_j P_ij (dP_ij - D_i) = 0 exactly with this D).
 */
#ifndef FLASHSCI_ATTENTION_SM80_BACKWARD_DQ_CUH
#define FLASHSCI_ATTENTION_SM80_BACKWARD_DQ_CUH

#include "attention/sm80/backward.cuh"

#define FS_T5_GRAD_BUCKETS 1024 /* T5 gradients on CUDA take up to this many buckets */

/* ---- tile configuration: warps (Br = 16 WARPS query rows) and Bc keys per step ---- */
template <int D> struct fs_bwd_dq_tile {
    enum { WARPS = 4, BR = 64, BC = D <= 128 ? 64 : 32, THREADS = 128 };
};

/* Shared memory (byte offsets): Q_i, dO_i, two stages of K_j and V_j, the dS tile, diagonal sums and buckets and the
 * bucket sums of the T5 gradient, then the T5 table. */
template <int D, typename T> struct fs_bwd_dq_smem {
    typedef fs_bwd_dq_tile<D> tile;
    enum {
        P = fs_pitch<D>::VALUE, Q = 0, DO = Q + tile::BR * P * (int)sizeof(T), KV = DO + tile::BR * P * (int)sizeof(T),
        STAGE = 2 * tile::BC * P * (int)sizeof(T), /* K_j then V_j */
        NDIAG = tile::BR + tile::BC - 1, DSP = tile::BC + 1, /* diagonals of a tile; dS row pitch (floats) */
        DS = KV + 2 * STAGE, DIAG = DS + tile::BR * DSP * 4, DBK = DIAG + NDIAG * 4, BSUM = DBK + NDIAG * 4,
        T5 = BSUM + FS_T5_GRAD_BUCKETS * 4
    };
    static int bytes(int t5_n) { return T5 + 4 * t5_n; }
};

/* The T5 gradient of one tile: dS (s, this warp's 16 rows x NS n8 tiles) through shared memory, diagonal sums in row
 * order (diagonal d: key - query = rel0 + d - (BR - 1)), then each bucket's thread adds its diagonals in order. */
template <int NDIAG, int DSP, int BR, int BC, int NS>
FS_DEV_T void t5_grad_tile(const fs_bwd_args &a, unsigned char *smem, const float (&s)[1][NS][4], int rel0, int warp, int gr,
                           int t4, int tid, int threads)
{
    const fs_attn_params &p = a.g.p;
    float *ds = reinterpret_cast<float *>(smem + (size_t)a.dq_smem_ds), *diag = ds + BR * DSP;
    int *dbk = reinterpret_cast<int *>(diag + NDIAG);
    float *bsum = reinterpret_cast<float *>(dbk + NDIAG);
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) ds[(warp * 16 + gr + 8 * (e >> 1)) * DSP + n * 8 + 2 * t4 + (e & 1)] = s[0][n][e];
    __syncthreads(); /* the tile is complete; every bucket thread is done with the previous tile's diagonals */
    for (int d = tid; d < NDIAG; d += threads) {
        const int c0 = d - (BR - 1); /* key - query of the diagonal within the tile */
        float sum = 0.f;
        for (int r = max(0, -c0); r < BR && r + c0 < BC; r++) sum += ds[r * DSP + r + c0];
        diag[d] = sum;
        dbk[d] = fs_t5_bucket(rel0 + c0, p.t5_buckets, p.t5_max_distance, p.t5_bidirectional);
    }
    __syncthreads();
    for (int n = tid; n < p.t5_buckets; n += threads) {
        float sum = 0.f;
        for (int d = 0; d < NDIAG; d++)
            if (dbk[d] == n) sum += diag[d];
        bsum[n] += sum;
    }
}

template <int D, typename T, bool FEAT>
__global__ void __launch_bounds__(fs_bwd_dq_tile<D>::THREADS) attention_bwd_dq_sm80(const fs_bwd_args a)
{
    using tile = fs_bwd_dq_tile<D>;
    using sm = fs_bwd_dq_smem<D, T>;
    constexpr int BR = tile::BR, BC = tile::BC, THREADS = tile::THREADS, P = sm::P, KD = D / 16, NS = BC / 8, NO = D / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    T *sQ = reinterpret_cast<T *>(smem + sm::Q), *sdO = reinterpret_cast<T *>(smem + sm::DO);
    T *sKV = reinterpret_cast<T *>(smem + sm::KV);
    float *s_t5 = reinterpret_cast<float *>(smem + sm::T5);

    const fs_attn_bwd_params &g = a.g;
    const fs_attn_params &p = g.p;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gr = lane >> 2, t4 = lane & 3;
    const int n_qt = (p.Sq + BR - 1) / BR;
    const int qt = blockIdx.x % n_qt, h = blockIdx.x / n_qt % p.H, b = blockIdx.x / n_qt / p.H;
    const int q0 = qt * BR;
    const fs_seq seq = FEAT ? seq_geometry(p, b) : fs_seq{0, 0, p.Sq, p.Sk};
    if (q0 >= seq.q_len) { /* rows past the length keep the zeros the pre-pass wrote */
        if (FEAT && g.dtable)
            for (int n = tid; n < p.t5_buckets; n += THREADS) a.t5_part[((int64_t)(b * p.H + h) * n_qt + qt) * p.t5_buckets + n] = 0.f;
        return;
    }
    const int rows = min(BR, seq.q_len - q0), hkv = h / p.kv_group;
    const int kv_end = p.causal ? min(seq.k_len, q0 + BR) : seq.k_len, n_kv = (kv_end + BC - 1) / BC;

    const T *gQ = static_cast<const T *>(p.q) + b * p.q_sb + h * p.q_sh + (seq.qo + q0) * p.q_ss;
    const T *gdO = static_cast<const T *>(g.dout) + b * g.do_sb + h * g.do_sh + (seq.qo + q0) * g.do_ss;
    const T *gK = static_cast<const T *>(p.k) + b * p.k_sb + hkv * p.k_sh + seq.ko * p.k_ss;
    const T *gV = static_cast<const T *>(p.v) + b * p.v_sb + hkv * p.v_sh + seq.ko * p.v_ss;
    load_tile<BR, D, THREADS>(sQ, gQ, p.q_ss, rows, tid);
    load_tile<BR, D, THREADS>(sdO, gdO, g.do_ss, rows, tid);
    auto load_kv = [&](int j) { /* K_j, V_j into stage j & 1 (committed regardless) */
        if (j < n_kv) {
            T *st = sKV + (j & 1) * 2 * BC * P;
            const int k0 = j * BC, valid = min(BC, seq.k_len - k0);
            load_tile<BC, D, THREADS>(st, gK + (int64_t)k0 * p.k_ss, p.k_ss, valid, tid);
            load_tile<BC, D, THREADS>(st + BC * P, gV + (int64_t)k0 * p.v_ss, p.v_ss, valid, tid);
        }
        cp_async_commit();
    };
    load_kv(0);
    if (FEAT && p.t5_table) bwd_t5_table(a, s_t5, h, tid, THREADS); /* visible after the first barrier */
    float *s_bsum = reinterpret_cast<float *>(smem + sm::BSUM);
    if (FEAT && g.dtable)
        for (int n = tid; n < p.t5_buckets; n += THREADS) s_bsum[n] = 0.f;

    /* this thread's rows g, g + 8 of its warp: L log2 e (+inf without a key) and D */
    const int row_base = q0 + warp * 16 + gr;
    float lse2[2], di[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = row_base + 8 * r;
        const float lse = i < seq.q_len ? static_cast<const float *>(p.lse)[b * p.lse_sb + h * p.lse_sh + seq.qo + i] : 0.f;
        lse2[r] = lse == -INFINITY ? INFINITY : lse * FS_LOG2E;
        di[r] = i < seq.q_len ? a.delta[fs_bwd_row(p, b, h, seq.qo, i)] : 0.f;
    }
    const int l7 = lane & 7, mi = lane >> 3;
    int q_off[4], b_off[4], t_off[4];
    lane_offsets<P>(q_off, warp * 16 + (lane & 15), lane >> 4); /* this warp's rows of Q_i, dO_i (A) */
    lane_offsets<P>(b_off, l7 + (mi >> 1) * 8, mi & 1);         /* K_j, V_j as B^T */
    lane_offsets<P>(t_off, l7 + (mi & 1) * 8, mi >> 1);         /* K_j as B (transposed loads) */
    const uint32_t sQ_a = smem_addr(sQ), sdO_a = smem_addr(sdO);

    float dq[1][NO][4], pdp[2] = {0.f, 0.f}; /* pdp: this thread's share of rowsum(P o dP) in a Delta pass */
#pragma unroll
    for (int n = 0; n < NO; n++) dq[0][n][0] = dq[0][n][1] = dq[0][n][2] = dq[0][n][3] = 0.f;
    for (int j = 0; j < n_kv; j++) {
        cp_async_wait<0>();
        __syncthreads(); /* K_j, V_j (and Q_i, dO_i, the T5 table) landed; every warp is done with stage j - 1 */
        load_kv(j + 1);
        const int k0 = j * BC;
        const uint32_t sK_a = smem_addr(sKV + (j & 1) * 2 * BC * P), sV_a = sK_a + 2 * BC * P;
        float s[1][NS][4], dp[1][NS][4];
#pragma unroll
        for (int n = 0; n < NS; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[0][n][e] = dp[0][n][e] = 0.f;
        mma_abt<1, KD, NS, P, P, T>(s, sQ_a, q_off, sK_a, b_off);
        mma_abt<1, KD, NS, P, P, T>(dp, sdO_a, q_off, sV_a, b_off);
        /* P, dS = P o (dP - D_i); masked: keys past the length or padded, causal keys after the query */
#pragma unroll
        for (int n = 0; n < NS; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int key = k0 + n * 8 + 2 * t4 + c;
                const bool out = key >= seq.k_len || (FEAT && p.kpm && !p.kpm[b * p.kpm_sb + (int64_t)key * p.kpm_sk]);
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int query = row_base + 8 * r;
                    const bool masked = out || (p.causal && key > query);
                    const float pv = bwd_prob<FEAT>(a, seq, s_t5, b, h, query, key, s[0][n][2 * r + c], lse2[r], masked);
                    if (a.delta_pass) pdp[r] = fmaf(pv, dp[0][n][2 * r + c], pdp[r]);
                    s[0][n][2 * r + c] = pv * (dp[0][n][2 * r + c] - di[r]);
                }
            }
        if (a.delta_pass) continue;
        if (FEAT && a.g.dtable) t5_grad_tile<sm::NDIAG, sm::DSP, BR, BC, NS>(a, smem, s, k0 - q0, warp, gr, t4, tid, THREADS);
        /* dQ_i += dS K_j */
#pragma unroll
        for (int kk = 0; kk < NS / 2; kk++) {
            uint32_t af[4];
            pack_a<T>(s[0][2 * kk], s[0][2 * kk + 1], af);
#pragma unroll
            for (int np = 0; np < NO / 2; np++) {
                uint32_t bf[4];
                ldmatrix_x4_trans(sK_a + 2 * (t_off[np & 3] + 64 * (np >> 2) + kk * 16 * P), bf);
                mma16816<T>(dq[0][2 * np], af, bf[0], bf[1]);
                mma16816<T>(dq[0][2 * np + 1], af, bf[2], bf[3]);
            }
        }
    }
    cp_async_wait<0>();
    if (a.delta_pass) { /* D_i = rowsum(P o dP) in float32: the four lanes of a row add their columns */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float x = pdp[r];
            x += __shfl_xor_sync(0xffffffff, x, 1);
            x += __shfl_xor_sync(0xffffffff, x, 2);
            const int i = row_base + 8 * r;
            if (t4 == 0 && i < seq.q_len) a.delta_out[fs_bwd_row(p, b, h, seq.qo, i)] = x;
        }
        return;
    }
    if (FEAT && g.dtable) { /* this block's bucket sums: partial (b, h, query tile) */
        __syncthreads();
        for (int n = tid; n < p.t5_buckets; n += THREADS)
            a.t5_part[((int64_t)(b * p.H + h) * n_qt + qt) * p.t5_buckets + n] = s_bsum[n];
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = row_base + 8 * r;
        if (i < seq.q_len) {
            float *dst = a.dq_acc + fs_bwd_row(p, b, h, seq.qo, i) * D + 4 * t4; /* in fs_dq_slot's order */
#pragma unroll
            for (int m = 0; m < NO / 2; m++)
                *reinterpret_cast<float4 *>(dst + 16 * m) = make_float4(dq[0][2 * m][2 * r], dq[0][2 * m][2 * r + 1],
                                                                         dq[0][2 * m + 1][2 * r], dq[0][2 * m + 1][2 * r + 1]);
        }
    }
}

#endif
