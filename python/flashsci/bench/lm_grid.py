"""The transformer-LM grid of the profiling study (python -m flashsci.bench --lm-grid): the five sizes of
bench/models/lm.py × context 128…4096, batch 4, bf16, each with naive, SDPA and flashsci attention. Per cell: the
inference forward (no grad) and one training step (forward, backward, fused AdamW) — one model and optimizer per cell,
its attention switched between turns, the three taking turns in alternating order over 4 rounds of 5 calls back to
back (CUDA events, after a warm-up), the median per attention — the step's peak memory under an 80 GB H100's limit
(torch's per-process memory fraction), out-of-memory cells, and one profiled forward and step (flashsci.profile): GEMM
fraction per pass, dominant kernel and top non-GEMM kernel, attention's share of the step, and inside the naive
attention the softmax's time against its two matmuls'."""
import gc
import statistics
import time

from flashsci.bench.models.lm import ATTENTION, SIZES, VOCAB, LM
from flashsci.bench.results import pyplot, save_figure, slug, write_results

CONTEXTS = (128, 256, 512, 1024, 2048, 4096)
BATCH = 4
H100_GIB = 79.1       # what torch reports as an 80 GB H100's total memory


ROUNDS = 4


def paired_ms(torch, fns, n=5, rounds=ROUNDS):
    """ms per call of each fn in fns (name -> fn, or None where it ran out of memory): the median over `rounds` of n
    back-to-back calls between two CUDA events, the fns taking turns in an order reversed every round (drift and the
    power cap's state fall on all alike), after a warm-up call each. The host queues calls ahead as a training loop does,
    so a cell shows max(host time, GPU time) per call."""
    names = [k for k, f in fns.items() if f is not None]
    times = {k: [] for k in names}
    for k in names:
        fns[k]()
    torch.cuda.synchronize()
    for r in range(rounds):
        for k in (names if r % 2 == 0 else names[::-1]):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fns[k]()
            end.record()
            end.synchronize()
            times[k].append(start.elapsed_time(end) / n)
    return {k: statistics.median(v) for k, v in times.items()}


def set_attention(model, attention):
    """Switch every block of model to attention ("naive", "sdpa" or "flashsci")."""
    for block in model.blocks:
        block.attention = attention


def passes(trace):
    """Per pass (inference, forward, backward, optimizer): GEMM fraction, dominant kernel, top non-GEMM kernel."""
    from flashsci.profile.categories import category
    from flashsci.profile.report import select, summary
    if not trace.kernels:
        return None       # the profiler saw no CUDA activity (CUPTI unavailable)
    out = {}
    for label in ("inference", "forward", "backward", "optimizer"):
        s = summary(trace, label, top=40)
        if not s["kernels"]:
            continue
        non_gemm = [t for t in s["top"] if category(t[0]) != "gemm"]
        out[label] = {"ms": s["total_ms"], "gemm_fraction": s["gemm_fraction"], "categories": s["categories"],
                      "dominant": s["top"][0][0], "top_non_gemm": non_gemm[0][0] if non_gemm else None,
                      "conversions": s["conversions"]}
    kernels, _ = select(trace, "inference", within="attention")
    cat = lambda c: sum(k["us"] for k in kernels if k["category"] == c) / 1e3
    out["inference attention"] = {"ms": sum(k["us"] for k in kernels) / 1e3, "softmax_ms": cat("softmax"),
                                  "matmul_ms": cat("gemm"), "fused_ms": cat("attention")}
    return out


def cell(torch, size, ctx):
    """The cell's rows, one per attention: each runs one forward and one step alone first (peak memory, out of memory:
    the phase that ran out), then those that fit are timed in turns (paired_ms) and profiled."""
    from flashsci.profile.trace import capture
    rf = torch.profiler.record_function
    rows = {a: {"size": size, "context": ctx, "attention": a} for a in ATTENTION}
    model = opt = None
    try:
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = LM(size, "sdpa")
        model = model.bfloat16()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        ids = torch.randint(VOCAB, (BATCH, ctx + 1), device="cuda")

        def forward():
            with torch.no_grad():
                model(ids[:, :-1])

        def step():
            with rf("forward"):
                loss = model.loss(ids)
            with rf("backward"):
                loss.backward()
            with rf("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        fits = {"forward ms": set(), "step ms": set()}
        for a in ATTENTION:
            set_attention(model, a)
            try:
                forward()
                fits["forward ms"].add(a)
                step()                      # the optimizer's state exists from the first attention's step on
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                step()
                torch.cuda.synchronize()
                rows[a]["peak GiB"] = torch.cuda.max_memory_allocated() / 2**30
                fits["step ms"].add(a)
            except torch.OutOfMemoryError:
                rows[a]["oom"] = "training step" if a in fits["forward ms"] else "forward"
                opt.zero_grad(set_to_none=True)
                gc.collect()
                torch.cuda.empty_cache()

        def turn(a, fn, key):
            return (lambda: (set_attention(model, a), fn())) if a in fits[key] else None
        for key, fn in (("forward ms", forward), ("step ms", step)):
            for a, ms in paired_ms(torch, {a: turn(a, fn, key) for a in ATTENTION}).items():
                rows[a][key] = ms
        for a in fits["step ms"]:
            set_attention(model, a)

            def profiled():
                with torch.no_grad(), rf("inference"):
                    model(ids[:, :-1])
                step()
            _, trace = capture(profiled)
            rows[a]["profile"] = passes(trace)
    finally:
        model = opt = None
        gc.collect()
        torch.cuda.empty_cache()
    return [rows[a] for a in ATTENTION]


def run_lm_grid(out_dir, sizes=None, contexts=None):
    import torch
    props = torch.cuda.get_device_properties(0)
    torch.cuda.set_per_process_memory_fraction(min(1.0, H100_GIB * 2**30 / props.total_memory))
    rows = []
    for size in sizes or SIZES:
        for ctx in contexts or CONTEXTS:
            for r in cell(torch, size, ctx):
                rows.append(r)
                attention = r["attention"]
                print(f"{size:6s} {ctx:5d} {attention:8s} " + (f"out of memory ({r['oom']})" if "oom" in r else
                      f"forward {r['forward ms']:8.2f} ms  step {r['step ms']:8.2f} ms  peak {r['peak GiB']:5.1f} GiB"),
                      flush=True)
    meta = {"gpu": props.name, "torch": torch.__version__, "batch": BATCH, "memory limit GiB": H100_GIB, "rounds": ROUNDS,
            "optimizer": "AdamW(fused=True)",
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if out_dir:
        stem = f"lm_grid_{slug(props.name)}_bfloat16"
        write_results(out_dir, stem, meta, rows, markdown(meta, rows))
        plot(out_dir, stem, rows)
    return rows


def get(rows, size, ctx, attention):
    return next((r for r in rows if r["size"] == size and r["context"] == ctx and r["attention"] == attention), None)


def fmt_ms(r, key):
    return "OOM" if r is None or "oom" in r and key not in r else f"{r[key]:.1f}" if key in r else "OOM"


def step_kernel_ms(r):
    """GPU time of a row's profiled step (its kernels in the forward, backward and optimizer passes), or None."""
    prof = (r or {}).get("profile")
    if not prof:
        return None
    return sum(prof[p]["ms"] for p in ("forward", "backward", "optimizer") if p in prof) or None


def markdown(meta, rows):
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    ctxs = sorted({r["context"] for r in rows})
    md = [f"# Transformer-LM grid — {meta['gpu']}", "",
          f"torch {meta['torch']}, bf16 weights, batch {meta['batch']}, AdamW (fused); memory capped at "
          f"{meta['memory limit GiB']} GiB (an 80 GB H100). Forward: inference, no grad. Step: forward + backward + "
          "optimizer. One model per cell, its attention switched between turns; ms per call: the median of "
          f"{meta.get('rounds', ROUNDS)} rounds of 5 calls back to back, the attentions taking turns in alternating "
          "order (CUDA events; the host queues ahead as in a training loop) after a warm-up. OOM: out of memory under "
          "the cap. Profiles (one forward and one step per cell, flashsci.profile) only for cells whose step fits.", "",
          *([meta["note"], ""] if meta.get("note") else []),
          "## Time (ms) and flashsci's speedup over SDPA", "",
          "Step kernels: the GPU time of the step's kernels in the profile (forward + backward + optimizer), which the "
          "step's wall-clock time exceeds where the host's per-op launch work, not the GPU, sets the pace (eager "
          "PyTorch at batch 4: the small and medium models up to 1024 tokens, large and xl at 128-256).", "",
          "| size | context | forward naive / SDPA / flashsci | speedup | step naive / SDPA / flashsci | speedup | "
          "step kernels SDPA / flashsci | speedup | peak GiB naive / SDPA / flashsci |", "|---|---|---|---|---|---|---|---|---|"]
    for size in sizes:
        for ctx in ctxs:
            n, s, f = (get(rows, size, ctx, a) for a in ATTENTION)
            sp = lambda k: (f"{s[k] / f[k]:.2f}x" if s and f and k in s and k in f else "—")
            ks, kf = step_kernel_ms(s), step_kernel_ms(f)
            kernels = f"{ks:.1f} / {kf:.1f} | {ks / kf:.2f}x" if ks and kf else "— | —"
            md.append(f"| {size} | {ctx} | {fmt_ms(n, 'forward ms')} / {fmt_ms(s, 'forward ms')} / {fmt_ms(f, 'forward ms')} "
                      f"| {sp('forward ms')} | {fmt_ms(n, 'step ms')} / {fmt_ms(s, 'step ms')} / {fmt_ms(f, 'step ms')} | "
                      f"{sp('step ms')} | {kernels} | {fmt_ms(n, 'peak GiB')} / {fmt_ms(s, 'peak GiB')} / {fmt_ms(f, 'peak GiB')} |")
    md += ["", "## Inside the attention (inference forward, kernel ms from the profile)", "",
           "Naive: the softmax's time against the two matmuls' (q·kᵀ and p·v); flashsci: its whole fused attention "
           "against the naive softmax + matmuls.", "",
           "| size | context | naive softmax ms | naive matmul ms | softmax / matmul | flashsci attention ms | "
           "naive softmax + matmul / flashsci | attention share of the step: SDPA / flashsci |",
           "|---|---|---|---|---|---|---|---|"]
    for size in sizes:
        for ctx in ctxs:
            n, s, f = (get(rows, size, ctx, a) for a in ATTENTION)
            na = (n.get("profile") or {}).get("inference attention") if n else None
            fa = (f.get("profile") or {}).get("inference attention") if f else None

            def share(r):
                if not r or not r.get("profile"):
                    return "—"
                tot = sum(r["profile"][p]["ms"] for p in ("forward", "backward", "optimizer") if p in r["profile"])
                att = sum(r["profile"][p]["categories"]["attention"] for p in ("forward", "backward") if p in r["profile"])
                return f"{100 * att / tot:.0f}%" if tot else "—"
            if na:
                ratio = f"{na['softmax_ms'] / na['matmul_ms']:.0%}" if na["matmul_ms"] else "—"
                fused = (f"{fa['fused_ms']:.2f} | {(na['softmax_ms'] + na['matmul_ms']) / fa['fused_ms']:.2f}x"
                         if fa and fa["fused_ms"] else "— | —")
                md.append(f"| {size} | {ctx} | {na['softmax_ms']:.2f} | {na['matmul_ms']:.2f} | {ratio} | {fused} | "
                          f"{share(s)} / {share(f)} |")
            else:
                md.append(f"| {size} | {ctx} | OOM | OOM | — | {fa['fused_ms']:.2f} | — | {share(s)} / {share(f)} |"
                          if fa else f"| {size} | {ctx} | OOM | OOM | — | — | — | {share(s)} / {share(f)} |")
    md += ["", "## GEMM fraction per pass and the top non-GEMM kernel (SDPA / flashsci)", "",
           "| size | context | inference | training forward | training backward | top non-GEMM kernel, flashsci backward |",
           "|---|---|---|---|---|---|"]
    for size in sizes:
        for ctx in ctxs:
            s, f = get(rows, size, ctx, "sdpa"), get(rows, size, ctx, "flashsci")
            if not (s and f and s.get("profile") and f.get("profile")):
                continue
            frac = lambda p: f"{100 * s['profile'][p]['gemm_fraction']:.0f}% / {100 * f['profile'][p]['gemm_fraction']:.0f}%"
            top = (f["profile"]["backward"]["top_non_gemm"] or "—")[:60].replace("|", "/")
            md.append(f"| {size} | {ctx} | {frac('inference')} | {frac('forward')} | {frac('backward')} | `{top}` |")
    return "\n".join(md) + "\n"


def plot(out_dir, stem, rows):
    """Training-step speedup of flashsci over SDPA against context, one line per size."""
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, size in enumerate(dict.fromkeys(r["size"] for r in rows)):
        pts = []
        for ctx in sorted({r["context"] for r in rows}):
            s, f = get(rows, size, ctx, "sdpa"), get(rows, size, ctx, "flashsci")
            if s and f and "step ms" in s and "step ms" in f:
                pts.append((ctx, s["step ms"] / f["step ms"]))
        if pts:
            ax.plot(*zip(*pts), "o-", color=f"C{i}", label=size)
    ax.set_xscale("log", base=2)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("context")
    ax.set_ylabel("training step: SDPA time / flashsci time")
    ax.legend(fontsize=8)
    save_figure(plt, fig, out_dir, stem)
