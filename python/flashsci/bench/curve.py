"""Loss curves (python -m flashsci.bench --train-curve): masked-LM training of ESM2-150M's config (random weights, bf16,
AdamW lr 1e-4) for 200 steps on random UniProt proteins, stock (sdpa, padded) and patched, from the same weights on
the same batches; three seeds for the masking, so the stock curves give the run-to-run spread. Reported: the mean loss
of the last 50 steps per seed and variant, the spread of stock's across seeds, and the largest same-seed difference
between patched and stock (the patched curve is within the spread when that difference is at most the spread)."""
import random
import statistics
import time

from flashsci.bench.proteins import read_fasta
from flashsci.bench.results import pyplot, save_figure, slug, write_results
from flashsci.bench.train import masked_batch

CONFIG = dict(vocab_size=33, pad_token_id=1, mask_token_id=32, position_embedding_type="rotary", token_dropout=True,
              emb_layer_norm_before=False, max_position_embeddings=1026, layer_norm_eps=1e-5, hidden_size=640,
              num_hidden_layers=30, num_attention_heads=20, intermediate_size=2560, hidden_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0)


def curve(torch, variant, batches):
    """Losses of len(batches) AdamW steps from the seeded initial weights."""
    import transformers
    from flashsci.integrations import patch
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.EsmForMaskedLM(transformers.EsmConfig(**CONFIG))
    model.set_attn_implementation("sdpa")
    model = model.bfloat16().train()
    if variant == "patched":
        patch(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []
    for ids, mask, labels in batches:
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return [x.item() for x in losses]


def run_curve(out_dir, fasta=None, steps=200, per_batch=24, seeds=(0, 1, 2)):
    import torch
    props = torch.cuda.get_device_properties(0)
    path, seqs = read_fasta(fasta)
    random.Random(0).shuffle(seqs)
    curves = {}
    for seed in seeds:
        rng = torch.Generator().manual_seed(seed)
        batches = [masked_batch(torch, seqs[(i * per_batch) % max(1, len(seqs) - per_batch):][:per_batch], "esm", rng)
                   for i in range(steps)]
        for variant in ("stock", "patched"):
            t0 = time.perf_counter()
            curves[(variant, seed)] = curve(torch, variant, batches)
            tail = statistics.mean(curves[(variant, seed)][-50:])
            print(f"seed {seed} {variant}: first {curves[(variant, seed)][0]:.4f}, last-50 mean {tail:.4f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    tails = {k: statistics.mean(v[-50:]) for k, v in curves.items()}
    stock = [tails[("stock", s)] for s in seeds]
    spread = max(stock) - min(stock)
    diff = max(abs(tails[("patched", s)] - tails[("stock", s)]) for s in seeds)
    ok = diff <= spread
    print(f"last-50 mean loss: stock spread over seeds {spread:.4f}, largest patched-stock difference {diff:.4f} -> "
          f"{'within' if ok else 'OUTSIDE'} the spread", flush=True)
    rows = [{"seed": s, "stock": tails[("stock", s)], "patched": tails[("patched", s)],
             "stock curve": curves[("stock", s)], "patched curve": curves[("patched", s)]} for s in seeds]
    meta = {"gpu": props.name, "torch": torch.__version__, "fasta": path, "steps": steps, "proteins per batch": per_batch,
            "stock spread": spread, "largest difference": diff, "within spread": ok,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if out_dir:
        md = [f"# Masked-LM loss curves, stock vs patched — {props.name}", "",
              f"ESM2-150M config, random weights, bf16, AdamW lr 1e-4, {steps} steps of {per_batch} random UniProt "
              f"proteins ({path}); same weights and batches for both variants, seeds {list(seeds)} for the masking.", "",
              "| seed | stock: mean loss of the last 50 steps | patched | difference |", "|---|---|---|---|"]
        md += [f"| {r['seed']} | {r['stock']:.4f} | {r['patched']:.4f} | {r['patched'] - r['stock']:+.4f} |" for r in rows]
        md += ["", f"Stock's spread across seeds: {spread:.4f}; largest same-seed difference: {diff:.4f} — the patched "
               f"curve is {'within' if ok else 'outside'} the stock run-to-run spread."]
        write_results(out_dir, f"train_curve_{slug(props.name)}_bfloat16", meta, rows, "\n".join(md) + "\n")
        plot(out_dir, f"train_curve_{slug(props.name)}_bfloat16", curves, seeds)
    return rows


def plot(out_dir, stem, curves, seeds):
    """The curves (10-step moving mean), stock solid and patched dashed, one colour per seed."""
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, s in enumerate(seeds):
        for variant, style in (("stock", "-"), ("patched", "--")):
            y = curves[(variant, s)]
            smooth = [statistics.mean(y[max(0, t - 9):t + 1]) for t in range(len(y))]
            ax.plot(smooth, style, color=f"C{i}", label=f"{variant}, seed {s}")
    ax.set_xlabel("step")
    ax.set_ylabel("masked-LM loss (10-step mean)")
    ax.legend(fontsize=7)
    save_figure(plt, fig, out_dir, stem)
