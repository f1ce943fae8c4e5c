"""Timers shared by the benchmark sets: kernel time by CUDA-graph replay over rotating input sets larger than L2
(medians, the timed functions taking turns), per-call wall time of back-to-back Python calls, and the FLOP count
of attention (4 B H Sq Sk D, half for causal)."""
import math
import statistics
import time

import flashsci


def flops(b, h, sq, sk, d, causal):
    f = 4.0 * b * h * sq * sk * d
    return f / 2 if causal else f


def median_event_time_us(torch, replay, calls, iters=15):
    return statistics.median(event_times_us(torch, replay, calls, iters))


def event_times_us(torch, replay, calls, iters):
    times = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / calls)
    return times


def capture_graph(torch, fn, inputs, calls):
    """A CUDA graph of `calls` calls of fn over the rotating input sets (after one warm-up pass off the graph)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for x in inputs:
            fn(*x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(*inputs[i % len(inputs)])
    graph.replay()
    torch.cuda.synchronize()
    return graph


def graph_kernel_times_us(torch, fns, inputs, optional=(), rounds=5, iters=3):
    """Median per-call device time of each function of fns (name -> fn) from CUDA-graph replays over rotating
    input sets; those named in optional give None where they raise RuntimeError (an SDPA backend that does not
    take the inputs). The functions take turns, `iters` replays each per round, so that clock and power drift
    over the measurement falls on all of them alike (a GPU that has just idled runs its first large GEMMs at
    higher clocks than later ones). Each turn starts with one untimed replay: at the board's power cap a turn
    runs slower right after some kernels than after others (H100, 1x16x16384x128: whichever followed SDPA's
    efficient backend lost 3-4%), and with the order fixed that place fell to the same function every round."""
    calls = max(len(inputs), 20)
    graphs, times = {}, {}
    for name, fn in fns.items():
        try:
            graphs[name] = capture_graph(torch, fn, inputs, calls)
            times[name] = []
        except RuntimeError:
            if name not in optional:
                raise
            graphs[name] = None
    for _ in range(rounds):
        for name, graph in graphs.items():
            if graph is not None:
                graph.replay()
                times[name] += event_times_us(torch, graph.replay, calls, iters)
    del graphs
    return {name: statistics.median(times[name]) if name in times else None for name in fns}


def paired_kernel_times_us(torch, ref, fns, inputs, optional=()):
    """Kernel times of ref against each function of fns, each pair timed on its own by graph_kernel_times_us:
    {name: (ref's time in that pair, the function's time)}, the latter None where an optional function raises. With
    five kernels in one rotation the turn order moved flashsci / cuDNN by up to 10% either way at the H100's power
    cap (8 x 32 x 1024 x 128: 0.95 in the recorded order, 1.10 reversed; 1.00-1.03 as a pair, 0.99 each alone by
    back-to-back calls); in a pair each kernel follows the other."""
    out = {}
    for name, fn in fns.items():
        t = graph_kernel_times_us(torch, {"ref": ref, name: fn}, inputs, optional=optional)
        out[name] = (t["ref"], t[name])
    return out


def graph_kernel_time_us(torch, fn, inputs):
    """Median per-call device time of fn over rotating input sets, from CUDA-graph replay."""
    return graph_kernel_times_us(torch, {"fn": fn}, inputs)["fn"]


def per_call_turns_us(torch, loops, x, rounds=7):
    """Median wall time per call of back-to-back calls, for each loop of loops ({name: (fn, n, sync)}: n calls, then
    with sync a wait for the GPU; without, the host loop alone), the loops taking turns round by round so that a
    host whose speed drifts moves them all alike (SDPA's call on an H100 host went from 32 to 20 µs within one run)."""
    for fn, _, _ in loops.values():
        for _ in range(20):
            fn(*x)
    runs = {name: [] for name in loops}
    for _ in range(rounds):
        for name, (fn, n, sync) in loops.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                fn(*x)
            if sync:
                torch.cuda.synchronize()
            runs[name].append((time.perf_counter() - t0) * 1e6 / n)
    torch.cuda.synchronize()
    return {name: statistics.median(r) for name, r in runs.items()}


def per_call_us(torch, fn, x, n=300, sync=True):
    """Median wall time per call of n back-to-back calls (sync=False: the host loop alone)."""
    return per_call_turns_us(torch, {"fn": (fn, n, sync)}, x)["fn"]


def with_backend(sdpa_kernel, backend, sdpa):
    """sdpa restricted to one SDPA backend (raises RuntimeError where that backend does not take the inputs)."""
    def fn(q, k, v):
        with sdpa_kernel(backend):
            return sdpa(q, k, v)
    return fn


def forced(kernel, fn):
    """fn with flashsci's attention dispatch set to kernel ('sm80' or 'auto') while it runs (and is captured)."""
    def call(*args):
        flashsci._flashsci._set_attention_kernel(kernel)
        try:
            return fn(*args)
        finally:
            flashsci._flashsci._set_attention_kernel("auto")
    return call


def attention_input_sets(torch, b, h, s, d, dtype, sk=None):
    """Rotating (q, k, v) sets of shape (b, h, s, d) (k, v: sk rows if given) whose bytes, outputs included, together
    reach twice the L2."""
    sk = s if sk is None else sk
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    n_sets = max(1, min(64, math.ceil(2 * l2 / (2 * b * h * (s + sk) * d * 2))))
    return [(torch.randn(b, h, s, d, device="cuda", dtype=dtype),
             *(torch.randn(b, h, sk, d, device="cuda", dtype=dtype) for _ in range(2))) for _ in range(n_sets)]


def event_turns_us(torch, fns, inputs, rounds=7, calls=10):
    """Median per-call time of each function of fns (name -> fn) by CUDA events around `calls` back-to-back calls over
    the rotating input sets, the functions taking turns round by round: for what a CUDA graph cannot capture (torch's
    autograd backward runs on its forward's stream, not the capturing one). Launch gaps count: use it for kernels of
    a millisecond or more."""
    for fn in fns.values():
        for x in inputs:
            fn(*x)
    torch.cuda.synchronize()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            fn(*inputs[0])
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for i in range(calls):
                fn(*inputs[i % len(inputs)])
            e1.record()
            e1.synchronize()
            times[name].append(e0.elapsed_time(e1) * 1e3 / calls)
    return {name: statistics.median(t) for name, t in times.items()}
