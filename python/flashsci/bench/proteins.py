"""The real protein length mix the benchmarks use: UniProt records from uniprot20k.fasta.gz (20,000 proteins;
found in data/ or ../shared/data/, or given by --fasta) and token-budget batches of them."""
import gzip
import os

TOKENS = 16384
FASTA = ["data/uniprot20k.fasta.gz", "../shared/data/uniprot20k.fasta.gz", "/usr/share/mmseqs2/examples/uniprot20k.fasta.gz"]


def read_fasta(path=None):
    """(path, sequences) of every record in a (gzipped) FASTA file, in file order; the default file where found."""
    path = path or next((p for p in FASTA if os.path.exists(p)), None)
    if path is None:
        raise FileNotFoundError(f"uniprot20k.fasta.gz not found in {FASTA}; pass --fasta")
    seqs, parts = [], None
    with gzip.open(path, "rt") as f:
        for line in f:
            if line.startswith(">"):
                if parts is not None:
                    seqs.append("".join(parts))
                parts = []
            elif parts is not None:
                parts.append(line.strip())
    if parts is not None:
        seqs.append("".join(parts))
    return path, seqs


def read_lengths(path=None):
    """(path, residue counts) of every record in a (gzipped) FASTA file."""
    path, seqs = read_fasta(path)
    return path, [len(s) for s in seqs]


def token_batches(lengths, budget=TOKENS):
    """Greedy batches in the given order whose padded size (count x longest) stays within budget."""
    batches, cur = [], []
    for n in lengths:
        if cur and (len(cur) + 1) * max(max(cur), n) > budget:
            batches.append(cur)
            cur = []
        cur.append(n)
    return batches + ([cur] if cur else [])
