"""torch.ops.flashsci on the CPU: torch.library's opcheck (schema, fake kernel, dispatch) for every op, results
equal to the direct calls, and torch.compile(fullgraph=True) tracing them without a graph break."""
import pytest

torch = pytest.importorskip("torch")
import flashsci  # noqa: E402
import flashsci.torch_ops  # noqa: E402,F401

ops = torch.ops.flashsci


def qkv(*shape, dtype=torch.float32):
    return [torch.randn(*shape, dtype=dtype) for _ in range(3)]


def varlen_args():
    q, k, v = qkv(17, 3, 16)
    cu = torch.tensor([0, 5, 5, 17], dtype=torch.int32)
    return q, k, v, cu, cu, 12, 12


@pytest.mark.parametrize("case", ["attention", "attention_opts", "varlen", "varlen_t5", "linear", "swiglu", "swiglu2"])
def test_opcheck(case):
    if case == "attention":
        op, args, kw = ops.attention, qkv(2, 3, 9, 16), {"causal": True}
    elif case == "attention_opts":
        op, args = ops.attention, qkv(2, 9, 3, 16)
        kw = {"layout": "bshd", "key_padding_mask": torch.rand(2, 9) > 0.3, "rotary_base": 500.0, "scale": 0.3,
              "t5_table": torch.randn(3, 32)}
    elif case == "varlen":
        op, args, kw = ops.attention_varlen, varlen_args(), {"rotary_base": 10000.0}
    elif case == "varlen_t5":
        op, args, kw = ops.attention_varlen, varlen_args(), {"t5_table": torch.randn(3, 32), "scale": 1.0}
    elif case == "linear":
        op, args, kw = ops.linear, (torch.randn(4, 5, 24), torch.randn(40, 24), torch.randn(40), "gelu"), {}
    elif case == "swiglu":
        op, args, kw = ops.swiglu, (torch.randn(7, 24), torch.randn(80, 24)), {}
    else:
        op, args, kw = ops.swiglu, (torch.randn(7, 24), torch.randn(40, 24), torch.randn(40, 24)), {}
    torch.library.opcheck(op, args, kw)


def test_ops_equal_direct_calls():
    q, k, v = qkv(2, 3, 9, 16)
    assert torch.equal(ops.attention(q, k, v, causal=True), flashsci.attention(q, k, v, causal=True))
    table = torch.randn(3, 32)
    args = varlen_args()
    assert torch.equal(ops.attention_varlen(*args, t5_table=table, t5_max_distance=64, t5_bidirectional=False),
                       flashsci.attention_varlen(*args, t5_bias=(table, 32, 64, False)))
    x, w, b = torch.randn(6, 24), torch.randn(16, 24), torch.randn(16)
    assert torch.equal(ops.linear(x, w, b, "silu"), flashsci.linear(x, w, b, activation="silu"))


def block(x, wqkv, wo, w1):
    """A pre-norm transformer block written with the ops, as torch.compile sees it."""
    T, d = x.shape
    qkv = ops.linear(torch.nn.functional.layer_norm(x, (d,)), wqkv).view(1, T, 3, 2, d // 2)
    a = ops.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], layout="bshd", rotary_base=10000.0)
    x = x + ops.linear(a.reshape(T, d), wo)
    return x + ops.swiglu(x, w1).sum(-1, keepdim=True)


def test_compile_fullgraph():
    torch._dynamo.reset()
    args = (torch.randn(11, 32), torch.randn(96, 32), torch.randn(32, 32), torch.randn(64, 32))
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(*args), block(*args), atol=1e-5)


# ---------------------------------------------------------------------------------------------------------- autograd

def leaf(*shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype, requires_grad=True)


@pytest.mark.parametrize("case", ["plain", "causal_gqa", "bshd_kpm_rotary", "bias_t5", "seqlens_bias_broadcast"])
def test_gradcheck(case):
    """Float64 gradients of flashsci.torch_ops.attention against finite differences, for every differentiable input."""
    torch.manual_seed(hash(case) % 1000)
    kw, extra = {}, []
    if case == "plain":
        q, k, v = leaf(2, 2, 6, 8), leaf(2, 2, 7, 8), leaf(2, 2, 7, 8)
    elif case == "causal_gqa":
        q, k, v = leaf(1, 4, 6, 8), leaf(1, 2, 6, 8), leaf(1, 2, 6, 8)
        kw["causal"] = True
    elif case == "bshd_kpm_rotary":
        q, k, v = leaf(2, 5, 2, 8), leaf(2, 5, 2, 8), leaf(2, 5, 2, 8)
        kw.update(layout="bshd", key_padding_mask=torch.tensor([[1, 1, 0, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool),
                  rotary_base=100.0, scale=0.4)
    elif case == "bias_t5":
        q, k, v = leaf(1, 2, 5, 8), leaf(1, 2, 6, 8), leaf(1, 2, 6, 8)
        extra = [leaf(1, 2, 5, 6), leaf(2, 8)]
        kw.update(t5_num_buckets=8, t5_max_distance=16)
    else:
        q, k, v = leaf(2, 2, 5, 8), leaf(2, 2, 5, 8), leaf(2, 2, 5, 8)
        extra = [leaf(1, 1, 5, 5)]          # broadcast over batch and heads: its gradient is summed
        kw["seqlens"] = torch.tensor([3, 5], dtype=torch.int32)

    def f(q, k, v, *extra):
        opts = dict(kw)
        if case == "bias_t5":
            opts.update(bias=extra[0], t5_table=extra[1])
        elif extra:
            opts["bias"] = extra[0]
        out = flashsci.torch_ops.attention(q, k, v, **opts)
        if "seqlens" in opts:               # rows past a sequence's length are unspecified; compare the valid ones
            mask = torch.arange(out.shape[2])[None, None, :, None] < opts["seqlens"][:, None, None, None]
            out = out * mask
        return out
    assert torch.autograd.gradcheck(f, (q, k, v, *extra), atol=1e-6, rtol=1e-5)


def test_gradcheck_varlen():
    torch.manual_seed(3)
    q, k, v = leaf(11, 2, 8), leaf(11, 2, 8), leaf(11, 2, 8)
    table = leaf(2, 8)
    cu = torch.tensor([0, 4, 4, 11], dtype=torch.int32)

    def f(q, k, v, table):
        return flashsci.torch_ops.attention_varlen(q, k, v, cu, cu, 7, 7, causal=True, t5_table=table,
                                                   t5_num_buckets=8, t5_max_distance=16, rotary_base=50.0)
    assert torch.autograd.gradcheck(f, (q, k, v, table), atol=1e-6, rtol=1e-5)


def test_grads_match_sdpa():
    """float32 gradients against torch's math SDPA on the same inputs (GQA expanded for it)."""
    torch.manual_seed(4)
    q, k, v = leaf(2, 4, 33, 16, dtype=torch.float32), leaf(2, 2, 40, 16, dtype=torch.float32), \
        leaf(2, 2, 40, 16, dtype=torch.float32)
    bias = leaf(2, 1, 33, 40, dtype=torch.float32)
    dout = torch.randn(2, 4, 33, 16)
    mine = torch.autograd.grad(flashsci.torch_ops.attention(q, k, v, bias=bias), (q, k, v, bias), dout)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1), attn_mask=bias.double())
    want = torch.autograd.grad(ref, (q, k, v, bias), dout.double())
    for got, exp in zip(mine, want):
        assert got.dtype == torch.float32 and got.shape == exp.shape
        torch.testing.assert_close(got, exp, atol=2e-5, rtol=1e-4)


def test_no_grad_for_options_and_lse():
    """Only q, k, v, bias and the T5 table get gradients; lse is returned without history."""
    q, k, v = leaf(1, 2, 5, 8), leaf(1, 2, 5, 8), leaf(1, 2, 5, 8)
    out, lse = ops.attention_fwd(q, k, v)
    assert out.requires_grad and not lse.requires_grad
    out.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_eager_calls_skip_the_dispatcher_traced_ones_do_not():
    """Eager calls on plain tensors record flashsci's autograd.Function (no custom-op dispatch) with the same gradients
    as the registered autograd of the custom op, which traced calls (fake tensors here) go through."""
    q, k, v = leaf(1, 2, 5, 8), leaf(1, 2, 5, 8), leaf(1, 2, 5, 8)
    out = ops.attention(q, k, v, causal=True)
    assert type(out.grad_fn).__name__ == "_EagerBackward"
    dout = torch.randn_like(out)
    eager = torch.autograd.grad(out, (q, k, v), dout)
    via_op = torch.autograd.grad(ops.attention_fwd(q, k, v, True)[0], (q, k, v), dout)
    assert all(torch.equal(a, b) for a, b in zip(eager, via_op))
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode, plain = FakeTensorMode(), q.detach()
    with mode:
        fq = mode.from_tensor(plain)
        assert ops.attention(fq, fq, fq).shape == q.shape       # the fake kernel, not the C function
    x, w = leaf(3, 8), leaf(16, 8)
    assert type(ops.swiglu(x, w).grad_fn).__name__ == "_EagerBackward"


def test_opcheck_backward_ops():
    """opcheck on the forward ops with inputs that require grad (autograd registration) and on the backward ops."""
    q, k, v = leaf(1, 2, 6, 8, dtype=torch.float32), leaf(1, 2, 6, 8, dtype=torch.float32), \
        leaf(1, 2, 6, 8, dtype=torch.float32)
    bias, table = leaf(1, 2, 6, 6, dtype=torch.float32), leaf(2, 32, dtype=torch.float32)
    torch.library.opcheck(ops.attention_fwd, (q, k, v), {"causal": True, "bias": bias, "t5_table": table})
    out, lse = ops.attention_fwd(q.detach(), k.detach(), v.detach())
    torch.library.opcheck(ops.attention_bwd, (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse),
                          {"bias": bias.detach(), "bias_grad": True, "t5_table": table.detach(), "t5_grad": True})
    vq, vk, vv, cu, _, mq, mk = varlen_args()
    vq.requires_grad_()
    torch.library.opcheck(ops.attention_varlen_fwd, (vq, vk, vv, cu, cu, mq, mk), {"causal": True})
    out, lse = ops.attention_varlen_fwd(vq.detach(), vk, vv, cu, cu, mq, mk)
    torch.library.opcheck(ops.attention_varlen_bwd, (torch.randn_like(out), vq.detach(), vk, vv, out, lse, cu, cu, mq, mk))


def test_compile_backward_and_checkpoint():
    """torch.compile(fullgraph=True) through forward and backward, and activation checkpointing, give eager's grads."""
    torch._dynamo.reset()
    torch.manual_seed(5)
    args = [torch.randn(11, 32, requires_grad=True), torch.randn(96, 32, requires_grad=True)]

    def net(x, w):
        qkv = (torch.nn.functional.layer_norm(x, (32,)) @ w.T).view(1, 11, 3, 2, 16)
        a = ops.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], layout="bshd", causal=True, rotary_base=1e4)
        return (x + a.reshape(11, 32)).square().sum()

    eager = torch.autograd.grad(net(*args), args)
    compiled = torch.autograd.grad(torch.compile(net, fullgraph=True, backend="aot_eager")(*args), args)
    ckpt = torch.autograd.grad(torch.utils.checkpoint.checkpoint(net, *args, use_reentrant=False), args)
    for a, b, c in zip(eager, compiled, ckpt):
        torch.testing.assert_close(b, a)
        torch.testing.assert_close(c, a)


@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_gradcheck_linear(act):
    """torch.ops.flashsci.linear's gradients (flashsci.linear_backward) against finite differences, float64."""
    x, w, b = (torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in ((3, 5, 16), (24, 16), (24,)))
    assert torch.autograd.gradcheck(lambda x, w, b: ops.linear(x, w, b, act), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: ops.linear(x, w, None, act), (x, w))


@pytest.mark.parametrize("packed", [False, True])
def test_gradcheck_swiglu(packed):
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    ws = [torch.randn(48 if packed else 24, 16, dtype=torch.float64, requires_grad=True) for _ in range(1 if packed else 2)]
    assert torch.autograd.gradcheck(lambda x, *w: ops.swiglu(x, *w), (x, *ws))


def test_linear_keeps_preactivation_only_when_recording():
    x, w = torch.randn(4, 16), torch.randn(8, 16, requires_grad=True)
    assert ops.linear_fwd(x, w, None, "gelu", flashsci.torch_ops.needs_grad(x, w))[1].shape == (4, 8)
    with torch.no_grad():
        assert ops.linear_fwd(x, w, None, "gelu", flashsci.torch_ops.needs_grad(x, w))[1].numel() == 0
    # a float32 bias gets a float32 gradient from bfloat16 inputs
    xb, wb, bb = torch.randn(4, 16, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(8, requires_grad=True)
    ops.linear(xb, wb, bb, "silu").float().sum().backward()
    assert bb.grad.dtype == torch.float32


def test_opcheck_linear_backward_ops():
    """opcheck on linear_fwd / swiglu_fwd with inputs that require grad, and on linear_bwd / swiglu_bwd."""
    x, w, b = torch.randn(6, 24, requires_grad=True), torch.randn(16, 24, requires_grad=True), torch.randn(16, requires_grad=True)
    torch.library.opcheck(ops.linear_fwd, (x, w, b, "gelu", True))
    y, h = ops.linear_fwd(x.detach(), w.detach(), b.detach(), "gelu", True)
    torch.library.opcheck(ops.linear_bwd, (torch.randn_like(y), x.detach(), w.detach(), h, "gelu", torch.float32))
    wg, wu = torch.randn(16, 24, requires_grad=True), torch.randn(16, 24, requires_grad=True)
    torch.library.opcheck(ops.swiglu_fwd, (x, wg, wu, True))
    y, h = ops.swiglu_fwd(x.detach(), wg.detach(), wu.detach(), True)
    torch.library.opcheck(ops.swiglu_bwd, (torch.randn_like(y), x.detach(), wg.detach(), wu.detach(), h))
    torch.library.opcheck(ops.swiglu_bwd, (torch.randn_like(y), x.detach(), torch.cat([wg, wu]).detach(), None, h))


def test_plain_linear_refuses_parameters_while_recording():
    """flashsci.linear records no autograd: a weight, w_up or bias that requires grad is refused while autograd records
    (a silently detached result would drop its gradient), accepted under no_grad."""
    x, w, b = torch.randn(4, 16), torch.randn(8, 16, requires_grad=True), torch.randn(8, requires_grad=True)
    with pytest.raises(ValueError, match="weight requires grad, but flashsci.linear does not record autograd"):
        flashsci.linear(x, w)
    with pytest.raises(ValueError, match="bias requires grad"):
        flashsci.linear(x, w.detach(), b)
    with pytest.raises(ValueError, match="w_up requires grad, but flashsci.swiglu"):
        flashsci.swiglu(x, w.detach(), w)
    with torch.no_grad():
        assert flashsci.linear(x, w, b).shape == (4, 8)


def test_wrong_argument_types_are_type_errors():
    """The differentiable wrappers name an argument of the wrong type in a TypeError, as torch's own functions do,
    instead of the dispatcher's RuntimeError or an AttributeError from inside the op."""
    q, k, v = qkv(1, 2, 8, 16)
    x, w = torch.randn(4, 16), torch.randn(8, 16)
    cases = [(lambda: flashsci.torch_ops.attention(q, None, v), r"attention: k must be a torch.Tensor, got NoneType"),
             (lambda: flashsci.torch_ops.attention(q, k, v, causal=1), r"causal must be a bool, got int"),
             (lambda: flashsci.torch_ops.attention(q, k, v, scale="0.1"), r"scale must be a float or None, got str"),
             (lambda: flashsci.torch_ops.attention(q, k, v, bias=0.0), r"bias must be a torch.Tensor or None, got float"),
             (lambda: flashsci.torch_ops.attention(q, k, v, t5_num_buckets=True), r"t5_num_buckets must be an int, got bool"),
             (lambda: flashsci.torch_ops.attention_varlen(*varlen_args()[:5], 12.0, 12),
              r"attention_varlen: max_seqlen_q must be an int, got float"),
             (lambda: flashsci.torch_ops.linear(x, w.numpy()), r"linear: weight must be a torch.Tensor, got ndarray"),
             (lambda: flashsci.torch_ops.linear(x, w, activation=torch.tensor(1)), r"activation must be a str or None"),
             (lambda: flashsci.torch_ops.swiglu([1.0], w), r"swiglu: x must be a torch.Tensor, got list")]
    for call, message in cases:
        with pytest.raises(TypeError, match=message):
            call()
    with pytest.raises(ValueError, match=r"max_seqlen_k must fit 64 bits, got 9223372036854775808"):
        flashsci.torch_ops.attention_varlen(*varlen_args()[:6], 2**63)
    with pytest.raises(ValueError, match="w_gate must be 2-D"):   # the C function's message, not an IndexError
        flashsci.torch_ops.swiglu(x.requires_grad_(), torch.tensor(1.0))


def test_qkvpacked_matches_separate_views():
    """attention_qkvpacked on a (B, S, 3, H, D) projection equals attention on its three views, forward and gradient
    (causal, rotary, a key padding mask), eager and through torch.compile(fullgraph=True)."""
    torch._dynamo.reset()
    torch.manual_seed(7)
    x = torch.randn(2, 13, 3, 2, 8, dtype=torch.float64, requires_grad=True)
    kpm = torch.rand(2, 13) > 0.3
    kpm[:, 0] = True
    dout = torch.randn(2, 13, 2, 8, dtype=torch.float64)

    def packed(t):
        return ops.attention_qkvpacked(t, causal=True, key_padding_mask=kpm, rotary_base=1e4)

    def separate(t):
        return ops.attention(t[:, :, 0], t[:, :, 1], t[:, :, 2], causal=True, layout="bshd", key_padding_mask=kpm,
                             rotary_base=1e4)
    want = separate(x)
    (g_want,) = torch.autograd.grad(want, x, dout)
    for fn in (packed, torch.compile(packed, fullgraph=True, backend="aot_eager")):
        got = fn(x)
        (g_got,) = torch.autograd.grad(got, x, dout)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g_got, g_want, rtol=1e-12, atol=1e-12)


def test_gradcheck_qkvpacked():
    torch.manual_seed(8)
    x = torch.randn(1, 9, 3, 2, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: flashsci.torch_ops.attention_qkvpacked(t, causal=True, rotary_base=1e4),
                                    (x,), atol=1e-6, rtol=1e-5)
    assert torch.autograd.gradcheck(lambda t: flashsci.torch_ops.attention_qkvpacked(t, scale=0.3), (x,), atol=1e-6,
                                    rtol=1e-5)


def test_opcheck_qkvpacked():
    x = leaf(1, 6, 3, 2, 8, dtype=torch.float32)
    torch.library.opcheck(ops.attention_qkvpacked_fwd, (x,), {"causal": True, "rotary_base": 1e4})
    out, lse = ops.attention_qkvpacked_fwd(x.detach())
    torch.library.opcheck(ops.attention_qkvpacked_bwd, (torch.randn_like(out), x.detach(), out, lse))


def test_qkvpacked_refuses_other_shapes():
    with pytest.raises(ValueError, match=r"qkv must have shape \(B, S, 3, H, D\), got \(1, 6, 2, 2, 8\)"):
        flashsci.torch_ops.attention_qkvpacked(torch.randn(1, 6, 2, 2, 8))
    with pytest.raises(ValueError, match="got \\(6, 3, 2, 8\\)"):
        flashsci.torch_ops.attention_qkvpacked(torch.randn(6, 3, 2, 8))
    with pytest.raises(TypeError, match="qkv must be a torch.Tensor, got list"):
        flashsci.torch_ops.attention_qkvpacked([1.0])
