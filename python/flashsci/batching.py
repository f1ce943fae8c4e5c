"""Token-budget batching for protein embedding, the way fair-esm's extract script and the ProtT5 embedder do
it: sort by length, cut into batches whose padded size stays under a token budget, run, and hand each
protein's embedding back in input order.

    from flashsci.batching import embed, token_batches
    vecs = embed(model.esm, sequences, tokenize, max_tokens=16384, pool="mean", special=(1, 1))
"""
import operator

import numpy as np


def _int(value, what):
    """value as an int (Python or NumPy integers); TypeError naming what for anything else (a float is not cut)."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(value).__name__} {value!r}") from None


def token_batches(lengths, max_tokens=16384, max_batch=None):
    """Indices into lengths grouped into batches, longest first: each batch's padded size (count × its longest
    length) is at most max_tokens, and at most max_batch sequences; a sequence longer than max_tokens gets a
    batch of its own. Ties keep input order, so the result is deterministic."""
    lengths = [_int(n, "each length") for n in lengths]
    if any(n < 0 for n in lengths):
        raise ValueError(f"lengths must be non-negative, got {min(lengths)}")
    if _int(max_tokens, "max_tokens") < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    if max_batch is not None and _int(max_batch, "max_batch") < 1:
        raise ValueError(f"max_batch must be at least 1 or None, got {max_batch}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, current = [], []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]
        full = (len(current) + 1) * max(longest, 1) > max_tokens or (max_batch and len(current) >= max_batch)
        if current and full:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def pad_batch(token_lists, pad_id):
    """(ids, mask) int64 NumPy arrays (B, longest), right-padded with pad_id; mask is 1 on tokens."""
    longest = max((len(t) for t in token_lists), default=0)
    ids = np.full((len(token_lists), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(token_lists), longest), dtype=np.int64)
    for r, t in enumerate(token_lists):
        ids[r, :len(t)] = t
        mask[r, :len(t)] = 1
    return ids, mask


def embed(model, sequences, tokenize=None, *, max_tokens=16384, max_batch=None, pool=None, special=(0, 0), pad_id=None):
    """Per-protein embeddings from model's last hidden state (an HF base model: EsmModel, T5EncoderModel, ...),
    in the order of sequences, computed in token-budget batches under torch.inference_mode.

    tokenize(seq) -> list of token ids (special tokens included); None when sequences are already id lists.
    special = (tokens at the start, tokens at the end) that are not residues (ESM: (1, 1), ProtT5: (0, 1)).
    pool=None gives each protein's residue embeddings (L, hidden), views into its batch's output; pool="mean"
    their mean (hidden,). pad_id defaults to model.config.pad_token_id."""
    import torch
    if pool not in (None, "mean"):
        raise ValueError(f"pool must be None or 'mean', got {pool!r}")
    head, tail = (int(s) for s in special)
    tokens = [list(tokenize(s)) if tokenize is not None else list(s) for s in sequences]
    if any(len(t) <= head + tail for t in tokens):
        raise ValueError(f"every sequence needs more than {head + tail} tokens (special={special})")
    pad = model.config.pad_token_id if pad_id is None else pad_id
    device = next(model.parameters()).device
    out = [None] * len(tokens)
    with torch.inference_mode():
        for batch in token_batches([len(t) for t in tokens], max_tokens, max_batch):
            ids, mask = (torch.from_numpy(a).to(device, non_blocking=True)
                         for a in pad_batch([tokens[i] for i in batch], pad))
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
            if pool == "mean":
                keep = mask.clone()
                keep[:, :head] = 0
                ends = mask.sum(1, keepdim=True)
                cols = torch.arange(mask.shape[1], device=device)
                keep[(cols >= ends - tail) & (cols < ends)] = 0
                vecs = (hidden.float() * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)
                for r, i in enumerate(batch):
                    out[i] = vecs[r]
            else:
                for r, i in enumerate(batch):
                    out[i] = hidden[r, head:len(tokens[i]) - tail]
    return out
