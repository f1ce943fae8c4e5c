"""Fine-tuning step benchmark (python -m flashsci.bench --train): one masked-LM training step (forward, backward,
AdamW) of models built from the real configs with random weights, bf16, on batches of real UniProt proteins in random
order (cropped to 1022 residues), stock against the same model after flashsci.integrations.patch (packed tokens,
flashsci's attention forward and backward):

- ESM2-650M and ESM2-3B (HF EsmForMaskedLM; stock: attn_implementation="sdpa", the padded batch);
- ProtT5-XL's encoder (HF T5EncoderModel, dropout 0, a linear token head; stock: sdpa and eager, the faster counts);
- ESM-C-600M (the esm package's ESMC and its sequence head; stock: its SDPA path on the padded batch);
- ESM2-650M with LoRA rank 8 on query/key/value/dense (PEFT; base weights frozen).

Per model and variant: median step time over the batches after a warm-up step, real tokens/s, peak GPU memory of the
timed steps, the loss of the first step (same weights, same batch)."""
import random
import statistics
import time

from flashsci.bench.e2e import CROP, ESM, MODELS as E2E_MODELS, esm_tokens, t5_tokens
from flashsci.bench.proteins import read_fasta
from flashsci.bench.results import slug, write_results

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
MODELS = {   # name: (family, config, proteins per batch, stock variants)
    "ESM2-650M": ("esm", dict(E2E_MODELS["ESM2-650M"][1], **NO_DROPOUT), 40, ("sdpa",)),
    "ESM2-3B": ("esm", dict(E2E_MODELS["ESM2-3B"][1], **NO_DROPOUT), 16, ("sdpa",)),
    "ProtT5-XL": ("t5", dict(E2E_MODELS["ProtT5-XL"][1], dropout_rate=0.0), 16, ("sdpa", "eager")),
    "ESM-C-600M": ("esmc", dict(d_model=1152, n_heads=18, n_layers=36), 40, ("sdpa",)),
    "ESM2-650M LoRA r8": ("esm-lora", dict(E2E_MODELS["ESM2-650M"][1], **NO_DROPOUT), 40, ("sdpa",)),
}
T5_VOCAB = 128
DEVICE = "cuda"


def masked_batch(torch, seqs, family, rng):
    """(ids, attention_mask, labels) of one padded batch: 15% of the residues masked."""
    toks = [t5_tokens(s[:CROP]) if family == "t5" else esm_tokens(s[:CROP]) for s in seqs]
    pad, mask_id = (0, 2) if family == "t5" else (ESM["pad_token_id"], ESM["mask_token_id"])
    S = max(len(t) for t in toks)
    ids = torch.full((len(toks), S), pad, dtype=torch.long)
    for i, t in enumerate(toks):
        ids[i, : len(t)] = torch.tensor(t)
    mask = (ids != pad).long()
    pick = (torch.rand(ids.shape, generator=rng) < 0.15) & (mask == 1)
    labels = ids.masked_fill(~pick, -100)
    ids = ids.masked_fill(pick, mask_id)
    return ids.to(DEVICE), mask.to(DEVICE), labels.to(DEVICE)


def build(torch, family, cfg, variant):
    """(model, loss(ids, mask, labels)) in bf16, training mode, stock variant or patched ("flashsci")."""
    import transformers
    from flashsci.integrations import patch
    F = torch.nn.functional
    torch.manual_seed(0)
    with torch.device(DEVICE):
        if family in ("esm", "esm-lora"):
            model = transformers.EsmForMaskedLM(transformers.EsmConfig(**cfg))
            if family == "esm-lora":
                import peft
                model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                                   target_modules=["query", "key", "value", "dense"]))
            loss = lambda ids, mask, labels: model(input_ids=ids, attention_mask=mask, labels=labels).loss
        elif family == "t5":
            model = transformers.T5EncoderModel(transformers.T5Config(**cfg))
            model.head = torch.nn.Linear(cfg["d_model"], T5_VOCAB)
            loss = lambda ids, mask, labels: F.cross_entropy(
                model.head(model(input_ids=ids, attention_mask=mask).last_hidden_state).flatten(0, 1).float(),
                labels.flatten(), ignore_index=-100)
        else:
            from esm.models.esmc import ESMC
            from esm.tokenization import get_esmc_model_tokenizers
            model = ESMC(cfg["d_model"], cfg["n_heads"], cfg["n_layers"], get_esmc_model_tokenizers(),
                         use_flash_attn=False)
            loss = lambda ids, mask, labels: F.cross_entropy(
                model(sequence_tokens=ids, sequence_id=mask.bool()).sequence_logits.flatten(0, 1).float(),
                labels.flatten(), ignore_index=-100)
    if hasattr(model, "set_attn_implementation") and variant != "flashsci":
        model.set_attn_implementation(variant)
    model = model.bfloat16().train()
    if variant == "flashsci":
        patch(model)
    return model, loss


def time_steps(torch, model, loss_fn, batches):
    """Median step time (ms) over batches after one warm-up step, the peak memory of a step (GiB), the first loss."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

    def step(ids, mask, labels):
        loss = loss_fn(ids, mask, labels)
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


def run_one(torch, name, seqs, n_batches):
    """The row of one model: each stock variant and the patched one on the same batches."""
    family, cfg, per_batch, stock_variants = MODELS[name]
    rng = torch.Generator().manual_seed(0)
    batches = [masked_batch(torch, seqs[i * per_batch:(i + 1) * per_batch], family, rng) for i in range(n_batches)]
    real = statistics.mean(int(b[1].sum()) for b in batches)
    padded = statistics.mean(b[1].numel() for b in batches)
    res = {}
    for variant in (*stock_variants, "flashsci"):
        try:
            model, loss_fn = build(torch, family, cfg, variant)
            res[variant] = time_steps(torch, model, loss_fn, batches)
        except torch.OutOfMemoryError:
            res[variant] = None
        model = loss_fn = None
        torch.cuda.empty_cache()
        if res[variant] is None:
            print(f"{name} {variant}: out of memory", flush=True)
        else:
            ms, gib, loss = res[variant]
            print(f"{name} {variant}: {ms:.1f} ms/step, {real / ms * 1e3:.0f} real tokens/s, peak {gib:.1f} GiB, "
                  f"first loss {loss:.4f}", flush=True)
    fits = [v for v in stock_variants if res[v] is not None]
    best = min(fits, key=lambda v: res[v][0]) if fits else None
    row = {"model": name, "batch": per_batch, "real tokens": real, "padded tokens": padded, "stock": best}
    if best is not None and res["flashsci"] is not None:
        (s_ms, s_gib, s_loss), (p_ms, p_gib, p_loss) = res[best], res["flashsci"]
        row.update({"stock ms": s_ms, "patched ms": p_ms, "speedup": s_ms / p_ms, "stock GiB": s_gib,
                    "patched GiB": p_gib, "memory ratio": p_gib / s_gib, "stock loss": s_loss, "patched loss": p_loss,
                    "variants": {v: res[v] for v in res}})
        print(f"{name}: {s_ms / p_ms:.2f}x faster than stock {best}, memory {p_gib / s_gib:.2f}x", flush=True)
    return row


def run_train(out_dir, fasta=None, n_batches=5, models=None):
    import torch
    import transformers
    props = torch.cuda.get_device_properties(0)
    path, seqs = read_fasta(fasta)
    random.Random(0).shuffle(seqs)
    rows = [run_one(torch, name, seqs, n_batches) for name in (models or MODELS)]
    meta = {"gpu": props.name, "torch": torch.__version__, "transformers": transformers.__version__, "fasta": path,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if out_dir:
        out = [f"# flashsci fine-tuning step vs stock — {meta['gpu']}", "",
               f"torch {meta['torch']}, transformers {meta['transformers']}, bf16 weights, AdamW, masked LM (15%), "
               f"{n_batches} batches of random UniProt proteins ({meta['fasta']}, cropped to {CROP}), median step after "
               "a warm-up, peak memory of the timed steps. Stock: the faster of the listed attention implementations "
               "on the padded batch; patched: flashsci.integrations.patch (packed tokens).", "",
               "| model | proteins / batch | real / padded tokens | stock | stock ms | patched ms | speedup | stock GiB | "
               "patched GiB | memory | first loss stock / patched |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "speedup" not in r:
                out.append(f"| {r['model']} | {r['batch']} | {r['real tokens']:.0f} / {r['padded tokens']:.0f} | "
                           f"{r['stock'] or 'out of memory'} | | | | | | | |")
                continue
            out.append(f"| {r['model']} | {r['batch']} | {r['real tokens']:.0f} / {r['padded tokens']:.0f} | {r['stock']} | "
                       f"{r['stock ms']:.1f} | {r['patched ms']:.1f} | {r['speedup']:.2f}x | {r['stock GiB']:.1f} | "
                       f"{r['patched GiB']:.1f} | {r['memory ratio']:.2f}x | {r['stock loss']:.4f} / {r['patched loss']:.4f} |")
        write_results(out_dir, f"train_{slug(props.name)}_bfloat16", meta, rows, "\n".join(out) + "\n")
    return rows
