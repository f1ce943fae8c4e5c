/* One (batch, head, query-block) of CPU flash attention. Paper notation (FlashAttention-2): a query block Q_i of Br
 * rows streams over key/value blocks K_j, V_j of Bc rows, keeping the running row max m_i, the running denominator
 * l_i and the unnormalised output O_i. No include guard: forward.c instantiates it per REAL (FS_REAL_DOUBLE 0: float
 * for fp16/bf16/fp32 inputs, 1: double for fp64) and per vector width (FS_VEC_BYTES, through instantiate.h), with
 * BLOCK_TARGET the width's target attribute: attention_block_f_16, ..., attention_block_d_32. */
#if FS_REAL_DOUBLE
#define REAL double
#define RNAME(name) name##_d
#define EXP exp
#define LOG log
#else
#define REAL float
#define RNAME(name) name##_f
#define EXP expf
#define LOG logf
#endif
#define WNAME(name) FS_V(RNAME(name)) /* name_<f|d>_<width> */

/* rot: the call's rotary table (fs_rotary_table), or NULL */
BLOCK_TARGET static void WNAME(attention_block)(const fs_attn_params *p, const float *rot, int64_t b, int64_t h,
                                                int64_t i0, REAL *scratch)
{
    const int D = p->D;
    const int64_t rows = (p->Sq - i0) < FS_CPU_BR ? (p->Sq - i0) : FS_CPU_BR;
    REAL *Qi = scratch;                    /* [Br][D]  scale * Q_i                        */
    REAL *Oi = Qi + FS_CPU_BR * D;         /* [Br][D]  unnormalised output                 */
    REAL *Kt = Oi + FS_CPU_BR * D;         /* [D][Bc]  K_j transposed                      */
    REAL *Vj = Kt + (int64_t)D * FS_CPU_BC;/* [Bc][D]                                      */
    REAL *S = Vj + (int64_t)FS_CPU_BC * D; /* [Br][Bc] scores, then probabilities P_ij     */
    REAL m[FS_CPU_BR], l[FS_CPU_BR];

    const char *qb = (const char *)p->q, *kb = (const char *)p->k, *vb = (const char *)p->v;
    const size_t es = fs_dtype_itemsize(p->dtype);
    const int64_t hkv = h / p->kv_group; /* the K/V head this query head reads */
    /* this sequence's rows: packed (cu_seqlens) or padded, then cut by seqlens; queries at or past q_len
     * are skipped (padded: written as zeros, lse -inf; packed: not written, they belong to the next one) */
    const int64_t qo = p->cu_seqlens_q ? p->cu_seqlens_q[b] : 0, ko = p->cu_seqlens_k ? p->cu_seqlens_k[b] : 0;
    int64_t q_len = p->cu_seqlens_q ? p->cu_seqlens_q[b + 1] - qo : p->Sq;
    int64_t k_len = p->cu_seqlens_k ? p->cu_seqlens_k[b + 1] - ko : p->Sk;
    if (p->seqlens) {
        const int64_t len = p->seqlens[b] < 0 ? 0 : p->seqlens[b];
        q_len = len < q_len ? len : q_len;
        k_len = len < k_len ? len : k_len;
    }
    const int64_t active = q_len - i0 < 0 ? 0 : (q_len - i0 < rows ? q_len - i0 : rows);
    for (int64_t r = 0; r < rows; r++) {
        if (r < active) {
            RNAME(fs_load_row)(qb + es * (b * p->q_sb + h * p->q_sh + (qo + i0 + r) * p->q_ss), p->dtype, Qi + r * D, D);
            for (int d = 0; d < D; d++) Qi[r * D + d] *= (REAL)p->scale;
            if (p->rotary) RNAME(fs_rotate_at)(Qi + r * D, D, rot, i0 + r, p->rotary_base, 1);
        }
        for (int d = 0; d < D; d++) Oi[r * D + d] = 0;
        m[r] = -INFINITY;
        l[r] = 0;
    }
    /* causal (top-left): query i sees keys j <= i, so this block needs keys below i0 + active */
    const int64_t kend = active == 0 ? 0 : p->causal ? (i0 + active < k_len ? i0 + active : k_len) : k_len;
    const char *bias = (const char *)p->bias;
    const size_t bias_es = p->bias ? fs_dtype_itemsize(p->bias_dtype) : 0;
    for (int64_t j0 = 0; j0 < kend; j0 += FS_CPU_BC) {
        const int cols = (int)((kend - j0) < FS_CPU_BC ? (kend - j0) : FS_CPU_BC);
        if (p->kpm) { /* a block of keys the padding mask drops altogether is skipped */
            int kept = 0;
            for (int c = 0; c < cols && !kept; c++) kept = p->kpm[b * p->kpm_sb + (j0 + c) * p->kpm_sk];
            if (!kept) continue;
        }
        for (int c = 0; c < cols; c++) {
            REAL row[FS_CPU_MAX_D];
            RNAME(fs_load_row)(kb + es * (b * p->k_sb + hkv * p->k_sh + (ko + j0 + c) * p->k_ss), p->dtype, row, D);
            if (p->rotary) RNAME(fs_rotate_at)(row, D, rot, j0 + c, p->rotary_base, 1);
            for (int d = 0; d < D; d++) Kt[(int64_t)d * FS_CPU_BC + c] = row[d];
            RNAME(fs_load_row)(vb + es * (b * p->v_sb + hkv * p->v_sh + (ko + j0 + c) * p->v_ss), p->dtype, Vj + (int64_t)c * D, D);
        }
        for (int d = 0; cols < FS_CPU_BC && d < D; d++) /* zero the unused columns: full-width products below */
            for (int c = cols; c < FS_CPU_BC; c++) Kt[(int64_t)d * FS_CPU_BC + c] = 0;
        /* T5 bias of this block by relative position j - i, from rel_min = j0 - (i0 + active - 1) */
        REAL t5[FS_CPU_BR + FS_CPU_BC];
        const int64_t rel_min = j0 - (i0 + active - 1);
        for (int t = 0; p->t5_table && t < active + cols - 1; t++) {
            const int bucket = fs_t5_bucket((int)(rel_min + t), p->t5_buckets, p->t5_max_distance, p->t5_bidirectional);
            t5[t] = (REAL)fs_load_scalar((const char *)p->t5_table + fs_dtype_itemsize(p->t5_dtype) * (h * p->t5_sh + bucket * p->t5_sn),
                                         p->t5_dtype);
        }
        /* S_ij = (scale Q_i) K_j^T for the active rows, in register tiles (columns past cols meet K_j's zeros) */
        WNAME(fs_matmul)((int)active, FS_CPU_BC, D, Qi, D, Kt, FS_CPU_BC, S, FS_CPU_BC, 0);
        for (int64_t r = 0; r < active; r++) {
            REAL *s = S + r * FS_CPU_BC;
            /* S_ij += bias_ij + t5(j - i);  masked keys (padding mask, causal) get -inf */
            if (bias) {
                const char *brow = bias + bias_es * (b * p->bias_sb + h * p->bias_sh + (i0 + r) * p->bias_sq);
                for (int c = 0; c < cols; c++) s[c] += (REAL)fs_load_scalar(brow + bias_es * (j0 + c) * p->bias_sk, p->bias_dtype);
            }
            if (p->t5_table)
                for (int c = 0; c < cols; c++) s[c] += t5[j0 + c - (i0 + r) - rel_min];
            if (p->kpm)
                for (int c = 0; c < cols; c++)
                    if (!p->kpm[b * p->kpm_sb + (j0 + c) * p->kpm_sk]) s[c] = -INFINITY;
            if (p->causal)
                for (int c = 0; c < cols; c++)
                    if (j0 + c > i0 + r) s[c] = -INFINITY;
            /* m_new = max(m_i, rowmax S_ij);  P_ij = exp(S_ij - m_new);  l_i = e^(m_i - m_new) l_i + rowsum P_ij;
             * O_i = e^(m_i - m_new) O_i here, + P_ij V_j below. A NaN score makes m_new NaN, and with it the row's l_i
             * and O_i, as torch's softmax does; a row with every key so far masked adds nothing (P_ij = 0) */
            const REAL mx = WNAME(fs_max_row)(s, cols, m[r]);
            if (mx == -INFINITY) {
                for (int c = 0; c < cols; c++) s[c] = 0;
                continue;
            }
            const REAL alpha = EXP(m[r] - mx);
            l[r] = alpha * l[r] + WNAME(fs_exp_row)(s, cols, mx);
            m[r] = mx;
            for (int d = 0; d < D; d++) Oi[r * D + d] *= alpha;
        }
        /* O_i += P_ij V_j over the block's cols keys, in register tiles */
        WNAME(fs_matmul)((int)active, D, cols, S, FS_CPU_BC, Vj, D, Oi, D, 1);
    }
    /* O_i = O_i / l_i;  lse_i = m_i + log(l_i); a row that saw no key (l_i = 0) is written as zeros, lse -inf; a NaN
     * l_i stays NaN in both */
    char *ob = (char *)p->o;
    for (int64_t r = 0; r < rows; r++) {
        if (p->cu_seqlens_q && r >= active) break;
        const REAL inv = l[r] == 0 ? 0 : 1 / l[r];
        REAL *o = Oi + r * D;
        for (int d = 0; d < D; d++) o[d] *= inv;
        RNAME(fs_store_row)(o, p->dtype, ob + es * (b * p->o_sb + h * p->o_sh + (qo + i0 + r) * p->o_ss), D);
        if (p->lse) {
            const int64_t li = b * p->lse_sb + h * p->lse_sh + qo + i0 + r;
            const REAL lse = l[r] == 0 ? -INFINITY : m[r] + LOG(l[r]);
            if (p->dtype == FS_F64) ((double *)p->lse)[li] = (double)lse;
            else ((float *)p->lse)[li] = (float)lse;
        }
    }
}

#undef REAL
#undef RNAME
#undef WNAME
#undef EXP
#undef LOG
