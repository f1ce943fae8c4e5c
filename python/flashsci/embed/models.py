"""The models flashsci.embed runs: an HF ESM2 (EsmModel / EsmForMaskedLM checkpoints) or T5 encoder (ProtT5) from a
hub name or a local directory, patched with flashsci, with what embedding needs to know about each family: how a
sequence becomes token ids, which tokens are not residues, and the longest window of residues."""
from dataclasses import dataclass

from flashsci.embed.fasta import RESIDUES


@dataclass
class Family:
    """What embedding needs to know about a model."""
    name: str
    head: int          # special tokens before the residues
    tail: int          # special tokens after them
    window: int        # longest run of residues per forward (0: none)
    pad_id: int
    alphabet: frozenset  # letters the model takes; others become X


def load(name_or_dir, device, dtype, revision=None, patched=True):
    """(model on device in dtype, eval, patched (or stock with sdpa attention); tokenize(list of str) -> list of id
    lists; Family; the model's revision or None)."""
    import torch
    import transformers
    from flashsci.integrations import patch
    cfg = transformers.AutoConfig.from_pretrained(name_or_dir, revision=revision)
    tok = transformers.AutoTokenizer.from_pretrained(name_or_dir, revision=revision)
    if cfg.model_type == "esm":
        # float32 first: buffers computed at load time (ESM's rotary inv_freq) lose their small values in fp16
        model = transformers.EsmModel.from_pretrained(name_or_dir, revision=revision, add_pooling_layer=False,
                                                      dtype=torch.float32)
        fam = Family("esm", 1, 1, int(cfg.max_position_embeddings) - 2, int(cfg.pad_token_id), frozenset(RESIDUES))
        prep = lambda s: s
    elif cfg.model_type == "t5":
        model = transformers.T5EncoderModel.from_pretrained(name_or_dir, revision=revision, dtype=torch.float32)
        fam = Family("t5", 0, 1, 0, int(cfg.pad_token_id), frozenset(RESIDUES - set("BUZO")))
        prep = lambda s: " ".join(s)   # ProtT5's tokenizer takes residues separated by spaces (rare ones as X)
    else:
        raise ValueError(f"flashsci.embed runs ESM2 and T5-encoder (ProtT5) models, got model_type {cfg.model_type!r}")
    model = model.to(device=device, dtype=dtype).eval()
    if patched:
        patch(model)
    else:
        model.set_attn_implementation("sdpa")

    def tokenize(seqs):
        return tok([prep(s) for s in seqs], add_special_tokens=True)["input_ids"]

    return model, tokenize, fam, getattr(cfg, "_commit_hash", None)
