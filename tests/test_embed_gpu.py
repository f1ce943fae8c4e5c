"""flashsci-embed on CUDA (bf16) with a small random ESM2 saved to disk: every protein's mean embedding from the batched
command against the same patched model run on that protein alone (differences are bf16 rounding of batch-shaped
GEMMs), and against the stock model in float32 within 2x the stock bf16 model's error."""
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
from safetensors.torch import load_file  # noqa: E402

from flashsci.embed.__main__ import main  # noqa: E402
from flashsci.integrations import patch  # noqa: E402
from test_embed_cpu import ESM_VOCAB, read_index, write_fasta  # noqa: E402

pytestmark = pytest.mark.gpu


def test_batched_matches_single_and_stock(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    d = tmp_path / "esm"
    d.mkdir()
    (d / "vocab.txt").write_text("\n".join(ESM_VOCAB) + "\n")
    tok = transformers.EsmTokenizer(str(d / "vocab.txt"))
    torch.manual_seed(0)
    cfg = transformers.EsmConfig(vocab_size=33, hidden_size=320, num_hidden_layers=6, num_attention_heads=20,
                                 intermediate_size=1280, position_embedding_type="rotary", pad_token_id=1,
                                 mask_token_id=32, token_dropout=True, max_position_embeddings=1026)
    transformers.EsmModel(cfg, add_pooling_layer=False).save_pretrained(d)
    tok.save_pretrained(d)
    g = torch.Generator().manual_seed(1)
    letters = "ACDEFGHIKLMNPQRSTVWY"
    records = [(f"p{i}", "".join(letters[j] for j in torch.randint(20, (int(n),), generator=g)))
               for i, n in enumerate(torch.randint(20, 700, (60,), generator=g))]
    out = str(tmp_path / "out")
    main([str(d), write_fasta(tmp_path / "in.fasta", records), "-o", out, "--dtype", "bf16", "--device", "cuda",
          "--max-tokens", "4096"])
    got = load_file(os.path.join(out, "shard-00000.safetensors"))["mean"].double()
    assert [r[0] for r in read_index(out)] == [rid for rid, _ in records]
    ref32 = transformers.EsmModel.from_pretrained(d, add_pooling_layer=False, dtype=torch.float32).cuda().eval()
    stock = transformers.EsmModel.from_pretrained(d, add_pooling_layer=False, dtype=torch.float32).cuda().bfloat16().eval()
    single = patch(transformers.EsmModel.from_pretrained(d, add_pooling_layer=False, dtype=torch.float32).cuda()
                   .bfloat16().eval())

    def mean(model, seq):
        ids = torch.tensor(tok([seq])["input_ids"], device="cuda")
        with torch.inference_mode():
            return model(input_ids=ids).last_hidden_state[0, 1:-1].double().mean(0).cpu()
    errs = {"batched vs single": 0.0, "batched vs fp32": 0.0, "stock bf16 vs fp32": 0.0}
    for r, (_, seq) in enumerate(records):
        ref = mean(ref32, seq)
        scale = ref.abs().max().item()
        errs["batched vs single"] = max(errs["batched vs single"], (got[r] - mean(single, seq)).abs().max().item() / scale)
        errs["batched vs fp32"] = max(errs["batched vs fp32"], (got[r] - ref).abs().max().item() / scale)
        errs["stock bf16 vs fp32"] = max(errs["stock bf16 vs fp32"], (mean(stock, seq) - ref).abs().max().item() / scale)
    print("max relative errors of mean embeddings:", {k: f"{v:.2e}" for k, v in errs.items()})
    assert errs["batched vs fp32"] <= 2 * errs["stock bf16 vs fp32"], errs
    assert errs["batched vs single"] <= 2 * errs["stock bf16 vs fp32"], errs
