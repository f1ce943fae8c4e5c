"""flashsci-embed on the GPU (python -m flashsci.bench --embed): models from the real configs with random weights saved
to a temporary directory (no downloads), real UniProt proteins, `--pool mean`, bf16.

- throughput: per model, the same command patched and with --no-patch (stock transformers sdpa on the same
  token-budget batches, the same files written); proteins/s of the embedding loop (the CLI's summary line, after
  model loading) and of the whole command; peak GPU and host memory.
- scaling (--embed-gpus 1,2,4): all proteins of the file, ESM2-650M patched, under torchrun with N processes; the
  embedding time is the slowest rank's loop, the speedup against the one-process run.
- resume (--embed-resume): a run killed with SIGKILL at three random points and started again each time ends with the
  same bytes in every file as an uninterrupted run.
"""
import os
import random
import re
import subprocess
import sys
import tempfile
import time

from flashsci.bench.e2e import ESM_VOCAB, MODELS, T5_RESIDUES
from flashsci.bench.proteins import read_fasta
from flashsci.bench.results import slug, write_results

SUMMARY = re.compile(r"flashsci-embed: rank (\d+): (\d+) proteins, (\d+) residues in ([\d.]+) s .* after ([\d.]+) s set-up; "
                     r"peak GPU memory ([\d.]+ GiB|n/a \(CPU\)), peak host memory ([\d.]+) GiB")


def t5_tokenizer():
    """A ProtT5-like tokenizer without downloads: residues separated by spaces, word-level ids, </s> appended."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{c: 3 + i for i, c in enumerate(T5_RESIDUES)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>",
                                                unk_token="<unk>")


def save_model(name, folder):
    """MODELS[name] (ESM2, ProtT5 or ESM-C) with random weights, in bf16, and a tokenizer, saved to folder."""
    import torch
    import transformers
    kind, cfg = MODELS[name]
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    if kind == "esmc":
        from esm.models.esmc import ESMC
        from esm.tokenization import get_esmc_model_tokenizers
        from flashsci.embed.models import save_esmc
        save_esmc(ESMC(1152, 18, 36, get_esmc_model_tokenizers()).bfloat16(), folder)   # ESM-C 600M's shape
        return folder
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        if kind == "esm":
            model = transformers.EsmModel(transformers.EsmConfig(**cfg), add_pooling_layer=False)
            with open(os.path.join(folder, "vocab.txt"), "w") as f:
                f.write("\n".join(ESM_VOCAB + ["<null_1>", "<mask>"]) + "\n")
            tok = transformers.EsmTokenizer(os.path.join(folder, "vocab.txt"))
        else:
            model = transformers.T5EncoderModel(transformers.T5Config(**cfg, dropout_rate=0.0))
            tok = t5_tokenizer()
    model.bfloat16().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def write_fasta(path, seqs):
    with open(path, "w") as f:
        f.write("".join(f">p{i}\n{s}\n" for i, s in enumerate(seqs)))
    return path


def embed(model_dir, fasta, out, *extra, gpus=1, check=True):
    """Run flashsci-embed (under torchrun for gpus > 1): (whole-command seconds, [summary per rank])."""
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(gpus)] if gpus > 1 else
           [sys.executable]) + ["-m", "flashsci.embed", model_dir, fasta, "-o", out, "--pool", "mean", "--dtype",
                                "bf16", *extra]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if check and r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    ranks = [dict(zip(("rank", "proteins", "residues", "loop s", "setup s", "GPU GiB", "host GiB"),
                      (int(m[0]), int(m[1]), int(m[2]), float(m[3]), float(m[4]),
                       float(m[5].split()[0]) if m[5][0].isdigit() else 0.0, float(m[6])))) for m in SUMMARY.findall(r.stderr)]
    if len(ranks) != gpus:
        raise RuntimeError(f"expected {gpus} summary lines from flashsci-embed, got {len(ranks)}:\n{r.stderr[-3000:]}")
    return wall, ranks


def throughput(tmp, seqs, models, n):
    rows = []
    for name in models:
        folder = save_model(name, os.path.join(tmp, slug(name)))
        fasta = write_fasta(os.path.join(tmp, f"in_{n[name]}.fasta"), seqs[:n[name]])
        res = {}
        for variant, extra in (("stock", ["--no-patch"]), ("flashsci", [])):
            wall, (r,) = embed(folder, fasta, os.path.join(tmp, f"{slug(name)}-{variant}"), *extra)
            res[variant] = dict(r, model=name, variant=variant, wall=wall, **{"proteins/s": r["proteins"] / r["loop s"],
                                "command proteins/s": r["proteins"] / wall})
            print(f"{name} {variant}: {res[variant]['proteins/s']:.0f} proteins/s embedding, "
                  f"{res[variant]['command proteins/s']:.0f} whole command; GPU {r['GPU GiB']:.1f} GiB", flush=True)
        res["flashsci"]["speedup"] = res["flashsci"]["proteins/s"] / res["stock"]["proteins/s"]
        res["flashsci"]["command speedup"] = res["flashsci"]["command proteins/s"] / res["stock"]["command proteins/s"]
        print(f"{name}: {res['flashsci']['speedup']:.2f}x embedding, {res['flashsci']['command speedup']:.2f}x "
              "whole command", flush=True)
        rows += [res["stock"], res["flashsci"]]
        subprocess.run(["rm", "-rf", folder])
    return rows


def scaling(tmp, seqs, gpus):
    folder = save_model("ESM2-650M", os.path.join(tmp, "scaling_model"))
    fasta = write_fasta(os.path.join(tmp, "all.fasta"), seqs)
    rows = []
    for g in gpus:
        wall, ranks = embed(folder, fasta, os.path.join(tmp, f"scaling-{g}"), "--shard-size", "250", gpus=g)
        loop = max(r["loop s"] for r in ranks)
        rows.append({"gpus": g, "proteins": sum(r["proteins"] for r in ranks), "loop s": loop, "wall": wall,
                     "proteins/s": len(seqs) / loop, "GPU GiB": max(r["GPU GiB"] for r in ranks),
                     "host GiB": max(r["host GiB"] for r in ranks),
                     "rank loop s": [r["loop s"] for r in sorted(ranks, key=lambda r: r["rank"])]})
        rows[-1]["speedup"] = rows[0]["loop s"] / loop
        rows[-1]["command speedup"] = rows[0]["wall"] / wall
        print(f"{g} GPU(s): {len(seqs)} proteins, slowest rank {loop:.1f} s ({rows[-1]['speedup']:.2f}x), whole command "
              f"{wall:.1f} s ({rows[-1]['command speedup']:.2f}x)", flush=True)
    return rows


def resume(tmp, seqs, n=3000, kills=3, seed=0):
    """Kill a run (SIGKILL) `kills` times at random points while it embeds (after a random number of new shards plus a
    random part of a shard's time), run it to the end, compare every file with the uninterrupted run's."""
    folder = save_model("ESM2-650M", os.path.join(tmp, "resume_model"))
    n = min(n, len(seqs))
    size = max(1, min(100, n // (kills + 3)))             # enough shards for the kills to land between them
    fasta = write_fasta(os.path.join(tmp, "resume.fasta"), seqs[:n])
    extra, shards = ["--shard-size", str(size)], -(-n // size)
    clean, killed = os.path.join(tmp, "resume-clean"), os.path.join(tmp, "resume-killed")
    wall, (r,) = embed(folder, fasta, clean, *extra)
    per_shard = r["loop s"] / shards
    rng = random.Random(seed)
    cmd = [sys.executable, "-m", "flashsci.embed", folder, fasta, "-o", killed, "--pool", "mean", "--dtype", "bf16", *extra]
    count = lambda: sum(x.startswith("shard-") and x.endswith(".json") for x in os.listdir(killed)) if os.path.isdir(killed) else 0
    points = []
    for target in sorted(rng.sample(range(1, shards - 1), kills)):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while count() < target and proc.poll() is None:
            time.sleep(0.01)
        time.sleep(rng.uniform(0, per_shard))
        exited = proc.poll() is not None
        proc.kill()
        proc.wait()
        points.append({"after shards": target, "shards finished": count(), "had exited": exited})
        print(f"killed after shard {target}: {count()} shards finished{' (it had already exited)' if exited else ''}",
              flush=True)
    embed(folder, fasta, killed, *extra)
    names = sorted(os.listdir(clean))
    same = names == sorted(os.listdir(killed)) and all(
        open(os.path.join(clean, x), "rb").read() == open(os.path.join(killed, x), "rb").read() for x in names)
    print(f"resume after {kills} kills: {'byte-identical' if same else 'DIFFERENT'} to the uninterrupted run "
          f"({len(names)} files)", flush=True)
    return {"proteins": n, "shards": shards, "uninterrupted s": wall, "kills": points, "files": len(names),
            "identical": same}


def run_embed_bench(out_dir, fasta=None, models=("ESM2-650M", "ESM2-3B", "ProtT5-XL", "ESM-C-600M"), gpus=None, resume_check=False,
                    n=None):
    import torch
    import transformers
    path, seqs = read_fasta(fasta)
    n = dict({"ESM2-650M": 6000, "ESM2-3B": 3000, "ProtT5-XL": 3000, "ESM-C-600M": 6000}, **(n or {}))
    tmp = tempfile.mkdtemp(prefix="flashsci-embed-")
    props = torch.cuda.get_device_properties(0)
    meta = {"gpu": props.name, "gpus": torch.cuda.device_count(), "torch": torch.__version__,
            "transformers": transformers.__version__, "fasta": path, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    md = [f"# flashsci-embed — {meta['gpu']}", "",
          f"torch {meta['torch']}, transformers {meta['transformers']}; models from the real configs with random weights, "
          f"bf16, `--pool mean`, 16384-token batches, proteins from {path} in file order (longer than ESM2's 1022: "
          "windows, `--long chunk`). Embedding = the CLI's loop after the model is loaded; whole command = process "
          "start to exit.", ""]
    result = {}
    if models:
        rows = throughput(tmp, seqs, models, n)
        result["throughput"] = rows
        md += ["## One GPU: flashsci-embed against the same job on the stock model (`--no-patch`: sdpa, same batches, "
               "same files)", "", "| model | proteins | variant | embedding proteins/s | speedup | whole command s | "
               "speedup | peak GPU GiB | peak host GiB |", "|---|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['model']} | {r['proteins']} | {r['variant']} | {r['proteins/s']:.0f} | {r.get('speedup', 1.0):.2f}x | "
               f"{r['wall']:.1f} | {r.get('command speedup', 1.0):.2f}x | {r['GPU GiB']:.1f} | {r['host GiB']:.2f} |"
               for r in rows]
    if gpus:
        rows = scaling(tmp, seqs, gpus)
        result["scaling"] = rows
        md += ["", f"## Scaling: all {len(seqs)} proteins, ESM2-650M, torchrun with one process per GPU (one process "
               "without torchrun for 1), shards of 250 records", "",
               "| GPUs | slowest rank's embedding s | speedup | per-rank s | whole command s | speedup | peak GPU GiB "
               "per rank | peak host GiB |", "|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['gpus']} | {r['loop s']:.1f} | {r['speedup']:.2f}x | {' / '.join(f'{x:.1f}' for x in r['rank loop s'])} | "
               f"{r['wall']:.1f} | {r['command speedup']:.2f}x | {r['GPU GiB']:.1f} | {r['host GiB']:.2f} |" for r in rows]
    if resume_check:
        r = resume(tmp, seqs)
        result["resume"] = r
        md += ["", "## Resume", "", f"ESM2-650M, {r['proteins']} proteins in {r['shards']} shards; uninterrupted "
               f"{r['uninterrupted s']:.1f} s. Killed (SIGKILL) while embedding with "
               + ", ".join(f"{p['shards finished']}" for p in r["kills"]) + " shards finished"
               + f", then run to the end: {r['files']} files, "
               + ("every one byte-identical to the uninterrupted run." if r["identical"] else "NOT identical.")]
    subprocess.run(["rm", "-rf", tmp])
    if out_dir:
        tag = f"_{meta['gpus']}gpu" if gpus and max(gpus) > 1 else ""
        write_results(out_dir, f"embed_{slug(props.name)}{tag}_bfloat16", meta, result, "\n".join(md) + "\n")
    return result
