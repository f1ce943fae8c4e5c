"""flashsci.integrations and torch.ops.flashsci on CUDA: patched fp16/bf16 HF ESM2 and T5 encoders within 2x
of stock's own error against stock fp32 (same weights), torch.compile(fullgraph=True) with inductor, and
CUDA-graph capture of the ops."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import flashsci.torch_ops  # noqa: E402,F401
from flashsci.integrations import patch, unpatch  # noqa: E402

pytestmark = pytest.mark.gpu
ops = torch.ops.flashsci


def esm_model(**kw):
    torch.manual_seed(0)
    cfg = transformers.EsmConfig(vocab_size=33, hidden_size=320, num_hidden_layers=4, num_attention_heads=5,
                                 intermediate_size=1280, position_embedding_type="rotary", pad_token_id=1,
                                 mask_token_id=32, token_dropout=True, max_position_embeddings=1026, **kw)
    with torch.device("cuda"):
        return transformers.EsmModel(cfg, add_pooling_layer=False).eval()


def t5_model(proj):
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=64, d_model=256, d_kv=64, num_heads=4, d_ff=1024, num_layers=4,
                                feed_forward_proj=proj)
    with torch.device("cuda"):
        return transformers.T5EncoderModel(cfg).eval()


def batch(lengths, vocab, pad):
    g = torch.Generator().manual_seed(sum(lengths))
    S = max(lengths)
    ids = torch.randint(*vocab, (len(lengths), S), generator=g)
    mask = (torch.arange(S)[None] < torch.tensor(lengths)[:, None]).long()
    ids[mask == 0] = pad
    return ids.cuda(), mask.cuda()


def errors(x, ref, mask):
    """(max, mean) |x - ref| over the valid tokens."""
    d = (x.float() - ref.float())[mask.bool()].abs()
    return d.max().item(), d.mean().item()


def check_against_stock(model, ids, mask, dtype):
    """Patched low-precision output (both plain_linear choices) within 2x of stock low precision's error
    against stock fp32."""
    with torch.no_grad():
        ref = model(ids, attention_mask=mask).last_hidden_state
        model.to(dtype)
        stock = model(ids, attention_mask=mask).last_hidden_state
        s_max, s_mean = errors(stock, ref, mask)
        for plain in ("torch", "flashsci"):
            patch(model, plain_linear=plain)
            out = torch.full_like(stock, float("nan"))
            out.copy_(model(ids, attention_mask=mask).last_hidden_state)
            unpatch(model)
            p_max, p_mean = errors(out, ref, mask)
            assert torch.isfinite(out[mask.bool()]).all()
            assert p_max <= 2 * s_max and p_mean <= 2 * s_mean, (plain, p_max, s_max, p_mean, s_mean)


LENGTHS = [[1, 37, 200, 513, 64, 5], [700], [130, 129, 128, 127]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("lengths", LENGTHS)
def test_esm_patched_accuracy(dtype, lengths):
    check_against_stock(esm_model(), *batch(lengths, (4, 30), 1), dtype)


@pytest.mark.parametrize("proj", ["relu", "gated-gelu", "gated-silu"])
@pytest.mark.parametrize("lengths", LENGTHS)
def test_t5_patched_accuracy(proj, lengths):
    check_against_stock(t5_model(proj), *batch(lengths, (3, 64), 0), torch.float16)


def test_esm_registry_fallback_accuracy():
    model = esm_model().half()
    ids, mask = batch([40, 90, 3], (4, 30), 1)
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
        patch(model)
        out = model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    for a, b in zip(out, ref):
        assert (a - b)[mask.bool()].abs().max() <= 2e-2 * b[mask.bool()].abs().max()


def test_patch_rejects_fp32_cuda_model():
    with pytest.raises(ValueError, match="float16 or bfloat16, got a torch.float32 model"):
        patch(esm_model())


def block(x, wqkv, wo, w1, cu, n):
    """Pre-norm block on packed rows with every op: fused qkv, varlen attention with rotary, swiglu FFN."""
    T, d = x.shape
    qkv = ops.linear(torch.nn.functional.layer_norm(x, (d,)), wqkv).view(T, 3, d // 64, 64)
    a = ops.attention_varlen(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, cu, n, n, rotary_base=10000.0)
    x = x + ops.linear(a.reshape(T, d), wo, None, "gelu")
    q = x.view(1, T, d // 64, 64)
    return x + ops.swiglu(x, w1) + ops.attention(q, q, q, layout="bshd", causal=True).view(T, d)


def block_inputs():
    d = 256
    h = lambda *s: torch.randn(*s, device="cuda", dtype=torch.float16) * 0.05  # noqa: E731
    cu = torch.tensor([0, 100, 101, 357], dtype=torch.int32, device="cuda")
    return h(357, d) * 20, h(3 * d, d), h(d, d), h(2 * d, d), cu, 256


def test_compile_fullgraph_inductor():
    torch._dynamo.reset()
    args = block_inputs()
    compiled = torch.compile(block, fullgraph=True)
    out, ref = compiled(*args), block(*args)
    assert (out - ref).abs().max() <= 1e-2 * ref.abs().max()


def test_cuda_graph_capture():
    args = block_inputs()
    static = [a.clone() for a in args[:-1]] + [args[-1]]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        block(*static)                              # warm-up off the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = block(*static)
    fresh = block_inputs()
    for s, f in zip(static[:-1], fresh[:-1]):
        s.copy_(f)
    out.fill_(float("nan"))
    graph.replay()
    ref = block(*fresh)
    assert torch.equal(out, ref)
