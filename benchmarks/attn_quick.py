"""Quick attention timing while iterating on a kernel (the full, recorded comparison is python -m flashsci.bench):
flashsci against SDPA's cuDNN and flash backends on a few large configs, CUDA events, median of 20 after warm-up.
    python benchmarks/attn_quick.py [--dtype bfloat16] [--head-dim 64]"""
import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashsci
from flashsci.bench import _median_event_time_us

F = torch.nn.functional
CONFIGS = [(8, 40, 1024, 64, False), (8, 18, 1024, 64, False), (8, 32, 1024, 128, False), (2, 32, 8192, 64, False),
           (2, 16, 8192, 128, False), (16, 32, 1024, 64, True), (2, 32, 8192, 64, True), (16, 16, 1024, 128, True),
           (2, 16, 8192, 128, True)]


def time_us(fn, reps=20):
    for _ in range(3):
        fn()
    return _median_event_time_us(torch, fn, 1, iters=reps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--head-dim", type=int, help="only the configs of this head dim")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    print(f"{torch.cuda.get_device_name()}  {dtype}\n{'config':>26} {'fs us':>8} {'cudnn':>8} {'flash':>8} "
          f"{'fs TF/s':>8} {'x cudnn':>9} {'max diff':>9}")
    for b, h, s, d, causal in CONFIGS:
        if args.head_dim and d != args.head_dim:
            continue
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
        out = torch.empty_like(q)
        row = [time_us(lambda: flashsci.attention(q, k, v, causal=causal, out=out))]
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
            with sdpa_kernel(backend):
                row.append(time_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)))
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        diff = (out.float() - ref.float()).abs().max().item()
        tflops = 4 * b * h * s * s * d / (2 if causal else 1) / row[0] / 1e6
        print(f"{f'{b}x{h}x{s}x{d}' + (' causal' if causal else ''):>26} {row[0]:8.1f} {row[1]:8.1f} {row[2]:8.1f} "
              f"{tflops:8.1f} {row[1] / row[0]:9.3f} {diff:9.1e}")


if __name__ == "__main__":
    main()
