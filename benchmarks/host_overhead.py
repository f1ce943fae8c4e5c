"""Per-call host cost of each interop route and of each piece of a flashsci.attention call (torch CUDA
tensors), measured with timeit on the GPU machine. Writes host_overhead_<gpu>.json/.md to --out.

    python benchmarks/host_overhead.py --out benchmarks/results
"""
import argparse
import json
import os
import statistics
import time
import timeit

import torch

import flashsci
from flashsci import _flashsci


def per_call_us(stmts, n=5000, rounds=9):
    """Median time per call of each statement: rounds of n back-to-back calls, the statements taking turns round by
    round so that a host whose speed drifts moves them all alike."""
    for stmt in stmts:
        timeit.timeit(stmt, number=500)
    runs = [[] for _ in stmts]
    for _ in range(rounds):
        for i, stmt in enumerate(stmts):
            torch.cuda.synchronize()
            runs[i].append(timeit.timeit(stmt, number=n) * 1e6 / n)
    torch.cuda.synchronize()
    return [statistics.median(r) for r in runs]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    q, k, v = (torch.randn(1, 1, 32, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)
    q8, k8, v8 = (torch.randn(1, 1, 256, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    small_np = q.cpu().numpy()
    raw = torch._C._cuda_getCurrentRawStream
    rows = [
        ("torch route: flashsci _inspect(t) (DLPack C exchange table where torch has one, + requires_grad, "
         "is_neg())", lambda: _flashsci._inspect(q)),
        ("torch attribute route: _inspect(t, 'torch_attrs') (dtype, is_cuda, get_device, requires_grad, is_neg, shape, "
         "stride, data_ptr)", lambda: _flashsci._inspect(q, "torch_attrs")),
        ("DLPack route: flashsci _inspect(t, 'dlpack') (t.__dlpack__ + capsule)", lambda: _flashsci._inspect(q, "dlpack")),
        ("CUDA array interface route: flashsci _inspect(t, 'cai')", lambda: _flashsci._inspect(q, "cai")),
        ("t.__dlpack__() alone", lambda: q.__dlpack__()),
        ("t.__cuda_array_interface__ alone", lambda: q.__cuda_array_interface__),
        ("torch.cuda.current_stream()", lambda: torch.cuda.current_stream()),
        ("torch._C._cuda_getCurrentRawStream(0)", lambda: raw(0)),
        ("q.new_empty(shape) (output allocation)", lambda: q.new_empty((1, 1, 32, 64))),
        ("torch.empty_like(q)", lambda: torch.empty_like(q)),
        ("torch.empty(shape, dtype=, device=)", lambda: torch.empty((1, 1, 32, 64), dtype=q.dtype, device=q.device)),
        ("q.dtype", lambda: q.dtype), ("q.is_cuda", lambda: q.is_cuda), ("q.get_device()", lambda: q.get_device()),
        ("q.requires_grad", lambda: q.requires_grad), ("q.shape", lambda: q.shape), ("q.stride()", lambda: q.stride()),
        ("q.data_ptr()", lambda: q.data_ptr()),
        ("flashsci _inspect(numpy array) (cost of _inspect's own dict, to subtract)", lambda: _flashsci._inspect(small_np)),
        ("flashsci.attention(q, k, v, out=out) (tiny problem: host-bound)", lambda: flashsci.attention(q, k, v, out=out)),
        ("flashsci.attention(q, k, v)", lambda: flashsci.attention(q, k, v)),
        ("flashsci.attention at (1, 1, 256, 128) (Hopper kernel on sm_90: four TMA maps encoded per call)",
         lambda: flashsci.attention(q8, k8, v8)),
        ("torch SDPA(q, k, v)", lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)),
    ]
    results = [{"what": name, "us_per_call": t} for (name, _), t in zip(rows, per_call_us([fn for _, fn in rows]))]
    gpu = torch.cuda.get_device_name(0)
    width = max(len(r["what"]) for r in results)
    print(f"host cost per call on {gpu} (timeit medians, back-to-back; the GPU keeps up at this size)")
    for r in results:
        print(f"  {r['what']:<{width}}  {r['us_per_call']:6.2f} us")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, "host_overhead_" + "".join(c if c.isalnum() else "_" for c in gpu))
        meta = {"gpu": gpu, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                "c_exchange": _flashsci._inspect(q)["c_exchange"]}
        with open(stem + ".json", "w") as f:
            json.dump({"meta": meta, "rows": results}, f, indent=1)
        with open(stem + ".md", "w") as f:
            f.write(f"# Host cost per call — {gpu}\n\ntorch {meta['torch']}, {meta['date']}; timeit medians of "
                    "back-to-back calls, the rows taking turns, on (1, 1, 32, 64) fp16 CUDA tensors; torch tensors "
                    f"read through the DLPack C exchange table: {'yes' if meta['c_exchange'] else 'no'}.\n\n"
                    "| what | µs per call |\n|---|---|\n")
            f.writelines(f"| {r['what']} | {r['us_per_call']:.2f} |\n" for r in results)


if __name__ == "__main__":
    main()
