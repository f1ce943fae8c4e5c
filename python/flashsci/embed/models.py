"""The models flashsci.embed runs: an HF ESM2 (EsmModel / EsmForMaskedLM checkpoints) or T5 encoder (ProtT5) from a
hub name or a local directory, or ESM-C through the esm package (`esmc_300m` / `esmc_600m`, which the package fetches,
or a directory with `esmc.json` ({"d_model", "n_heads", "n_layers"}) and `model.safetensors`, an ESMC state dict),
patched with flashsci, with what embedding needs to know about each family: how a sequence becomes token ids, which
tokens are not residues, and the longest window of residues (ESM-C: its 2,048-token training context)."""
import json
import os
from dataclasses import dataclass
from types import SimpleNamespace

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


ESMC_NAMES = ("esmc_300m", "esmc_600m")


def is_esmc(name_or_dir):
    """Whether name_or_dir names an ESM-C model: one of the esm package's names or a directory with esmc.json."""
    return name_or_dir in ESMC_NAMES or os.path.exists(os.path.join(name_or_dir, "esmc.json"))


def save_esmc(model, folder):
    """An ESMC's shape and weights in the directory form load() reads (esmc.json + model.safetensors)."""
    from safetensors.torch import save_file
    os.makedirs(folder, exist_ok=True)
    attn = model.transformer.blocks[0].attn
    with open(os.path.join(folder, "esmc.json"), "w") as f:
        json.dump({"d_model": attn.d_model, "n_heads": attn.n_heads, "n_layers": len(model.transformer.blocks)}, f)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(folder, "model.safetensors"))


class EsmcEmbedder:
    """An ESMC as embedding calls it: __call__(input_ids, attention_mask).last_hidden_state = the final-norm embeddings
    (the logits head and per-block hidden states skipped, patched or stock)."""

    def __init__(self, model, patched):
        from flashsci.integrations.esmc import embeddings
        self.model, self.patched, self.embeddings = model, patched, embeddings
        self.config = SimpleNamespace(hidden_size=model.transformer.blocks[0].attn.d_model)

    def parameters(self):
        return self.model.parameters()

    def __call__(self, input_ids, attention_mask):
        mask = attention_mask.bool()
        if self.patched:
            x = self.embeddings(self.model, input_ids, mask)
        elif self.model._use_flash_attn:     # flash-attn installed: the esm package's own unpadded path
            x = self.model(sequence_tokens=input_ids, sequence_id=mask).embeddings
        else:
            x = self.model.transformer(self.model.embed(input_ids), sequence_id=mask)[0]
        return SimpleNamespace(last_hidden_state=x)


def load_esmc(name_or_dir, device, dtype, patched):
    """(EsmcEmbedder, tokenize, Family) for an ESM-C name or directory (see the module's doc)."""
    import torch
    try:
        from esm.models.esmc import ESMC
        from esm.tokenization import get_esmc_model_tokenizers
    except ImportError as e:
        raise ImportError(f"ESM-C models need the esm package (pip install esm): {e}") from None
    from flashsci.integrations import patch
    tok = get_esmc_model_tokenizers()
    if name_or_dir in ESMC_NAMES:
        model = ESMC.from_pretrained(name_or_dir, device=torch.device("cpu"))
    else:
        from safetensors.torch import load_file
        with open(os.path.join(name_or_dir, "esmc.json")) as f:
            shape = json.load(f)
        model = ESMC(shape["d_model"], shape["n_heads"], shape["n_layers"], tok)
        model.load_state_dict(load_file(os.path.join(name_or_dir, "model.safetensors")))
    model = model.to(device=device, dtype=dtype).eval()
    if patched:
        patch(model)
    fam = Family("esmc", 1, 1, 2046, int(tok.pad_token_id), frozenset(RESIDUES))

    def tokenize(seqs):
        return tok(list(seqs), add_special_tokens=True)["input_ids"]

    return EsmcEmbedder(model, patched), tokenize, fam


def load(name_or_dir, device, dtype, revision=None, patched=True):
    """(model on device in dtype, eval, patched (or stock with sdpa attention); tokenize(list of str) -> list of id
    lists or arrays; Family; the model's revision or None)."""
    if is_esmc(name_or_dir):
        return (*load_esmc(name_or_dir, device, dtype, patched), None)
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

    if cfg.model_type == "esm":
        tokenize = letter_table_tokenizer(tok, fam.alphabet) or tokenize
    return model, tokenize, fam, getattr(cfg, "_commit_hash", None)


def letter_table_tokenizer(tok, alphabet):
    """tokenize(list of str) for a vocabulary of one token per letter (ESM2's): <cls>, each letter's id through a
    byte table, <eos> — the ids tok gives for sequences of alphabet letters (cleaned sequences have no others), at
    NumPy speed (ESM2's tokenizer is transformers' Python one: about 5 ms a protein). None when tok disagrees with
    the table on the alphabet, or a letter is no token of its own."""
    import numpy as np
    letters = "".join(sorted(alphabet))
    ids = [tok.convert_tokens_to_ids(c) for c in letters]
    if tok.cls_token_id is None or tok.eos_token_id is None or tok.unk_token_id in ids:
        return None
    table = np.zeros(256, dtype=np.int64)
    table[np.frombuffer(letters.encode(), dtype=np.uint8)] = ids
    head, tail = np.array([tok.cls_token_id]), np.array([tok.eos_token_id])

    def tokenize(seqs):
        return [np.concatenate([head, table[np.frombuffer(s.encode(), dtype=np.uint8)], tail]) for s in seqs]

    probe = letters + letters[::-1]
    return tokenize if tok([probe], add_special_tokens=True)["input_ids"][0] == tokenize([probe])[0].tolist() else None
