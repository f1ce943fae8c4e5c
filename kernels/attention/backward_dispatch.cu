/* Attention backward on CUDA, host side: workspace, the rotary pre-pass, the order of the passes and the kernels, and
 * the main kernel's choice: the Hopper one (sm90/backward_kernel.cuh) where it covers the problem, else the portable
 * ones (sm80/backward.cuh, backward_dq.cuh). Head dims without a kernel of their own run at the next native one through
 * zero-padded copies (attention/head_copy.cu), which also rotate q and k and rotate dq back over the true head dim.
 * Workspace per call (stated in docs/api.md): 4 (Dp + 1) bytes per query row and head (dQ's float32 accumulator at the
 * kernels' head dim Dp, Delta), plus q and k rotated when the forward used rotary, plus 4 bytes per (batch, head, 64
 * queries, bucket) for the T5 gradient (on Hopper 4 bytes per (batch, head, 128 keys, relative position: up to
 * 2 max_distance + 1 of them) if that is more) and on Hopper each head's T5 table (up to 4 (2 max_distance + 385)
 * bytes), plus (padded head dims) q, k, v, dO, dk and dv at Dp, plus (deterministic runs on Hopper) 8 bytes per
 * (batch, head, 64 queries) for the counters that order dQ's adds, and 16 for the one the CTAs take blocks from, plus
 * (Hopper runs whose kernel converts dQ itself) 4 bytes per (batch, head, 64 queries) for its tile counters, plus
 * (Hopper runs whose kernel zeroes dQ's accumulator itself) 8 bytes per (batch, K/V head), causal 4 per (batch, head,
 * 64 queries). */
#include "attention/head_copy.h"
#include "attention/launchers.h"
#include "attention/sm80/backward.h"
#include "attention/sm90/backward.h"
#include "common/workspace.h"

/* x rounded up to a multiple of 256 bytes. */
static size_t align256(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

/* The main kernels in g's dtype: the Hopper kernel where it may run and covers g (deterministic runs: its dQ adds
 * ordered by zeroed counters; the T5 gradient's runs: its delta pass first), else the portable ones (deterministic
 * runs: the main kernel and the dQ kernel). Sets w->t5_hopper: whether t5_part holds the Hopper kernel's sums, and
 * clears w->dq_done where the Hopper kernel does not run (then the post-pass converts dQ), and w->dq_zeroed after
 * zeroing the accumulator there. */
static cudaError_t run_kernels(const fs_attn_bwd_params *g, fs_bwd_work *w, int device, cudaStream_t stream)
{
    if (w->sm90 && fs_sm90_backward_covers(g, w->rotary, w->rotary_dim)) {
        const fs_sm90_bwd_work w90 = {w->dq_acc, w->delta, g->deterministic ? w->dq_order : NULL, w->rotary,
                                      w->rotary_base, w->t5_rows, g->dtable ? w->t5_part : NULL, w->dq_done,
                                      w->dq_zeroed};
        w->t5_hopper = 1;
        cudaError_t err = cudaSuccess;
        if (w90.dq_order) err = cudaMemsetAsync(w90.dq_order, 0, 4 * fs_sm90_order_ints(&g->p), stream);
        /* the tile counters and the zeroing counters, one after the other in the workspace */
        const size_t counters = (w90.dq_done ? fs_sm90_dq_done_ints(&g->p) : 0) +
                                (w90.dq_zeroed ? fs_sm90_dq_zeroed_ints(&g->p) : 0);
        if (counters && err == cudaSuccess)
            err = cudaMemsetAsync(w90.dq_done ? w90.dq_done : w90.dq_zeroed, 0, 4 * counters, stream);
        if (err != cudaSuccess) return err;
        return g->p.dtype == FS_BF16 ? fs_sm90_backward_bf16(g, &w90, device, stream) : fs_sm90_backward_fp16(g, &w90, device, stream);
    }
    w->t5_hopper = 0;
    w->dq_done = NULL; /* the portable kernels leave dQ's conversion to the post-pass */
    if (w->dq_zeroed) { /* ... and need the accumulator zeroed, which the pre-pass left to the Hopper kernel */
        w->dq_zeroed = NULL;
        cudaError_t err = cudaMemsetAsync(w->dq_acc, 0, 4 * (size_t)w->rows * g->p.D, stream);
        if (err != cudaSuccess) return err;
    }
    return g->p.dtype == FS_BF16 ? fs_sm80_backward_bf16(g, w, device, stream) : fs_sm80_backward_fp16(g, w, device, stream);
}

/* A copy between an operand of p (its own strides and head dim) and token-major scratch rows of Dp columns. to_scratch:
 * into the scratch (zero columns past D, rotated by rd > 0); else back (the first D columns, rotated back by rd > 0). */
static fs_head_copy operand_copy(const fs_attn_params *p, int query_side, int H, int Dp, int to_scratch, const void *x,
                                 int64_t sb, int64_t sh, int64_t ss, void *scratch, int rd)
{
    const int packed = p->cu_seqlens_q != NULL;
    fs_head_copy c;
    c.nb = packed ? 1 : p->B;
    c.S = packed ? (int)(query_side ? p->total_q : p->total_k) : query_side ? p->Sq : p->Sk;
    c.H = H;
    c.cu = packed ? (query_side ? p->cu_seqlens_q : p->cu_seqlens_k) : NULL;
    c.n_seq = p->B;
    c.rd = rd;
    c.inverse = !to_scratch;
    c.base = p->rotary_base;
    c.scale = 1.f;
    c.src_f32 = 0;
    const int64_t tss = (int64_t)H * Dp, tsh = Dp, tsb = packed ? 0 : (int64_t)c.S * H * Dp;
    c.src = to_scratch ? x : scratch;
    c.dst = to_scratch ? scratch : (void *)x;
    c.s_sb = to_scratch ? sb : tsb; c.s_sh = to_scratch ? sh : tsh; c.s_ss = to_scratch ? ss : tss;
    c.d_sb = to_scratch ? tsb : sb; c.d_sh = to_scratch ? tsh : sh; c.d_ss = to_scratch ? tss : ss;
    c.D_src = p->D;
    c.D_dst = to_scratch ? Dp : p->D;
    return c;
}

/* Whether the Hopper kernel takes g at its own head dim (in the kernels' view: rotary done by the pre-pass). */
static int hopper_native(const fs_attn_bwd_params *g, int sm90)
{
    fs_attn_bwd_params view = *g;
    view.p.rotary = 0;
    return sm90 && fs_sm90_backward_covers(&view, g->p.rotary, g->p.D);
}

/* The head dim the kernels run p at: its own where a kernel reads it (on Hopper also 80, 96 and 112, which the wgmma
 * kernel reads directly: sm90_kernel_dim) or the next native one; on Hopper, other D in (64, 128) at 128 where the
 * wgmma kernel takes the padded problem (as the forward: faster than the portable kernel at 96). hopper:
 * hopper_native(g, sm90). */
static int backward_dim(const fs_attn_bwd_params *g, int sm90, int hopper)
{
    if (hopper) return g->p.D;
    const int Dp = fs_attention_run_dim(g->p.D);
    if (!sm90 || Dp == g->p.D || g->p.D < 64 || g->p.D > 128) return Dp;
    fs_attn_bwd_params wide = *g;
    wide.p.D = 128;
    wide.p.rotary = 0;
    return fs_sm90_backward_covers(&wide, 0, 0) ? 128 : Dp;
}

/* A head dim without its own kernel: pad q, k (rotated), v and dO to Dp, run, copy dq (from the accumulator, scaled and
 * rotated back), dk, dv back. The portable main kernel rotates dk back itself, over the true head dim; for the Hopper
 * one, which turns only a whole head dim, the copy back does. */
static cudaError_t backward_padded(const fs_attn_bwd_params *g, fs_bwd_work *w, int Dp, int device, cudaStream_t stream)
{
    const fs_attn_params *p = &g->p;
    const int Hkv = fs_kv_heads(p), packed = p->cu_seqlens_q != NULL;
    const size_t rows_q = packed ? (size_t)p->total_q : (size_t)p->B * p->Sq, rows_k = packed ? (size_t)p->total_k : (size_t)p->B * p->Sk;
    const size_t bq = align256(2 * rows_q * p->H * Dp), bk = align256(2 * rows_k * Hkv * Dp);
    char *buf = NULL;
    cudaError_t err = cudaMallocAsync((void **)&buf, 2 * bq + 4 * bk, stream);
    if (err != cudaSuccess) return err;
    char *q = buf, *dout = q + bq, *k = dout + bq, *v = k + bk, *dk = v + bk, *dv = dk + bk;
    const fs_head_copy in[4] = {
        operand_copy(p, 1, p->H, Dp, 1, p->q, p->q_sb, p->q_sh, p->q_ss, q, p->rotary ? p->D : 0),
        operand_copy(p, 1, p->H, Dp, 1, g->dout, g->do_sb, g->do_sh, g->do_ss, dout, 0),
        operand_copy(p, 0, Hkv, Dp, 1, p->k, p->k_sb, p->k_sh, p->k_ss, k, p->rotary ? p->D : 0),
        operand_copy(p, 0, Hkv, Dp, 1, p->v, p->v_sb, p->v_sh, p->v_ss, v, 0)};
    fs_attn_bwd_params pg = *g;
    pg.p.D = Dp;
    pg.p.rotary = 0;
    pg.p.q = q; pg.p.q_sb = in[0].d_sb; pg.p.q_sh = in[0].d_sh; pg.p.q_ss = in[0].d_ss;
    pg.p.k = k; pg.p.k_sb = in[2].d_sb; pg.p.k_sh = in[2].d_sh; pg.p.k_ss = in[2].d_ss;
    pg.p.v = v; pg.p.v_sb = in[3].d_sb; pg.p.v_sh = in[3].d_sh; pg.p.v_ss = in[3].d_ss;
    pg.dout = dout; pg.do_sb = in[1].d_sb; pg.do_sh = in[1].d_sh; pg.do_ss = in[1].d_ss;
    pg.dk = dk; pg.dk_sb = in[2].d_sb; pg.dk_sh = in[2].d_sh; pg.dk_ss = in[2].d_ss;
    pg.dv = dv; pg.dv_sb = in[3].d_sb; pg.dv_sh = in[3].d_sh; pg.dv_ss = in[3].d_ss;
    /* dq from the accumulator: rows (B, H, Sq) padded, (H, total_q) packed, Dp floats each */
    fs_head_copy cq = operand_copy(p, 1, p->H, Dp, 0, g->dq, g->dq_sb, g->dq_sh, g->dq_ss, w->dq_acc, p->rotary ? p->D : 0);
    cq.src_f32 = 1;
    cq.s_ss = Dp;
    cq.s_sh = (int64_t)(packed ? p->total_q : p->Sq) * Dp;
    cq.s_sb = packed ? 0 : cq.s_sh * p->H;
    cq.scale = w->scale;
    fs_bwd_work wk = *w; /* the main kernel's view */
    const int hopper = w->sm90 && fs_sm90_backward_covers(&pg, 0, 0);
    if (hopper) wk.rotary = 0;
    const fs_head_copy ck = operand_copy(p, 0, Hkv, Dp, 0, g->dk, g->dk_sb, g->dk_sh, g->dk_ss, dk,
                                         hopper && p->rotary ? p->D : 0);
    const fs_head_copy cv = operand_copy(p, 0, Hkv, Dp, 0, g->dv, g->dv_sb, g->dv_sh, g->dv_ss, dv, 0);
    err = cudaMemsetAsync(dk, 0, 2 * bk, stream); /* rows no sequence covers come back as zeros */
    for (int i = 0; i < 4 && err == cudaSuccess; i++) err = fs_head_copy_launch(&in[i], p->dtype, device, stream);
    if (err == cudaSuccess) err = fs_sm80_backward_pre(g, w, Dp, device, stream);
    if (err == cudaSuccess) err = run_kernels(&pg, &wk, device, stream);
    w->t5_hopper = wk.t5_hopper;
    if (err == cudaSuccess) err = fs_head_copy_launch(&cq, p->dtype, device, stream);
    if (err == cudaSuccess) err = fs_head_copy_launch(&ck, p->dtype, device, stream);
    if (err == cudaSuccess) err = fs_head_copy_launch(&cv, p->dtype, device, stream);
    const cudaError_t fr = cudaFreeAsync(buf, stream);
    return err != cudaSuccess ? err : fr;
}

extern "C" cudaError_t fs_attention_backward_gpu(const fs_attn_bwd_params *g, int device, int sm90, cudaStream_t stream)
{
    const fs_attn_params *p = &g->p;
    if (p->dtype != FS_F16 && p->dtype != FS_BF16) return cudaErrorInvalidValue;
    if (p->D % 8 || p->D > 256) return cudaErrorNotSupported;
    const int hopper = hopper_native(g, sm90), Dp = backward_dim(g, sm90, hopper), native = Dp == p->D;
    fs_bwd_work w;
    w.sm90 = sm90;
    w.rows = (int64_t)p->H * (p->cu_seqlens_q ? p->total_q : (int64_t)p->B * p->Sq);
    w.scale = (float)p->scale;
    w.rotary = p->rotary;
    w.rotary_dim = p->D;
    w.rotary_base = p->rotary_base;
    /* workspace: the counters other launchers keep at zero, Delta, dQ's accumulator, the rotated q and k */
    const size_t off_delta = FS_COUNTER_BYTES, off_acc = align256(off_delta + 4 * (size_t)w.rows);
    const size_t off_rot = align256(off_acc + 4 * (size_t)w.rows * Dp);
    const size_t off_t5 = align256(off_rot + (p->rotary && native ? fs_rotary_bytes(p) : 0));
    const size_t t5_q = (size_t)p->B * p->H * ((p->Sq + 63) / 64) * p->t5_buckets, t5_k = fs_sm90_bwd_t5_part_floats(p);
    const size_t t5_floats = g->dtable ? (sm90 && t5_k > t5_q ? t5_k : t5_q) : 0;
    const size_t off_t5_rows = align256(off_t5 + 4 * t5_floats);
    const size_t off_order = align256(off_t5_rows + (sm90 && p->t5_table ? 4 * (size_t)p->H * fs_sm90_bwd_t5_row(p) : 0));
    /* the Hopper kernel converts dQ itself (no post-pass) where it runs g at its own head dim and can */
    const int convert = hopper && native && fs_sm90_backward_converts(g, p->rotary);
    /* ... or zeroes dQ's accumulator itself (no zeroing in the pre-pass) */
    const int zeroes = hopper && native && fs_sm90_backward_zeroes(g);
    const size_t off_done = align256(off_order + (sm90 && g->deterministic ? 4 * fs_sm90_order_ints(p) : 0));
    const size_t off_zeroed = off_done + (convert ? 4 * fs_sm90_dq_done_ints(p) : 0);
    const size_t bytes = off_zeroed + (zeroes ? 4 * fs_sm90_dq_zeroed_ints(p) : 0);
    char *ws = NULL;
    cudaError_t err = fs_workspace_get(device, stream, bytes, (void **)&ws);
    if (err != cudaSuccess) return err;
    w.delta = (float *)(ws + off_delta);
    w.dq_acc = (float *)(ws + off_acc);
    w.t5_part = (float *)(ws + off_t5);
    w.t5_rows = (float *)(ws + off_t5_rows);
    w.t5_hopper = 0;
    w.dq_order = sm90 && g->deterministic ? (int *)(ws + off_order) : NULL;
    w.dq_done = convert ? (int *)(ws + off_done) : NULL;
    w.dq_zeroed = zeroes ? (int *)(ws + off_zeroed) : NULL;
    if (native) {
        fs_attn_bwd_params kg = *g; /* the kernels' view: q and k rotated, rotary off */
        if (p->rotary) err = fs_rotary_qk(p, device, stream, ws + off_rot, &kg.p);
        if (err == cudaSuccess) err = fs_sm80_backward_pre(g, &w, p->D, device, stream);
        if (err == cudaSuccess) err = run_kernels(&kg, &w, device, stream);
        if (err == cudaSuccess && !w.dq_done) err = fs_sm80_backward_post(g, &w, device, stream);
    } else {
        err = backward_padded(g, &w, Dp, device, stream);
    }
    if (err == cudaSuccess && g->dtable)
        err = w.t5_hopper ? fs_sm90_backward_t5_sum(g, w.t5_part, device, stream)
                          : fs_sm80_backward_t5_sum(g, w.t5_part, device, stream);
    const cudaError_t rel = fs_workspace_release(stream, ws);
    return err != cudaSuccess ? err : rel;
}
