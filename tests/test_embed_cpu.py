"""flashsci-embed on the CPU with tiny random ESM2 and T5 models saved to disk (no downloads): the whole command on a
small FASTA, parity of every embedding with the stock model run on that sequence alone, the long-sequence rules, the
bad-record rules, and resume after a kill (byte-identical shards)."""
import gzip
import os
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
from safetensors.torch import load_file  # noqa: E402

from flashsci.embed import plan  # noqa: E402
from flashsci.embed.__main__ import main  # noqa: E402
from flashsci.embed.compute import windows  # noqa: E402

ESM_VOCAB = ["<cls>", "<pad>", "<eos>", "<unk>", *"LAGVSERTIDPKQNFYMHWCXBUZO.-", "<null_1>", "<mask>"]


@pytest.fixture(scope="module")
def esm_dir(tmp_path_factory):
    """A 2-layer ESM2-shaped model (rotary, window 62 residues) and its tokenizer, saved."""
    d = tmp_path_factory.mktemp("esm")
    (d / "vocab.txt").write_text("\n".join(ESM_VOCAB) + "\n")
    tok = transformers.EsmTokenizer(str(d / "vocab.txt"))
    torch.manual_seed(0)
    cfg = transformers.EsmConfig(vocab_size=33, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=64, position_embedding_type="rotary", pad_token_id=1, mask_token_id=32,
                                 token_dropout=True, max_position_embeddings=64)
    transformers.EsmModel(cfg, add_pooling_layer=False).save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    """A 2-layer ProtT5-shaped encoder and a word-level tokenizer of residues + </s>, saved."""
    from flashsci.bench.embedding import t5_tokenizer
    d = tmp_path_factory.mktemp("t5")
    tok = t5_tokenizer()
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=32, d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2,
                                feed_forward_proj="relu", pad_token_id=0, eos_token_id=1, dropout_rate=0.0)
    transformers.T5EncoderModel(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


RECORDS = [("p1", "MKTAYIAKQRQISFVKSHFSRQ"), ("p1", "ACDEFGHIK"), ("p2", "mkvl aaG\nIIGGS"), ("empty", ""),
           ("odd", "MKJ*LLA"), ("long", "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ" * 4), ("p3", "W"), ("p4", "GGGGSGGGGS")]


def write_fasta(path, records, gz=False):
    text = "".join(f">{rid} some description\n{seq}\n" for rid, seq in records)
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return str(path)


def stock_embedding(model_dir, seq, family):
    """The stock HF model on one sequence alone (float64): per-residue embeddings, windows averaged as the CLI does."""
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    if family == "esm":
        model = transformers.EsmModel.from_pretrained(model_dir, add_pooling_layer=False).double().eval()
        head, window = 1, model.config.max_position_embeddings - 2
        enc = lambda s: tok([s])["input_ids"]
    else:
        model = transformers.T5EncoderModel.from_pretrained(model_dir).double().eval()
        head, window = 0, 0
        enc = lambda s: tok([" ".join(s)])["input_ids"]
    total, count = torch.zeros(len(seq), model.config.hidden_size, dtype=torch.float64), torch.zeros(len(seq), 1)
    with torch.no_grad():
        for a, e in windows(len(seq), window):
            h = model(input_ids=torch.tensor(enc(seq[a:e]))).last_hidden_state[0]
            total[a:e] += h[head:head + e - a]
            count[a:e] += 1
    return total / count


def read_index(out):
    lines = open(os.path.join(out, "index.tsv")).read().splitlines()
    assert lines[0] == "id\tlength\tshard\trow\tchunked"
    return [line.split("\t") for line in lines[1:]]


def test_esm_end_to_end(esm_dir, tmp_path):
    fasta = write_fasta(tmp_path / "in.fasta.gz", RECORDS, gz=True)
    out = str(tmp_path / "out")
    assert main([esm_dir, fasta, "-o", out, "--pool", "both", "--shard-size", "3", "--max-tokens", "64",
                 "--dtype", "fp32", "--device", "cpu"]) == 0
    index = read_index(out)
    assert [r[0] for r in index] == ["p1", "p1", "p2", "odd", "long", "p3", "p4"]   # the empty record left out
    assert [r[4] for r in index] == ["no", "no", "no", "no", "yes", "no", "no"]
    bad = open(os.path.join(out, "bad_records.tsv")).read()
    assert "empty\tempty sequence" in bad and "odd\t2 letters outside" in bad and "p1\tduplicate id" in bad
    cleaned = {"p2": "MKVLAAGIIGGS", "odd": "MKXXLLA"}
    for rid, length, shard, row, _ in index:
        t = load_file(os.path.join(out, shard + ".safetensors"))
        r = int(row)
        seq = cleaned.get(rid) or next(s for i, s in RECORDS if i == rid and len(s) == int(length))
        ref = stock_embedding(esm_dir, seq, "esm")
        res = t["residues"][t["offsets"][r]:t["offsets"][r + 1]].double()
        assert res.shape == ref.shape and (res - ref).abs().max() <= 1e-4 * ref.abs().max(), rid
        assert (t["mean"][r].double() - ref.mean(0)).abs().max() <= 1e-4 * ref.abs().max(), rid
    import json
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    assert len(manifest["shards"]) == 3 and manifest["options"]["pool"] == "both"
    means = str(tmp_path / "means")   # --pool mean: whole sequences pooled in the batch, windowed ones from their rows
    main([esm_dir, fasta, "-o", means, "--shard-size", "3", "--max-tokens", "64", "--dtype", "fp32", "--device", "cpu"])
    for rid, length, shard, row, chunked in read_index(means):
        t = load_file(os.path.join(means, shard + ".safetensors"))
        assert "residues" not in t
        seq = cleaned.get(rid) or next(s for i, s in RECORDS if i == rid and len(s) == int(length))
        ref = stock_embedding(esm_dir, seq, "esm")
        assert (t["mean"][int(row)].double() - ref.mean(0)).abs().max() <= 1e-4 * ref.abs().max(), (rid, chunked)
    stock = str(tmp_path / "stock")   # the baseline: the stock model on the same batches
    main([esm_dir, fasta, "-o", stock, "--shard-size", "3", "--max-tokens", "64", "--device", "cpu", "--no-patch"])
    for k in range(3):
        a, b = (load_file(os.path.join(d, f"shard-0000{k}.safetensors"))["mean"] for d in (out, stock))
        assert (a - b).abs().max() <= 1e-4 * b.abs().max()


def test_t5_mean_and_long_rules(t5_dir, esm_dir, tmp_path):
    fasta = write_fasta(tmp_path / "in.fasta", [("a", "MKTAYIAKQRQISFVKSHFSRQ"), ("b", "MKUBZOAA"), ("c", "G" * 150)])
    out = str(tmp_path / "t5")
    main([t5_dir, fasta, "-o", out, "--dtype", "fp32", "--device", "cpu"])
    t = load_file(os.path.join(out, "shard-00000.safetensors"))
    for r, (rid, seq) in enumerate([("a", "MKTAYIAKQRQISFVKSHFSRQ"), ("b", "MKXXXXAA"), ("c", "G" * 150)]):
        ref = stock_embedding(t5_dir, seq, "t5").mean(0)
        assert (t["mean"][r].double() - ref).abs().max() <= 1e-4 * ref.abs().max(), rid
    assert [r[4] for r in read_index(out)] == ["no", "no", "no"]   # T5 has no window
    trunc = str(tmp_path / "trunc")
    main([esm_dir, fasta, "-o", trunc, "--long", "truncate", "--pool", "per-residue", "--device", "cpu"])
    assert [int(r[1]) for r in read_index(trunc)] == [22, 8, 150]
    t = load_file(os.path.join(trunc, "shard-00000.safetensors"))
    assert t["offsets"].tolist() == [0, 22, 30, 92] and "mean" not in t
    with pytest.raises(SystemExit, match="c has 150 residues, more than the model's 62"):
        main([esm_dir, fasta, "-o", str(tmp_path / "err"), "--long", "error", "--device", "cpu"])


def test_esm_letter_table_matches_the_tokenizer(esm_dir):
    """ESM2's tokenization by a byte table gives the HF tokenizer's ids on random cleaned sequences (every letter of
    the alphabet, X for the rest) and refuses a vocabulary without a letter of the alphabet."""
    import random
    from flashsci.embed.fasta import RESIDUES
    from flashsci.embed.models import letter_table_tokenizer
    tok = transformers.AutoTokenizer.from_pretrained(esm_dir)
    tokenize = letter_table_tokenizer(tok, frozenset(RESIDUES))
    rng = random.Random(5)
    seqs = ["".join(rng.choice(sorted(RESIDUES)) for _ in range(rng.randint(1, 300))) for _ in range(50)]
    assert [t.tolist() for t in tokenize(seqs)] == tok(seqs, add_special_tokens=True)["input_ids"]
    assert letter_table_tokenizer(tok, frozenset(RESIDUES | {"J"})) is None


def test_deal_is_deterministic_and_balanced():
    sizes = [50, 10, 40, 40, 30, 20, 5, 5]
    ranks = plan.deal(sizes, 3)
    assert ranks == plan.deal(sizes, 3) and sorted(k for r in ranks for k in r) == list(range(8))
    loads = [sum(sizes[k] for k in r) for r in ranks]
    assert max(loads) - min(loads) <= max(sizes)


def test_resume_after_kill_is_byte_identical(esm_dir, tmp_path):
    """A run killed (SIGKILL) after its first shard, started again, ends with the same bytes as an uninterrupted
    run; a shard whose file no longer matches its checksum is redone."""
    records = [(f"s{i}", "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ"[: 5 + (7 * i) % 28]) for i in range(300)]
    fasta = write_fasta(tmp_path / "in.fasta", records)
    args = [esm_dir, fasta, "--pool", "both", "--shard-size", "4", "--device", "cpu"]
    clean = str(tmp_path / "clean")
    main(args[:2] + ["-o", clean] + args[2:])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), FLASHSCI_NUM_THREADS="1")
    for attempt in range(5):   # a run can finish between the first shard and the kill: try again in a fresh folder
        killed = str(tmp_path / f"killed{attempt}")
        proc = subprocess.Popen([sys.executable, "-m", "flashsci.embed", *args[:2], "-o", killed, *args[2:]], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while not os.path.exists(os.path.join(killed, "shard-00000.json")) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if not os.path.exists(os.path.join(killed, "manifest.json")):
            break
    assert not os.path.exists(os.path.join(killed, "manifest.json")), "no kill landed before the run finished"
    assert os.path.exists(os.path.join(killed, "shard-00000.json"))
    with open(os.path.join(killed, "shard-00000.safetensors"), "r+b") as f:   # a damaged shard is redone
        f.seek(100)
        f.write(b"\0\0\0\0")
    stray = os.path.join(killed, ".partial", "shard-00000")   # what a kill inside safetensors' save leaves behind
    os.makedirs(stray, exist_ok=True)
    open(os.path.join(stray, ".tmpAbC123"), "wb").write(b"partial")
    main(args[:2] + ["-o", killed] + args[2:])
    names = sorted(os.listdir(clean))   # nothing else: a killed writer's temporary files are gone with the scratch folder
    assert names == sorted(os.listdir(killed))
    for n in names:
        assert open(os.path.join(clean, n), "rb").read() == open(os.path.join(killed, n), "rb").read(), n


def test_two_ranks_under_torchrun_match_one_process(esm_dir, tmp_path):
    """torchrun with two CPU processes (gloo): each rank writes its dealt shards, rank 0 the index and manifest; every
    file equals the single-process run's."""
    records = [(f"s{i}", "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ"[: 3 + (5 * i) % 30]) for i in range(30)]
    fasta = write_fasta(tmp_path / "in.fasta", records)
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    main([esm_dir, fasta, "-o", one, "--shard-size", "4", "--device", "cpu"])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), FLASHSCI_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "flashsci.embed",
                        esm_dir, fasta, "-o", two, "--shard-size", "4", "--device", "cpu"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    names = sorted(os.listdir(one))
    assert names == sorted(os.listdir(two))
    for n in names:
        assert open(os.path.join(one, n), "rb").read() == open(os.path.join(two, n), "rb").read(), n


def test_esmc_directory_patched_and_stock(tmp_path):
    """ESM-C from a directory (esmc.json + model.safetensors): every record's embeddings match the stock ESMC run on
    that sequence alone; --no-patch gives the same means."""
    esmc_module = pytest.importorskip("esm.models.esmc")
    from esm.tokenization import get_esmc_model_tokenizers
    from flashsci.embed.models import save_esmc
    torch.manual_seed(6)
    model = esmc_module.ESMC(d_model=32, n_heads=4, n_layers=2, tokenizer=get_esmc_model_tokenizers(),
                             use_flash_attn=False)
    folder = str(tmp_path / "esmc")
    save_esmc(model, folder)
    records = [("a", "MKTAYIAKQRQISFVKSHFSRQ"), ("b", "ACDEFGHIKWY"), ("c", "MKV" * 30)]
    fasta = write_fasta(tmp_path / "in.fasta", records)
    out, stock = str(tmp_path / "out"), str(tmp_path / "stock")
    main([folder, fasta, "-o", out, "--pool", "both", "--dtype", "fp32", "--device", "cpu", "--max-tokens", "64"])
    main([folder, fasta, "-o", stock, "--dtype", "fp32", "--device", "cpu", "--max-tokens", "64", "--no-patch"])
    t, s = (load_file(os.path.join(d, "shard-00000.safetensors")) for d in (out, stock))
    model = model.double().eval()
    tok = get_esmc_model_tokenizers()
    for r, (rid, seq) in enumerate(records):
        with torch.no_grad():
            ref = model(sequence_tokens=torch.tensor(tok([seq])["input_ids"])).embeddings[0, 1:-1]
        res = t["residues"][t["offsets"][r]:t["offsets"][r + 1]].double()
        assert res.shape == ref.shape and (res - ref).abs().max() <= 1e-4 * ref.abs().max(), rid
        assert (t["mean"][r].double() - ref.mean(0)).abs().max() <= 1e-4 * ref.abs().max(), rid
        assert (s["mean"][r].double() - ref.mean(0)).abs().max() <= 1e-4 * ref.abs().max(), rid
