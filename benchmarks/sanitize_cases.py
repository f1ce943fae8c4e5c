"""A representative set of attention launches for compute-sanitizer (memcheck, racecheck):
every head dim, both dtypes, tails, causal, bshd strides, KV groups, the split-KV + combine path, the splits of a
thread-block cluster (Hopper), lse; then the
protein options (padding mask with tile skipping, seqlens, bias, T5, rotary, varlen incl. empty sequences; on
both kernels); grouped K/V heads on both kernels;
then linear / swiglu on both GEMM kernels (tails in M, N, K, strided rows, every epilogue) and their backward; then the edges: size 1,
size 0 (no rows, no keys: the fill kernel), rows with no kept key, NaN rows and keys, on both attention kernels; then
the backward (every head dim, GQA, each option, varlen, deterministic, empty problems) on the portable kernel forced,
then dispatched. SANITIZE_ONLY=linear or backward runs those cases alone."""
import itertools
import os

import torch

import flashsci

ONLY = os.environ.get("SANITIZE_ONLY", "")


def backward(q, k, v, **kw):
    """One forward (lse) and backward (on Hopper the sm_90a main kernel where it covers the problem, else sm80)."""
    out, lse = flashsci.attention(q, k, v, return_lse=True, **kw)
    flashsci.attention_backward(torch.randn_like(out), q, k, v, out, lse, **kw)


def backward_cases():
    """Backward: every head dim, tails, causal, GQA, bshd, each option, varlen, empty problems."""
    dev, f16 = "cuda", torch.float16
    for dtype in (torch.float16, torch.bfloat16):
        for d in (32, 64, 80, 96, 128):  # 80, 96 on Hopper: the D = 128 kernel reading them directly
            q = torch.randn(2, 4, 150, d, device=dev, dtype=dtype)
            k, v = (torch.randn(2, 2, 170, d, device=dev, dtype=dtype) for _ in range(2))
            backward(q, k, v)
            backward(q, k, v, causal=True)
            backward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), layout="bshd")
    # non-causal D = 64 on Hopper: a persistent grid, CTAs taking two or three key blocks each
    qp, kp = torch.randn(2, 8, 300, 64, device=dev, dtype=f16), torch.randn(2, 8, 2100, 64, device=dev, dtype=f16)
    backward(qp, kp, kp)
    qp = torch.randn(2, 8, 2100, 64, device=dev, dtype=torch.bfloat16)
    backward(qp, qp, qp, rotary=True)
    q, k, v = (torch.randn(2, 4, 300, 64, device=dev, dtype=f16) for _ in range(3))
    backward(q, k, v, key_padding_mask=torch.rand(2, 300, device=dev) < 0.7, causal=True)
    backward(q, k, v, seqlens=torch.tensor([300, 0], dtype=torch.int32, device=dev), rotary=True)
    out, lse = flashsci.attention(q, k, v, return_lse=True, causal=True)
    flashsci.attention_backward(torch.randn_like(out), q, k, v, out, lse, causal=True, deterministic=True)
    qg, kg = torch.randn(2, 4, 300, 128, device=dev, dtype=f16), torch.randn(2, 2, 300, 128, device=dev, dtype=f16)
    out, lse = flashsci.attention(qg, kg, kg, return_lse=True)   # deterministic over grouped heads, every tile shared
    flashsci.attention_backward(torch.randn_like(out), qg, kg, kg, out, lse, deterministic=True)
    backward(q, k, v, bias=torch.randn(1, 4, 300, 300, device=dev), t5_bias=(torch.randn(4, 32, device=dev), 32, 128, True))
    for shape in ((2, 4, 300, 300), (1, 1, 300, 300), (2, 1, 1, 300), (4, 300, 1)):  # dbias (bias_grad), T5 gradient
        bias = torch.randn(*shape, device=dev)
        out, lse = flashsci.attention(q, k, v, bias=bias, return_lse=True, causal=True)
        flashsci.attention_backward(torch.randn_like(out), q, k, v, out, lse, bias=bias, causal=True, bias_grad=True)
    t5 = (torch.randn(4, 32, device=dev), 32, 128, True)
    out, lse = flashsci.attention(q, k, v, t5_bias=t5, return_lse=True)
    flashsci.attention_backward(torch.randn_like(out), q, k, v, out, lse, t5_bias=t5, t5_grad=True, deterministic=True)
    flashsci.attention_backward(torch.randn_like(out), q, k, v, out, lse, t5_bias=t5, t5_grad=True)  # Hopper: sm90 T5
    qt, kt = (torch.randn(2, 4, n, 128, device=dev, dtype=f16) for n in (700, 1000))  # tiles outside the span
    kpm = torch.rand(2, 1000, device=dev) < 0.8
    out, lse = flashsci.attention(qt, kt, kt, t5_bias=t5, key_padding_mask=kpm, return_lse=True)
    flashsci.attention_backward(torch.randn_like(out), qt, kt, kt, out, lse, t5_bias=t5, key_padding_mask=kpm,
                                t5_grad=True)
    for d in (128, 112):
        qp, kp, vp = (torch.randn(500, 4, d, device=dev, dtype=f16) for _ in range(3))
        cu = torch.tensor([0, 1, 1, 200, 500], dtype=torch.int32, device=dev)
        out, lse = flashsci.attention_varlen(qp, kp, vp, cu, cu, 300, 300, causal=True, return_lse=True, rotary=True)
        flashsci.attention_varlen_backward(torch.randn_like(out), qp, kp, vp, out, lse, cu, cu, 300, 300, causal=True,
                                           rotary=True)
    # packed, non-causal D = 64: most blocks lie past their sequence's keys (on Hopper their CTAs end at once)
    lens = [1300, 0, 1, 129, 700, 5, 128, 257]
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=dev)
    qp, kp, vp = (torch.randn(sum(lens), 4, 64, device=dev, dtype=f16) for _ in range(3))
    out, lse = flashsci.attention_varlen(qp, kp, vp, cu, cu, 1300, 1300, return_lse=True)
    flashsci.attention_varlen_backward(torch.randn_like(out), qp, kp, vp, out, lse, cu, cu, 1300, 1300)
    # ... deterministic: staggered key blocks adding dQ in two chains, into two accumulators
    flashsci.attention_varlen_backward(torch.randn_like(out), qp, kp, vp, out, lse, cu, cu, 1300, 1300,
                                       deterministic=True)
    out, lse = flashsci.attention_varlen(qp, kp, vp, cu, cu, 1300, 1300, causal=True, return_lse=True)  # lightest first
    flashsci.attention_varlen_backward(torch.randn_like(out), qp, kp, vp, out, lse, cu, cu, 1300, 1300, causal=True,
                                       deterministic=True)
    backward(q[:, :, :0], q, q)
    backward(q, q[:, :, :0], q[:, :, :0])
    torch.cuda.synchronize()


if ONLY == "backward":
    for kernel in ("auto", "sm80"):
        flashsci._flashsci._set_attention_kernel(kernel)
        backward_cases()
    print("sanitize cases done (backward only)")
    raise SystemExit(0)
CASES = [  # (B, H, Sq, Sk, D, causal, layout)
    (1, 2, 77, 130, 32, False, "bhsd"), (2, 1, 64, 64, 64, True, "bhsd"), (1, 3, 100, 37, 96, True, "bshd"),
    (1, 2, 129, 200, 128, False, "bshd"), (1, 1, 50, 70, 256, True, "bhsd"),
    (1, 1, 40, 900, 64, False, "bhsd"), (1, 2, 100, 300, 32, True, "bshd"),   # 4 KV groups per block
    (1, 1, 40, 4500, 64, False, "bhsd"), (1, 1, 2200, 6000, 128, True, "bhsd"),  # split-KV + combine (4, 1 groups)
    (1, 1, 100, 1100, 64, False, "bhsd"), (2, 1, 70, 1500, 96, True, "bshd"),  # Hopper: splits in a cluster
    (2, 66, 130, 200, 128, True, "bhsd"), (2, 66, 200, 130, 128, False, "bshd"),  # sm90 (wgmma) on Hopper,
    (2, 66, 300, 333, 64, True, "bshd"), (2, 66, 257, 100, 64, False, "bhsd"),     # several items per block,
    (2, 66, 200, 700, 64, False, "bhsd"), (2, 66, 300, 130, 128, True, "bshd"),    # idle warpgroups (1 or 2)
    (1, 8, 1950, 1950, 64, False, "bshd"), (2, 8, 1000, 1300, 64, True, "bhsd"),   # sm90 D = 64 on two warpgroups
]
for dtype in (torch.float16, torch.bfloat16) if ONLY != "linear" else ():
    for b, h, sq, sk, d, causal, layout in CASES:
        shape = lambda s: (b, h, s, d) if layout == "bhsd" else (b, s, h, d)
        q = torch.randn(shape(sq), device="cuda", dtype=dtype)
        k, v = (torch.randn(shape(sk), device="cuda", dtype=dtype) for _ in range(2))
        out, lse = flashsci.attention(q, k, v, causal=causal, layout=layout, return_lse=True)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()

dev, f16 = "cuda", torch.float16
for kernel in ("auto", "sm80"):  # linear / swiglu: M, N, K tails, strided x rows, every epilogue, small-M tiles
    flashsci._flashsci._set_gemm_kernel(kernel)
    for m, k_, n, kw in [(300, 200, 264, dict(activation="gelu")), (129, 64, 72, dict(activation="silu")),
                         (1, 8, 8, dict()), (700, 520, 392, dict(activation="relu", out_dtype=torch.float32))]:
        x = torch.randn(m, k_ + 8, device=dev, dtype=torch.bfloat16)[:, :k_]
        w = torch.randn(n, k_, device=dev, dtype=torch.bfloat16)
        flashsci.linear(x, w, torch.randn(n, device=dev), **kw)
        flashsci.swiglu(x, torch.randn(2 * n, k_, device=dev, dtype=torch.bfloat16))
    flashsci.linear(torch.randn(2048, 256, device=dev, dtype=f16), torch.randn(2304, 256, device=dev, dtype=f16))  # 128x256 tiles
    for n in (10240, 12288):  # 128x160 tiles (TMA stores in 32-column boxes), 128x192
        flashsci.linear(torch.randn(256, 256, device=dev, dtype=f16), torch.randn(n, 256, device=dev, dtype=f16),
                        torch.randn(n, device=dev, dtype=f16), activation="gelu")
    torch.cuda.synchronize()
for width in (128, 160, 192, 256):  # every Hopper tile width: staging + TMA, activation warps, swiglu, tails
    flashsci._flashsci._set_gemm_kernel(f"sm90:{width}")
    x = torch.randn(333, 200, device=dev, dtype=f16)
    for act in ("relu", "gelu"):
        flashsci.linear(x, torch.randn(392, 200, device=dev, dtype=f16), torch.randn(392, device=dev, dtype=f16), activation=act)
    flashsci.swiglu(x, torch.randn(2 * 392, 200, device=dev, dtype=f16))
    # one K step per tile, many tiles per CTA: each bias buffer reused while the ring runs ahead
    flashsci.linear(torch.randn(2000, 64, device=dev, dtype=f16), torch.randn(2048, 64, device=dev, dtype=f16),
                    torch.randn(2048, device=dev), activation="gelu")
    # keeping the pre-activation: many tiles (stored by the activation warps; SwiGLU's g and u tiles side by side,
    # N's tail), relu and few tiles (the product into it, then the elementwise pass)
    for rows in (5000, 300):
        xk = torch.randn(rows, 64, device=dev, dtype=f16)
        for act, n in (("gelu", 2048), ("relu", 392)):
            flashsci.linear(xk, torch.randn(n, 64, device=dev, dtype=f16), torch.randn(n, device=dev), activation=act,
                            preactivation=torch.empty(rows, n, device=dev, dtype=f16))
        flashsci.swiglu(xk, torch.randn(2 * 392, 64, device=dev, dtype=f16), preactivation=torch.empty(rows, 784, device=dev, dtype=f16))
    torch.cuda.synchronize()
for kernel in ("auto", "sm80", "sm90:128", "sm90:192"):  # the backward: transposed products, halves, elementwise passes
    flashsci._flashsci._set_gemm_kernel(kernel)
    # (9000, 1280, 1000): several rounds of tiles in every product
    for m, k_, n in [(300, 200, 264), (5, 64, 24), (2000, 136, 392), (9000, 1280, 1000)]:
        x = torch.randn(m, k_ + 8, device=dev, dtype=torch.bfloat16)[:, :k_]
        w, h = torch.randn(n, k_, device=dev, dtype=torch.bfloat16), torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        y = flashsci.linear(x, w, torch.randn(n, device=dev), activation="gelu", preactivation=h)
        flashsci.linear_backward(torch.randn_like(y), x, w, preactivation=h, activation="gelu", bias_grad=True)
        wu, h2 = torch.randn(n, k_, device=dev, dtype=torch.bfloat16), torch.empty(m, 2 * n, device=dev, dtype=torch.bfloat16)
        y = flashsci.swiglu(x, w, wu, preactivation=h2)
        flashsci.swiglu_backward(torch.randn_like(y), x, w, wu, preactivation=h2)
    torch.cuda.synchronize()
flashsci._flashsci._set_gemm_kernel("auto")
if ONLY == "linear":
    print("sanitize cases done (linear only)")
    raise SystemExit(0)
q, k, v = (torch.randn(3, 2, 300, 64, device=dev, dtype=f16) for _ in range(3))
kpm = torch.rand(3, 300, device=dev) < 0.6
kpm[1, 70:] = False
kpm[2] = False
lens = torch.tensor([300, 17, 0], dtype=torch.int32, device=dev)
table = torch.randn(2, 32, device=dev)
bias = torch.randn(1, 2, 300, 300, device=dev, dtype=f16)
for kw in [dict(key_padding_mask=kpm, causal=True), dict(seqlens=lens, rotary=True), dict(bias=bias, t5_bias=(table, 32, 128, True)),
           dict(key_padding_mask=kpm, seqlens=lens, t5_bias=(table, 32, 128, False), rotary=True, causal=True)]:
    flashsci.attention(q, k, v, **kw)
    torch.cuda.synchronize()
q1, k1, v1 = torch.randn(40, 1, 128, device=dev, dtype=f16), torch.randn(3000, 1, 128, device=dev, dtype=f16), torch.randn(3000, 1, 128, device=dev, dtype=f16)
flashsci.attention(q1[None].transpose(1, 2), k1[None].transpose(1, 2), v1[None].transpose(1, 2),
                   key_padding_mask=torch.rand(1, 3000, device=dev) < 0.1)   # split KV over a compacted tile list
for d in (64, 128):
    lengths = [0, 1, 100, 700, 5]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device=dev)
    qp, kp, vp = (torch.randn(int(cu[-1]), 3, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
    out, lse = flashsci.attention_varlen(qp, kp, vp, cu, cu, 700, 700, causal=True, rotary=True,
                                         t5_bias=(torch.randn(3, 32, device=dev), 32, 128, True), return_lse=True)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    # the same with enough heads for the sm90 kernel on Hopper (packed rows, T5, rotary by the pre-pass)
    qp, kp, vp = (torch.randn(int(cu[-1]), 40, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
    flashsci.attention_varlen(qp, kp, vp, cu, cu, 700, 700, causal=True, t5_bias=(torch.randn(40, 32, device=dev), 32, 128, True),
                              rotary=True, return_lse=True)
q, k, v = (torch.randn(2, 32, 300, 128, device=dev, dtype=f16) for _ in range(3))  # sm90: the T5 bias alone (T5 kernel)
for causal in (False, True):
    flashsci.attention(q, k, v, scale=1.0, causal=causal, t5_bias=(torch.randn(32, 32, device=dev), 32, 128, True))
q, k, v = (torch.randn(3, 48, 300, 64, device=dev, dtype=f16) for _ in range(3))   # sm90: seqlens, T5, rotary
flashsci.attention(q, k, v, seqlens=lens, t5_bias=(torch.randn(48, 32, device=dev), 32, 128, False), causal=True)
flashsci.attention(q.transpose(1, 2), k[:, :, :200].transpose(1, 2), v[:, :, :200].transpose(1, 2), layout="bshd",
                   rotary=True)
kpm = torch.rand(3, 300, device=dev) < 0.7                                          # sm90: key padding, holes and a suffix
kpm[1, 200:] = False
flashsci.attention(q, k, v, key_padding_mask=kpm, causal=True, rotary=True)
pos = torch.arange(700, device=dev)                                                 # sm90: all-padding tiles skipped
kpm = torch.stack([pos >= 400, (pos < 30) | (pos >= 600), pos == 699])             # (left padding, a hole, one key)
for d in (64, 128):
    q, k, v = (torch.randn(3, 48, 700, d, device=dev, dtype=f16) for _ in range(3))
    flashsci.attention(q, k, v, key_padding_mask=kpm, causal=d == 64)
q, k, v = (torch.randn(1, 2, 600, 96, device=dev, dtype=f16) for _ in range(3))     # sm80: rotary by the pre-pass
flashsci.attention(q, k, v, rotary=True, key_padding_mask=torch.rand(1, 600, device=dev) < 0.5, causal=True)
cu = torch.tensor([0, 1, 171, 301, 301, 340], dtype=torch.int32, device=dev)           # sm90, 64-key tiles
qp, kp, vp = (torch.randn(340, 48, 64, device=dev, dtype=f16) for _ in range(3))
flashsci.attention_varlen(qp, kp, vp, cu, cu, 170, 170, t5_bias=(torch.randn(48, 32, device=dev), 32, 128, True))
for kernel in ("auto", "sm80"):  # grouped-query attention: K/V heads shared by 4 query heads; one K/V head by expand
    flashsci._flashsci._set_attention_kernel(kernel)
    q = torch.randn(2, 48, 300, 128, device=dev, dtype=f16)
    k, v = (torch.randn(2, 12, 333, 128, device=dev, dtype=f16) for _ in range(2))
    flashsci.attention(q, k, v, causal=True)
    flashsci.attention(q[..., :64], k[..., :64], v[..., :64], rotary=True)
    flashsci.attention(q[:, :, :, :64], *(x[:, :1, :300, :64].expand(2, 48, 300, 64) for x in (k, v)))
    flashsci.attention_varlen(qp, kp[:, :12], vp[:, :12], cu, cu, 170, 170, causal=True, rotary=True)
    torch.cuda.synchronize()
for kernel in ("auto", "sm80"):  # edges: size 1 and 0, padding-only rows, NaN rows and keys
    flashsci._flashsci._set_attention_kernel(kernel)
    one = torch.randn(1, 1, 1, 64, device=dev, dtype=f16)
    flashsci.attention(one, one, one, return_lse=True)
    q, k = torch.randn(2, 3, 130, 64, device=dev, dtype=f16), torch.randn(2, 3, 0, 64, device=dev, dtype=f16)
    flashsci.attention(q, k, k, return_lse=True)
    flashsci.attention(q[:, :, :0], q, q, return_lse=True)
    kpm = torch.ones(2, 130, dtype=torch.bool, device=dev)
    kpm[1] = False
    q[0, 1, 7] = float("nan")
    k = torch.randn(2, 3, 130, 64, device=dev, dtype=f16)
    k[1, 2, 50, 0] = float("nan")
    flashsci.attention(q, k, k, key_padding_mask=kpm, return_lse=True)
    flashsci.attention(q, k, k, causal=True, return_lse=True)
    torch.cuda.synchronize()
for kernel in ("sm80", "auto"):
    flashsci._flashsci._set_attention_kernel(kernel)
    backward_cases()
print("sanitize cases done")
