"""Fine-tuning step benchmark (python -m flashsci.bench --train): one masked-LM training step (forward, backward,
AdamW) of HF transformers' EsmForMaskedLM built from ESM2's real config with random weights, bf16, on batches of 40
real UniProt proteins in random order (cropped to 1022 residues: <cls> + residues + <eos> fit ESM2's 1024), stock
(attn_implementation="sdpa", the padded batch) against the same model after flashsci.integrations.patch (packed
tokens, flashsci's attention forward and backward). Per variant: median step time over the batches after a warm-up,
real tokens/s, peak GPU memory of a step; the loss of the first step on both (same weights, same batch).
"""
import random
import statistics
import time

from flashsci.bench.e2e import CROP, ESM, esm_tokens
from flashsci.bench.proteins import read_fasta
from flashsci.bench.results import slug, write_results

MODELS = {"ESM2-650M": dict(ESM, hidden_size=1280, num_hidden_layers=33, num_attention_heads=20, intermediate_size=5120,
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)}


def masked_batch(torch, seqs, rng):
    """(ids, attention_mask, labels) of one padded batch: 15% of the residues masked (ESM's mask token)."""
    toks = [esm_tokens(s[:CROP]) for s in seqs]
    S = max(len(t) for t in toks)
    ids = torch.full((len(toks), S), ESM["pad_token_id"], dtype=torch.long)
    for i, t in enumerate(toks):
        ids[i, : len(t)] = torch.tensor(t)
    mask = (ids != ESM["pad_token_id"]).long()
    pick = (torch.rand(ids.shape, generator=rng) < 0.15) & (mask == 1)
    labels = ids.masked_fill(~pick, -100)
    ids = ids.masked_fill(pick, ESM["mask_token_id"])
    return ids.cuda(), mask.cuda(), labels.cuda()


def time_steps(torch, model, batches):
    """Median step time (ms) over batches after one warm-up step, the peak memory of a step (GiB), the first loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step(ids, mask, labels):
        loss = model(ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    first = step(*batches[0]).item()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for b in batches:
        t0 = time.perf_counter()
        step(*b)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), torch.cuda.max_memory_allocated() / 2**30, first


def run_train(out_dir, fasta=None, n_batches=5, batch_size=40):
    import torch
    import transformers
    from flashsci.integrations import patch
    props = torch.cuda.get_device_properties(0)
    path, seqs = read_fasta(fasta)
    random.Random(0).shuffle(seqs)
    rng = torch.Generator().manual_seed(0)
    batches = [masked_batch(torch, seqs[i * batch_size:(i + 1) * batch_size], rng) for i in range(n_batches)]
    real = statistics.mean(int(b[1].sum()) for b in batches)
    padded = statistics.mean(b[1].numel() for b in batches)
    rows = []
    for name, cfg in MODELS.items():
        res = {}
        for variant in ("stock sdpa", "patched"):
            torch.manual_seed(0)
            with torch.device("cuda"):
                model = transformers.EsmForMaskedLM(transformers.EsmConfig(**cfg))
            model.set_attn_implementation("sdpa")
            model = model.bfloat16().train()
            if variant == "patched":
                patch(model)
            res[variant] = time_steps(torch, model, batches)
            del model
            torch.cuda.empty_cache()
            ms, gib, loss = res[variant]
            print(f"{name} {variant}: {ms:.1f} ms/step, {real / ms * 1e3:.0f} real tokens/s, peak {gib:.1f} GiB, "
                  f"first loss {loss:.4f}", flush=True)
        (s_ms, s_gib, s_loss), (p_ms, p_gib, p_loss) = res["stock sdpa"], res["patched"]
        rows.append({"model": name, "batch": batch_size, "real tokens": real, "padded tokens": padded,
                     "stock ms": s_ms, "patched ms": p_ms, "speedup": s_ms / p_ms, "stock GiB": s_gib,
                     "patched GiB": p_gib, "memory ratio": p_gib / s_gib, "stock loss": s_loss, "patched loss": p_loss})
        print(f"{name}: {s_ms / p_ms:.2f}x faster, memory {p_gib / s_gib:.2f}x", flush=True)
    meta = {"gpu": props.name, "torch": torch.__version__, "transformers": transformers.__version__, "fasta": path,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if out_dir:
        out = [f"# flashsci fine-tuning step vs stock transformers — {meta['gpu']}", "",
               f"torch {meta['torch']}, transformers {meta['transformers']}, bf16 weights, AdamW, masked LM (15%), "
               f"{n_batches} batches of {batch_size} random UniProt proteins ({meta['fasta']}), median step after a "
               "warm-up, peak memory of the timed steps.", "",
               "| model | real / padded tokens | stock sdpa ms | patched ms | speedup | stock GiB | patched GiB | memory | "
               "first loss stock / patched |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            out.append(f"| {r['model']} | {r['real tokens']:.0f} / {r['padded tokens']:.0f} | {r['stock ms']:.1f} | "
                       f"{r['patched ms']:.1f} | {r['speedup']:.2f}x | {r['stock GiB']:.1f} | {r['patched GiB']:.1f} | "
                       f"{r['memory ratio']:.2f}x | {r['stock loss']:.4f} / {r['patched loss']:.4f} |")
        write_results(out_dir, f"train_{slug(props.name)}_bfloat16", meta, rows, "\n".join(out) + "\n")
    return rows
