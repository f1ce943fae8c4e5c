"""Embedding one shard of records: long sequences cut into overlapping windows, everything in token-budget batches
(flashsci.batching.token_batches, longest first, deterministic), and each record's per-residue embeddings and their
mean assembled in shard order.

Windows (ESM2: 1,022 residues): a sequence of L > W residues is embedded as the windows [s, s + W) for
s = 0, W/2, W, ... while s + W < L, plus the last window [L - W, L); each residue's embedding is the mean over the
windows that hold it, and the mean-pooled embedding the mean over residues of those.
"""
import torch

from flashsci.batching import pad_batch, token_batches


def windows(length, window):
    """The (start, end) residue windows of a sequence: one window when it fits (or window is 0)."""
    if window <= 0 or length <= window:
        return [(0, length)]
    step = max(1, window // 2)
    starts = list(range(0, length - window, step)) + [length - window]
    return [(s, s + window) for s in starts]


def embed_shard(model, tokenize, fam, seqs, max_tokens, long_rule, per_residue, mean):
    """For seqs (cleaned strings, non-empty): (list of per-residue (L, hidden) float32 CPU tensors or None, list of
    mean (hidden,) float32 or None, list of chunked flags). Means of whole sequences are pooled on the model's device
    (only (batch, hidden) comes back); residue rows come back only for per-residue output and for windowed sequences."""
    pieces, owner, kept, chunked = [], [], [], []   # forward items: text, (sequence, start, end); per sequence:
    for i, s in enumerate(seqs):                    # residues kept, whether it was cut into windows
        spans = windows(len(s), fam.window if long_rule == "chunk" else 0)
        if long_rule == "truncate" and fam.window and len(s) > fam.window:
            spans = [(0, fam.window)]
        kept.append(spans[-1][1])
        chunked.append(len(spans) > 1)
        for a, e in spans:
            pieces.append(s[a:e])
            owner.append((i, a, e))
    tokens = tokenize(pieces)
    device = next(model.parameters()).device
    rows, means, sums, counts = [None] * len(seqs), [None] * len(seqs), {}, {}
    with torch.inference_mode():
        for batch in token_batches([len(t) for t in tokens], max_tokens):
            ids, mask = (torch.from_numpy(a).to(device) for a in pad_batch([tokens[j] for j in batch], fam.pad_id))
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
            spans = [owner[j] for j in batch]
            lens = [e - a for _, a, e in spans]
            n = torch.tensor(lens, device=device)
            cols = torch.arange(hidden.shape[1], device=device)
            keep = (cols >= fam.head) & (cols < fam.head + n[:, None])          # (B, S): each piece's residues
            if mean and not per_residue:
                # mean_i = sum over piece i's residues of h / n_i
                vecs = ((hidden.float() * keep[..., None]).sum(1) / n[:, None]).cpu()
            if per_residue or any(chunked[i] for i, _, _ in spans):
                parts = hidden[keep].float().cpu().split(lens)             # residue rows, piece by piece
            for r, (i, a, e) in enumerate(spans):
                if chunked[i]:
                    if i not in sums:
                        sums[i], counts[i] = torch.zeros(kept[i], hidden.shape[2]), torch.zeros(kept[i], 1)
                    sums[i][a:e] += parts[r]
                    counts[i][a:e] += 1
                elif per_residue:
                    rows[i] = parts[r]
                else:
                    means[i] = vecs[r]
    for i in sums:
        rows[i] = sums[i] / counts[i]        # each residue: the mean over the windows that hold it
    if mean:
        means = [m if m is not None else rows[i].mean(0) for i, m in enumerate(means)]
    return (rows if per_residue else None), (means if mean else None), chunked
