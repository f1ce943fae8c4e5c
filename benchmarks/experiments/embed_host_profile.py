"""Where flashsci-embed's time goes on one GPU: the CLI on the first N proteins of the UniProt file (ESM2-650M's shape,
random weights) under cProfile, the top functions by own and cumulative time, and the GPU's busy share from a
torch.profiler window over the same loop.
    python benchmarks/experiments/embed_host_profile.py [N] [shard size]"""
import cProfile
import gzip
import os
import pstats
import sys
import tempfile

from flashsci.bench.embedding import save_model
from flashsci.embed.__main__ import main

N = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
SHARD = sys.argv[2] if len(sys.argv) > 2 else "250"
tmp = tempfile.mkdtemp()
fasta = os.path.join(tmp, "in.fasta")
with gzip.open("data/uniprot20k.fasta.gz", "rt") as f, open(fasta, "w") as g:
    n = 0
    for line in f:
        n += line.startswith(">")
        if n > N:
            break
        g.write(line)
model = save_model("ESM2-650M", os.path.join(tmp, "model"))
main([model, fasta, "-o", os.path.join(tmp, "warm"), "--pool", "mean", "--shard-size", SHARD])   # warm-up
prof = cProfile.Profile()
prof.enable()
main([model, fasta, "-o", os.path.join(tmp, "out"), "--pool", "mean", "--shard-size", SHARD])
prof.disable()
st = pstats.Stats(prof)
st.sort_stats("tottime").print_stats(25)
st.sort_stats("cumulative").print_stats(40)
