"""The studies' tables from a Trace: kernel time per category, the top kernels with call counts, the GEMM fraction,
dtype-conversion copies, for one pass (the kernels launched inside a record_function range of that name) or all."""
from collections import defaultdict

from flashsci.profile.categories import CATEGORIES


def select(trace, label=None, within=None):
    """(kernels, conversions) launched inside a range named label (all when None) and, when given, inside within."""
    want = lambda labels: (label is None or label in labels) and (within is None or within in labels)
    return [k for k in trace.kernels if want(k["labels"])], [c for c in trace.conversions if want(c)]


def summary(trace, label=None, batches=1, top=8):
    """{total_ms, per_batch_ms, categories {name: ms}, gemm_fraction, top [(name, calls, ms)], conversions} of a pass."""
    kernels, conversions = select(trace, label)
    per_cat, per_name, calls = defaultdict(float), defaultdict(float), defaultdict(int)
    for k in kernels:
        per_cat[k["category"]] += k["us"] / 1e3
        per_name[k["name"]] += k["us"] / 1e3
        calls[k["name"]] += 1
    total = sum(per_cat.values())
    names = sorted(per_name, key=lambda n: -per_name[n])[:top]
    return {"total_ms": total, "per_batch_ms": total / max(batches, 1), "batches": batches,
            "categories": {c: per_cat.get(c, 0.0) for c in CATEGORIES},
            "gemm_fraction": per_cat.get("gemm", 0.0) / total if total else 0.0,
            "top": [(n, calls[n], per_name[n]) for n in names], "kernels": len(kernels),
            "conversions": len(conversions)}


def launch_listing(trace, width=100):
    """Text lines: every kernel of trace in launch order with its time, then their total (for experiments)."""
    lines = [f"   {k['us']:8.1f} us  {k['name'][:width]}" for k in trace.kernels]
    return lines + [f"   {sum(k['us'] for k in trace.kernels):8.1f} us  total"]


def short(name, width=70):
    """A kernel name cut to its function and template head, for tables."""
    name = name.replace("void ", "").replace("|", "/")
    return name if len(name) <= width else name[: width - 1] + "…"


def category_table(rows):
    """Markdown: one row per (label, summary) with each category's ms and share, the GEMM fraction and the copies."""
    head = "| run | CUDA ms / batch | " + " | ".join(CATEGORIES) + " | GEMM fraction | dtype-conversion copies |"
    out = [head, "|" + "---|" * (len(CATEGORIES) + 4)]
    for label, s in rows:
        total = s["total_ms"] or 1.0
        cells = [f"{s['categories'][c] / max(1, s.get('batches', 1)):.1f} ({100 * s['categories'][c] / total:.0f}%)"
                 for c in CATEGORIES]
        out.append(f"| {label} | {s['per_batch_ms']:.1f} | " + " | ".join(cells) +
                   f" | {100 * s['gemm_fraction']:.0f}% | {s['conversions']} |")
    return out


def top_table(label, s):
    """Markdown: the top kernels of one summary with their category, calls and time."""
    from flashsci.profile.categories import category
    out = [f"Top kernels, {label}:", "", "| kernel | category | calls | ms |", "|---|---|---|---|"]
    out += [f"| `{short(n)}` | {category(n)} | {c} | {ms:.2f} |" for n, c, ms in s["top"]]
    return out


def plot(path, title, rows):
    """A PNG of stacked bars, one per (label, summary), ms per batch by category; False without matplotlib."""
    from flashsci.bench.results import pyplot
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(rows)), 4.0))
    bottom = [0.0] * len(rows)
    for i, c in enumerate(CATEGORIES):
        vals = [s["categories"][c] / max(1, s.get("batches", 1)) for _, s in rows]
        ax.bar(range(len(rows)), vals, bottom=bottom, label=c, color=f"C{i}")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([label for label, _ in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("CUDA kernel ms per batch")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
