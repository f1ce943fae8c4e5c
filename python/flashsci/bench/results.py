"""Writing benchmark results: JSON with the run's metadata and rows, a markdown table, and (with matplotlib
installed) a PNG plot beside them."""
import json
import os


def fmt(x, spec=".1f"):
    """x formatted with spec, or '-' for None."""
    return "-" if x is None else format(x, spec)


def md_table(cols, cells):
    """Markdown table lines: a header of the column names cols, then one row per list of cell strings."""
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] + ["| " + " | ".join(c) + " |" for c in cells]


def slug(name):
    """A device or model name as a file-name part: 'NVIDIA H100 80GB HBM3' -> 'NVIDIA_H100_80GB_HBM3'."""
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def write_results(out_dir, stem, meta, rows, markdown):
    """out_dir/stem.json ({meta, rows}) and out_dir/stem.md."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, stem + ".json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(out_dir, stem + ".md"), "w") as f:
        f.write(markdown)
    print(f"wrote {os.path.join(out_dir, stem)}.json/.md")


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (with a one-line note) where matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot written: matplotlib is not installed (pip install 'flashsci[plot]')")
        return None
    return plt


def save_figure(plt, fig, out_dir, stem):
    """fig laid out and written to out_dir/stem.png, then closed; returns the path."""
    fig.tight_layout()
    path = os.path.join(out_dir, stem + ".png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")
    return path


def write_plot(out_dir, stem, title, labels, series, ylabel):
    """out_dir/stem.png: grouped bars, one group per label and one bar per series ({name: [value per label]});
    a one-line note instead where matplotlib is not installed (pip install 'flashsci[plot]')."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(labels) * len(series)), 4.0))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(labels))]
        ax.bar(xs, [v if v is not None else 0 for v in values], width, label=name)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return save_figure(plt, fig, out_dir, stem)
