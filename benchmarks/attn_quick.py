"""Quick attention timing while iterating on a kernel (the full, recorded comparison is python -m flashsci.bench):
flashsci against SDPA's cuDNN backend on a few large configs, timed as the recorded benchmark does (CUDA-graph
replay over input sets that together exceed L2, the two taking turns, median). With --kv-sweep: a fixed set of
query tiles (B, H, Sq = 8, 18, 1024) against Sk = 512 ... 4096 keys (CUDA events on warm inputs), and the
straight-line fit time = rounds x (a + b Sk / 128): a is the cost per work item outside the key loop (Q load,
first S and last P V alone, O store), b the cost per 128 keys (gemm_quick.py does the same for the GEMM).
    python benchmarks/attn_quick.py [--dtype bfloat16] [--head-dim 64] [--shape 1,16,16384,128[,causal]] [--kv-sweep]
A shape's S may be Sq:Sk (1,1,100:1024,128); a shape cuDNN does not take prints '-' for it. --rotary times flashsci with
rotary=True (cuDNN still plain, no diff), --sm80 the portable kernel on Hopper too. --kv-heads N gives K/V N heads
(grouped-query attention; N = 1 keeps every batch's K/V in L2, which separates the kernel's memory stalls from the rest)."""
import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashsci
from flashsci.bench.timing import attention_input_sets, graph_kernel_times_us, median_event_time_us, with_backend

F = torch.nn.functional
CONFIGS = [(8, 40, 1024, 64, False), (8, 18, 1024, 64, False), (8, 32, 1024, 128, False), (16, 32, 1024, 64, False),
           (4, 32, 4096, 64, False), (2, 32, 8192, 64, False),
           (2, 16, 8192, 128, False), (16, 32, 1024, 64, True), (2, 32, 8192, 64, True), (16, 16, 1024, 128, True),
           (2, 16, 8192, 128, True)]


def time_us(fn, reps=20):
    for _ in range(3):
        fn()
    return median_event_time_us(torch, fn, 1, iters=reps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--head-dim", type=int, help="only the configs of this head dim")
    ap.add_argument("--shape", action="append", help="B,H,S[:Sk],D[,causal] instead of the built-in configs (repeatable)")
    ap.add_argument("--kv-sweep", action="store_true", help="the per-item / per-key-tile split instead")
    ap.add_argument("--rotary", action="store_true", help="flashsci with rotary=True")
    ap.add_argument("--sm80", action="store_true", help="force the portable kernel")
    ap.add_argument("--kv-heads", type=int, help="K/V heads (default: H)")
    args = ap.parse_args()
    if args.sm80:
        flashsci._flashsci._set_attention_kernel("sm80")
    dtype = getattr(torch, args.dtype)
    if args.kv_sweep:
        return kv_sweep(dtype, args.head_dim or 64)
    print(f"{torch.cuda.get_device_name()}  {dtype}\n{'config':>26} {'fs us':>8} {'cudnn':>8} "
          f"{'fs TF/s':>8} {'x cudnn':>9} {'max diff':>9}")
    configs = [parse_shape(x) for x in args.shape] if args.shape else [(b, h, s, s, d, c) for b, h, s, d, c in CONFIGS]
    for b, h, sq, sk, d, causal in configs:
        if args.head_dim and d != args.head_dim:
            continue
        inputs = attention_input_sets(torch, b, h, sq, d, dtype, sk=sk)
        gqa = bool(args.kv_heads) and args.kv_heads != h
        if gqa:
            inputs = [(q, k[:, :args.kv_heads].contiguous(), v[:, :args.kv_heads].contiguous()) for q, k, v in inputs]
        fs = lambda q, k, v: flashsci.attention(q, k, v, causal=causal, rotary=args.rotary)
        cudnn = with_backend(sdpa_kernel, SDPBackend.CUDNN_ATTENTION,
                              lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa))
        times = graph_kernel_times_us(torch, {"fs": fs, "cudnn": cudnn}, inputs, optional=("cudnn",))
        name = f"{b}x{h}x{sq}{'' if sq == sk else f':{sk}'}x{d}" + (f" kv{args.kv_heads}" if gqa else "") + (" causal" if causal else "")
        tflops = 4 * b * h * sq * sk * d / (2 if causal else 1) / times["fs"] / 1e6
        if times["cudnn"] is None or args.rotary:
            cu = '-' if times["cudnn"] is None else f"{times['cudnn']:.1f}"
            print(f"{name:>26} {times['fs']:8.1f} {cu:>8} {tflops:8.1f} {'-':>9} {'-':>9}", flush=True)
        else:
            diff = (fs(*inputs[0]).float() - cudnn(*inputs[0]).float()).abs().max().item()
            print(f"{name:>26} {times['fs']:8.1f} {times['cudnn']:8.1f} {tflops:8.1f} {times['cudnn'] / times['fs']:9.3f} "
                  f"{diff:9.1e}", flush=True)
        del inputs


def parse_shape(text):
    """'B,H,S[:Sk],D' or 'B,H,S[:Sk],D,causal' -> (B, H, Sq, Sk, D, causal)."""
    parts = text.split(",")
    sq, _, sk = parts[2].partition(":")
    return int(parts[0]), int(parts[1]), int(sq), int(sk or sq), int(parts[3]), parts[4:] == ["causal"]


def kv_sweep(dtype, d, b=8, h=18, sq=1024):
    """Time against Sk at a fixed item count; fit per-item and per-key-tile costs for flashsci and cuDNN."""
    items = b * h * (sq // 128)
    rounds = -(-items // torch.cuda.get_device_properties(0).multi_processor_count)
    rows = []
    for sk in (512, 1024, 2048, 4096):
        q = torch.randn(b, h, sq, d, device="cuda", dtype=dtype)
        k, v = (torch.randn(b, h, sk, d, device="cuda", dtype=dtype) for _ in range(2))
        out = torch.empty_like(q)
        fs = time_us(lambda: flashsci.attention(q, k, v, out=out))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            cu = time_us(lambda: F.scaled_dot_product_attention(q, k, v))
        rows.append((sk, fs, cu))
        print(f"{b}x{h}x{sq}x{d}, Sk {sk:5d}: flashsci {fs:8.1f} us, cuDNN {cu:8.1f} us, x cudnn {cu / fs:6.3f}")
    for col, who in ((1, "flashsci"), (2, "cuDNN")):
        xs, ts = [r[0] / 128 for r in rows], [r[col] for r in rows]
        xbar, tbar = sum(xs) / len(xs), sum(ts) / len(ts)
        slope = sum((x - xbar) * (t - tbar) for x, t in zip(xs, ts)) / sum((x - xbar) ** 2 for x in xs)
        print(f"fit {who}: per item {(tbar - slope * xbar) / rounds:.2f} us + {slope / rounds * 1e3:.1f} ns per 128 keys "
              f"({items} items, {rounds} rounds)")


if __name__ == "__main__":
    main()
