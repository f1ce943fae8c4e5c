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
