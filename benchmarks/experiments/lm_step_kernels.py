"""One LM-grid training step kernel by kernel, SDPA model beside flashsci model: per pass (forward, backward), every
kernel name's total time and calls under torch.profiler, sorted by time, with its category; then the per-category
difference (flashsci - SDPA); and where the GPU waits: each model's step by CUDA events against the host's time to
queue it (no sync), and the profiled step's idle time between kernels per pass with its largest gaps. Shows where a
cell's step time goes that the grid's category table sums up. --power N: first N steps back to back per model, two
rounds in turns, with the GPU's energy and mean SM clock (NVML) over each run: whether the step is power-bound.
    python benchmarks/experiments/lm_step_kernels.py [--size large] [--context 4096] [--top 25] [--power 10]"""
import argparse
import time
from collections import defaultdict

import torch

from flashsci.bench.lm_grid import BATCH, set_attention
from flashsci.bench.nvml import ClockSampler, Nvml
from flashsci.bench.models.lm import LM, VOCAB
from flashsci.profile.categories import CATEGORIES, category
from flashsci.profile.report import select, short
from flashsci.profile.trace import capture

ap = argparse.ArgumentParser()
ap.add_argument("--size", default="large")
ap.add_argument("--context", type=int, default=4096)
ap.add_argument("--top", type=int, default=25)
ap.add_argument("--power", type=int, default=0, help="steps per run of the energy and clock turns (0: none)")
args = ap.parse_args()

torch.manual_seed(0)
with torch.device("cuda"):
    model = LM(args.size, "sdpa").bfloat16()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
ids = torch.randint(VOCAB, (BATCH, args.context + 1), device="cuda")
rf = torch.profiler.record_function


def step():
    with rf("forward"):
        loss = model.loss(ids)
    with rf("backward"):
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def idle(kernels, top=6):
    """GPU time between kernels (launch order by start), and the largest gaps with the kernel that follows each."""
    ks = sorted(kernels, key=lambda k: k["start"])
    gaps = [(b["start"] - (a["start"] + a["us"]), b["name"]) for a, b in zip(ks, ks[1:])]
    return sum(g for g, _ in gaps if g > 0) / 1e3, sorted(gaps, reverse=True)[:top]


def power_turns(n, rounds=2):
    """n steps back to back per model, the models in turns: ms per step, J per step, W and mean SM MHz."""
    nvml = Nvml()
    for r in range(rounds):
        for attention in ("sdpa", "flashsci") if r % 2 == 0 else ("flashsci", "sdpa"):
            set_attention(model, attention)
            step()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with ClockSampler(nvml) as s:
                start.record()
                for _ in range(n):
                    step()
                end.record()
                end.synchronize()
            ms = start.elapsed_time(end)
            print(f"{attention:8s} round {r}: {ms / n:7.2f} ms a step, {s.joules / n:6.1f} J a step, "
                  f"{s.joules / ms * 1e3:5.0f} W, SM clock {s.mean_mhz:5.0f} MHz", flush=True)


print(torch.cuda.get_device_name(), args.size, args.context)
if args.power:
    power_turns(args.power)
per_cat = {}
for attention in ("sdpa", "flashsci"):
    set_attention(model, attention)
    step()
    step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    step()
    host = (time.perf_counter() - t0) * 1e3
    end.record()
    end.synchronize()
    print(f"\n{attention}: one step {start.elapsed_time(end):.2f} ms on the GPU, {host:.2f} ms to queue on the host")
    _, trace = capture(step)
    for label in ("forward", "backward"):
        kernels, _ = select(trace, label)
        ms, calls = defaultdict(float), defaultdict(int)
        for k in kernels:
            ms[k["name"]] += k["us"] / 1e3
            calls[k["name"]] += 1
        cats = defaultdict(float)
        for name, t in ms.items():
            cats[category(name)] += t
        per_cat[attention, label] = cats
        gpu_idle, gaps = idle(kernels)
        print(f"\n{attention} {label}: {sum(ms.values()):.2f} ms in {len(kernels)} kernels, GPU idle between them "
              f"{gpu_idle:.2f} ms (profiled); largest gaps: " +
              ", ".join(f"{g:.0f} us before {short(n, 40)}" for g, n in gaps))
        for name in sorted(ms, key=lambda n: -ms[n])[: args.top]:
            print(f"  {ms[name]:8.2f} ms {calls[name]:5d}x  {category(name):13s} {short(name, 110)}")
print("\nflashsci - sdpa, ms per category:")
for label in ("forward", "backward"):
    print(f"  {label:8s} " + "  ".join(f"{c} {per_cat['flashsci', label][c] - per_cat['sdpa', label][c]:+.2f}"
                                       for c in CATEGORIES))
