/* Attention backward for sm_80+, the additive bias's gradient (bias_grad): dbias = dS summed over the dimensions the
 * bias broadcasts over, in the bias's own shape and dtype, deterministic. A block owns a 64 x 64 tile of the bias's
 * (B or 1, H or 1, Sq or 1, Sk or 1) index space (one tile along a broadcast sequence dimension) and loops, in a fixed
 * order, over every (b, h, query tile, key tile) that adds into it, recomputing
 *   S = Q_i K_j^T,  P = exp2(S c + bias log2 e [+ T5] - L_i log2 e),  dP = dO_i V_j^T,  dS = P o (dP - D_i)
 * (4 warps x 16 query rows) and summing dS in registers; rows or columns along a broadcast sequence dimension are then
 * summed across lanes and warps. Two products per visited tile: a full-size bias costs about 40% of the main kernel.
 */
#ifndef FLASHSCI_ATTENTION_SM80_BACKWARD_DBIAS_CUH
#define FLASHSCI_ATTENTION_SM80_BACKWARD_DBIAS_CUH

#include "attention/sm80/backward.cuh"

/* ---- tile configuration: 4 warps x 16 query rows, 64 keys ---- */
template <int D> struct fs_bwd_dbias_tile {
    enum { WARPS = 4, BR = 64, BC = 64, THREADS = 128 };
};

/* Shared memory (byte offsets): Q_i, dO_i, K_j, V_j, the cross-warp column sums, then the T5 table. */
template <int D, typename T> struct fs_bwd_dbias_smem {
    typedef fs_bwd_dbias_tile<D> tile;
    enum {
        P = fs_pitch<D>::VALUE, TILE = 64 * P * (int)sizeof(T),
        Q = 0, DO = TILE, K = 2 * TILE, V = 3 * TILE, COLS = 4 * TILE, T5 = COLS + tile::WARPS * tile::BC * 4
    };
    static int bytes(int t5_n) { return T5 + 4 * t5_n; }
};

/* Store x, converted to the bias's dtype, at element i of dbias. */
FS_DEV void store_as(void *base, int64_t i, fs_dtype dt, float x)
{
    if (dt == FS_F32) static_cast<float *>(base)[i] = x;
    else if (dt == FS_F64) static_cast<double *>(base)[i] = x;
    else if (dt == FS_F16) static_cast<__half *>(base)[i] = __float2half_rn(x);
    else static_cast<__nv_bfloat16 *>(base)[i] = __float2bfloat16_rn(x);
}

template <int D, typename T>
__global__ void __launch_bounds__(fs_bwd_dbias_tile<D>::THREADS) attention_bwd_dbias_sm80(const fs_bwd_args a)
{
    using tile = fs_bwd_dbias_tile<D>;
    using sm = fs_bwd_dbias_smem<D, T>;
    constexpr int BR = tile::BR, BC = tile::BC, THREADS = tile::THREADS, P = sm::P, KD = D / 16, NS = BC / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    T *sQ = reinterpret_cast<T *>(smem + sm::Q), *sdO = reinterpret_cast<T *>(smem + sm::DO);
    T *sK = reinterpret_cast<T *>(smem + sm::K), *sV = reinterpret_cast<T *>(smem + sm::V);
    float *s_cols = reinterpret_cast<float *>(smem + sm::COLS), *s_t5 = reinterpret_cast<float *>(smem + sm::T5);

    const fs_attn_bwd_params &g = a.g;
    const fs_attn_params &p = g.p;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gr = lane >> 2, t4 = lane & 3;
    const int64_t *dims = g.dbias_dims;
    const bool all_b = dims[0] == 1, all_h = dims[1] == 1, all_q = dims[2] == 1, all_k = dims[3] == 1;
    const int n_qt = (p.Sq + BR - 1) / BR, n_kt = (p.Sk + BC - 1) / BC;
    const int tiles_q = all_q ? 1 : n_qt, tiles_k = all_k ? 1 : n_kt;
    int bid = blockIdx.x;
    const int kt0 = bid % tiles_k; bid /= tiles_k;
    const int qt0 = bid % tiles_q; bid /= tiles_q;
    const int hb = bid % (int)dims[1], bb = bid / (int)dims[1];

    const int l7 = lane & 7, mi = lane >> 3;
    int q_off[4], b_off[4];
    lane_offsets<P>(q_off, warp * 16 + (lane & 15), lane >> 4); /* this warp's rows of Q_i, dO_i (A) */
    lane_offsets<P>(b_off, l7 + (mi >> 1) * 8, mi & 1);         /* K_j, V_j as B^T */
    float acc[NS][4];
#pragma unroll
    for (int n = 0; n < NS; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;

    for (int b = all_b ? 0 : bb; b < (all_b ? p.B : bb + 1); b++) {
        const fs_seq seq = seq_geometry(p, b);
        for (int h = all_h ? 0 : hb; h < (all_h ? p.H : hb + 1); h++) {
            const int hkv = h / p.kv_group;
            if (p.t5_table) {
                __syncthreads(); /* every warp is done with the previous head's table */
                bwd_t5_table(a, s_t5, h, tid, THREADS);
            }
            for (int qt = all_q ? 0 : qt0; qt < (all_q ? n_qt : qt0 + 1); qt++) {
                const int q0 = qt * BR;
                const int row_base = q0 + warp * 16 + gr;
                float lse2[2], di[2];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int i = row_base + 8 * r;
                    const float lse = i < seq.q_len ? static_cast<const float *>(p.lse)[b * p.lse_sb + h * p.lse_sh + i] : 0.f;
                    lse2[r] = lse == -INFINITY ? INFINITY : lse * FS_LOG2E;
                    di[r] = i < seq.q_len ? a.delta[fs_bwd_row(p, b, h, 0, i)] : 0.f;
                }
                for (int kt = all_k ? 0 : kt0; kt < (all_k ? n_kt : kt0 + 1); kt++) {
                    const int k0 = kt * BC;
                    if (q0 >= seq.q_len || k0 >= seq.k_len || (p.causal && k0 > q0 + BR - 1)) continue; /* dS = 0 there */
                    __syncthreads(); /* every warp is done with the previous tiles */
                    load_tile<BR, D, THREADS>(sQ, static_cast<const T *>(p.q) + b * p.q_sb + h * p.q_sh + (int64_t)q0 * p.q_ss,
                                                  p.q_ss, min(BR, seq.q_len - q0), tid);
                    load_tile<BR, D, THREADS>(sdO, static_cast<const T *>(g.dout) + b * g.do_sb + h * g.do_sh +
                                                  (int64_t)q0 * g.do_ss, g.do_ss, min(BR, seq.q_len - q0), tid);
                    load_tile<BC, D, THREADS>(sK, static_cast<const T *>(p.k) + b * p.k_sb + hkv * p.k_sh + (int64_t)k0 * p.k_ss,
                                                  p.k_ss, min(BC, seq.k_len - k0), tid);
                    load_tile<BC, D, THREADS>(sV, static_cast<const T *>(p.v) + b * p.v_sb + hkv * p.v_sh + (int64_t)k0 * p.v_ss,
                                                  p.v_ss, min(BC, seq.k_len - k0), tid);
                    cp_async_commit();
                    cp_async_wait<0>();
                    __syncthreads();
                    float s[1][NS][4], dp[1][NS][4];
#pragma unroll
                    for (int n = 0; n < NS; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) s[0][n][e] = dp[0][n][e] = 0.f;
                    mma_abt<1, KD, NS, P, P, T>(s, smem_addr(sQ), q_off, smem_addr(sK), b_off);
                    mma_abt<1, KD, NS, P, P, T>(dp, smem_addr(sdO), q_off, smem_addr(sV), b_off);
#pragma unroll
                    for (int n = 0; n < NS; n++)
#pragma unroll
                        for (int c = 0; c < 2; c++) {
                            const int key = k0 + n * 8 + 2 * t4 + c;
                            const bool out = key >= seq.k_len || (p.kpm && !p.kpm[b * p.kpm_sb + (int64_t)key * p.kpm_sk]);
#pragma unroll
                            for (int r = 0; r < 2; r++) {
                                const int query = row_base + 8 * r;
                                const bool masked = out || query >= seq.q_len || (p.causal && key > query);
                                const float pv = bwd_prob<true>(a, seq, s_t5, b, h, query, key, s[0][n][2 * r + c], lse2[r], masked);
                                acc[n][2 * r + c] += pv * (dp[0][n][2 * r + c] - di[r]);
                            }
                        }
                }
            }
        }
    }

    /* sums along broadcast sequence dimensions: keys within a row (lanes t4, then n8 tiles), queries across lanes g
     * and warps (through shared memory, warps in order) */
    if (all_k) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float x = 0.f;
#pragma unroll
            for (int n = 0; n < NS; n++) x += acc[n][2 * r] + acc[n][2 * r + 1];
            x += __shfl_xor_sync(0xffffffff, x, 1);
            x += __shfl_xor_sync(0xffffffff, x, 2);
#pragma unroll
            for (int n = 0; n < NS; n++) acc[n][2 * r] = acc[n][2 * r + 1] = x; /* every column holds the row's sum */
        }
    }
    if (all_q) {
#pragma unroll
        for (int n = 0; n < NS; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                float x = acc[n][c] + acc[n][2 + c];
                x += __shfl_xor_sync(0xffffffff, x, 4);
                x += __shfl_xor_sync(0xffffffff, x, 8);
                x += __shfl_xor_sync(0xffffffff, x, 16);
                if (gr == 0) s_cols[warp * BC + n * 8 + 2 * t4 + c] = x;
            }
        __syncthreads();
    }
    /* write the tile (rows / columns of one where the bias broadcasts) */
    const int64_t *st = g.dbias_strides;
    const int64_t base = bb * st[0] + hb * st[1];
    if (all_q) {
        for (int j = tid; j < (all_k ? 1 : BC); j += THREADS) {
            const int key = kt0 * BC + j;
            if (key >= p.Sk && !all_k) continue;
            const float x = s_cols[j] + s_cols[BC + j] + s_cols[2 * BC + j] + s_cols[3 * BC + j];
            store_as(g.dbias, base + (all_k ? 0 : key * st[3]), p.bias_dtype, x);
        }
        return;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int query = qt0 * BR + warp * 16 + gr + 8 * r;
        if (query >= p.Sq) continue;
        if (all_k) {
            if (t4 == 0) store_as(g.dbias, base + query * st[2], p.bias_dtype, acc[0][2 * r]);
            continue;
        }
#pragma unroll
        for (int n = 0; n < NS; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int key = kt0 * BC + n * 8 + 2 * t4 + c;
                if (key < p.Sk) store_as(g.dbias, base + query * st[2] + key * st[3], p.bias_dtype, acc[n][2 * r + c]);
            }
    }
}

#endif
