"""The work of a flashsci.embed run: records in input order cut into shards of a fixed count, a first streaming pass
that counts each shard's residues (one number per shard is all it keeps), and shards dealt to ranks by a greedy
balance of those counts (largest first, to the rank with the fewest so far; ties by index): deterministic for a given
input and world size, and a resumed run finds the same shards whatever its world size."""
from flashsci.embed.fasta import records


def shard_sizes(path, shard_size):
    """(residues, records) per shard over the whole file (one streaming pass)."""
    sizes, counts = [], []
    for pos, _, seq in records(path):
        if pos % shard_size == 0:
            sizes.append(0)
            counts.append(0)
        sizes[-1] += len(seq)
        counts[-1] += 1
    return sizes, counts


def deal(sizes, world):
    """The shards of each rank: [[shard, ...] for rank in range(world)], each list in shard order."""
    load = [0] * world
    ranks = [[] for _ in range(world)]
    for k in sorted(range(len(sizes)), key=lambda k: (-sizes[k], k)):
        r = min(range(world), key=lambda r: (load[r], r))
        ranks[r].append(k)
        load[r] += sizes[k]
    return [sorted(x) for x in ranks]


def shard_records(path, shard_size, wanted):
    """(shard, [(id, sequence), ...]) for the shards in wanted (a set), streaming, in file order."""
    current, rows = None, []
    for pos, rid, seq in records(path):
        k = pos // shard_size
        if k != current:
            if current in wanted:
                yield current, rows
            current, rows = k, []
        if k in wanted:
            rows.append((rid, seq))
    if current in wanted:
        yield current, rows
