"""Timings under pytest (pytest-benchmark), one case per listed config and implementation: flashsci and its torch
counterpart (GPU) or NumPy counterpart (CPU) timed in the same run, each timed output checked against a float64
reference. Marked `bench` and left out of the default run:

    pytest -m bench --benchmark-json=bench.json            # the record
    pytest -m bench --benchmark-compare=0001               # against an earlier saved run (--benchmark-autosave)

GPU cases time a CUDA graph of CALLS calls (inputs rotated over sets larger than L2) and synchronize, so each round
is device time plus one launch; extra_info holds the per-call time by CUDA events. Outputs are checked from a call
into a NaN-poisoned buffer.
"""
import math

import numpy as np
import pytest

import flashsci
from flashsci.bench.attention import PROTEIN, SEED
from flashsci.bench.timing import event_times_us

from conftest import reference_attention

pytest.importorskip("pytest_benchmark")
pytestmark = pytest.mark.bench

CALLS = 20
GEMM = [("ESM2-3B fc1 gelu", 2048, 2560, 10240, "gelu"), ("ESM2-3B fc2", 2048, 10240, 2560, None),
        ("ProtT5-XL wi relu", 2048, 1024, 16384, "relu"), ("ESM-C-600M swiglu", 2048, 1152, 3072, "swiglu")]
CPU_ATTENTION = [(1, 4, 256, 64), (2, 8, 128, 64), (1, 2, 512, 128)]


def _max_err(out, ref):
    """Max abs difference of out (any framework) to a float64 NumPy reference."""
    return float(np.abs(np.asarray(out, dtype=np.float64) - ref).max())


# ------------------------------------------------------------------------------------------------------------ CPU

@pytest.mark.parametrize("impl", ["flashsci", "numpy"])
@pytest.mark.parametrize("cfg", CPU_ATTENTION, ids=lambda c: "x".join(map(str, c)))
def test_cpu_attention(benchmark, cfg, impl):
    from flashsci.bench.cpu import numpy_attention
    rng = np.random.default_rng(sum(cfg))
    q, k, v = (rng.standard_normal(cfg).astype(np.float32) for _ in range(3))
    fn = (lambda: flashsci.attention(q, k, v)) if impl == "flashsci" else (lambda: numpy_attention(q, k, v))
    out = benchmark.pedantic(fn, rounds=5, iterations=1, warmup_rounds=1)
    ref, _ = reference_attention(q, k, v)
    assert _max_err(out, ref) < 1e-4
    benchmark.extra_info.update(config=cfg, impl=impl, device="cpu")


# ------------------------------------------------------------------------------------------------------------ GPU

def _graph_target(torch, fn, inputs):
    """A callable replaying a CUDA graph of CALLS calls of fn over the input sets, then synchronizing."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*inputs[0])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS):
            fn(*inputs[i % len(inputs)])

    def replay():
        graph.replay()
        torch.cuda.synchronize()
    return replay


def _per_call_us(torch, replay, rounds=7):
    """Median per-call device time of the graph by CUDA events."""
    return sorted(event_times_us(torch, replay, CALLS, rounds))[rounds // 2]


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["flashsci", "torch"])
@pytest.mark.parametrize("cfg", [("seed", c) for c in SEED] + list(PROTEIN.items()), ids=lambda c: f"{c[0]}-" + "x".join(map(str, c[1])))
def test_gpu_attention(benchmark, cfg, impl):
    torch = pytest.importorskip("torch")
    from flashsci.bench.timing import attention_input_sets, flops
    b, h, s, d = cfg[1]
    inputs = attention_input_sets(torch, b, h, s, d, torch.float16)
    fn = flashsci.attention if impl == "flashsci" else torch.nn.functional.scaled_dot_product_attention
    replay = _graph_target(torch, fn, inputs)
    benchmark.pedantic(replay, rounds=10, iterations=1, warmup_rounds=2)
    us = _per_call_us(torch, replay)
    out = torch.full_like(inputs[0][0], float("nan"))        # poisoned: an unwritten element fails the check
    if impl == "flashsci":
        flashsci.attention(*inputs[0], out=out)
    else:
        out.copy_(fn(*inputs[0]))
    q, k, v = (x[:1, :2].cpu().double().numpy() for x in inputs[0])
    ref, _ = reference_attention(q, k, v)
    assert _max_err(out[:1, :2].float().cpu(), ref) < 4e-3
    benchmark.extra_info.update(config=cfg[1], impl=impl, calls_per_round=CALLS, kernel_us=us,
                                tflops=flops(b, h, s, s, d, False) / us / 1e6, gpu=torch.cuda.get_device_name())


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["flashsci", "torch"])
@pytest.mark.parametrize("cfg", GEMM, ids=lambda c: c[0].replace(" ", "-"))
def test_gpu_linear(benchmark, cfg, impl):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    _, m, k, n, mode = cfg
    rows = 2 * n if mode == "swiglu" else n
    inputs = [(torch.randn(m, k, device="cuda", dtype=torch.float16),
               torch.randn(rows, k, device="cuda", dtype=torch.float16) / math.sqrt(k),
               torch.randn(n, device="cuda", dtype=torch.float16)) for _ in range(4)]
    if mode == "swiglu":
        fs = lambda x, w, b: flashsci.swiglu(x, w)
        th = lambda x, w, b: (lambda g, u: F.silu(g) * u)(*F.linear(x, w).chunk(2, dim=-1))
    else:
        act = {"gelu": F.gelu, "relu": F.relu, None: lambda y: y}[mode]
        fs = lambda x, w, b: flashsci.linear(x, w, b, activation=mode)
        th = lambda x, w, b: act(F.linear(x, w, b))
    replay = _graph_target(torch, fs if impl == "flashsci" else th, inputs)
    benchmark.pedantic(replay, rounds=10, iterations=1, warmup_rounds=2)
    us = _per_call_us(torch, replay)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)   # poisoned
    if impl == "flashsci" and mode == "swiglu":
        flashsci.swiglu(inputs[0][0], inputs[0][1], out=out)
    elif impl == "flashsci":
        flashsci.linear(*inputs[0], activation=mode, out=out)
    else:
        out.copy_(th(*inputs[0]))
    x, w, bias = (t.double() for t in inputs[0])
    if mode == "swiglu":
        g, u = (x[:64] @ w.T).chunk(2, dim=-1)
        ref = F.silu(g) * u
    else:
        ref = {"gelu": F.gelu, "relu": F.relu, None: lambda y: y}[mode](x[:64] @ w.T + bias)
    assert (out[:64].double() - ref).abs().max().item() < 2e-2 * max(1.0, ref.abs().max().item())
    benchmark.extra_info.update(config=cfg, impl=impl, calls_per_round=CALLS, kernel_us=us,
                                tflops=2.0 * m * rows * k / us / 1e6, gpu=torch.cuda.get_device_name())
