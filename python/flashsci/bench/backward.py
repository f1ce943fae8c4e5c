"""Benchmark of the attention backward against torch (python -m flashsci.bench --sets backward).

- sweep: B * S = 16384, H * D = 2048, D = 64 and 128, causal and not: flashsci.attention_backward (and its
  deterministic=True run, against the default) against the backward of SDPA's FlashAttention-2 backend and of its cuDNN
  backend (torch.autograd.grad of an output whose forward ran on that backend, retain_graph, so the backward alone is
  timed); the protein shapes ESM2-3B (8, 40, 1024, 64), ESM-C-600M (8, 18, 1024, 64) and ProtT5-XL (8, 32, 1024, 128)
  likewise; and one training step's attention (forward + backward) against SDPA's cuDNN backend.
- t5: ProtT5-XL's heads with the T5 bias, with its table's gradient and frozen, against SDPA with the bias
  materialised (and its gradient), against the portable kernel forced, and the step.
- varlen: ESM2-3B heads on 16k-token batches of real UniProt lengths (random order): attention_varlen_backward on the
  packed batch against SDPA's backward on the same batch padded, with the key padding mask, and (torch 2.10+) against
  the backward of torch's varlen_attn on the packed batch (FlashAttention-2's varlen kernels), each in its own pair.
- backward_portable (python -m flashsci.bench --sets backward_portable): sweep, protein shapes and varlen as above with
  flashsci's portable (sm80, mma.sync) kernels forced, forward and backward, as on GPUs the Hopper kernels do not
  cover.
TF/s count 2.5x the forward's FLOPs (FlashAttention's convention: 4 B H Sq Sk D forward, half for causal). Kernel times
by CUDA events around back-to-back calls over input sets larger than L2 (torch's autograd backward cannot be captured
in a graph on its own), medians, flashsci in a pair of turns with each torch variant.
"""
import itertools
import random
import time

import flashsci
from flashsci.bench.proteins import read_lengths, token_batches
from flashsci.bench.results import slug, write_plot, write_results
from flashsci.bench.timing import event_turns_us, flops

SWEEP = [(16384 // s, 2048 // d, s, d) for d in (64, 128) for s in (512, 1024, 2048, 4096, 8192)]
PROTEIN = [("ESM2-3B", (8, 40, 1024, 64)), ("ESM-C-600M", (8, 18, 1024, 64)), ("ProtT5-XL", (8, 32, 1024, 128))]


def backward_sets(torch, b, h, s, d, dtype, causal, backends, n_sets=2):
    """Rotating input sets: (q, k, v, dout, out, lse) for flashsci and, per torch backend, the outputs whose
    backward torch runs ({name: (out, (q, k, v))}); n_sets x 5 tensors of B H S D exceed the L2 from 1k tokens."""
    from torch.nn.attention import sdpa_kernel
    F = torch.nn.functional
    sets = []
    for _ in range(n_sets):
        q, k, v, dout = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(4))
        out, lse = flashsci.attention(q, k, v, causal=causal, return_lse=True)
        theirs = {}
        for name, be in backends.items():
            leaves = tuple(x.detach().requires_grad_() for x in (q, k, v))
            try:
                with sdpa_kernel(be):
                    theirs[name] = (F.scaled_dot_product_attention(*leaves, is_causal=causal), leaves)
            except RuntimeError:
                theirs[name] = None
        sets.append((q, k, v, dout, out, lse, theirs))
    return sets


def torch_backward(torch, name):
    """The timed torch call: the backward of the saved forward of backend `name`."""
    def fn(q, k, v, dout, out, lse, theirs):
        if theirs[name] is None:
            raise RuntimeError(f"SDPA backend {name} does not take these inputs")
        o, leaves = theirs[name]
        return torch.autograd.grad(o, leaves, dout, retain_graph=True)
    return fn


def bench_step(torch, sets, causal, backend):
    """One training step's attention, forward and backward, flashsci against SDPA's cuDNN backend (the forward
    recorded by autograd on the saved leaves, then torch.autograd.grad), in their own pair."""
    from torch.nn.attention import sdpa_kernel
    if sets[0][6]["cudnn"] is None:
        return {"step flashsci us": None, "step cudnn us": None, "step speedup vs cudnn": None}

    def ours(q, k, v, dout, out, lse, theirs):
        o, m = flashsci.attention(q, k, v, causal=causal, return_lse=True)
        return flashsci.attention_backward(dout, q, k, v, o, m, causal=causal)

    def cudnn(q, k, v, dout, out, lse, theirs):
        leaves = theirs["cudnn"][1]
        with sdpa_kernel(backend):
            o = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
        return torch.autograd.grad(o, leaves, dout)
    t = event_turns_us(torch, {"fs": ours, "cudnn": cudnn}, sets)
    return {"step flashsci us": t["fs"], "step cudnn us": t["cudnn"], "step speedup vs cudnn": t["cudnn"] / t["fs"]}


def bench_dense(torch, dtype, causal, label, b, h, s, d):
    from torch.nn.attention import SDPBackend
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    sets = backward_sets(torch, b, h, s, d, dtype, causal, backends)
    fs = lambda q, k, v, dout, out, lse, theirs: flashsci.attention_backward(dout, q, k, v, out, lse, causal=causal)
    pairs = {}
    for n in backends:
        if sets[0][6][n] is None:
            pairs[n] = (event_turns_us(torch, {"fs": fs}, sets)["fs"], None)
        else:
            t = event_turns_us(torch, {"fs": fs, n: torch_backward(torch, n)}, sets)
            pairs[n] = (t["fs"], t[n])
    bwd_flops = 2.5 * flops(b, h, s, s, d, causal)
    row = {"set": label, "B": b, "H": h, "S": s, "D": d, "causal": causal}
    for n in backends:
        fs_t, t = pairs[n]
        row[f"flashsci us (vs {n})"] = fs_t
        row[f"{n} us"] = t
        row[f"{n} TF/s"] = bwd_flops / t / 1e6 if t else None
        row[f"speedup vs {n}"] = t / fs_t if t else None
    row["flashsci TF/s"] = bwd_flops / pairs["flash"][0] / 1e6
    det = lambda q, k, v, dout, out, lse, theirs: flashsci.attention_backward(dout, q, k, v, out, lse, causal=causal,
                                                                              deterministic=True)
    t = event_turns_us(torch, {"fs": fs, "det": det}, sets)
    row["deterministic us"] = t["det"]
    row["deterministic / default"] = t["det"] / t["fs"]
    row.update(bench_step(torch, sets, causal, backends["cudnn"]))
    q, k, v, dout, out, lse, theirs = sets[0]
    mine = fs(*sets[0])
    ref = torch_backward(torch, "flash")(*sets[0]) if theirs["flash"] else None
    row["max diff vs flash"] = max((a.float() - r.float()).abs().max().item() for a, r in zip(mine, ref)) if ref else None
    del sets
    torch.cuda.empty_cache()
    return row


def _sdpa_with_bias(torch, backends, q, k, v, bias, dout):
    """SDPA's forward on the first backend of backends that also runs its backward with this bias (grad or not):
    (backend name, backend, output, leaves)."""
    from torch.nn.attention import sdpa_kernel
    for name, be in backends:
        leaves = tuple(x.detach().requires_grad_() for x in (q, k, v)) + (bias,)
        try:
            with sdpa_kernel(be):
                o = torch.nn.functional.scaled_dot_product_attention(*leaves[:3], attn_mask=bias, scale=1.0)
            torch.autograd.grad(o, [x for x in leaves if x.requires_grad], dout, retain_graph=True)
        except RuntimeError:
            continue
        return name, be, o, leaves
    raise RuntimeError("no SDPA backend takes this bias")


def bench_t5(torch, dtype, b=8, h=32, s=1024, d=128):
    """ProtT5-XL's heads with their T5 bias (32 buckets, max_distance 128, bidirectional, scale 1), two rows: with the
    table's gradient (t5_grad, full fine-tuning) against SDPA's backward with the bias materialised as (1, H, S, S) in
    the input dtype and its gradient (cuDNN, or the efficient backend where cuDNN refuses it; the table's reduction from
    that gradient not timed), and with the table frozen (LoRA) against SDPA's with the bias not needing one; each also
    against flashsci's portable kernel forced, and one training step's attention (forward + backward), in own pairs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from flashsci.bench.features import t5_table_bias
    F = torch.nn.functional
    table = torch.randn(h, 32, device="cuda")
    kw = dict(scale=1.0, t5_bias=(table, 32, 128, True))
    bias = t5_table_bias(torch, table, s).to(dtype)
    backends = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    rows = []
    for grad in (True, False):
        leaf = bias.detach().requires_grad_(grad)
        sets = []
        for _ in range(2):
            q, k, v, dout = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(4))
            out, lse = flashsci.attention(q, k, v, return_lse=True, **kw)
            name, be, o, leaves = _sdpa_with_bias(torch, backends, q, k, v, leaf, dout)
            sets.append((q, k, v, dout, out, lse, (o, [x for x in leaves if x.requires_grad], leaves)))

        def ours(q, k, v, dout, out, lse, theirs):
            return flashsci.attention_backward(dout, q, k, v, out, lse, t5_grad=grad, **kw)

        def portable(*x):
            flashsci._flashsci._set_attention_kernel("sm80")
            try:
                return ours(*x)
            finally:
                flashsci._flashsci._set_attention_kernel("auto")

        def theirs_bwd(q, k, v, dout, out, lse, theirs):
            return torch.autograd.grad(theirs[0], theirs[1], dout, retain_graph=True)

        def ours_step(q, k, v, dout, out, lse, theirs):
            o, m = flashsci.attention(q, k, v, return_lse=True, **kw)
            return flashsci.attention_backward(dout, q, k, v, o, m, t5_grad=grad, **kw)

        def theirs_step(q, k, v, dout, out, lse, theirs, be=be):
            leaves = theirs[2]
            with sdpa_kernel(be):
                o = F.scaled_dot_product_attention(*leaves[:3], attn_mask=leaves[3], scale=1.0)
            return torch.autograd.grad(o, theirs[1], dout)
        t = event_turns_us(torch, {"fs": ours, "torch": theirs_bwd}, sets)
        tp = event_turns_us(torch, {"fs": ours, "portable": portable}, sets)
        ts = event_turns_us(torch, {"fs": ours_step, "torch": theirs_step}, sets)
        bwd_flops = 2.5 * flops(b, h, s, s, d, False)
        rows.append({"set": "t5", "label": "ProtT5-XL + T5, " + ("table gradient" if grad else "table frozen"),
                     "B": b, "H": h, "S": s, "D": d, "causal": False, "table gradient": grad, "torch backend": name,
                     "flashsci us": t["fs"], "flashsci TF/s": bwd_flops / t["fs"] / 1e6, "torch us": t["torch"],
                     "torch TF/s": bwd_flops / t["torch"] / 1e6, "speedup vs torch": t["torch"] / t["fs"],
                     "flashsci us (vs portable)": tp["fs"], "portable us": tp["portable"],
                     "speedup vs portable": tp["portable"] / tp["fs"], "step flashsci us": ts["fs"],
                     "step torch us": ts["torch"], "step speedup vs torch": ts["torch"] / ts["fs"]})
        del sets
        torch.cuda.empty_cache()
    return rows


def bench_varlen(torch, dtype, lengths, n_batches=4):
    F = torch.nn.functional
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:     # torch before 2.10
        varlen_attn = None
    h, d = 40, 64
    capped = [min(n, 4096) for n in lengths]
    random.Random(0).shuffle(capped)
    rows = []
    for i, lens in enumerate(token_batches(capped)[:n_batches]):
        b, s, total = len(lens), max(lens), sum(lens)
        cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
        q, k, v, dout = (torch.randn(total, h, d, device="cuda", dtype=dtype) for _ in range(4))
        out, lse = flashsci.attention_varlen(q, k, v, cu, cu, s, s, return_lse=True)
        padded = []
        for x in (q, k, v, dout):   # the same batch padded to (B, H, S, D)
            y = torch.zeros(b, s, h, d, device="cuda", dtype=dtype)
            for j, (lo, hi) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
                y[j, : hi - lo] = x[lo:hi]
            padded.append(y.transpose(1, 2))
        keep = (torch.arange(s, device="cuda")[None, :] < torch.tensor(lens, device="cuda")[:, None])[:, None, None, :]
        leaves = tuple(x.detach().requires_grad_() for x in padded[:3])
        o = F.scaled_dot_product_attention(*leaves, attn_mask=keep)
        vleaves = tuple(x.detach().requires_grad_() for x in (q, k, v))
        ov = None
        if varlen_attn:
            try:
                ov = varlen_attn(*vleaves, cu, cu, s, s)
            except RuntimeError as e:   # e.g. a GPU its FlashAttention-2 build does not cover: the row says so
                print(f"varlen batch {i}: torch's varlen_attn failed ({e}); no comparison with it", flush=True)
        # one input set: (q, k, v, dout, out, lse) packed, then SDPA's (padded dout, output, leaves), then varlen_attn's
        sets = [(q, k, v, dout, out, lse, padded[3], o, leaves, ov, vleaves)]
        fs = lambda q, k, v, dout, out, lse, *_: flashsci.attention_varlen_backward(dout, q, k, v, out, lse, cu, cu, s, s)
        sd = lambda *x: torch.autograd.grad(x[7], x[8], x[6], retain_graph=True)
        vl = lambda *x: torch.autograd.grad(x[9], x[10], x[3], retain_graph=True)
        t = event_turns_us(torch, {"fs": fs, "sdpa": sd}, sets)
        fs_t, t = t["fs"], t["sdpa"]
        tv = event_turns_us(torch, {"fs": fs, "varlen": vl}, sets) if ov is not None else None
        useful = 2.5 * 4.0 * h * d * sum(n * n for n in lens)
        rows.append({"set": "varlen", "batch": i, "B": b, "S": s, "tokens": total, "D": d, "H": h, "causal": False,
                     "flashsci us": fs_t, "sdpa+mask us": t, "speedup vs sdpa+mask": t / fs_t,
                     "flashsci TF/s": useful / fs_t / 1e6,
                     "varlen_attn us": tv["varlen"] if tv else None,
                     "speedup vs varlen_attn": tv["varlen"] / tv["fs"] if tv else None})
        print(f"varlen batch {i}: {b}x{s} ({total} tokens): flashsci {fs_t:.1f} us, SDPA+mask {t:.1f} us -> {t / fs_t:.2f}x"
              + (f"; varlen_attn {tv['varlen']:.1f} us -> {tv['varlen'] / tv['fs']:.2f}x" if tv else ""), flush=True)
        del sets, padded, leaves, o, vleaves, ov
        torch.cuda.empty_cache()
    return rows


def run_backward(dtype_name, out_dir, fasta=None, portable=False):
    """The sets above (portable: flashsci's portable kernels forced for every call, no T5 rows), written as
    backward[_portable]_<gpu>_<dtype>.json/.md/.png under out_dir."""
    import torch
    dtype = getattr(torch, dtype_name)
    props = torch.cuda.get_device_properties(0)
    print(f"GPU: {props.name}; torch {torch.__version__}; dtype {dtype_name}{'; portable kernels forced' * portable}",
          flush=True)
    flashsci._flashsci._set_attention_kernel("sm80" if portable else "auto")
    try:
        rows, path = _run_backward_sets(torch, dtype, fasta, portable)
    finally:
        flashsci._flashsci._set_attention_kernel("auto")
    meta = {"gpu": props.name, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "dtype": dtype_name,
            "fasta": path, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "portable": portable}
    if out_dir:
        stem = f"backward{'_portable' * portable}_{slug(props.name)}_{dtype_name}"
        write_results(out_dir, stem, meta, rows, _markdown(rows, meta))
        dense = [r for r in rows if r["set"] not in ("varlen", "t5")]
        write_plot(out_dir, stem, f"attention backward{' (portable kernels)' * portable} on {props.name}, {dtype_name}",
                   [f"{r['B']}x{r['H']}x{r['S']}x{r['D']}{' c' if r['causal'] else ''}" for r in dense],
                   {"vs FA2 (SDPA flash)": [r["speedup vs flash"] for r in dense],
                    "vs cuDNN": [r["speedup vs cudnn"] for r in dense]}, "torch time / flashsci time")
    return rows


def _run_backward_sets(torch, dtype, fasta, portable):
    """The rows of every set and the FASTA file's path."""
    rows = []

    def add(row):
        rows.append(row)
        print(" ".join(f"{key}={val:.4g}" if isinstance(val, float) else f"{key}={val}" for key, val in row.items()),
              flush=True)
    for (label, shape), causal in itertools.chain(((("sweep", c), cz) for c in SWEEP for cz in (False, True)),
                                                  ((p, False) for p in PROTEIN)):
        add(bench_dense(torch, dtype, causal, label, *shape))
    if not portable:    # the T5 rows time the portable kernel themselves
        for row in bench_t5(torch, dtype):
            add(row)
    path, lengths = read_lengths(fasta)
    return rows + bench_varlen(torch, dtype, lengths), path


def _f(x, spec=".1f"):
    return "—" if x is None else format(x, spec)


def _markdown(rows, meta):
    portable = meta.get("portable")
    out = [f"# flashsci attention backward{' (portable kernels)' * portable} vs torch — {meta['gpu']}", "",
           *(["flashsci's portable (sm80, mma.sync) kernels forced for every call, forward and backward, as on GPUs "
              "the Hopper kernels do not cover.", ""] if portable else []),
           f"torch {meta['torch']}, cuDNN {meta['cudnn']}, {meta['dtype']}, {meta['date']}. Backward alone (µs, CUDA "
           "events, median); TF/s with 2.5x the forward FLOPs. flashsci is timed in a pair with each torch backend; "
           "speedup = torch time / flashsci time within the pair.", "",
           "deterministic=True is timed in its own pair with the default; its column is its time over the default's. "
           "Step: one training step's attention, forward + backward, against SDPA's cuDNN backend in its own pair.",
           "",
           "| set | B×H×S×D | causal | flashsci µs | TF/s | FA2 µs | FA2 TF/s | vs FA2 | cuDNN µs | cuDNN TF/s | vs cuDNN | "
           "deterministic | step vs cuDNN |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["set"] in ("varlen", "t5"):
            continue
        out.append(f"| {r['set']} | {r['B']}×{r['H']}×{r['S']}×{r['D']} | {'yes' if r['causal'] else 'no'} | "
                   f"{r['flashsci us (vs flash)']:.1f} | {r['flashsci TF/s']:.0f} | {_f(r['flash us'])} | "
                   f"{_f(r['flash TF/s'], '.0f')} | {_f(r['speedup vs flash'], '.2f')}× | {_f(r['cudnn us'])} | "
                   f"{_f(r['cudnn TF/s'], '.0f')} | {_f(r['speedup vs cudnn'], '.2f')}× | "
                   f"{r['deterministic / default']:.2f}× | {_f(r.get('step speedup vs cudnn'), '.2f')}× |")
    t5 = [r for r in rows if r["set"] == "t5"]
    if t5:
        out += ["", "ProtT5-XL's heads with the T5 bias (32 buckets, max_distance 128; scale 1): flashsci's backward "
                "against SDPA's with the bias materialised (1, H, S, S) (with the table's gradient: the bias's "
                "gradient, the table's reduction from it not timed), against flashsci's portable kernel forced, and "
                "one training step's attention (forward + backward), each in its own pair:", "",
                "| B×H×S×D | table | SDPA backend | flashsci µs | TF/s | SDPA µs | TF/s | speedup | portable µs | "
                "Hopper / portable | step µs | SDPA step µs | step speedup |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in t5:
            out.append(f"| {r['B']}×{r['H']}×{r['S']}×{r['D']} | {'gradient' if r['table gradient'] else 'frozen'} | "
                       f"{r['torch backend']} | {r['flashsci us']:.1f} | {r['flashsci TF/s']:.0f} | "
                       f"{r['torch us']:.1f} | {r['torch TF/s']:.0f} | {r['speedup vs torch']:.2f}× | "
                       f"{r['portable us']:.1f} | "
                       f"{r['speedup vs portable']:.2f}× | {r['step flashsci us']:.1f} | {r['step torch us']:.1f} | "
                       f"{r['step speedup vs torch']:.2f}× |")
    out += ["", f"Packed varlen backward, ESM2-3B heads (H=40, D=64), 16k-token batches of {meta['fasta']} (random "
            "order, lengths capped at 4096), against SDPA's backward on the padded batch with the key padding mask and "
            "against torch's varlen_attn backward on the packed batch (FlashAttention-2), each in its own pair; all: "
            "the batches together (their times summed):", "",
            "| batch | B×S | tokens | flashsci µs | useful TF/s | SDPA+mask µs | speedup | varlen_attn µs | speedup |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["set"] == "varlen":
            vs = r.get("speedup vs varlen_attn")
            out.append(f"| {r['batch']} | {r['B']}×{r['S']} | {r['tokens']} | {r['flashsci us']:.1f} | "
                       f"{r['flashsci TF/s']:.0f} | {r['sdpa+mask us']:.1f} | {r['speedup vs sdpa+mask']:.2f}× | "
                       f"{_f(r.get('varlen_attn us'))} | {_f(vs, '.2f')}{'×' if vs else ''} |")
    packed = [r for r in rows if r["set"] == "varlen"]
    if len(packed) > 1:   # the batches together: the length mix's throughput
        fs, sd = sum(r["flashsci us"] for r in packed), sum(r["sdpa+mask us"] for r in packed)
        useful = sum(r["flashsci TF/s"] * r["flashsci us"] for r in packed)
        vl = [r for r in packed if r.get("speedup vs varlen_attn")]
        vl_cell = "| |"
        if len(vl) == len(packed):   # flashsci's time in the varlen_attn pairs: their time / the speedup
            t = sum(r["varlen_attn us"] for r in vl)
            vl_cell = f"{t:.1f} | {t / sum(r['varlen_attn us'] / r['speedup vs varlen_attn'] for r in vl):.2f}× |"
        out.append(f"| all | | {sum(r['tokens'] for r in packed)} | {fs:.1f} | {useful / fs:.0f} | {sd:.1f} | "
                   f"{sd / fs:.2f}× | {vl_cell}")
    return "\n".join(out) + "\n"
