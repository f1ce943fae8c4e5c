"""Does the turn order of the recorded benchmark's graph timing move flashsci's ratio to cuDNN? On one shape, times
flashsci and SDPA's backends as flashsci.bench does (graph_kernel_times_us: CUDA-graph replays in turns, an untimed replay
opening each turn) in the recorded order, in the reverse order and as a pair (flashsci, cuDNN), each twice, then the
two alone by back-to-back calls (per_call_us: a sustained run of one kernel).
    python benchmarks/turn_order.py --shape 2,16,8192,128 [--dtype bfloat16]"""
import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashsci
from flashsci.bench.timing import attention_input_sets, graph_kernel_times_us, per_call_us, with_backend

F = torch.nn.functional


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", action="append", help="B,H,S,D, non-causal (repeatable)")
    ap.add_argument("--dtype", default="float16")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    backend = lambda be: with_backend(sdpa_kernel, be, F.scaled_dot_product_attention)
    fns = {"flashsci": lambda q, k, v: flashsci.attention(q, k, v), "sdpa": F.scaled_dot_product_attention,
           "flash": backend(SDPBackend.FLASH_ATTENTION), "cudnn": backend(SDPBackend.CUDNN_ATTENTION),
           "efficient": backend(SDPBackend.EFFICIENT_ATTENTION)}
    orders = {"recorded": list(fns), "reversed": list(fns)[::-1], "pair": ["flashsci", "cudnn"]}
    print(f"{torch.cuda.get_device_name()}  {args.dtype}; flashsci / cuDNN kernel time (us)")
    for shape in args.shape or ["2,16,8192,128"]:
        b, h, s, d = (int(x) for x in shape.split(","))
        inputs = attention_input_sets(torch, b, h, s, d, dtype)
        for name, order in orders.items():
            for rep in range(2):
                t = graph_kernel_times_us(torch, {n: fns[n] for n in order}, inputs)
                print(f"{shape:>16} {name:>9} {rep}: {t['flashsci']:8.1f} / {t['cudnn']:8.1f} = {t['flashsci'] / t['cudnn']:.3f}",
                      flush=True)
        fs, cu = per_call_us(torch, fns["flashsci"], inputs[0]), per_call_us(torch, fns["cudnn"], inputs[0])
        print(f"{shape:>16} {'alone':>9}  : {fs:8.1f} / {cu:8.1f} = {fs / cu:.3f}", flush=True)


if __name__ == "__main__":
    main()
