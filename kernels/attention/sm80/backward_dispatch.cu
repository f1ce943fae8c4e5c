/* Attention backward on sm_80+, host side: workspace, the rotary pre-pass, and the order of the passes and the main
 * kernel (backward.cuh). Workspace per call (stated in docs/api.md): 4 (D + 1) bytes per query row and head (dQ's
 * float32 accumulator, Delta), plus q and k rotated when the forward used rotary. */
#include "attention/launchers.h"
#include "attention/sm80/backward.h"
#include "common/workspace.h"

int fs_sm80_backward_native(int D)
{
    return D == 32 || D == 64 || D == 96 || D == 128;
}

/* x rounded up to a multiple of 256 bytes. */
static size_t align256(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

extern "C" cudaError_t fs_attention_backward_sm80(const fs_attn_bwd_params *g, int device, int sm_count, int major,
                                                   cudaStream_t stream)
{
    (void)sm_count;
    (void)major;
    const fs_attn_params *p = &g->p;
    if (p->dtype != FS_F16 && p->dtype != FS_BF16) return cudaErrorInvalidValue;
    if (!fs_sm80_backward_native(p->D) || g->dbias || g->dtable || g->deterministic) return cudaErrorNotSupported;
    fs_bwd_work w;
    w.rows = (int64_t)p->H * (p->cu_seqlens_q ? p->total_q : (int64_t)p->B * p->Sq);
    w.scale = (float)p->scale;
    w.rotary = p->rotary;
    w.rotary_base = p->rotary_base;
    /* workspace: the counters other launchers keep at zero, Delta, dQ's accumulator, the rotated q and k */
    const size_t off_delta = FS_COUNTER_BYTES, off_acc = align256(off_delta + 4 * (size_t)w.rows);
    const size_t off_rot = align256(off_acc + 4 * (size_t)w.rows * p->D);
    const size_t bytes = off_rot + (p->rotary ? fs_rotary_bytes(p) : 0);
    char *ws = NULL;
    cudaError_t err = fs_workspace_get(device, stream, bytes, (void **)&ws);
    if (err != cudaSuccess) return err;
    w.delta = (float *)(ws + off_delta);
    w.dq_acc = (float *)(ws + off_acc);
    fs_attn_bwd_params kg = *g; /* the main kernel's view: q and k rotated, rotary off */
    if (p->rotary) err = fs_rotary_qk(p, device, stream, ws + off_rot, &kg.p);
    if (err == cudaSuccess) err = fs_sm80_backward_pre(g, &w, device, stream);
    if (err == cudaSuccess)
        err = p->dtype == FS_BF16 ? fs_sm80_backward_bf16(&kg, &w, device, stream) : fs_sm80_backward_fp16(&kg, &w, device, stream);
    if (err == cudaSuccess) err = fs_sm80_backward_post(g, &w, device, stream);
    const cudaError_t rel = fs_workspace_release(stream, ws);
    return err != cudaSuccess ? err : rel;
}
