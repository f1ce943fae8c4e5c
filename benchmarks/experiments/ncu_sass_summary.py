"""Summary of an Nsight Compute SASS source page (`ncu --import R.ncu-rep --page source --csv --print-source sass`,
from a report taken with `--set full`): the warp-stall reasons over all samples, the instructions with the most
samples and their top reasons, and the instructions with excess shared-memory wavefronts (bank conflicts) or excess
global sectors (partly used sectors). No GPU needed.
    python3 benchmarks/experiments/ncu_sass_summary.py bwd_sass.csv [--top 30]"""
import argparse
import collections
import csv


def number(text):
    """A counter's value as ncu writes it ("1,234"), 0 where empty or not a number."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", help="the source page as CSV")
    ap.add_argument("--top", type=int, default=30, help="instructions to list")
    args = ap.parse_args()
    with open(args.csv) as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if "Source" in r)  # ncu writes a line or two before the header
    col = {name: i for i, name in enumerate(rows[head])}
    data = rows[head + 1:]
    stalls = [name for name in col if name.startswith("stall_") and "Not Issued" not in name]
    if stalls:
        total = collections.Counter({s: sum(number(r[col[s]]) for r in data) for s in stalls})
        samples = sum(total.values()) or 1
        print(f"stall samples {samples:.0f}")
        for s, v in total.most_common():
            if v:
                print(f"  {s[6:]:24s} {v:10.0f} {100 * v / samples:5.1f}%")
        key = "Warp Stall Sampling (All Samples)"
        if key in col:
            print("instructions with the most samples (line, samples, share, SASS, top reasons)")
            ranked = sorted(((number(r[col[key]]), n, r) for n, r in enumerate(data)), key=lambda x: -x[0])
            for v, n, r in ranked[:args.top]:
                top = sorted(((number(r[col[s]]), s[6:]) for s in stalls), reverse=True)[:3]
                print(f"{n:6d} {v:8.0f} {100 * v / samples:5.1f}% {r[col['Source']].strip()[:64]:64s} "
                      + " ".join(f"{s}:{c:.0f}" for c, s in top if c))
    for key in ("L1 Wavefronts Shared Excessive", "L2 Theoretical Sectors Global Excessive"):
        if key not in col:
            continue
        ranked = sorted(((number(r[col[key]]), n, r[col["Source"]].strip()) for n, r in enumerate(data)), reverse=True)
        print(f"{key}: {sum(v for v, _, _ in ranked):.0f}")
        for v, n, src in ranked[:args.top]:
            if v:
                print(f"{n:6d} {v:12.0f} {src[:70]}")


if __name__ == "__main__":
    main()
