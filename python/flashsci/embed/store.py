"""Output of flashsci.embed: one safetensors file per shard (`mean` (n, hidden) float32, and for per-residue output
`residues` (sum of lengths, hidden) in the run's dtype with `offsets` (n + 1,) int64), per-shard index and
bad-record parts, and a completion record (the file's sha256), each written into a scratch folder `.partial/<shard>/`
and renamed into place, so that a killed run leaves either a finished shard or none; then `index.tsv` (id, length,
shard, row, chunked), `bad_records.tsv` and `manifest.json`. A scratch folder belongs to the one rank writing its shard
and is emptied before each use, so whatever a killed writer left there (safetensors' own temporary files included) is
gone once the shard is redone, and `.partial` itself once the run finishes."""
import hashlib
import json
import os
import shutil

PARTIAL = ".partial"


def shard_name(k):
    return f"shard-{k:05d}"


def sha256(path):
    """The hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def done(out, k):
    """The completion record of shard k when the shard is finished and its file matches it, else None."""
    base = os.path.join(out, shard_name(k))
    try:
        with open(base + ".json") as f:
            rec = json.load(f)
        if os.path.exists(base + ".index.tsv") and os.path.exists(base + ".bad.tsv") and sha256(base + ".safetensors") == rec["sha256"]:
            return rec
    except (OSError, ValueError, KeyError):
        pass
    return None


def _scratch(out, name):
    """An empty scratch folder out/.partial/name (what a killed writer left there removed)."""
    d = os.path.join(out, PARTIAL, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def _atomic(scratch, path, write):
    """write(temporary path) inside scratch, then rename the result to path."""
    tmp = os.path.join(scratch, os.path.basename(path))
    write(tmp)
    os.replace(tmp, path)


def write_shard(out, k, tensors, rows, bad, meta):
    """Shard k: tensors (name -> CPU tensor) to safetensors, rows (id, length, chunked) to its index part, bad
    (id, what was done) to its bad-record part, then the completion record (meta + sha256) last."""
    from safetensors.torch import save_file
    base = os.path.join(out, shard_name(k))
    scratch = _scratch(out, shard_name(k))
    _atomic(scratch, base + ".safetensors", lambda p: save_file({n: t.contiguous() for n, t in sorted(tensors.items())}, p))

    def index(p):
        with open(p, "w") as f:
            for r, (rid, length, chunked) in enumerate(rows):
                f.write(f"{rid}\t{length}\t{shard_name(k)}\t{r}\t{'yes' if chunked else 'no'}\n")
    _atomic(scratch, base + ".index.tsv", index)
    _atomic(scratch, base + ".bad.tsv", lambda p: open(p, "w").write("".join(f"{rid}\t{why}\n" for rid, why in bad)))
    rec = dict(meta, shard=shard_name(k), records=len(rows), sha256=sha256(base + ".safetensors"))
    _atomic(scratch, base + ".json", lambda p: open(p, "w").write(json.dumps(rec, sort_keys=True)))
    shutil.rmtree(scratch, ignore_errors=True)
    return rec


def finish(out, n_shards, manifest):
    """index.tsv (every shard's rows in shard order), bad_records.tsv (shard, id, what was done) and manifest.json
    (manifest + the shards' records); then the scratch folders go."""
    shards = []
    scratch = _scratch(out, "final")

    def index(p):
        with open(p, "w") as f:
            f.write("id\tlength\tshard\trow\tchunked\n")
            for k in range(n_shards):
                with open(os.path.join(out, shard_name(k) + ".index.tsv")) as part:
                    f.write(part.read())
                with open(os.path.join(out, shard_name(k) + ".json")) as rec:
                    shards.append(json.load(rec))
    _atomic(scratch, os.path.join(out, "index.tsv"), index)

    def bad(p):
        with open(p, "w") as f:
            f.write("shard\tid\twhat\n")
            for k in range(n_shards):
                with open(os.path.join(out, shard_name(k) + ".bad.tsv")) as part:
                    f.write("".join(f"{shard_name(k)}\t{line}" for line in part))
    _atomic(scratch, os.path.join(out, "bad_records.tsv"), bad)
    body = dict(manifest, shards=shards)
    _atomic(scratch, os.path.join(out, "manifest.json"), lambda p: open(p, "w").write(json.dumps(body, indent=1, sort_keys=True)))
    shutil.rmtree(os.path.join(out, PARTIAL), ignore_errors=True)
