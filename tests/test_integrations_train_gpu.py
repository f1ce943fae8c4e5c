"""Training through patched HF models on CUDA (bf16): after one backward on real-length batches, every parameter's
gradient from the patched model is within 2x the error of the stock bf16 model's, both against the stock float32
model (per-parameter max error relative to the gradient's size), for ESM2 (masked LM, rotary; head dim 16 as ESM2-8M,
which runs padded, and 64) and a ProtT5-shaped encoder (T5 bias with the table's gradient)."""
import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers import EsmConfig, EsmForMaskedLM, T5Config, T5EncoderModel  # noqa: E402

from flashsci.integrations import patch  # noqa: E402

pytestmark = pytest.mark.gpu


def lengths_batch(lengths, vocab, pad, mask_token=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    S = max(lengths)
    ids = torch.randint(*vocab, (len(lengths), S), generator=g)
    if mask_token is not None:
        ids[torch.rand(ids.shape, generator=g) < 0.15] = mask_token
    mask = (torch.arange(S)[None] < torch.tensor(lengths)[:, None]).long()
    ids[mask == 0] = pad
    return ids.cuda(), mask.cuda()


def param_grads(model, loss_fn):
    model.zero_grad(set_to_none=True)
    loss_fn(model).backward()
    return {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}


def compare(ref32, stock16, patched16):
    """Per parameter: max |g - g32| / max |g32|; patched within 2x stock bf16's, with a floor of 1% of a bf16 ulp."""
    worst = []
    for name, g in ref32.items():
        scale = g.abs().max().item() or 1.0
        e_stock = (stock16[name] - g).abs().max().item() / scale
        e_ours = (patched16[name] - g).abs().max().item() / scale
        worst.append((e_ours / max(e_stock, 1e-4), name, e_ours, e_stock))
        assert e_ours <= max(2 * e_stock, 4e-5), (name, e_ours, e_stock)
    return max(worst)


@pytest.mark.parametrize("hidden,heads", [(320, 20), (256, 4)])
def test_esm_masked_lm_step(hidden, heads):
    torch.manual_seed(0)
    cfg = EsmConfig(vocab_size=33, hidden_size=hidden, num_hidden_layers=4, num_attention_heads=heads,
                    intermediate_size=4 * hidden, position_embedding_type="rotary", pad_token_id=1, mask_token_id=32,
                    token_dropout=True, max_position_embeddings=1026, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)
    ref = EsmForMaskedLM(cfg).cuda().train()
    stock, fused = copy.deepcopy(ref).bfloat16(), copy.deepcopy(ref).bfloat16()
    patch(fused)
    ids, mask = lengths_batch([120, 377, 33, 250, 512], (4, 30), 1, mask_token=32)
    labels = ids.masked_fill(mask == 0, -100)
    loss = lambda m: m(ids, attention_mask=mask, labels=labels).loss
    compare(param_grads(ref, loss), param_grads(stock, loss), param_grads(fused, loss))


def test_t5_encoder_step_with_the_table():
    torch.manual_seed(0)
    cfg = T5Config(vocab_size=128, d_model=256, d_kv=64, num_heads=4, d_ff=1024, num_layers=3, feed_forward_proj="relu",
                   dropout_rate=0.0)
    ref = T5EncoderModel(cfg).cuda().train()
    stock, fused = copy.deepcopy(ref).bfloat16(), copy.deepcopy(ref).bfloat16()
    patch(fused)
    ids, mask = lengths_batch([300, 45, 190], (2, 128), 0)
    proj = torch.randn(256, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    loss = lambda m: ((m(ids, attention_mask=mask).last_hidden_state.float() @ proj) * mask).sum()
    got = param_grads(fused, loss)
    assert "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight" in got
    compare(param_grads(ref, loss), param_grads(stock, loss), got)


def test_esm_lora_step():
    """LoRA (PEFT, rank 8) on a patched ESM2: the adapters' gradients within 2x stock bf16's error."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    cfg = EsmConfig(vocab_size=33, hidden_size=320, num_hidden_layers=3, num_attention_heads=20, intermediate_size=1280,
                    position_embedding_type="rotary", pad_token_id=1, mask_token_id=32, token_dropout=True,
                    max_position_embeddings=1026, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ref = peft.get_peft_model(EsmForMaskedLM(cfg).cuda(), peft.LoraConfig(
        r=8, lora_alpha=16, target_modules=["query", "key", "value", "dense"]))
    for n, p in ref.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.02)
    ref.train()
    stock, fused = copy.deepcopy(ref).bfloat16(), patch(copy.deepcopy(ref).bfloat16())
    ids, mask = lengths_batch([120, 377, 33, 250], (4, 30), 1, mask_token=32)
    labels = ids.masked_fill(mask == 0, -100)
    loss = lambda m: m(input_ids=ids, attention_mask=mask, labels=labels).loss
    got = param_grads(fused, loss)
    assert got and all("lora_" in n for n in got)
    compare(param_grads(ref, loss), param_grads(stock, loss), got)


def test_esmc_step():
    """ESM-C (the esm package's ESMC, 4 blocks of ESM-C-600M's head shape): every gradient within 2x stock bf16's."""
    esmc_module = pytest.importorskip("esm.models.esmc")
    from esm.tokenization import get_esmc_model_tokenizers
    torch.manual_seed(0)
    ref = esmc_module.ESMC(d_model=512, n_heads=8, n_layers=4, tokenizer=get_esmc_model_tokenizers(),
                           use_flash_attn=False).cuda().train()
    stock, fused = copy.deepcopy(ref).bfloat16(), patch(copy.deepcopy(ref).bfloat16())
    ids, mask = lengths_batch([120, 377, 33, 250], (4, 30), 1, mask_token=32)
    labels = ids.masked_fill(mask == 0, -100)
    loss = lambda m: torch.nn.functional.cross_entropy(
        m(sequence_tokens=ids).sequence_logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
    compare(param_grads(ref, loss), param_grads(stock, loss), param_grads(fused, loss))
