"""Benchmark of the differentiable fused linear layers against torch autograd (python -m flashsci.bench --sets
linear_train): forward + backward of one layer, the shapes of the protein models' feed-forward blocks at 16k tokens
(a fine-tuning batch):
- Linear + GELU (ESM2-3B fc1): torch.ops.flashsci.linear(x, w, b, "gelu") vs F.gelu(F.linear(x, w, b));
- Linear + bias (ESM2-3B fc2): torch.ops.flashsci.linear(x, w, b) vs F.linear(x, w, b);
- SwiGLU (ESM-C-600M, packed weight): torch.ops.flashsci.swiglu(x, w) vs one packed F.linear + chunk + F.silu * up,
  and vs two F.linear + F.silu * up (the faster is "torch").
Each step is torch.autograd.grad of the output against dy for x, the weights and the bias. Times by CUDA events
around back-to-back steps over input sets, the two sides taking turns (a graph cannot capture autograd's backward),
medians of 7 rounds; gradients compared with torch's.
"""
import math
import time

import flashsci
from flashsci.bench.results import fmt, md_table, slug, write_results
from flashsci.bench.timing import event_turns_us

M = 16384
# name, M, K, N, mode
SHAPES = [("ESM2-3B fc1", M, 2560, 10240, "gelu"), ("ESM2-3B fc2", M, 10240, 2560, "bias"),
          ("ESM2-650M fc1", M, 1280, 5120, "gelu"), ("ESM-C-600M ffn", M, 1152, 3072, "swiglu")]


def _steps(torch, mode):
    """(flashsci step, {torch variant: step}); a step maps (x, w, b, dy) to the gradients."""
    from flashsci import torch_ops as ops
    F = torch.nn.functional

    def step(fn):
        def run(x, w, b, dy):
            leaves = (x, w) if mode == "swiglu" else (x, w, b)
            return torch.autograd.grad(fn(x, w, b), leaves, dy)
        return run

    if mode == "swiglu":
        def packed(x, w, b):
            g, u = F.linear(x, w).chunk(2, dim=-1)
            return F.silu(g) * u

        def two(x, w, b):
            n = w.shape[0] // 2
            return F.silu(F.linear(x, w[:n])) * F.linear(x, w[n:])
        return step(lambda x, w, b: ops.swiglu(x, w)), {"packed F.linear+silu*mul": step(packed), "2 F.linear+silu*mul": step(two)}
    if mode == "gelu":
        return step(lambda x, w, b: ops.linear(x, w, b, "gelu")), {"F.gelu(F.linear)": step(lambda x, w, b: F.gelu(F.linear(x, w, b)))}
    return step(lambda x, w, b: ops.linear(x, w, b)), {"F.linear": step(lambda x, w, b: F.linear(x, w, b))}


def run_linear_train(dtype_name, out_dir):
    import torch
    dtype = getattr(torch, dtype_name)
    props = torch.cuda.get_device_properties(0)
    print(f"GPU: {props.name}; torch {torch.__version__}; dtype {dtype_name}", flush=True)
    rows = []
    for name, m, k, n, mode in SHAPES:
        n_w = 2 * n if mode == "swiglu" else n
        inputs = [(torch.randn(m, k, device="cuda", dtype=dtype).requires_grad_(),
                   (torch.randn(n_w, k, device="cuda", dtype=dtype) / math.sqrt(k)).requires_grad_(),
                   torch.randn(n, device="cuda", dtype=dtype).requires_grad_(),
                   torch.randn(m, n, device="cuda", dtype=dtype)) for _ in range(2)]
        ours, variants = _steps(torch, mode)
        g_ours, g_torch = ours(*inputs[0]), next(iter(variants.values()))(*inputs[0])
        diff = max((a.float() - b.float()).abs().max().item() / max(b.float().abs().max().item(), 1e-30)
                   for a, b in zip(g_ours, g_torch))
        times = event_turns_us(torch, {"flashsci": ours, **variants}, inputs)
        ours_us = times.pop("flashsci")
        best = min(times, key=times.get)
        fl = 3 * 2.0 * m * n_w * k  # forward and two backward products
        row = {"shape": name, "M": m, "K": k, "N": n, "mode": mode, "dtype": dtype_name, "flashsci_us": ours_us,
               "torch": times, "torch_best": best, "torch_best_us": times[best], "speedup_vs_torch_best": times[best] / ours_us,
               "flashsci_tflops": fl / ours_us / 1e6, "torch_best_tflops": fl / times[best] / 1e6,
               "max_rel_grad_diff_vs_torch": diff}
        rows.append(row)
        print(" | ".join(_cells(row)), flush=True)
        del inputs, g_ours, g_torch
        torch.cuda.empty_cache()
    meta = {"gpu": props.name, "torch": torch.__version__, "flashsci_build": flashsci.build_info(), "dtype": dtype_name,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if out_dir:
        write_results(out_dir, f"linear_train_{slug(props.name)}_{dtype_name}", meta, rows, _markdown(rows, meta))
    return rows


COLS = ["shape", "M", "K", "N", "mode", "flashsci us", "TF/s", "torch best", "torch us", "torch TF/s", "speedup",
        "max grad diff (rel.)"]


def _cells(r):
    return [r["shape"], str(r["M"]), str(r["K"]), str(r["N"]), r["mode"], fmt(r["flashsci_us"]), fmt(r["flashsci_tflops"]),
            r["torch_best"], fmt(r["torch_best_us"]), fmt(r["torch_best_tflops"]), fmt(r["speedup_vs_torch_best"], ".3f"),
            f"{r['max_rel_grad_diff_vs_torch']:.1e}"]


def _markdown(rows, meta):
    lines = [f"# differentiable linear / SwiGLU, forward + backward, vs torch autograd — {meta['gpu']}", "",
             f"torch {meta['torch']}, dtype {meta['dtype']}, {meta['date']}. One step = forward and "
             "torch.autograd.grad for x, weight (and bias); CUDA events around back-to-back steps, flashsci and torch "
             "taking turns, medians of 7 rounds; speedup = torch / flashsci; TF/s = 3 · 2·M·N·K / time (SwiGLU: N = "
             "2 × the output width); grad diff = max |flashsci − torch| / max |torch| over the gradients.", ""]
    lines += md_table(COLS, [_cells(r) for r in rows])
    return "\n".join(lines) + "\n"
