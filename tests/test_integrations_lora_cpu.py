"""LoRA (PEFT) on patched HF models on the CPU (float64): an adapter-wrapped model, patched before or after
get_peft_model, gives the stock adapter-wrapped model's loss and the gradient of every trainable parameter (the LoRA
A and B matrices; the frozen base weights get none), trains to the same adapters, and merges into the same weights."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from flashsci.integrations import is_patched, patch  # noqa: E402
from test_integrations_cpu import batch  # noqa: E402
from test_integrations_train_cpu import assert_same, esm_lm, grads, lm_loss, t5_encoder, t5_loss  # noqa: E402

ESM_TARGETS = ["query", "key", "value", "dense"]
T5_TARGETS = ["q", "k", "v", "o", "wi", "wi_0", "wi_1", "wo"]


def lora(model, targets):
    """model wrapped with rank-4 LoRA on targets; B starts random (PEFT's zeros would make every A gradient 0)."""
    cfg = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets)
    wrapped = peft.get_peft_model(model, cfg)
    torch.manual_seed(11)
    for name, p in wrapped.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    return wrapped


def trained(model, loss_fn, ids, mask, steps=3):
    """model after steps of SGD on its trainable parameters (AdamW would turn the rounding noise of gradients that are
    0 in exact arithmetic into steps of +-lr)."""
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss_fn(model, ids, mask).backward()
        opt.step()
    return model


@pytest.mark.parametrize("order", ["patch then wrap", "wrap then patch"])
def test_esm_lora_gradients_training_and_merge(order):
    ids, mask = batch([9, 14, 3, 11], mask_token=32)
    stock = lora(esm_lm(), ESM_TARGETS)
    fused = lora(patch(esm_lm()), ESM_TARGETS) if order == "patch then wrap" else patch(lora(esm_lm(), ESM_TARGETS))
    assert is_patched(fused)
    ref = grads(stock, lm_loss, ids, mask)
    got = grads(fused, lm_loss, ids, mask)
    assert_same(got, ref)
    assert ref[1] and all("lora_" in n for n in ref[1])        # only the adapters train
    assert sorted(n for n, _ in fused.named_parameters()) == sorted(n for n, _ in stock.named_parameters())
    before = {n: p.detach().clone() for n, p in fused.named_parameters()}
    trained(stock, lm_loss, ids, mask)
    trained(fused, lm_loss, ids, mask)
    for (n, a), (_, b) in zip(stock.named_parameters(), fused.named_parameters()):
        assert torch.allclose(a, b, rtol=0, atol=1e-9), n
        assert torch.equal(b, before[n]) != ("lora_" in n), n   # the adapters moved, the base did not
    s_merged, f_merged = stock.merge_and_unload(), fused.merge_and_unload()
    for (n, a), (_, b) in zip(s_merged.state_dict().items(), f_merged.state_dict().items()):
        assert torch.allclose(a, b, rtol=0, atol=1e-8), n
    with torch.no_grad():                                       # the merged patched model computes what the stock one does
        ref_loss = lm_loss(s_merged, ids, mask).item()
        assert abs(lm_loss(f_merged, ids, mask).item() - ref_loss) <= 1e-7 * abs(ref_loss)


@pytest.mark.parametrize("proj", ["relu", "gated-silu"])
def test_t5_lora_gradients(proj):
    ids, mask = batch([6, 17, 11], vocab=(2, 40), pad=0)
    stock = lora(t5_encoder(proj), T5_TARGETS)
    fused = patch(lora(t5_encoder(proj), T5_TARGETS))
    assert_same(grads(fused, t5_loss, ids, mask), grads(stock, t5_loss, ids, mask), tol=2e-6)   # HF: T5 norms in fp32


def test_lora_changes_the_patched_output():
    """The adapters are not skipped: with nonzero B the patched output differs from the base model's, by what the
    stock adapter-wrapped model says."""
    ids, mask = batch([9, 14, 3], mask_token=32)
    base = patch(esm_lm()).eval()
    wrapped = patch(lora(esm_lm(), ESM_TARGETS)).eval()
    with torch.no_grad():
        assert abs(lm_loss(base, ids, mask).item() - lm_loss(wrapped, ids, mask).item()) > 1e-4
