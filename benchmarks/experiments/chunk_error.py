"""The error of `flashsci-embed --long chunk` (windows of W residues every W/2, each residue the mean over the windows
that hold it) and of `--long truncate` against the full-length embedding, on a model without a window limit:
ProtT5-XL's encoder config with random weights (no downloads), float32 on the CPU, stock transformers, real UniProt
proteins longer than ESM2's window (W = 1,022). python benchmarks/experiments/chunk_error.py [n_proteins]"""
import sys
import time

import torch
import transformers

from flashsci.bench.e2e import MODELS
from flashsci.bench.embedding import t5_tokenizer
from flashsci.bench.proteins import read_fasta
from flashsci.embed.compute import windows

W = 1022
n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
torch.manual_seed(0)
model = transformers.T5EncoderModel(transformers.T5Config(**MODELS["ProtT5-XL"][1], dropout_rate=0.0)).eval()
tok = t5_tokenizer()
_, seqs = read_fasta()
long = [s for s in seqs if 1100 <= len(s) <= 2600][:n]


def rows(seq):
    """Per-residue embeddings (L, d_model) of seq alone (ProtT5: no prefix token, </s> after the residues)."""
    ids = torch.tensor([tok(" ".join(seq))["input_ids"]])
    with torch.inference_mode():
        return model(input_ids=ids).last_hidden_state[0, :len(seq)].double()


def rel(a, b):
    return ((a - b).norm(dim=-1) / b.norm(dim=-1)).double()


print(f"ProtT5-XL config, random weights, float32, CPU; window {W}")
for seq in long:
    t0 = time.time()
    full = rows(seq)
    total, count = torch.zeros_like(full), torch.zeros(len(seq), 1, dtype=torch.float64)
    for a, e in windows(len(seq), W):
        piece = rows(seq[a:e])
        total[a:e] += piece
        count[a:e] += 1
        if a == 0:
            mean_t = piece.mean(0)   # --long truncate: the first W residues alone
    chunk = total / count
    per = rel(chunk, full)
    mean_c, mean_f = chunk.mean(0), full.mean(0)
    cos = torch.nn.functional.cosine_similarity(mean_c, mean_f, dim=0).item()
    print(f"L = {len(seq)} ({len(windows(len(seq), W))} windows): per-residue relative error median "
          f"{per.median().item():.3g}, max {per.max().item():.3g}; mean-pooled: chunk {rel(mean_c, mean_f).item():.3g} "
          f"(cosine {cos:.5f}), truncate {rel(mean_t, mean_f).item():.3g}  [{time.time() - t0:.0f} s]", flush=True)
