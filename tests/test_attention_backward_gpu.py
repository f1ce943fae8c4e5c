"""CUDA attention backward (the sm_80+ kernels; on Hopper the sm_90a kernel where it covers the problem) against
torch: every gradient within 2x the error of torch's own low-precision backward (SDPA with the masks and biases
materialised, rotary in the input dtype) against float64 autograd through the same attention; outputs NaN-poisoned
first; rows without a kept key get zero gradients."""
import random

import pytest

import flashsci
from test_attention_features_gpu import causal_keep, esm_rotary, pack, poisoned, rand, t5_dense

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
F = torch.nn.functional
DTYPES = [torch.float16, torch.bfloat16]


def attention64(q, k, v, scale, keep=None, add=None, rotary=None):
    """float64 attention on (B, H, S, D) leaves, differentiable; K/V heads repeated for grouped queries; rows with no
    kept key give zeros (and zero gradients)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if rotary:
        q, k, scale = esm_rotary(q * scale, rotary), esm_rotary(k, rotary), 1.0
    s = (q @ k.transpose(-1, -2)) * scale
    if add is not None:
        s = s + add.double()
    if keep is None:
        return torch.softmax(s, -1) @ v
    keep = keep.expand_as(s)
    live = keep.any(-1, keepdim=True)
    s = s.masked_fill(~keep, float("-inf")).masked_fill(~live, 0.0)
    return (torch.softmax(s, -1) * live) @ v


def attention_lowp(q, k, v, scale, keep=None, add=None, rotary=None, causal=False):
    """torch's own result in the input dtype: SDPA (flash / efficient / cuDNN where they apply, else math) with the
    mask and bias as one additive mask; rotary in the input dtype."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if rotary:
        q, k, scale = esm_rotary(q * scale, rotary), esm_rotary(k, rotary), 1.0
    if keep is None and add is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    mask = torch.zeros((), device=q.device, dtype=torch.float32)
    if add is not None:
        mask = mask + add.float()
    if keep is not None:
        mask = mask.masked_fill(~keep, float("-inf"))
    mask = mask.to(q.dtype).expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def grads(fn, q, k, v, dout, **kw):
    """(dq, dk, dv) of sum(fn(q, k, v) * dout), NaN (torch's result for rows without a key) as 0."""
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves, **kw)
    return [g.nan_to_num(0.0) for g in torch.autograd.grad(out, leaves, dout.to(out.dtype))]


def check(ours, ref, theirs, what):
    """ours within 2x torch's low-precision error against the float64 reference, for dq, dk, dv. Two allowances, both
    from the final rounding to fp16 / bf16 rather than from the algorithm: where torch is exact (a gradient that is 0
    in exact arithmetic, such as dq over a single key), 1e-4 of the largest gradient entry; and where torch rounded every
    element of a gradient to its nearest value (max error under half an ulp), one element one ulp away from it (a
    float32 sum that fell on the other side of a rounding midpoint) passes when the mean error is within 1.25x torch's."""
    floor = 1e-4 * max(r.abs().max().item() for r in ref)
    for name, o, r, t in zip(("dq", "dk", "dv"), ours, ref, theirs):
        assert o.shape == r.shape, f"{what} {name}: shape {tuple(o.shape)} != {tuple(r.shape)}"
        assert torch.isfinite(o).all(), f"{what} {name}: NaN-poisoned or non-finite gradient left"
        err = (o.double() - r).abs().max().item()
        torch_err = (t.double() - r).abs().max().item()
        ulp = torch.finfo(o.dtype).eps * 2.0 ** torch.frexp(r.abs().max().float())[1].item() / 2
        flip = err <= 2 * torch_err + ulp and (o.double() - r).abs().mean() <= 1.25 * (t.double() - r).abs().mean()
        if err > max(2 * torch_err, floor) and not flip:
            at = (o.double() - r).abs().argmax().item()
            raise AssertionError(f"{what} {name}: err {err:.3e} > 2 x torch {torch_err:.3e} (mean abs err "
                                 f"{(o.double() - r).abs().mean().item():.2e} vs torch {(t.double() - r).abs().mean().item():.2e}; "
                                 f"worst at flat index {at}: ref {r.flatten()[at].item():.4f}, ours {o.flatten()[at].item():.4f}, "
                                 f"torch {t.flatten()[at].item():.4f}; ref max {r.abs().max().item():.3f})")


def flashsci_grads(q, k, v, dout, deterministic=False, **kw):
    """flashsci's forward (return_lse) then backward into poisoned gradients."""
    out, lse = flashsci.attention(q, k, v, return_lse=True, **kw)
    dq, dk, dv = poisoned(q), poisoned(k), poisoned(v)
    res = flashsci.attention_backward(dout, q, k, v, out, lse, dq=dq, dk=dk, dv=dv, deterministic=deterministic, **kw)
    assert res[0] is dq and res[1] is dk and res[2] is dv
    return dq, dk, dv


def run_case(b, h, hkv, sq, sk, d, dtype, causal=False, kpm=None, lens=None, add=None, table=None, rotary=None,
             layout="bhsd", scale=None, deterministic=False, what=""):
    """One problem through flashsci and both references, options as flashsci takes them."""
    q, k, v, dout = rand(b, h, sq, d, dtype=dtype), rand(b, hkv, sk, d, dtype=dtype), rand(b, hkv, sk, d, dtype=dtype), \
        rand(b, h, sq, d, dtype=dtype)
    sc = d ** -0.5 if scale is None else scale
    keep = torch.ones(b, 1, sq, sk, dtype=torch.bool, device="cuda")
    kw, masked = {}, False
    if causal:
        kw["causal"], keep, masked = True, keep & causal_keep(sq, sk), True
    if kpm is not None:
        kw["key_padding_mask"], keep, masked = kpm, keep & kpm[:, None, None, :], True
    if lens is not None:
        kw["seqlens"] = lens
        valid = torch.arange(sq, device="cuda")[None, :] < lens[:, None].long()
        keep, masked = keep & valid[:, None, None, :] & valid[:, None, :, None], True
    total = add
    if add is not None:
        kw["bias"] = add
    if table is not None:
        kw["t5_bias"] = (table, table.shape[1], 128, True)
        t5 = t5_dense(table, sq, sk, table.shape[1], 128, True)
        total = t5 if total is None else total + t5
    if rotary:
        kw["rotary"] = rotary
    if scale is not None:
        kw["scale"] = scale
    ref_kw = dict(scale=sc, keep=keep if masked else None, add=total, rotary=rotary)
    ref = grads(attention64, *(x.double() for x in (q, k, v)), dout.double(), **ref_kw)
    theirs = grads(attention_lowp, q, k, v, dout, causal=causal and not masked, **ref_kw)
    if layout == "bshd":
        tq, tk, tv, tdo = (x.transpose(1, 2).contiguous() for x in (q, k, v, dout))
        ours = [x.transpose(1, 2) for x in flashsci_grads(tq, tk, tv, tdo, deterministic, layout="bshd", **kw)]
    else:
        ours = flashsci_grads(q, k, v, dout, deterministic, **kw)
    check(ours, ref, theirs, what or f"{b, h, hkv, sq, sk, d, dtype} {sorted(kw)}")
    return ours


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [32, 64, 80, 96, 112, 128])
def test_plain(d, causal, dtype):
    run_case(2, 3, 3, 300, 300, d, dtype, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES)
def test_d80_long(dtype):
    """D = 80 (the 2.7B LM's; on Hopper its own kernel, products over 80 columns, shared memory as at 128): many key
    blocks adding into every query tile, Sq != Sk, grouped K/V, causal with rotary."""
    run_case(1, 4, 2, 700, 1100, 80, dtype)
    run_case(2, 4, 4, 1000, 1000, 80, dtype, causal=True, rotary=10000.0, layout="bshd")


@pytest.mark.parametrize("dtype", DTYPES)
def test_persistent_grid(dtype):
    """Non-causal D = 64 on padded batches (on Hopper a persistent grid: one CTA per SM, each taking several key
    blocks, the ring, the K/V hand-over and the staged dQ running on from block to block): more blocks than any GPU's
    SMs, a partial last key block, Sq != Sk, grouped K/V, rotary, both layouts; the T5 bias on the same shapes (one CTA
    per block)."""
    run_case(2, 8, 8, 300, 2100, 64, dtype)
    run_case(3, 12, 4, 1000, 1000, 64, dtype, rotary=10000.0, layout="bshd")
    run_case(2, 8, 8, 700, 2100, 64, dtype, table=torch.randn(8, 32, device="cuda"))


@pytest.mark.parametrize("sq,sk", [(1, 1), (1, 200), (200, 1), (77, 300), (300, 77), (1024, 1024), (129, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_lengths(sq, sk, causal):
    run_case(1, 2, 2, sq, sk, 64, torch.float16, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_kv_and_layout(dtype):
    run_case(2, 8, 2, 333, 333, 64, dtype, causal=True)
    run_case(2, 6, 3, 200, 250, 128, dtype, layout="bshd")
    run_case(1, 4, 1, 100, 100, 96, dtype, layout="bshd", causal=True)


@pytest.mark.parametrize("kernel", ["auto", "sm80"])
def test_kernel_choice(kernel):
    """Both main kernels on a Hopper device (auto: the sm_90a one for D = 64 / 128 without a bias; sm80 forced), and
    either on other devices: plain, causal with grouped K/V, key padding, seqlens, packed rotary, deterministic."""
    flashsci._flashsci._set_attention_kernel(kernel)
    try:
        run_case(2, 4, 4, 300, 300, 64, torch.bfloat16)
        run_case(2, 8, 2, 333, 333, 128, torch.float16, causal=True)
        run_case(2, 4, 4, 260, 260, 64, torch.float16, kpm=torch.rand(2, 260, device="cuda") < 0.7, rotary=10000.0)
        lens = torch.tensor([200, 0, 77], dtype=torch.int32, device="cuda")
        run_case(3, 4, 4, 200, 200, 128, torch.bfloat16, lens=lens)
        lengths = [130, 1, 257, 64]
        cu, (q, k, v) = pack(lengths, 4, 64, torch.bfloat16)
        dout = torch.randn_like(q)
        out, lse = flashsci.attention_varlen(q, k, v, cu, cu, 257, 257, causal=True, rotary=True, return_lse=True)
        grads_packed = [flashsci.attention_varlen_backward(dout, q, k, v, out, lse, cu, cu, 257, 257, causal=True,
                                                           rotary=True, deterministic=det) for det in (False, True)]
        ref, theirs = varlen_grads(q, k, v, dout, cu, cu, True, 64 ** -0.5, rotary=10000.0)
        for got in grads_packed:
            check(got, ref, theirs, f"{kernel} varlen rotary")
    finally:
        flashsci._flashsci._set_attention_kernel("auto")


def test_main_kernel_by_device():
    """On Hopper (a 90a build) the wgmma main kernel runs a plain D = 64 backward, D = 80 on its own instantiation
    without padded copies, D = 96 on the D = 128 one without copies, D = 72 padded to 128, the T5 bias with and without
    its table's gradient; the portable one when forced, for an additive bias and for the T5 bias when causal or
    deterministic; elsewhere always the portable one (kernel names from the profiler)."""
    from flashsci.profile.trace import capture
    hopper = torch.cuda.get_device_capability()[0] == 9 and "90a" in flashsci.build_info()["cuda_architectures"]

    def kernels(kernel, d=64, deterministic=False, t5_grad=False, **kw):
        q, k, v, dout = (rand(2, 4, 256, d) for _ in range(4))
        out, lse = flashsci.attention(q, k, v, return_lse=True, **kw)
        flashsci._flashsci._set_attention_kernel(kernel)
        try:
            _, trace = capture(lambda: flashsci.attention_backward(dout, q, k, v, out, lse, deterministic=deterministic,
                                                                   t5_grad=t5_grad, **kw))
        finally:
            flashsci._flashsci._set_attention_kernel("auto")
        return " ".join(x["name"] for x in trace.kernels)
    auto = kernels("auto")
    if not auto:
        pytest.skip("the profiler saw no CUDA kernels")
    assert ("attention_bwd_sm90<64" in auto) == hopper and ("attention_bwd_sm80" in auto) != hopper
    d80 = kernels("auto", d=80, causal=True, rotary=True)
    assert ("attention_bwd_sm90<80" in d80) == hopper and ("head_copy" in d80) != hopper
    d96 = kernels("auto", d=96)
    assert ("attention_bwd_sm90<128" in d96) == hopper and ("head_copy" in d96) != hopper
    d72 = kernels("auto", d=72, causal=True)
    assert ("attention_bwd_sm90<128" in d72) == hopper and "head_copy" in d72
    t5 = (torch.randn(4, 32, device="cuda"), 32, 128, True)
    assert ("attention_bwd_sm90<64" in kernels("auto", t5_bias=t5)) == hopper
    assert ("attention_bwd_sm90<64" in kernels("auto", t5_bias=t5, t5_grad=True)) == hopper
    for names in (kernels("auto", t5_bias=t5, causal=True), kernels("auto", t5_bias=t5, deterministic=True)):
        assert "attention_bwd_sm80" in names and "attention_bwd_sm90" not in names
    for names in (kernels("sm80"), kernels("auto", bias=torch.randn(256, 256, device="cuda"))):
        assert "attention_bwd_sm80" in names and "attention_bwd_sm90" not in names


def test_strided_inputs():
    """q, k, v, dout as views into wider buffers (head-interleaved qkv), gradients into strided outputs."""
    b, s, h, d = 2, 260, 4, 64
    qkv = rand(b, s, 3, h, d)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    dout = rand(b, s, h, 2 * d)[..., :d]
    out, lse = flashsci.attention(q, k, v, layout="bshd", causal=True, return_lse=True)
    dqkv = torch.full_like(qkv, float("nan"))
    dq, dk, dv = flashsci.attention_backward(dout, q, k, v, out, lse, layout="bshd", causal=True, dq=dqkv[:, :, 0],
                                             dk=dqkv[:, :, 1], dv=dqkv[:, :, 2])
    ref = grads(attention64, *(x.transpose(1, 2).double() for x in (q, k, v)), dout.transpose(1, 2).double(),
                scale=d ** -0.5, keep=causal_keep(s, s))
    theirs = grads(attention_lowp, *(x.transpose(1, 2) for x in (q, k, v)), dout.transpose(1, 2), scale=d ** -0.5,
                   causal=True)
    check([x.transpose(1, 2) for x in (dq, dk, dv)], ref, theirs, "strided")
    assert torch.isfinite(dqkv).all()


@pytest.mark.parametrize("d,causal,deterministic", [(64, False, False), (64, False, True), (64, True, False),
                                                    (128, False, False), (128, True, False)])
def test_gradients_into_padded_rows(d, causal, deterministic):
    """dq, dk, dv into views of buffers whose rows are d + 8 elements apart (16-byte aligned, as the CUDA kernels
    require): on Hopper the persistent kernel (D = 64 non-causal) stores dK, dV from each thread, the others by TMA
    where a CTA takes one block; the pad columns stay as they were."""
    b, h, s, pad = 2, 4, 300, 8
    q, k, v, dout = (rand(b, h, s, d) for _ in range(4))
    out, lse = flashsci.attention(q, k, v, causal=causal, return_lse=True)
    bufs = [torch.full((b, h, s, d + pad), float("nan"), dtype=q.dtype, device="cuda") for _ in range(3)]
    dq, dk, dv = flashsci.attention_backward(dout, q, k, v, out, lse, causal=causal, dq=bufs[0][..., :d],
                                             dk=bufs[1][..., :d], dv=bufs[2][..., :d], deterministic=deterministic)
    ref = grads(attention64, *(x.double() for x in (q, k, v)), dout.double(), scale=d ** -0.5,
                keep=causal_keep(s, s) if causal else None)
    theirs = grads(attention_lowp, q, k, v, dout, scale=d ** -0.5, causal=causal)
    check((dq, dk, dv), ref, theirs, f"rows of {d} + {pad}")
    for buf in bufs:
        assert buf[..., d:].isnan().all(), "a gradient was written into the padding between rows"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
def test_key_padding_mask_and_seqlens(d, dtype):
    b, s = 3, 400
    kpm = torch.rand(b, s, device="cuda") < 0.7
    kpm[2] = False                                    # a batch whose every key is padded: zero gradients
    ours = run_case(b, 4, 4, s, s, d, dtype, kpm=kpm)
    assert (ours[0][2] == 0).all() and (ours[1][2] == 0).all() and (ours[2][2] == 0).all()
    lens = torch.tensor([400, 1, 0], dtype=torch.int32, device="cuda")
    ours = run_case(b, 4, 2, s, s, d, dtype, lens=lens, causal=True)
    assert (ours[0][1, :, 1:] == 0).all() and (ours[1][1, :, 1:] == 0).all() and (ours[2][2] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_accumulator_not_zeroed_before(dtype):
    """dQ's float32 accumulator lives in a workspace kept across calls; on Hopper the non-causal one-CTA-per-block
    kernels on padded batches (D = 96-128, the T5 bias) zero it themselves ahead of their adds instead of the pre-pass,
    causal ones at D = 96-128 each query tile by its first writer, and deterministic runs on padded batches without
    seqlens store each query tile's first share. Before each case a call with large gradients leaves large sums there;
    then partial last query tiles, more key blocks than SMs with grouped K/V, seqlens with an empty and a one-token
    sequence (rows past them zero), the T5 bias; causal with Sq != Sk and grouped heads; deterministic causal and not,
    Sq != Sk, D = 64, 80 and 128."""
    big = rand(2, 8, 700, 128, dtype=dtype)
    out, lse = flashsci.attention(big, big, big, return_lse=True)
    stale = lambda: flashsci.attention_backward(big * 1e3, big, big, big, out, lse)
    cases = [((2, 4, 2, 300, 500, 128), {}), ((2, 8, 4, 700, 2100, 128), {}),
             ((2, 4, 4, 300, 300, 128), dict(table=torch.randn(4, 32, device="cuda"))),
             ((2, 8, 2, 700, 900, 128), dict(causal=True)), ((2, 4, 4, 1100, 700, 64), dict(causal=True)),
             ((2, 6, 3, 333, 333, 112), dict(causal=True, layout="bshd")),
             ((2, 4, 2, 300, 500, 128), dict(deterministic=True)),
             ((2, 4, 4, 700, 650, 64), dict(deterministic=True, causal=True)),
             ((3, 4, 2, 333, 900, 80), dict(deterministic=True, layout="bshd")),
             ((2, 4, 4, 650, 300, 128), dict(deterministic=True, causal=True))]
    for shape, kw in cases:
        stale()
        run_case(*shape, dtype, **kw)
    stale()
    lens = torch.tensor([300, 0, 1], dtype=torch.int32, device="cuda")
    for deterministic in (False, True):
        ours = run_case(3, 4, 4, 300, 300, 112, dtype, lens=lens, deterministic=deterministic)
        assert (ours[0][1] == 0).all() and (ours[0][2, :, 1:] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_t5_rotary(dtype):
    s = 300
    run_case(2, 4, 4, s, s, 64, dtype, add=torch.randn(2, 1, s, s, device="cuda", dtype=dtype))
    run_case(2, 4, 4, s, s + 20, 128, dtype, add=torch.randn(1, 4, 1, s + 20, device="cuda"), causal=True)
    run_case(2, 4, 4, s, s, 64, dtype, table=torch.randn(4, 32, device="cuda"), scale=1.0)
    run_case(2, 4, 2, s, s, 128, dtype, table=torch.randn(4, 32, device="cuda"), causal=True)
    run_case(2, 4, 4, 700, 700, 64, dtype, rotary=10000.0)
    run_case(1, 4, 2, 300, 300, 128, dtype, rotary=500.0, causal=True, kpm=torch.rand(1, 300, device="cuda") < 0.8)


def varlen_grads(q, k, v, dout, cu_q, cu_k, causal, scale, rotary=None, table=None):
    """Per sequence: float64 reference and torch's own low-precision gradients, packed back."""
    ref = [torch.zeros_like(x, dtype=torch.float64) for x in (q, k, v)]
    theirs = [torch.zeros_like(x) for x in (q, k, v)]
    for i in range(len(cu_q) - 1):
        a, e, ka, ke = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        if e == a or ke == ka:
            continue
        qs, ks, vs, ds = (x.transpose(0, 1)[None] for x in (q[a:e], k[ka:ke], v[ka:ke], dout[a:e]))
        keep = causal_keep(e - a, ke - ka) if causal else None
        add = t5_dense(table, e - a, ke - ka, table.shape[1], 128, True) if table is not None else None
        kw = dict(scale=scale, keep=keep, add=add, rotary=rotary)
        r = grads(attention64, *(x.double() for x in (qs, ks, vs)), ds.double(), **kw)
        t = grads(attention_lowp, qs, ks, vs, ds, **kw)
        for acc, g, (lo, hi) in zip(ref, r, ((a, e), (ka, ke), (ka, ke))):
            acc[lo:hi] = g[0].transpose(0, 1)
        for acc, g, (lo, hi) in zip(theirs, t, ((a, e), (ka, ke), (ka, ke))):
            acc[lo:hi] = g[0].transpose(0, 1)
    return ref, theirs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen(causal, dtype):
    lengths = [1, 80, 0, 333, 1000, 2, 129]
    cu, (q, k, v) = pack(lengths, 4, 64, dtype)
    dout = torch.randn_like(q)
    out, lse = flashsci.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=causal, return_lse=True)
    dq, dk, dv = poisoned(q), poisoned(k), poisoned(v)
    flashsci.attention_varlen_backward(dout, q, k, v, out, lse, cu, cu, max(lengths), max(lengths), causal=causal,
                                       dq=dq, dk=dk, dv=dv)
    ref, theirs = varlen_grads(q, k, v, dout, cu, cu, causal, 0.125)
    check((dq, dk, dv), ref, theirs, "varlen")


@pytest.mark.parametrize("d,causal", [(64, False), (64, True), (128, False)])
def test_varlen_many_sequences(d, causal):
    """Many short sequences beside a long one: most (key block, head, sequence) blocks lie past their sequence's keys
    (on Hopper their CTAs end at once)."""
    rng = random.Random(d + causal)
    lengths = [rng.choice([0, 1, rng.randrange(2, 130), rng.randrange(130, 400)]) for _ in range(23)] + [900]
    cu, (q, k, v) = pack(lengths, 8, d, torch.bfloat16)
    dout = torch.randn_like(q)
    m = max(lengths)
    out, lse = flashsci.attention_varlen(q, k, v, cu, cu, m, m, causal=causal, return_lse=True)
    dq, dk, dv = poisoned(q), poisoned(k), poisoned(v)
    flashsci.attention_varlen_backward(dout, q, k, v, out, lse, cu, cu, m, m, causal=causal, dq=dq, dk=dk, dv=dv)
    ref, theirs = varlen_grads(q, k, v, dout, cu, cu, causal, d ** -0.5)
    check((dq, dk, dv), ref, theirs, f"{len(lengths)} sequences")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", ["auto", "sm80"])
def test_varlen_cross_lengths_plain(kernel, causal):
    """Packed batches with no other option take the sequence kernel, non-causal ones its unmasked 128-query tile at
    D = 64: keys and queries past a sequence's end are zero rows, whatever the other side's length (queries without keys,
    keys without queries, lengths around the tile's 128 rows); rows without keys get zero dq, keys without queries zero
    dk and dv."""
    lq, lk = [5, 300, 64, 7, 0, 129, 128, 1], [9, 200, 0, 700, 3, 127, 256, 1]
    cu_q, (q, _, _) = pack(lq, 3, 64, torch.bfloat16)
    cu_k, (_, k, v) = pack(lk, 3, 64, torch.bfloat16)
    dout = torch.randn_like(q)
    flashsci._flashsci._set_attention_kernel(kernel)
    try:
        out, lse = flashsci.attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal, return_lse=True)
        dq, dk, dv = poisoned(q), poisoned(k), poisoned(v)
        flashsci.attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, max(lq), max(lk), causal=causal,
                                           dq=dq, dk=dk, dv=dv)
    finally:
        flashsci._flashsci._set_attention_kernel("auto")
    ref, theirs = varlen_grads(q, k, v, dout, cu_q, cu_k, causal, 64 ** -0.5)
    check((dq, dk, dv), ref, theirs, f"{kernel} causal={causal}")
    assert (dq[305:369] == 0).all() and (dk[909:912] == 0).all() and (dv[909:912] == 0).all()


def test_varlen_cross_lengths_t5_rotary():
    lq, lk = [5, 300, 64, 7, 0], [9, 200, 0, 700, 3]
    cu_q, (q, _, _) = pack(lq, 2, 128, torch.bfloat16)
    cu_k, (_, k, v) = pack(lk, 2, 128, torch.bfloat16)
    dout = torch.randn_like(q)
    table = torch.randn(2, 32, device="cuda")
    for kw, ref_kw in [({}, {}), ({"t5_bias": (table, 32, 128, True)}, {"table": table}),
                       ({"rotary": True}, {"rotary": 10000.0})]:
        out, lse = flashsci.attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), return_lse=True, **kw)
        dq, dk, dv = flashsci.attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, max(lq), max(lk), **kw)
        ref, theirs = varlen_grads(q, k, v, dout, cu_q, cu_k, False, 128 ** -0.5, **ref_kw)
        check((dq, dk, dv), ref, theirs, f"varlen {list(kw)}")
        assert (dq[305:369] == 0).all()


@pytest.mark.parametrize("seed", range(300))
def test_fuzzed(seed):
    rng = random.Random(seed * 7919 + 11)
    d = rng.choice([32, 64, 96, 128])
    dtype = rng.choice(DTYPES)
    b, hkv = rng.randint(1, 3), rng.randint(1, 3)
    h = hkv * rng.choice([1, 1, 2, 4])
    sq = rng.randint(1, 520)
    sk = sq if rng.random() < 0.6 else rng.randint(1, 520)
    kw = dict(causal=rng.random() < 0.4, layout=rng.choice(["bhsd", "bshd"]))
    if rng.random() < 0.3:
        kw["kpm"] = torch.rand(b, sk, device="cuda") < rng.random()
    if sq == sk and rng.random() < 0.3:
        kw["lens"] = torch.tensor([rng.randint(0, sq) for _ in range(b)], dtype=torch.int32, device="cuda")
    if rng.random() < 0.25:
        kw["table"] = torch.randn(h, 32, device="cuda")
    if rng.random() < 0.25:
        kw["add"] = torch.randn(*rng.choice([(1, h, 1, sk), (b, 1, sq, sk), (sq, sk)]), device="cuda")
    if rng.random() < 0.3:
        kw["rotary"] = rng.choice([10000.0, 500.0])
    run_case(b, h, hkv, sq, sk, d, dtype, what=f"seed {seed}", **kw)


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_autograd(dtype):
    """flashsci.torch_ops.attention on CUDA: loss.backward() gives the kernels' gradients."""
    import flashsci.torch_ops  # noqa: F401
    q, k, v = (rand(2, 4, 200, 64, dtype=dtype).requires_grad_() for _ in range(3))
    out = flashsci.torch_ops.attention(q, k, v, causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref = flashsci_grads(q.detach(), k.detach(), v.detach(), dout, causal=True)
    for got, want in zip((q.grad, k.grad, v.grad), ref):
        assert torch.equal(got, want)


@pytest.mark.parametrize("d", [16, 24, 40, 72, 80, 112, 136, 256])
def test_head_dims(d):
    """D = 256 (its own kernel: four warps per 32 keys), head dims that run padded to the next native one and (Hopper)
    80 (its own kernel) and 112 (the D = 128 one) without copies, with rotary over the true head dim, causal masks, grouped K/V and
    packed sequences."""
    run_case(2, 4, 4, 200, 200, d, torch.bfloat16)
    run_case(2, 4, 2, 230, 230, d, torch.float16, causal=True, rotary=10000.0)
    run_case(1, 4, 4, 150, 150, d, torch.float16, kpm=torch.rand(1, 150, device="cuda") < 0.7, layout="bshd")
    lengths = [3, 0, 180, 77]
    cu, (q, k, v) = pack(lengths, 2, d, torch.bfloat16)
    dout = torch.randn_like(q)
    out, lse = flashsci.attention_varlen(q, k, v, cu, cu, 180, 180, causal=True, rotary=True, return_lse=True)
    dq, dk, dv = flashsci.attention_varlen_backward(dout, q, k, v, out, lse, cu, cu, 180, 180, causal=True, rotary=True)
    ref, theirs = varlen_grads(q, k, v, dout, cu, cu, True, d ** -0.5, rotary=10000.0)
    check((dq, dk, dv), ref, theirs, f"d={d} varlen rotary")


def repeated_equal(first, run):
    """run() three more times: every gradient bit-identical to first's."""
    for _ in range(3):
        again = run()
        assert all(torch.equal(x, y) for x, y in zip(first, again))


@pytest.mark.parametrize("d", [64, 80, 128])
def test_deterministic(d):
    """deterministic=True: bit-identical across runs (Hopper: dQ's adds in key-block order; elsewhere the dQ kernel by
    query block), as accurate as the default."""
    b, h, s = 2, 4, 700
    q, k, v, dout = (rand(b, h, s, d) for _ in range(4))
    kpm = torch.rand(b, s, device="cuda") < 0.8
    kw = dict(causal=True, key_padding_mask=kpm, rotary=True)
    out, lse = flashsci.attention(q, k, v, return_lse=True, **kw)
    first = flashsci.attention_backward(dout, q, k, v, out, lse, deterministic=True, **kw)
    repeated_equal(first, lambda: flashsci.attention_backward(dout, q, k, v, out, lse, deterministic=True, **kw))
    keep = causal_keep(s, s) & kpm[:, None, None, :]
    ref = grads(attention64, *(x.double() for x in (q, k, v)), dout.double(), scale=d ** -0.5, keep=keep, rotary=10000.0)
    theirs = grads(attention_lowp, q, k, v, dout, scale=d ** -0.5, keep=keep, rotary=10000.0)
    check(first, ref, theirs, "deterministic")


@pytest.mark.parametrize("d", [64, 128])
def test_deterministic_grouped_and_packed(d):
    """deterministic=True over many key blocks per query tile: grouped K/V heads without a mask (every key block adds
    to every tile, in key-block order on Hopper) and packed causal sequences (on Hopper D = 64's key blocks lightest
    first, each tile's adds from its last key block down; D = 128's tiles last first)."""
    b, h, hkv, s = 2, 4, 2, 1100
    q, dout, k, v = rand(b, h, s, d), rand(b, h, s, d), rand(b, hkv, s, d), rand(b, hkv, s, d)
    out, lse = flashsci.attention(q, k, v, return_lse=True)
    first = flashsci.attention_backward(dout, q, k, v, out, lse, deterministic=True)
    repeated_equal(first, lambda: flashsci.attention_backward(dout, q, k, v, out, lse, deterministic=True))
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    ref = grads(attention64, *(x.double() for x in (q, kr, vr)), dout.double(), scale=d ** -0.5)
    theirs = grads(attention_lowp, q, kr, vr, dout, scale=d ** -0.5)
    fold = lambda g: (g[0], *(x.unflatten(1, (hkv, 2)).double().sum(2).to(x.dtype) for x in g[1:]))
    check(first, fold(ref), fold(theirs), "deterministic grouped")

    lengths = [700, 1, 0, 1300, 257]
    cu, (pq, pk, pv) = pack(lengths, 3, d, torch.bfloat16)
    pdo = torch.randn_like(pq)
    m = max(lengths)
    out, lse = flashsci.attention_varlen(pq, pk, pv, cu, cu, m, m, causal=True, return_lse=True)
    run = lambda: flashsci.attention_varlen_backward(pdo, pq, pk, pv, out, lse, cu, cu, m, m, causal=True,
                                                     deterministic=True)
    first = run()
    repeated_equal(first, run)
    ref, theirs = varlen_grads(pq, pk, pv, pdo, cu, cu, True, d ** -0.5)
    check(first, ref, theirs, "deterministic varlen causal")


@pytest.mark.parametrize("d", [64, 80, 128])
def test_deterministic_non_causal(d):
    """deterministic=True without a causal mask, where Hopper's key blocks start at staggered query tiles, each tile's
    adds in the order the blocks reach it, when every block's tiles go once around (Sq = Sk, Sq > Sk, packed sequences
    of any length), all from tile 0 in key-block order when they do not (Sq < Sk): bit-identical across runs, as
    accurate as the default."""
    for sq, sk in ((650, 650), (1000, 300), (200, 900)):
        q, dout, k, v = rand(2, 4, sq, d), rand(2, 4, sq, d), rand(2, 4, sk, d), rand(2, 4, sk, d)
        out, lse = flashsci.attention(q, k, v, return_lse=True)
        run = lambda: flashsci.attention_backward(dout, q, k, v, out, lse, deterministic=True)
        first = run()
        repeated_equal(first, run)
        ref = grads(attention64, *(x.double() for x in (q, k, v)), dout.double(), scale=d ** -0.5)
        theirs = grads(attention_lowp, q, k, v, dout, scale=d ** -0.5)
        check(first, ref, theirs, f"deterministic {sq} x {sk}")
    lengths = [700, 1, 0, 1300, 257, 129, 64]
    cu, (pq, pk, pv) = pack(lengths, 3, d, torch.bfloat16)
    pdo = torch.randn_like(pq)
    m = max(lengths)
    out, lse = flashsci.attention_varlen(pq, pk, pv, cu, cu, m, m, return_lse=True)
    run = lambda: flashsci.attention_varlen_backward(pdo, pq, pk, pv, out, lse, cu, cu, m, m, deterministic=True)
    first = run()
    repeated_equal(first, run)
    ref, theirs = varlen_grads(pq, pk, pv, pdo, cu, cu, False, d ** -0.5)
    check(first, ref, theirs, "deterministic varlen")


def bias_t5_grads(fn, q, k, v, dout, bias=None, table=None, dtype=None, md=128, bidir=True, **kw):
    """Gradients of sum(fn(...) * dout) with respect to the bias and the T5 table (leaves in their own dtype; the
    attention's additive term is bias + t5_dense(table, max_distance md, bidirectional bidir), cast to `dtype` when
    given)."""
    leaves, add = [], None
    if bias is not None:
        bias = bias.detach().requires_grad_()
        leaves.append(bias)
        add = bias
    if table is not None:
        table = table.detach().requires_grad_()
        leaves.append(table)
        t5 = t5_dense(table, q.shape[2], k.shape[2], table.shape[1], md, bidir)
        add = t5 if add is None else add + t5
    if dtype is not None:
        add = add.to(dtype)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):   # torch's low-precision bias gradient: the math backend (efficient refuses
        out = fn(q, k, v, add=add, **kw)  # some lse strides with a mask that needs grad)
    return [g.nan_to_num(0.0) for g in torch.autograd.grad(out, leaves, dout.to(out.dtype))]


@pytest.mark.parametrize("shape", [(2, 4, 300, 310), (1, 4, 300, 310), (2, 1, 300, 310), (300, 310), (2, 1, 1, 310),
                                   (1, 4, 1, 310), (2, 4, 300, 1), (1, 1, 1, 1)])
@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16])
def test_bias_grad(shape, bias_dtype):
    """dbias in the bias's own shape and dtype (broadcast dims summed), with causal, a key padding mask and rotary."""
    b, h, sq, sk, d = 2, 4, 300, 310, 64
    q, dout = rand(b, h, sq, d, dtype=torch.bfloat16), rand(b, h, sq, d, dtype=torch.bfloat16)
    k, v = rand(b, h, sk, d, dtype=torch.bfloat16), rand(b, h, sk, d, dtype=torch.bfloat16)
    bias = torch.randn(*shape, device="cuda").to(bias_dtype)
    kpm = torch.rand(b, sk, device="cuda") < 0.8
    keep = kpm[:, None, None, :] & torch.ones(sq, sk, dtype=torch.bool, device="cuda").tril()
    out, lse = flashsci.attention(q, k, v, bias=bias, causal=True, key_padding_mask=kpm, rotary=True, return_lse=True)
    res = flashsci.attention_backward(dout, q, k, v, out, lse, bias=bias, causal=True, key_padding_mask=kpm, rotary=True,
                                      bias_grad=True)
    assert len(res) == 4 and res[3].shape == bias.shape and res[3].dtype == bias_dtype
    sc, kw = d ** -0.5, dict(keep=keep, rotary=10000.0)
    (ref,) = bias_t5_grads(attention64, q.double(), k.double(), v.double(), dout.double(), bias=bias.double(), scale=sc, **kw)
    (theirs,) = bias_t5_grads(attention_lowp, q, k, v, dout, bias=bias.float(), dtype=q.dtype, scale=sc, **kw)
    err = (res[3].double() - ref).abs().max().item()
    torch_err = (theirs.double() - ref).abs().max().item()
    assert err <= 2 * torch_err + torch.finfo(bias_dtype).eps * ref.abs().max().item(), (shape, err, torch_err)
    again = flashsci.attention_backward(dout, q, k, v, out, lse, bias=bias, causal=True, key_padding_mask=kpm, rotary=True,
                                        bias_grad=True)
    assert torch.equal(again[3], res[3])   # deterministic


@pytest.mark.parametrize("d,causal", [(64, False), (128, False), (128, True)])
def test_t5_grad(d, causal):
    """The T5 table's gradient (H, buckets) float32 against autograd through HF's bucket function; padded and packed
    (on Hopper non-causal runs take the wgmma kernel, causal ones the portable one)."""
    b, h, s = 2, 4, 333
    q, k, v, dout = (rand(b, h, s, d, dtype=torch.bfloat16) for _ in range(4))
    table = torch.randn(h, 32, device="cuda")
    kw = dict(t5_bias=(table, 32, 128, True), scale=1.0, causal=causal)
    out, lse = flashsci.attention(q, k, v, return_lse=True, **kw)
    dq, dk, dv, dtable = flashsci.attention_backward(dout, q, k, v, out, lse, t5_grad=True, **kw)
    assert dtable.shape == (h, 32) and dtable.dtype == torch.float32
    keep = causal_keep(s, s) if causal else None
    (ref,) = bias_t5_grads(attention64, q.double(), k.double(), v.double(), dout.double(), table=table.double(),
                           scale=1.0, keep=keep)
    (theirs,) = bias_t5_grads(attention_lowp, q, k, v, dout, table=table, dtype=q.dtype, scale=1.0, keep=keep)
    err, torch_err = (dtable.double() - ref).abs().max().item(), (theirs.double() - ref).abs().max().item()
    assert err <= 2 * torch_err, (err, torch_err)
    first = flashsci.attention_backward(dout, q, k, v, out, lse, t5_grad=True, deterministic=True, **kw)
    again = flashsci.attention_backward(dout, q, k, v, out, lse, t5_grad=True, deterministic=True, **kw)
    assert all(torch.equal(x, y) for x, y in zip(again, first))
    assert (first[3].double() - ref).abs().max().item() <= 2 * torch_err
    # packed: the sum of each sequence's own gradient
    lengths = [1, 200, 0, 133]
    cu, (pq, pk, pv) = pack(lengths, h, d, torch.bfloat16)
    pdo = torch.randn_like(pq)
    out, lse = flashsci.attention_varlen(pq, pk, pv, cu, cu, 200, 200, return_lse=True, **kw)
    *_, dtable = flashsci.attention_varlen_backward(pdo, pq, pk, pv, out, lse, cu, cu, 200, 200, t5_grad=True, **kw)
    ref = torch.zeros(h, 32, dtype=torch.float64, device="cuda")
    for i in range(len(lengths)):
        a, e = int(cu[i]), int(cu[i + 1])
        if e > a:
            x = [y[a:e].transpose(0, 1)[None] for y in (pq, pk, pv, pdo)]
            ref += bias_t5_grads(attention64, *(y.double() for y in x), table=table.double(), scale=1.0,
                                 keep=causal_keep(e - a, e - a) if causal else None)[0]
    assert (dtable.double() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 96, 128])
def test_t5_grad_options(d, dtype):
    """The T5 bias and its table's gradient with the other options (on Hopper the wgmma kernel): Sq != Sk over 1,000
    keys (tiles wholly before, inside and after the table's span of positions), a key padding mask, seqlens, rotary,
    unidirectional buckets, max_distance 40."""
    b, h, sq, sk = 2, 4, 700, 1100
    q, dout = (rand(b, h, sq, d, dtype=dtype) for _ in range(2))
    k, v = (rand(b, h, sk, d, dtype=dtype) for _ in range(2))
    table = torch.randn(h, 32, device="cuda")
    kpm = torch.rand(b, sk, device="cuda") < 0.8
    keep = kpm[:, None, None, :].expand(b, 1, sq, sk)
    for bidir, md, opts, ref_kw in [(True, 128, dict(key_padding_mask=kpm), dict(keep=keep)),
                                    (False, 40, dict(rotary=True), dict(rotary=10000.0))]:
        kw = dict(t5_bias=(table, 32, md, bidir), scale=d ** -0.5, **opts)
        out, lse = flashsci.attention(q, k, v, return_lse=True, **kw)
        grads_ = flashsci.attention_backward(dout, q, k, v, out, lse, t5_grad=True, **kw)
        add = t5_dense(table, sq, sk, 32, md, bidir)
        ref = grads(attention64, *(x.double() for x in (q, k, v)), dout.double(), scale=d ** -0.5,
                    add=add.double(), **ref_kw)
        theirs = grads(attention_lowp, q, k, v, dout, scale=d ** -0.5, add=add, **ref_kw)
        check(grads_[:3], ref, theirs, f"t5 {d} {dtype} {bidir} {md}")
        t5_kw = dict(md=md, bidir=bidir, scale=d ** -0.5, **ref_kw)
        (dref,) = bias_t5_grads(attention64, q.double(), k.double(), v.double(), dout.double(), table=table.double(),
                                **t5_kw)
        (dlow,) = bias_t5_grads(attention_lowp, q, k, v, dout, table=table, dtype=dtype, **t5_kw)
        err, torch_err = (grads_[3].double() - dref).abs().max().item(), (dlow.double() - dref).abs().max().item()
        assert err <= 2 * torch_err, (d, dtype, bidir, md, err, torch_err)
    lens = torch.tensor([700, 333], dtype=torch.int32, device="cuda")
    run_case(2, 4, 4, 700, 700, d, dtype, lens=lens, table=torch.randn(4, 32, device="cuda"))


def test_unsupported_are_clear():
    q, k, v = (rand(1, 2, 64, 64) for _ in range(3))
    out, lse = flashsci.attention(q, k, v, return_lse=True)
    with pytest.raises(TypeError, match="float16 and bfloat16"):
        flashsci.attention_backward(out.float(), q.float(), k.float(), v.float(), out.float(), lse)
    q84 = rand(1, 2, 64, 88)[..., :84]
    with pytest.raises(ValueError, match="multiples of 8 up to 256, got 84"):
        flashsci.attention_backward(q84, q84, q84, q84, q84, lse)


@pytest.mark.parametrize("d", [64, 80, 128])
def test_qkvpacked_torch_op(d):
    """flashsci.torch_ops.attention_qkvpacked on CUDA: its packed gradient (dq, dk, dv written into strided views of one
    (B, S, 3, H, D) tensor) equals the gradients through attention on the three views (the LM's causal rotary case)."""
    import flashsci.torch_ops as ops
    x = rand(2, 300, 3, 4, d, dtype=torch.bfloat16).requires_grad_()
    dout = rand(2, 300, 4, d, dtype=torch.bfloat16)
    got = ops.attention_qkvpacked(x, causal=True, rotary_base=10000.0)
    (g_got,) = torch.autograd.grad(got, x, dout)
    want = ops.attention(x[:, :, 0], x[:, :, 1], x[:, :, 2], causal=True, layout="bshd", rotary_base=10000.0)
    (g_want,) = torch.autograd.grad(want, x, dout)
    assert torch.equal(got, want)
    torch.testing.assert_close(g_got, g_want, rtol=2e-2, atol=2e-2)   # dQ's float atomics add in another order
    assert torch.isfinite(g_got).all()
