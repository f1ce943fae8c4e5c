"""Training through patched HF models on the CPU (float64): the patched ESM2 masked-LM and T5 encoder give the stock
loss and the stock gradient of every parameter (packed tokens, flashsci's attention backward, the T5 table's
gradient), with hidden dropout, gradient checkpointing, and the stock fallbacks (attention dropout, per-layer
outputs through the registry attention)."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers import EsmConfig, EsmForMaskedLM, T5Config, T5EncoderModel  # noqa: E402

from flashsci.integrations import patch  # noqa: E402
from flashsci.integrations.packing import adjacent  # noqa: E402
from test_integrations_cpu import batch  # noqa: E402


def esm_lm(kind="rotary", hidden_dropout=0.0, attention_dropout=0.0):
    """A small random ESM2-shaped masked-LM in float64, training mode."""
    torch.manual_seed(1)
    cfg = EsmConfig(vocab_size=33, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
                    position_embedding_type=kind, pad_token_id=1, mask_token_id=32, token_dropout=True,
                    max_position_embeddings=64, hidden_dropout_prob=hidden_dropout,
                    attention_probs_dropout_prob=attention_dropout)
    return EsmForMaskedLM(cfg).double().train()


def t5_encoder(proj="relu", dropout=0.0):
    torch.manual_seed(2)
    cfg = T5Config(vocab_size=40, d_model=48, d_kv=16, num_heads=4, d_ff=80, num_layers=3, feed_forward_proj=proj,
                   relative_attention_max_distance=20, dropout_rate=dropout)
    return T5EncoderModel(cfg).double().train()


def lm_loss(model, ids, mask):
    """Masked-LM loss on the valid tokens (labels: the ids themselves)."""
    labels = ids.masked_fill(mask == 0, -100)
    return model(ids, attention_mask=mask, labels=labels).loss


def t5_loss(model, ids, mask):
    """A fixed random projection of the valid tokens' outputs (sum(out^2) would be flat: T5's final RMS norm with
    its initial weights of 1 makes every row's square sum d_model)."""
    out = model(ids, attention_mask=mask).last_hidden_state
    proj = torch.randn(out.shape[-1], generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    return ((out @ proj) * mask).sum()


def grads(model, loss_fn, ids, mask):
    """(loss, {name: grad}) of one backward."""
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model, ids, mask)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same(a, b, tol=1e-7):
    """Same loss and the same gradient for every parameter, relative to each gradient's size (at least 1e-6 of the
    largest gradient: the key bias's gradient is 0 in exact arithmetic without rotary, a softmax being blind to a
    shift of a whole row, so both sides hold rounding noise there)."""
    (la, ga), (lb, gb) = a, b
    assert abs(la - lb) <= tol * abs(lb)
    assert set(ga) == set(gb), set(ga) ^ set(gb)
    largest = max(g.abs().max().item() for g in gb.values())
    for name in gb:
        scale = max(gb[name].abs().max().item(), 1e-6 * largest)
        err = (ga[name] - gb[name]).abs().max().item() / scale
        assert err <= tol, (name, err)


@pytest.mark.parametrize("kind", ["rotary", "absolute"])
def test_esm_masked_lm_gradients(kind):
    model = esm_lm(kind)
    ids, mask = batch([7, 19, 1, 12], mask_token=32)
    ref = grads(model, lm_loss, ids, mask)
    patch(model)
    assert_same(grads(model, lm_loss, ids, mask), ref)


def test_esm_gradient_checkpointing_and_optimizer_step():
    """Checkpointed layers give the same gradients; an optimizer step on the patched model updates the same
    parameters as on the stock one, the fused q/k/v weights staying views of one buffer (SGD: AdamW would turn the
    rounding noise of gradients that are 0 in exact arithmetic into steps of +-lr)."""
    ids, mask = batch([9, 14, 3])
    stock, fused = esm_lm(), esm_lm()
    ref = grads(stock, lm_loss, ids, mask)
    patch(fused)
    fused.gradient_checkpointing_enable()
    assert_same(grads(fused, lm_loss, ids, mask), ref)
    for model in (stock, fused):
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        grads(model, lm_loss, ids, mask)
        opt.step()
    for (n, a), (_, b) in zip(stock.named_parameters(), fused.named_parameters()):
        assert torch.allclose(a, b, rtol=0, atol=1e-9), n
    sa = fused.esm.encoder.layer[0].attention.self
    assert adjacent([sa.query.weight, sa.key.weight, sa.value.weight]) is not None


def test_esm_hidden_dropout_trains_and_attention_dropout_falls_back():
    """Hidden dropout runs on the packed path (its own random draws); attention dropout takes the stock forward,
    which then matches stock bit for bit under the same seed."""
    ids, mask = batch([9, 14, 3])
    model = patch(esm_lm(hidden_dropout=0.2))
    loss, g = grads(model, lm_loss, ids, mask)
    assert torch.isfinite(torch.tensor(loss)) and all(torch.isfinite(x).all() for x in g.values())
    model.eval()
    with torch.no_grad():
        a, b = lm_loss(model, ids, mask), lm_loss(model, ids, mask)
    assert a == b   # no dropout in eval mode
    stock, fused = esm_lm(attention_dropout=0.3), patch(esm_lm(attention_dropout=0.3))
    torch.manual_seed(5)
    ref = grads(stock, lm_loss, ids, mask)
    torch.manual_seed(5)
    assert_same(grads(fused, lm_loss, ids, mask), ref)


@pytest.mark.parametrize("proj", ["relu", "gated-gelu", "gated-silu"])
def test_t5_encoder_gradients_with_the_table(proj):
    model = t5_encoder(proj)
    ids, mask = batch([6, 17, 11], vocab=(2, 40), pad=0)
    ref = grads(model, t5_loss, ids, mask)
    patch(model)
    got = grads(model, t5_loss, ids, mask)
    assert any("relative_attention_bias" in n for n in got[1])
    assert_same(got, ref, tol=2e-6)   # HF takes T5's mean square in float32 even in float64 models


def test_stock_fallback_under_grad_uses_the_differentiable_registry_attention():
    """output_hidden_states takes the stock forward, whose attention is flashsci's registry function; with gradients
    it runs the differentiable op and matches stock sdpa's gradients."""
    ids, mask = batch([8, 13])
    stock = esm_lm()
    stock.set_attn_implementation("sdpa")

    def loss_hidden(model, ids, mask):
        out = model(ids, attention_mask=mask, output_hidden_states=True)
        proj = torch.randn(out.hidden_states[0].shape[-1], generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        return sum(((h @ proj) * mask).sum() for h in out.hidden_states)

    ref = grads(stock, loss_hidden, ids, mask)
    fused = patch(esm_lm())
    assert_same(grads(fused, loss_hidden, ids, mask), ref)
