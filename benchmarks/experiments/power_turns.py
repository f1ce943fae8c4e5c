"""Time and energy per call of flashsci and SDPA's backends taking turns on one attention shape, as the recorded
benchmark times them (CUDA-graph replays over rotating input sets), with the GPU's energy counter and SM clock read
through NVML (ctypes, libnvidia-ml) around and during each turn. The H100 runs these shapes at its 700 W cap; with
--order and --warm this found that a turn right after the efficient backend's runs 3-4% slower, and that one
untimed replay opening each turn removes that (docs/performance.md). At turns of ~0.2 s NVML's energy
and clock figures lag into the neighbouring turns: read them as rough, the times as the measurement. With --backward,
the backward (bf16) of flashsci, SDPA's cuDNN and FlashAttention-2 in turns of back-to-back calls (autograd's backward
cannot be captured), --causal for causal attention.
    python benchmarks/experiments/power_turns.py --shape 1,16,16384,128 [--mix all|cudnn] [--order sdpa,flashsci,...] [--warm 1] [--rounds 5]
    python benchmarks/experiments/power_turns.py --backward --shape 4,16,4096,128 [--causal]"""
import argparse
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashsci
from flashsci.bench.nvml import ClockSampler, Nvml
from flashsci.bench.timing import attention_input_sets, capture_graph, with_backend

F = torch.nn.functional


def turn(nvml, graph, calls, replays, warm):
    """Replays of one graph after `warm` untimed ones: (us per call, J per call, mean SM MHz sampled every 5 ms)."""
    for _ in range(warm):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with ClockSampler(nvml) as s:
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
    n = calls * replays
    return start.elapsed_time(end) * 1e3 / n, s.joules / n, s.mean_mhz


def backward_turn(nvml, fn, inputs, calls):
    """`calls` back-to-back backward calls over the rotating inputs after one untimed call: (us, J, mean SM MHz)."""
    fn(*inputs[0])
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with ClockSampler(nvml) as s:
        start.record()
        for i in range(calls):
            fn(*inputs[i % len(inputs)])
        end.record()
        end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls, s.joules / calls, s.mean_mhz


def backward_fns(causal):
    """flashsci's backward and torch's (cuDNN, FlashAttention-2) on the saved forwards of backward_sets."""
    from flashsci.bench.backward import torch_backward
    fs = lambda q, k, v, dout, out, lse, theirs: flashsci.attention_backward(dout, q, k, v, out, lse, causal=causal)
    return {"flashsci": fs, "cudnn": torch_backward(torch, "cudnn"), "flash": torch_backward(torch, "flash")}


def main_backward(args, b, h, s, d):
    from flashsci.bench.backward import backward_sets
    from flashsci.bench.timing import flops
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    inputs = backward_sets(torch, b, h, s, d, torch.bfloat16, args.causal, backends)
    fns = backward_fns(args.causal)
    if args.order:
        fns = {name: fns[name] for name in args.order.split(",")}
    f = 2.5 * flops(b, h, s, s, d, args.causal)
    calls = max(20, int(0.3 / (f / 400e12)))  # turns of about 0.3 s at 400 TF/s
    nvml = Nvml()
    rows = {name: [] for name in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            rows[name].append(backward_turn(nvml, fn, inputs, calls))
    print(f"{torch.cuda.get_device_name()}  {b}x{h}x{s}x{d} bf16 backward, causal={args.causal}, {args.rounds} rounds "
          "of ~0.3 s turns (medians over rounds)")
    print(f"{'kernel':>10} {'us/call':>9} {'J/call':>8} {'SM MHz':>7} {'TF/s':>7} {'GFLOP/J':>8} {'kcycles/call':>13}")
    for name, r in rows.items():
        us, j, mhz = (statistics.median(x[i] for x in r) for i in range(3))
        print(f"{name:>10} {us:9.1f} {j:8.3f} {mhz:7.0f} {f / us / 1e6:7.1f} {f / j / 1e9:8.1f} {us * mhz / 1e3:13.1f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1,16,16384,128", help="B,H,S,D (non-causal)")
    ap.add_argument("--mix", default="all", choices=["all", "cudnn"], help="every SDPA backend in turns, or cuDNN alone")
    ap.add_argument("--order", default=None, help="comma-separated turn order of the mix's kernels (default: flashsci first)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--replays", type=int, default=3)
    ap.add_argument("--warm", type=int, default=0, help="untimed replays at the start of each turn")
    ap.add_argument("--backward", action="store_true", help="the backward (bf16) against cuDNN's and FA2's")
    ap.add_argument("--causal", action="store_true", help="with --backward: causal attention")
    args = ap.parse_args()
    b, h, s, d = (int(x) for x in args.shape.split(","))
    if args.backward:
        return main_backward(args, b, h, s, d)
    inputs = attention_input_sets(torch, b, h, s, d, torch.float16)
    sdpa = F.scaled_dot_product_attention
    backend = lambda be: with_backend(sdpa_kernel, be, sdpa)
    fns = {"flashsci": lambda q, k, v: flashsci.attention(q, k, v)}
    if args.mix == "all":
        fns.update({"sdpa": sdpa, "flash": backend(SDPBackend.FLASH_ATTENTION), "cudnn": backend(SDPBackend.CUDNN_ATTENTION),
                    "efficient": backend(SDPBackend.EFFICIENT_ATTENTION)})
    else:
        fns["cudnn"] = backend(SDPBackend.CUDNN_ATTENTION)
    if args.order:
        fns = {name: fns[name] for name in args.order.split(",")}
    calls = max(len(inputs), 20)
    graphs = {name: capture_graph(torch, fn, inputs, calls) for name, fn in fns.items()}
    nvml = Nvml()
    rows = {name: [] for name in fns}
    for _ in range(args.rounds):
        for name, g in graphs.items():
            rows[name].append(turn(nvml, g, calls, args.replays, args.warm))
    flops = 4 * b * h * s * s * d
    print(f"{torch.cuda.get_device_name()}  {b}x{h}x{s}x{d} fp16 non-causal, mix {args.mix}, {args.rounds} rounds of "
          f"{args.replays} x {calls} calls (medians over rounds)")
    print(f"{'kernel':>10} {'us/call':>9} {'J/call':>8} {'SM MHz':>7} {'TF/s':>7} {'GFLOP/J':>8} {'kcycles/call':>13}")
    for name, r in rows.items():
        us, j, mhz = (statistics.median(x[i] for x in r) for i in range(3))
        per_j = f"{flops / j / 1e9:8.1f}" if j > 0 else f"{'-':>8}"  # short turns: the energy counter may not move
        print(f"{name:>10} {us:9.1f} {j:8.3f} {mhz:7.0f} {flops / us / 1e6:7.1f} {per_j} {us * mhz / 1e3:13.1f}")


if __name__ == "__main__":
    main()
