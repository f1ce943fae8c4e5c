"""ESM-C (the esm package's ESMC, built small without downloads) patched on the CPU in float64: the same logits,
embeddings and per-block hidden states as the stock model on every real token, the same loss and gradient of every
parameter, with residue scaling (n_layers != 36), the GELU FFN variant and LoRA adapters."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
esmc_module = pytest.importorskip("esm.models.esmc")
from esm.tokenization import get_esmc_model_tokenizers  # noqa: E402

from flashsci.integrations import is_patched, patch, unpatch  # noqa: E402
from test_integrations_cpu import batch  # noqa: E402
from test_integrations_train_cpu import assert_same  # noqa: E402

TOL = 2e-6   # esm computes the rotary angles in float32 whatever the model's dtype


def esmc(layers=4, ffn="swiglu"):
    """A small random ESMC in float64, training mode (36 layers would make the residue scaling 1)."""
    torch.manual_seed(4)
    model = esmc_module.ESMC(d_model=64, n_heads=4, n_layers=layers, tokenizer=get_esmc_model_tokenizers(),
                             use_flash_attn=False)
    if ffn == "gelu":
        from esm.layers.blocks import gelu_ln_ffn
        for block in model.transformer.blocks:
            block.ffn = gelu_ln_ffn(64, 4.0, False)
    for name, p in model.named_parameters():   # LayerNorms start at 1/0: move them so a mistake shows
        if p.dim() == 1:
            torch.nn.init.normal_(p, mean=1.0 if "weight" in name else 0.0, std=0.1)
    return model.double().train()


def tokens(lengths):
    """ESM-C ids: <cls> residues <eos>, padded with its pad id."""
    ids, mask = batch([n + 2 for n in lengths], vocab=(4, 24), pad=1)
    ids[:, 0] = 0
    ids[torch.arange(len(lengths)), torch.tensor(lengths) + 1] = 2
    return ids, mask


def mlm_loss(model, ids, mask):
    out = model(sequence_tokens=ids)
    labels = ids.masked_fill(mask == 0, -100)
    return torch.nn.functional.cross_entropy(out.sequence_logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def rel(a, b, mask):
    m = mask.bool()
    return ((a - b)[..., m, :].abs().max() / b[..., m, :].abs().max()).item()


@pytest.mark.parametrize("ffn", ["swiglu", "gelu"])
def test_esmc_outputs_match_stock(ffn):
    ids, mask = tokens([30, 7, 19])
    model = esmc(ffn=ffn).eval()
    with torch.no_grad():
        ref = model(sequence_tokens=ids)
        patch(model)
        assert is_patched(model)
        got = model(sequence_tokens=ids)
    assert rel(got.sequence_logits, ref.sequence_logits, mask) < TOL
    assert rel(got.embeddings, ref.embeddings, mask) < TOL
    assert got.hidden_states.shape == ref.hidden_states.shape
    assert rel(got.hidden_states, ref.hidden_states, mask) < TOL
    unpatch(model)
    with torch.no_grad():
        assert torch.equal(model(sequence_tokens=ids).embeddings, ref.embeddings)


def test_esmc_gradients_match_stock():
    ids, mask = tokens([25, 9, 16, 3])
    stock, fused = esmc(), patch(esmc())

    def grads(model):
        model.zero_grad(set_to_none=True)
        loss = mlm_loss(model, ids, mask)
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert_same(grads(fused), grads(stock), tol=TOL)


def test_esmc_lora_gradients():
    pytest.importorskip("peft")
    from test_integrations_lora_cpu import lora
    ids, mask = tokens([12, 20])
    targets = ["layernorm_qkv.1", "out_proj", "ffn.1", "ffn.3"]
    stock, fused = lora(esmc(), targets), patch(lora(esmc(), targets))

    def grads(model):
        model.zero_grad(set_to_none=True)
        loss = mlm_loss(model.base_model.model, ids, mask)
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    ref = grads(stock)
    assert ref[1] and all("lora_" in n for n in ref[1])
    assert_same(grads(fused), ref, tol=TOL)


def test_esmc_integer_sequence_ids_take_the_stock_forward():
    ids, _ = tokens([10, 10])
    model = esmc().eval()
    seq_id = torch.zeros_like(ids)
    seq_id[:, 6:] = 1          # two sequences in each row
    with torch.no_grad():
        ref = model(sequence_tokens=ids, sequence_id=seq_id).embeddings
        got = patch(model)(sequence_tokens=ids, sequence_id=seq_id).embeddings
    assert torch.equal(got, ref)
