"""Streaming FASTA input for flashsci.embed: records one at a time (plain or gzipped), never the whole file in memory,
and the rules for bad records."""
import gzip
import re

# letters a protein language model's alphabet may hold (the 20 standard residues, X, and the rare B, U, Z, O)
RESIDUES = set("ACDEFGHIKLMNPQRSTVWYXBUZO")
_BAD = re.compile(r"[^A-Z]")


def open_text(path):
    """A text handle on path, gunzipped when it ends in .gz."""
    return gzip.open(path, "rt") if str(path).endswith(".gz") else open(path, "rt")


def records(path):
    """(position, id, sequence) of every record in file order; id is the header's first word; the sequence has its
    whitespace removed and letters upper-cased (positions count every record, bad ones included)."""
    pos, rid, parts = 0, None, []
    with open_text(path) as f:
        for line in f:
            if line.startswith(">"):
                if rid is not None:
                    yield pos, rid, "".join(parts)
                    pos += 1
                head = line[1:].strip()
                rid, parts = (head.split()[0] if head else f"record{pos}"), []
            elif rid is not None:
                parts.append("".join(line.split()).upper())
    if rid is not None:
        yield pos, rid, "".join(parts)


def clean(seq, alphabet=RESIDUES):
    """(sequence for the model, note): letters outside alphabet become X; note says how many, or is empty."""
    bad = sum(1 for c in seq if c not in alphabet)
    if not bad:
        return seq, ""
    return "".join(c if c in alphabet else "X" for c in seq), f"{bad} letters outside the alphabet replaced by X"
