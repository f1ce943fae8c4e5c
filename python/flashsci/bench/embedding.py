"""flashsci-embed against the same job on the stock model (python -m flashsci.bench --embed): ESM2-650M from its real
config with random weights saved to a temporary directory (no downloads), the first N proteins of the UniProt file,
`flashsci-embed --pool mean` patched and with --no-patch (stock transformers sdpa on the same token-budget batches,
the same files written), bf16; wall time of each whole command after a warm-up run on a few proteins."""
import os
import subprocess
import sys
import tempfile
import time

from flashsci.bench.e2e import ESM, ESM_VOCAB
from flashsci.bench.proteins import read_fasta
from flashsci.bench.results import slug, write_results

CONFIG = dict(ESM, hidden_size=1280, num_hidden_layers=33, num_attention_heads=20, intermediate_size=5120)


def run_embed_bench(out_dir, fasta=None, n=3000):
    import torch
    import transformers
    tmp = tempfile.mkdtemp(prefix="flashsci-embed-")
    model_dir = os.path.join(tmp, "esm2_650m")
    os.makedirs(model_dir)
    with open(os.path.join(model_dir, "vocab.txt"), "w") as f:
        f.write("\n".join(ESM_VOCAB + ["<null_1>", "<mask>"]) + "\n")
    transformers.EsmTokenizer(os.path.join(model_dir, "vocab.txt")).save_pretrained(model_dir)
    torch.manual_seed(0)
    with torch.device("cuda"):
        transformers.EsmModel(transformers.EsmConfig(**CONFIG), add_pooling_layer=False).save_pretrained(model_dir)
    path, seqs = read_fasta(fasta)
    inp = os.path.join(tmp, "in.fasta")
    with open(inp, "w") as f:
        f.write("".join(f">p{i}\n{s}\n" for i, s in enumerate(seqs[:n])))
    warm = os.path.join(tmp, "warm.fasta")
    with open(warm, "w") as f:
        f.write("".join(f">w{i}\n{s}\n" for i, s in enumerate(seqs[:50])))
    rows = []
    for variant, extra in (("stock", ["--no-patch"]), ("flashsci", [])):
        cmd = [sys.executable, "-m", "flashsci.embed", model_dir, inp, "--pool", "mean", "--dtype", "bf16", *extra]
        run = lambda c: subprocess.run(c, capture_output=True, text=True)
        r = run(cmd[:4] + [warm] + cmd[5:] + ["-o", os.path.join(tmp, variant + "-warm")])
        if r.returncode:
            raise RuntimeError(f"flashsci-embed ({variant}) failed:\n{r.stderr[-3000:]}")
        t0 = time.perf_counter()
        r = run(cmd + ["-o", os.path.join(tmp, variant)])
        if r.returncode:
            raise RuntimeError(f"flashsci-embed ({variant}) failed:\n{r.stderr[-3000:]}")
        wall = time.perf_counter() - t0
        rows.append({"variant": variant, "proteins": n, "seconds": wall, "proteins/s": n / wall})
        print(f"{variant}: {n} proteins in {wall:.1f} s, {n / wall:.0f} proteins/s", flush=True)
    rows[1]["speedup"] = rows[0]["seconds"] / rows[1]["seconds"]
    print(f"flashsci-embed vs stock: {rows[1]['speedup']:.2f}x", flush=True)
    props = torch.cuda.get_device_properties(0)
    meta = {"gpu": props.name, "torch": torch.__version__, "transformers": transformers.__version__, "fasta": path,
            "model": "ESM2-650M config, random weights", "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if out_dir:
        md = [f"# flashsci-embed vs the stock model — {meta['gpu']}", "",
              f"{meta['model']}, bf16, `--pool mean`, the first {n} proteins of {path}; wall time of the whole command "
              "(model load, reading, batches, writing) after a warm-up command.", "",
              "| variant | proteins/s | seconds | speedup |", "|---|---|---|---|"]
        md += [f"| {r['variant']} | {r['proteins/s']:.0f} | {r['seconds']:.1f} | {r.get('speedup', 1.0):.2f}x |" for r in rows]
        write_results(out_dir, f"embed_{slug(props.name)}_bfloat16", meta, rows, "\n".join(md) + "\n")
    return rows
