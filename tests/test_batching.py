"""flashsci.batching: token-budget batches (pure Python) and embed() on a small HF model (needs torch)."""
import random

import numpy as np
import pytest

from flashsci.batching import pad_batch, token_batches


def test_token_batches_budget_order_and_cover():
    rng = random.Random(3)
    lengths = [rng.randint(1, 900) for _ in range(500)]
    batches = token_batches(lengths, 4096)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(500))
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 4096
    for b, nxt in zip(batches, batches[1:]):          # greedy: the next sequence did not fit
        assert (len(b) + 1) * lengths[b[0]] > 4096


def test_token_batches_edges():
    assert token_batches([], 10) == []
    assert token_batches([50, 3, 3], 10) == [[0], [1, 2]]            # too long alone: its own batch
    assert token_batches([2, 2, 2, 2, 2], 100, max_batch=2) == [[0, 1], [2, 3], [4]]
    assert token_batches([0, 0], 1) == [[0], [1]]
    with pytest.raises(ValueError, match="max_tokens must be at least 1, got 0"):
        token_batches([1], 0)
    with pytest.raises(ValueError, match="lengths must be non-negative, got -1"):
        token_batches([1, -1], 8)
    with pytest.raises(ValueError, match="max_batch must be at least 1 or None, got 0"):
        token_batches([1], 8, max_batch=0)
    assert token_batches(np.array([3, 1, 2]), np.int32(4)) == [[0], [2, 1]]   # NumPy integers are ints
    with pytest.raises(TypeError, match="each length must be an int, got float 1.5"):   # not cut to 1
        token_batches([1.5, 2], 8)
    with pytest.raises(TypeError, match="max_tokens must be an int, got float inf"):
        token_batches([1], float("inf"))


def test_pad_batch():
    ids, mask = pad_batch([[5, 6, 7], [8]], pad_id=1)
    assert ids.tolist() == [[5, 6, 7], [8, 1, 1]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_embed_order_and_pooling():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from flashsci.batching import embed
    torch.manual_seed(0)
    cfg = transformers.EsmConfig(vocab_size=33, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, position_embedding_type="rotary", pad_token_id=1,
                                 token_dropout=False, mask_token_id=32)
    model = transformers.EsmModel(cfg).double().eval()
    rng = random.Random(5)
    seqs = [[0] + [rng.randint(4, 29) for _ in range(rng.randint(1, 40))] + [2] for _ in range(23)]
    per_res = embed(model, seqs, max_tokens=64, special=(1, 1))
    means = embed(model, seqs, max_tokens=64, pool="mean", special=(1, 1))
    for s, r, m in zip(seqs, per_res, means):
        with torch.no_grad():
            alone = model(torch.tensor([s])).last_hidden_state[0, 1:-1]
        assert r.shape == alone.shape and torch.allclose(r, alone, atol=1e-10)
        assert torch.allclose(m.double(), alone.mean(0), atol=1e-6)
    with pytest.raises(ValueError, match="pool must be None or 'mean', got 'max'"):
        embed(model, seqs, pool="max")
    with pytest.raises(ValueError, match="more than 2 tokens"):
        embed(model, [[0, 2]], special=(1, 1))
