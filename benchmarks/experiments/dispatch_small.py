"""Problems with fewer work items than SMs on a Hopper GPU: flashsci as dispatched (sm90_pays in
kernels/attention/sm90/dispatch.cu), flashsci forced onto the portable sm80 kernel, and SDPA's cuDNN backend, timed in turns
by CUDA-graph replay over input sets beyond L2 (as the recorded benchmark times). Writes a markdown table with the GPU
name to --out (--shape B,H,S,D[,causal], repeatable: those shapes instead, printed only).
    python benchmarks/dispatch_small.py --out benchmarks/results"""
import argparse
import os

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashsci
from flashsci.bench.results import slug
from flashsci.bench.timing import attention_input_sets, forced, graph_kernel_times_us, with_backend

F = torch.nn.functional
SHAPES = [(1, 1, 256, 128, False), (1, 1, 1024, 128, False), (1, 8, 2048, 128, False), (2, 8, 1024, 128, False),
          (1, 32, 512, 128, False), (1, 16, 1024, 128, True), (1, 8, 2048, 64, False), (2, 8, 1024, 64, False),
          (1, 32, 512, 64, False), (1, 20, 1024, 64, False), (1, 20, 1024, 64, True), (1, 8, 1024, 64, False),
          (8, 8, 256, 64, False), (1, 1, 512, 64, False), (1, 1, 256, 64, False), (1, 1, 64, 64, False),
          (1, 20, 512, 64, False), (1, 2, 1024, 64, False), (1, 4, 2048, 64, False), (1, 1, 512, 64, True)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--shape", action="append", help="B,H,S,D[,causal] instead of the built-in shapes")
    args = ap.parse_args()
    shapes = SHAPES
    if args.shape:
        shapes = [tuple(int(x) for x in a.split(",")[:4]) + (a.endswith(",causal"),) for a in args.shape]
        args.out = None
    name = torch.cuda.get_device_name()
    lines = [f"# flashsci attention below one work item per SM — {name}", "",
             f"torch {torch.__version__}, float16, kernel times (µs) by CUDA-graph replay in turns, median.", "",
             "| B×H×S×D | dispatched to | flashsci | flashsci on sm80 | cuDNN | × sm80 | × cuDNN |",
             "|---|---|---|---|---|---|---|"]
    for b, h, s, d, causal in shapes:
        inputs = attention_input_sets(torch, b, h, s, d, torch.float16)
        fs = lambda q, k, v: flashsci.attention(q, k, v, causal=causal)
        cudnn = with_backend(sdpa_kernel, SDPBackend.CUDNN_ATTENTION,
                              lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        t = graph_kernel_times_us(torch, {"fs": fs, "sm80": forced("sm80", fs), "cudnn": cudnn}, inputs)
        kernel = flashsci._flashsci._launch_plan(b, h, s, s, d, causal)["kernel"]
        shape = f"{b}×{h}×{s}×{d}{' causal' if causal else ''}"
        lines.append(f"| {shape} | {kernel} | {t['fs']:.1f} | {t['sm80']:.1f} | {t['cudnn']:.1f} | "
                     f"{t['sm80'] / t['fs']:.2f} | {t['cudnn'] / t['fs']:.2f} |")
        print(lines[-1], flush=True)
        del inputs
    if args.out:
        path = os.path.join(args.out, f"dispatch_small_{slug(name)}_float16.md")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        print("wrote", path)


if __name__ == "__main__":
    main()
