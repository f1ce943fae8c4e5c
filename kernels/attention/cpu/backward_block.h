/* The tasks of the CPU attention backward. No include guard: backward.c instantiates it per REAL (FS_REAL_DOUBLE 0:
 * float for fp16 / bf16 / fp32 inputs, 1: double for fp64) and per vector width (FS_VEC_BYTES, through
 * instantiate.h; BLOCK_TARGET the width's target attribute); SUF(name) is name_<f|d>_<width>. Paper notation (FlashAttention-2): with
 * the forward's scores S_ij = q'_i . k'_j + bias_ij + t5(j - i) (q' = rot(scale q), k' = rot(k)), P_ij =
 * exp(S_ij - lse_i) and Delta_i = dO_i . O_i:
 *     dV_j = sum_i P_ij dO_i      dP_ij = dO_i . V_j      dS_ij = P_ij (dP_ij - Delta_i)
 *     dq_i = scale rot^T(sum_j dS_ij k'_j)      dk_j = rot^T(sum_i dS_ij q'_i)
 *     dbias = dS summed over the bias's broadcast dims      dtable[h][bucket(j - i)] += dS_ij
 * Every task recomputes S, P and dP for the tiles it needs and owns its output elements (no atomics: the CPU
 * results are the same run to run). */

#if FS_REAL_DOUBLE
#define REAL double
#define SUF(name) FS_V(name##_d)
#define RNAME(name) name##_d
#define EXP exp
#else
#define REAL float
#define SUF(name) FS_V(name##_f)
#define RNAME(name) name##_f
#define EXP expf
#endif
#define LOAD_ROW RNAME(fs_load_row)
#define STORE_ROW RNAME(fs_store_row)
#define ROTATE_AT RNAME(fs_rotate_at)
#define MATMUL SUF(fs_matmul)
#define EXP_ROW SUF(fs_exp_row)

/* A block of query rows as the gradients need them. */
typedef struct {
    REAL *q, *dout;                    /* [Br][D]: q' (scaled and rotated, as the forward used it) and dO */
    REAL delta[FS_CPU_BR], lse[FS_CPU_BR];
    int64_t i0;                        /* the first row's position in its sequence */
    int rows;                          /* rows that attend (0 .. Br) */
} SUF(qblock);

/* A block of keys: K' and V transposed ([D][Bc], zero past cols) and K' by rows ([Bc][D]). */
typedef struct {
    REAL *kt, *vt, *k;
    int64_t j0;
    int cols;
} SUF(kblock);

/* Carve a task's scratch into a query block and a key block; returns the rest. */
static REAL *SUF(carve)(REAL *buf, int D, SUF(qblock) *qb, SUF(kblock) *kb)
{
    qb->q = buf;
    qb->dout = qb->q + FS_CPU_BR * D;
    kb->kt = qb->dout + FS_CPU_BR * D;
    kb->vt = kb->kt + (int64_t)D * FS_CPU_BC;
    kb->k = kb->vt + (int64_t)D * FS_CPU_BC;
    return kb->k + (int64_t)FS_CPU_BC * D;
}

/* Rows i0 .. i0 + rows - 1 of sequence b (seq), head h into qb (tmp: D scratch for the output row). */
BLOCK_TARGET static void SUF(load_qblock)(const fs_attn_bwd_params *g, const float *rot, int64_t b, int64_t h, fs_cpu_seq seq,
                             int64_t i0, int rows, SUF(qblock) *qb, REAL *tmp)
{
    const fs_attn_params *p = &g->p;
    const int D = p->D;
    const size_t es = fs_dtype_itemsize(p->dtype);
    qb->i0 = i0;
    qb->rows = rows;
    for (int r = 0; r < rows; r++) {
        const int64_t row = seq.qo + i0 + r;
        REAL *q = qb->q + (int64_t)r * D, *dout = qb->dout + (int64_t)r * D;
        LOAD_ROW((const char *)p->q + es * (b * p->q_sb + h * p->q_sh + row * p->q_ss), p->dtype, q, D);
        for (int d = 0; d < D; d++) q[d] *= (REAL)p->scale;
        if (p->rotary) ROTATE_AT(q, D, rot, i0 + r, p->rotary_base, 1);
        LOAD_ROW((const char *)g->dout + es * (b * g->do_sb + h * g->do_sh + row * g->do_ss), p->dtype, dout, D);
        LOAD_ROW((const char *)p->o + es * (b * p->o_sb + h * p->o_sh + row * p->o_ss), p->dtype, tmp, D);
        REAL delta = 0;
        for (int d = 0; d < D; d++) delta += dout[d] * tmp[d];
        qb->delta[r] = delta;
        const int64_t li = b * p->lse_sb + h * p->lse_sh + row;
        qb->lse[r] = p->dtype == FS_F64 ? (REAL)((const double *)p->lse)[li] : (REAL)((const float *)p->lse)[li];
    }
}

/* Keys j0 .. j0 + cols - 1 of sequence b (seq), K/V head hkv into kb (row: D scratch). */
BLOCK_TARGET static void SUF(load_kblock)(const fs_attn_params *p, const float *rot, int64_t b, int64_t hkv, fs_cpu_seq seq,
                             int64_t j0, int cols, SUF(kblock) *kb, REAL *row)
{
    const int D = p->D;
    const size_t es = fs_dtype_itemsize(p->dtype);
    kb->j0 = j0;
    kb->cols = cols;
    for (int c = 0; c < FS_CPU_BC; c++) {
        if (c < cols) {
            const int64_t key = seq.ko + j0 + c;
            REAL *k = kb->k + (int64_t)c * D;
            LOAD_ROW((const char *)p->k + es * (b * p->k_sb + hkv * p->k_sh + key * p->k_ss), p->dtype, k, D);
            if (p->rotary) ROTATE_AT(k, D, rot, j0 + c, p->rotary_base, 1);
            LOAD_ROW((const char *)p->v + es * (b * p->v_sb + hkv * p->v_sh + key * p->v_ss), p->dtype, row, D);
            for (int d = 0; d < D; d++) {
                kb->kt[(int64_t)d * FS_CPU_BC + c] = k[d];
                kb->vt[(int64_t)d * FS_CPU_BC + c] = row[d];
            }
        } else {
            for (int d = 0; d < D; d++) kb->kt[(int64_t)d * FS_CPU_BC + c] = kb->vt[(int64_t)d * FS_CPU_BC + c] = 0;
        }
    }
}

/* Whether a padding mask drops every key of the block (it is skipped then, as the forward skips it). */
BLOCK_TARGET static int SUF(all_padding)(const fs_attn_params *p, int64_t b, int64_t j0, int cols)
{
    if (!p->kpm) return 0;
    for (int c = 0; c < cols; c++)
        if (p->kpm[b * p->kpm_sb + (j0 + c) * p->kpm_sk]) return 0;
    return 1;
}

/* P_ij and dS_ij of query block qb against key block kb, into prob and ds ([Br][Bc]); masked keys get 0. A row whose
 * lse is -inf (no kept key) has P = 0. */
BLOCK_TARGET static void SUF(tile)(const fs_attn_params *p, int64_t b, int64_t h, const SUF(qblock) *qb,
                                    const SUF(kblock) *kb, REAL *prob, REAL *ds)
{
    const int D = p->D, cols = kb->cols;
    const char *bias = (const char *)p->bias;
    const size_t bias_es = bias ? fs_dtype_itemsize(p->bias_dtype) : 0;
    /* the T5 bias by relative position j - i, from rel_min = j0 - (i0 + rows - 1) */
    REAL t5[FS_CPU_BR + FS_CPU_BC];
    const int64_t rel_min = kb->j0 - (qb->i0 + qb->rows - 1);
    for (int t = 0; p->t5_table && t < qb->rows + cols - 1; t++) {
        const int bucket = fs_t5_bucket((int)(rel_min + t), p->t5_buckets, p->t5_max_distance, p->t5_bidirectional);
        t5[t] = (REAL)fs_load_scalar((const char *)p->t5_table + fs_dtype_itemsize(p->t5_dtype) * (h * p->t5_sh + bucket * p->t5_sn),
                                     p->t5_dtype);
    }
    /* S_ij = q'_i k'_j into prob, dP_ij = dO_i V_j into ds (register tiles; columns past cols meet zeros) */
    MATMUL(qb->rows, FS_CPU_BC, D, qb->q, D, kb->kt, FS_CPU_BC, prob, FS_CPU_BC, 0);
    MATMUL(qb->rows, FS_CPU_BC, D, qb->dout, D, kb->vt, FS_CPU_BC, ds, FS_CPU_BC, 0);
    for (int r = 0; r < qb->rows; r++) {
        const int64_t i = qb->i0 + r;
        const REAL lse = qb->lse[r], delta = qb->delta[r];
        REAL *pr = prob + (int64_t)r * FS_CPU_BC, *dsr = ds + (int64_t)r * FS_CPU_BC;
        /* S_ij + bias_ij + t5(j - i), -inf where masked; then P_ij = exp(S_ij - lse_i), 0 in a row without keys */
        for (int c = 0; c < FS_CPU_BC; c++) {
            const int64_t j = kb->j0 + c;
            const int masked = c >= cols || (p->causal && j > i) || (p->kpm && !p->kpm[b * p->kpm_sb + j * p->kpm_sk]);
            REAL x = pr[c];
            if (!masked && bias)
                x += (REAL)fs_load_scalar(bias + bias_es * (b * p->bias_sb + h * p->bias_sh + i * p->bias_sq + j * p->bias_sk),
                                          p->bias_dtype);
            if (!masked && p->t5_table) x += t5[j - i - rel_min];
            pr[c] = masked ? -INFINITY : x;
        }
        if (lse == -INFINITY)
            for (int c = 0; c < FS_CPU_BC; c++) pr[c] = 0;
        else
            EXP_ROW(pr, FS_CPU_BC, lse);
        /* dS_ij = P_ij (dP_ij - Delta_i) */
        for (int c = 0; c < FS_CPU_BC; c++) dsr[c] = pr[c] * (dsr[c] - delta);
    }
}

/* dq of query block t (sequence b, head h, rows i0 ..): sum over the visible key blocks of dS K', then scale rot^T. */
BLOCK_TARGET static void SUF(dq_task)(void *ctx, int64_t t, void *scratch)
{
    const fs_attn_bwd_params *g = ((const backward_job *)ctx)->g;
    const float *rot = ((const backward_job *)ctx)->rot;
    const fs_attn_params *p = &g->p;
    const int D = p->D;
    const int64_t q_blocks = (p->Sq + FS_CPU_BR - 1) / FS_CPU_BR, bh = t / q_blocks, b = bh / p->H, h = bh % p->H;
    const int64_t i0 = (t % q_blocks) * FS_CPU_BR, hkv = h / p->kv_group;
    SUF(qblock) qb;
    SUF(kblock) kb;
    REAL *rest = SUF(carve)((REAL *)scratch, D, &qb, &kb);
    REAL *dq = rest, *prob = dq + FS_CPU_BR * D, *ds = prob + FS_CPU_BR * FS_CPU_BC;
    REAL *row = ds + FS_CPU_BR * FS_CPU_BC;
    const fs_cpu_seq seq = fs_cpu_sequence(p, b);
    const int rows_in = (int)(p->Sq - i0 < FS_CPU_BR ? p->Sq - i0 : FS_CPU_BR);
    const int active = (int)(seq.q_len - i0 <= 0 ? 0 : seq.q_len - i0 < rows_in ? seq.q_len - i0 : rows_in);
    SUF(load_qblock)(g, rot, b, h, seq, i0, active, &qb, row);
    for (int64_t e = 0; e < (int64_t)FS_CPU_BR * D; e++) dq[e] = 0;
    const int64_t kend = active == 0 ? 0 : p->causal ? (i0 + active < seq.k_len ? i0 + active : seq.k_len) : seq.k_len;
    for (int64_t j0 = 0; j0 < kend; j0 += FS_CPU_BC) {
        const int cols = (int)(kend - j0 < FS_CPU_BC ? kend - j0 : FS_CPU_BC);
        if (SUF(all_padding)(p, b, j0, cols)) continue;
        SUF(load_kblock)(p, rot, b, hkv, seq, j0, cols, &kb, row);
        SUF(tile)(p, b, h, &qb, &kb, prob, ds);
        MATMUL(active, D, cols, ds, FS_CPU_BC, kb.k, D, dq, D, 1);   /* dq_i += dS_ij k'_j */
    }
    const size_t es = fs_dtype_itemsize(p->dtype);
    for (int r = 0; r < rows_in; r++) {
        if (p->cu_seqlens_q && r >= active) break; /* packed: the next sequence's rows */
        REAL *dqr = dq + (int64_t)r * D;
        if (r < active) {
            if (p->rotary) ROTATE_AT(dqr, D, rot, i0 + r, p->rotary_base, -1);
            for (int d = 0; d < D; d++) dqr[d] *= (REAL)p->scale;
        }
        STORE_ROW(dqr, p->dtype, (char *)g->dq + es * (b * g->dq_sb + h * g->dq_sh + (seq.qo + i0 + r) * g->dq_ss), D);
    }
}

/* dk, dv of key block t (sequence b, K/V head hkv, keys j0 ..): sums over the query heads of the group and the query
 * blocks that see the keys. */
BLOCK_TARGET static void SUF(dkv_task)(void *ctx, int64_t t, void *scratch)
{
    const fs_attn_bwd_params *g = ((const backward_job *)ctx)->g;
    const float *rot = ((const backward_job *)ctx)->rot;
    const fs_attn_params *p = &g->p;
    const int D = p->D, hkv_count = p->H / p->kv_group;
    const int64_t k_blocks = (p->Sk + FS_CPU_BC - 1) / FS_CPU_BC, bh = t / k_blocks, b = bh / hkv_count;
    const int64_t hkv = bh % hkv_count, j0 = (t % k_blocks) * FS_CPU_BC;
    SUF(qblock) qb;
    SUF(kblock) kb;
    REAL *rest = SUF(carve)((REAL *)scratch, D, &qb, &kb);
    REAL *dk = rest, *dv = dk + FS_CPU_BC * D, *prob = dv + FS_CPU_BC * D;
    REAL *ds = prob + FS_CPU_BR * FS_CPU_BC, *pt = ds + FS_CPU_BR * FS_CPU_BC, *dst = pt + FS_CPU_BC * FS_CPU_BR;
    REAL *row = dst + FS_CPU_BC * FS_CPU_BR;
    const fs_cpu_seq seq = fs_cpu_sequence(p, b);
    const int cols_in = (int)(p->Sk - j0 < FS_CPU_BC ? p->Sk - j0 : FS_CPU_BC);
    const int kcols = (int)(seq.k_len - j0 <= 0 ? 0 : seq.k_len - j0 < cols_in ? seq.k_len - j0 : cols_in);
    for (int64_t e = 0; e < (int64_t)FS_CPU_BC * D; e++) dk[e] = dv[e] = 0;
    if (kcols > 0 && !SUF(all_padding)(p, b, j0, kcols)) {
        SUF(load_kblock)(p, rot, b, hkv, seq, j0, kcols, &kb, row);
        const int64_t i_start = p->causal ? j0 / FS_CPU_BR * FS_CPU_BR : 0; /* query i sees key j <= i */
        for (int gi = 0; gi < p->kv_group; gi++) {
            const int64_t h = hkv * p->kv_group + gi;
            for (int64_t i0 = i_start; i0 < seq.q_len; i0 += FS_CPU_BR) {
                const int rows = (int)(seq.q_len - i0 < FS_CPU_BR ? seq.q_len - i0 : FS_CPU_BR);
                SUF(load_qblock)(g, rot, b, h, seq, i0, rows, &qb, row);
                SUF(tile)(p, b, h, &qb, &kb, prob, ds);
                /* dV_j += P_ij dO_i, dk_j += dS_ij q'_i: P and dS transposed, then register tiles */
                for (int r = 0; r < rows; r++)
                    for (int c = 0; c < kcols; c++) {
                        pt[c * FS_CPU_BR + r] = prob[r * FS_CPU_BC + c];
                        dst[c * FS_CPU_BR + r] = ds[r * FS_CPU_BC + c];
                    }
                MATMUL(kcols, D, rows, pt, FS_CPU_BR, qb.dout, D, dv, D, 1);
                MATMUL(kcols, D, rows, dst, FS_CPU_BR, qb.q, D, dk, D, 1);
            }
        }
    }
    const size_t es = fs_dtype_itemsize(p->dtype);
    for (int c = 0; c < cols_in; c++) {
        if (p->cu_seqlens_k && c >= kcols) break; /* packed: the next sequence's keys */
        REAL *dkc = dk + (int64_t)c * D;
        if (p->rotary && c < kcols) ROTATE_AT(dkc, D, rot, j0 + c, p->rotary_base, -1);
        const int64_t key = seq.ko + j0 + c;
        STORE_ROW(dkc, p->dtype, (char *)g->dk + es * (b * g->dk_sb + hkv * g->dk_sh + key * g->dk_ss), D);
        STORE_ROW(dv + (int64_t)c * D, p->dtype, (char *)g->dv + es * (b * g->dv_sb + hkv * g->dv_sh + key * g->dv_ss), D);
    }
}

/* One element set of dbias: task t is (bias batch bb, bias head hh, query block qi when the bias has a query
 * dimension); it sums dS over the batches and heads the bias broadcasts over (and over the rows and keys it
 * broadcasts over) into acc, then writes its elements. */
BLOCK_TARGET static void SUF(dbias_task)(void *ctx, int64_t t, void *scratch)
{
    const fs_attn_bwd_params *g = ((const backward_job *)ctx)->g;
    const float *rot = ((const backward_job *)ctx)->rot;
    const fs_attn_params *p = &g->p;
    const int D = p->D;
    const int64_t *dims = g->dbias_dims;
    const int64_t q_blocks = dims[2] == 1 ? 1 : (p->Sq + FS_CPU_BR - 1) / FS_CPU_BR;
    const int64_t bb = t / (dims[1] * q_blocks), hh = t / q_blocks % dims[1], qi = t % q_blocks;
    const int64_t acc_rows = dims[2] == 1 ? 1 : FS_CPU_BR, acc_cols = dims[3];
    SUF(qblock) qb;
    SUF(kblock) kb;
    REAL *rest = SUF(carve)((REAL *)scratch, D, &qb, &kb);
    REAL *prob = rest, *ds = prob + FS_CPU_BR * FS_CPU_BC, *row = ds + FS_CPU_BR * FS_CPU_BC;
    REAL *acc = row + D;
    for (int64_t e = 0; e < acc_rows * acc_cols; e++) acc[e] = 0;
    const int64_t i_first = dims[2] == 1 ? 0 : qi * FS_CPU_BR, i_last = dims[2] == 1 ? p->Sq : i_first + FS_CPU_BR;
    for (int64_t b = dims[0] == 1 ? 0 : bb; b < (dims[0] == 1 ? p->B : bb + 1); b++)
        for (int64_t h = dims[1] == 1 ? 0 : hh; h < (dims[1] == 1 ? p->H : hh + 1); h++) {
            const fs_cpu_seq seq = fs_cpu_sequence(p, b);
            for (int64_t i0 = i_first; i0 < i_last && i0 < seq.q_len; i0 += FS_CPU_BR) {
                const int rows = (int)(seq.q_len - i0 < FS_CPU_BR ? seq.q_len - i0 : FS_CPU_BR);
                SUF(load_qblock)(g, rot, b, h, seq, i0, rows, &qb, row);
                const int64_t kend = p->causal ? (i0 + rows < seq.k_len ? i0 + rows : seq.k_len) : seq.k_len;
                for (int64_t j0 = 0; j0 < kend; j0 += FS_CPU_BC) {
                    const int cols = (int)(kend - j0 < FS_CPU_BC ? kend - j0 : FS_CPU_BC);
                    SUF(load_kblock)(p, rot, b, h / p->kv_group, seq, j0, cols, &kb, row);
                    SUF(tile)(p, b, h, &qb, &kb, prob, ds);
                    for (int r = 0; r < rows; r++)
                        for (int c = 0; c < cols; c++)
                            acc[(dims[2] == 1 ? 0 : r) * acc_cols + (dims[3] == 1 ? 0 : j0 + c)] += ds[r * FS_CPU_BC + c];
                }
            }
        }
    const size_t es = fs_dtype_itemsize(p->bias_dtype);
    for (int64_t r = 0; r < acc_rows && i_first + r < (dims[2] == 1 ? 1 : p->Sq); r++) {
        const int64_t i = dims[2] == 1 ? 0 : i_first + r;
        STORE_ROW(acc + r * acc_cols, p->bias_dtype, (char *)g->dbias + es * (bb * g->dbias_strides[0] +
                  hh * g->dbias_strides[1] + i * g->dbias_strides[2]), (int)acc_cols);
    }
}

/* The T5 table's gradient of head t: dS of every (b, i, j) summed into the bucket of j - i (accumulated in double). */
BLOCK_TARGET static void SUF(dtable_task)(void *ctx, int64_t t, void *scratch)
{
    const fs_attn_bwd_params *g = ((const backward_job *)ctx)->g;
    const float *rot = ((const backward_job *)ctx)->rot;
    const fs_attn_params *p = &g->p;
    const int D = p->D;
    const int64_t h = t;
    SUF(qblock) qb;
    SUF(kblock) kb;
    REAL *rest = SUF(carve)((REAL *)scratch, D, &qb, &kb);
    REAL *prob = rest, *ds = prob + FS_CPU_BR * FS_CPU_BC, *row = ds + FS_CPU_BR * FS_CPU_BC;
    double *acc = (double *)(row + D + 1);
    acc = (double *)(((uintptr_t)acc + 7) & ~(uintptr_t)7);
    for (int n = 0; n < p->t5_buckets; n++) acc[n] = 0;
    for (int64_t b = 0; b < p->B; b++) {
        const fs_cpu_seq seq = fs_cpu_sequence(p, b);
        for (int64_t i0 = 0; i0 < seq.q_len; i0 += FS_CPU_BR) {
            const int rows = (int)(seq.q_len - i0 < FS_CPU_BR ? seq.q_len - i0 : FS_CPU_BR);
            SUF(load_qblock)(g, rot, b, h, seq, i0, rows, &qb, row);
            const int64_t kend = p->causal ? (i0 + rows < seq.k_len ? i0 + rows : seq.k_len) : seq.k_len;
            for (int64_t j0 = 0; j0 < kend; j0 += FS_CPU_BC) {
                const int cols = (int)(kend - j0 < FS_CPU_BC ? kend - j0 : FS_CPU_BC);
                if (SUF(all_padding)(p, b, j0, cols)) continue;
                SUF(load_kblock)(p, rot, b, h / p->kv_group, seq, j0, cols, &kb, row);
                SUF(tile)(p, b, h, &qb, &kb, prob, ds);
                for (int r = 0; r < rows; r++)
                    for (int c = 0; c < cols; c++) {
                        const int bucket = fs_t5_bucket((int)(j0 + c - (i0 + r)), p->t5_buckets, p->t5_max_distance,
                                                        p->t5_bidirectional);
                        acc[bucket] += ds[r * FS_CPU_BC + c];
                    }
            }
        }
    }
    for (int n = 0; n < p->t5_buckets; n++) g->dtable[h * g->dtable_sh + n] = (float)acc[n];
}

#undef REAL
#undef SUF
#undef RNAME
#undef EXP
#undef LOAD_ROW
#undef STORE_ROW
#undef ROTATE_AT
#undef MATMUL
#undef EXP_ROW
