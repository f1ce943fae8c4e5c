"""Capturing a run under torch.profiler and reading its trace back: every GPU kernel, memcpy and memset with its
duration and the record_function ranges ("forward", "backward", "optimizer", "attention", ...) that were open on the
host when it was launched, and every aten::copy_ between two floating-point dtypes (the studies' fp16↔fp32 copies;
integer and bool conversions of masks and offsets are bookkeeping, not counted)."""
import json
import os
import tempfile
from dataclasses import dataclass, field

from flashsci.profile.categories import category

FLOATS = {"float", "double", "c10::Half", "c10::BFloat16", "c10::Float8_e4m3fn", "c10::Float8_e5m2"}


@dataclass
class Trace:
    kernels: list = field(default_factory=list)       # dicts: name, category, start, us (GPU µs), labels (frozenset)
    conversions: list = field(default_factory=list)   # labels (frozenset) of each float-converting aten::copy_


def labels_at(ranges, ts):
    """The names of the ranges [(start, end, name)] that contain host time ts."""
    return frozenset(name for start, end, name in ranges if start <= ts <= end)


def parse(events):
    """A Trace from a Chrome-trace event list as torch.profiler exports it."""
    ranges, launches, gpu, copies = [], {}, [], []
    for e in events:
        cat, args = e.get("cat", ""), e.get("args") or {}
        if cat == "user_annotation":
            ranges.append((e["ts"], e["ts"] + e.get("dur", 0), e["name"]))
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            launches[args["correlation"]] = e["ts"]
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            gpu.append(e)
        elif cat == "cpu_op" and e.get("name") == "aten::copy_":
            types = args.get("Input type") or []
            if len(types) >= 2 and types[0] in FLOATS and types[1] in FLOATS and types[0] != types[1]:
                copies.append(e["ts"])
    out = Trace()
    for e in gpu:
        name = e["name"] if e["cat"] == "kernel" else e["cat"].replace("gpu_", "") + " " + e["name"]
        ts = launches.get((e.get("args") or {}).get("correlation"))
        out.kernels.append({"name": name, "category": category(name), "start": float(e.get("ts", 0)),
                            "us": float(e.get("dur", 0)),
                            "labels": labels_at(ranges, ts) if ts is not None else frozenset()})
    out.conversions = [labels_at(ranges, ts) for ts in copies]
    return out


def capture(fn):
    """(fn's result, Trace) of one call of fn under torch.profiler (CPU and CUDA activities, input types recorded)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        result = fn()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.unlink(path)
    return result, parse(events)
