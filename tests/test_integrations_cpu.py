"""flashsci.integrations on the CPU (float32 and float64 models): patched HF ESM2 and T5 encoders give the stock
outputs on the valid tokens, fall back to the stock forward where they must, and unpatch cleanly."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers import EsmConfig, EsmForMaskedLM, EsmModel, T5Config, T5EncoderModel, T5Model  # noqa: E402

from flashsci.integrations import is_patched, patch, unpatch  # noqa: E402
from flashsci.integrations.packing import Packed  # noqa: E402


def esm(kind="rotary", cls=EsmModel, dtype=torch.float64, **kw):
    """A small random ESM2-shaped model (ESM2's vocabulary and special tokens)."""
    torch.manual_seed(1)
    cfg = EsmConfig(vocab_size=33, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
                    position_embedding_type=kind, pad_token_id=1, mask_token_id=32, token_dropout=True,
                    max_position_embeddings=64, **kw)
    return cls(cfg).to(dtype).eval()


def t5(proj="relu", cls=T5EncoderModel, dtype=torch.float64):
    """A small random T5 encoder (ProtT5-shaped: no attention scaling, 32 buckets)."""
    torch.manual_seed(2)
    cfg = T5Config(vocab_size=40, d_model=48, d_kv=16, num_heads=4, d_ff=80, num_layers=3, feed_forward_proj=proj,
                   relative_attention_max_distance=20)
    return cls(cfg).to(dtype).eval()


def batch(lengths, S=None, vocab=(4, 30), pad=1, mask_token=None):
    """Random right-padded ids and mask for the given lengths (mask_token sprinkled in when given)."""
    S = S or max(lengths)
    ids = torch.randint(*vocab, (len(lengths), S))
    if mask_token is not None:
        ids[torch.rand(ids.shape) < 0.15] = mask_token
    mask = (torch.arange(S)[None] < torch.tensor(lengths)[:, None]).long()
    ids[mask == 0] = pad
    return ids, mask


def close(a, b, mask, tol=1e-6):
    """Max |a - b| on the valid tokens, relative to max |b| there, is below tol (float64 models still differ at
    1e-7: HF computes T5's mean square and the rotary angles in float32)."""
    m = mask.bool()
    err = (a - b)[m].abs().max().item() / b[m].abs().max().item()
    assert err <= tol, err


@pytest.mark.parametrize("plain", ["torch", "flashsci"])
@pytest.mark.parametrize("kind", ["rotary", "absolute"])
@pytest.mark.parametrize("lengths", [[7, 19, 1, 12], [9, 9], [5]])
def test_esm_matches_stock(kind, lengths, plain):
    model = esm(kind)
    ids, mask = batch(lengths, mask_token=32)
    with torch.no_grad():
        ref = model(ids, attention_mask=mask)
        patch(model, plain_linear=plain)
        out = model(ids, attention_mask=mask)
    close(out.last_hidden_state, ref.last_hidden_state, mask)
    assert torch.allclose(out.pooler_output, ref.pooler_output, atol=1e-10)
    assert (out.last_hidden_state * (1 - mask[..., None])).abs().max() == 0


def test_esm_masked_lm_without_mask_and_tuple_return():
    model = esm(cls=EsmForMaskedLM)
    ids, mask = batch([11, 11])
    with torch.no_grad():
        ref = model(ids).logits
        patch(model)
        out = model(ids).logits
        tup = model.esm(ids, return_dict=False)
        dflt = model.esm(ids, return_dict=None)
    close(out, ref, mask)
    assert isinstance(tup, tuple) and tup[0].shape == (2, 11, 64) and dflt.last_hidden_state.shape == (2, 11, 64)


def test_esm_float32_rope_theta():
    model = esm(dtype=torch.float32, rope_theta=500.0)
    ids, mask = batch([13, 4, 8])
    with torch.no_grad():
        ref = model(ids, attention_mask=mask).last_hidden_state
        patch(model)
        out = model(ids, attention_mask=mask).last_hidden_state
    close(out, ref, mask, tol=1e-5)


def test_esm_fallbacks_use_registry_attention():
    model = esm(cls=EsmForMaskedLM)
    ids, mask = batch([6, 10, 3])
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, output_hidden_states=True)
        patch(model)
        assert model.config._attn_implementation == "fsci"
        out = model(ids, attention_mask=mask, output_hidden_states=True)
    assert len(out.hidden_states) == len(ref.hidden_states) == 4
    for a, b in zip(out.hidden_states, ref.hidden_states):
        close(a, b, mask)
    unpatch(model)
    assert model.config._attn_implementation == "sdpa" and not is_patched(model)


def test_esm_gradients_fall_back_to_stock():
    model = esm(dtype=torch.float32)
    patch(model)
    ids, mask = batch([5, 8])
    model(ids, attention_mask=mask).last_hidden_state.float().pow(2).sum().backward()
    assert model.encoder.layer[0].attention.self.query.weight.grad is not None


def test_patch_keeps_state_and_survives_to():
    model = esm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids, mask = batch([9, 4])
    with torch.no_grad():
        ref = model(ids, attention_mask=mask).last_hidden_state
        patch(model)
        after = model.state_dict()
        assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
        model.to(torch.float32)       # re-allocates the fused q/k/v views: the patched path concatenates instead
        out = model(ids, attention_mask=mask).last_hidden_state
    close(out.double(), ref, mask, tol=1e-5)


def test_unpatch_restores_stock():
    model = esm()
    ids, mask = batch([9, 4])
    with torch.no_grad():
        ref = model(ids, attention_mask=mask).last_hidden_state
        assert is_patched(patch(model))
        patch(model)                  # twice is harmless
        unpatch(model)
        out = model(ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(out, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("plain", ["torch", "flashsci"])
@pytest.mark.parametrize("proj", ["relu", "gated-gelu", "gated-silu", "gelu"])
@pytest.mark.parametrize("lengths", [[7, 30, 1, 12], [20]])
def test_t5_encoder_matches_stock(proj, lengths, plain):
    model = t5(proj)
    ids, mask = batch(lengths, vocab=(3, 40), pad=0)
    with torch.no_grad():
        ref = model(ids, attention_mask=mask).last_hidden_state
        patch(model, plain_linear=plain)
        out = model(ids, attention_mask=mask).last_hidden_state
    close(out, ref, mask)


def test_t5_model_patches_only_its_encoder():
    model = t5(cls=T5Model)
    ids, mask = batch([8, 5], vocab=(3, 40), pad=0)
    dec = torch.randint(3, 40, (2, 4))
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).last_hidden_state
        patch(model)
        out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).last_hidden_state
    assert "forward" in model.encoder.__dict__ and "forward" not in model.decoder.__dict__
    assert model.config._attn_implementation == "sdpa"      # a decoder keeps its stock attention
    close(out, ref, torch.ones(dec.shape))      # the decoder's states, computed from the patched encoder's


def test_t5_hidden_states_fallback():
    model = t5()
    ids, mask = batch([8, 5, 2], vocab=(3, 40), pad=0)
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
        patch(model)
        out = model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    for a, b in zip(out, ref):
        close(a, b, mask)


def test_patch_errors():
    with pytest.raises(TypeError, match="ESM .* or T5 encoder .* got Linear"):
        patch(torch.nn.Linear(4, 4))
    for call in (patch, unpatch, is_patched):   # a model name is not a model
        with pytest.raises(TypeError, match="takes a torch.nn.Module .* got str"):
            call("facebook/esm2_t33_650M_UR50D")
    model = t5("gated-gelu")
    model.config.dense_act_fn = "tanh"
    with pytest.raises(ValueError, match="activations .* got 'tanh'"):
        patch(model)
    with pytest.raises(ValueError, match="plain_linear must be 'torch' or 'flashsci', got 'cublas'"):
        patch(t5(), plain_linear="cublas")


def test_packed_round_trip():
    x = torch.randn(3, 6, 2, 5)
    mask = torch.tensor([[1] * 6, [1] * 2 + [0] * 4, [0] * 6])
    p = Packed(x, mask)
    assert p.x.shape == (8, 2, 5) and p.max_seqlen == 6 and p.cu_seqlens.tolist() == [0, 6, 8, 8]
    y = p.unpack(p.x)
    assert torch.equal(y[mask.bool()], x[mask.bool()]) and y[~mask.bool()].abs().max() == 0
    p = Packed(x, None)
    assert p.cu_seqlens.tolist() == [0, 6, 12, 18] and torch.equal(p.unpack(p.x), x)
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(3, 6\), got \(3, 5\)"):
        Packed(x, mask[:, :5])
