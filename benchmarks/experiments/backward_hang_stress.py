"""The attention backward's cross-CTA waits under load: backward calls in a loop on shapes that exercise them (the
persistent kernel's dQ conversion, the kernel-side zeroing of dQ's accumulator, non-causal and causal, the
deterministic ordered adds), fresh data each, each call synchronised; a watchdog thread names the shape still
running after WATCH seconds (default 20) and exits 3. Run several at once to share the GPU between processes:
    for i in 1 2 3 4; do python benchmarks/experiments/backward_hang_stress.py 60 & done; wait
    python benchmarks/experiments/backward_hang_stress.py 60 persistent,causal128   (SECONDS [CASES])"""
import os
import random
import sys
import threading
import time

import torch

import flashsci

# (B, H, Hkv, Sq, Sk, D) and options
CASES = {
    "persistent": dict(shape=(2, 8, 8, 300, 2100, 64)),
    "persistent_rotary": dict(shape=(3, 12, 4, 1000, 1000, 64), rotary=10000.0),
    "persistent_seqlens": dict(shape=(2, 1, 1, 290, 290, 64), lens=[123, 32]),
    "t5_64": dict(shape=(2, 8, 8, 700, 2100, 64), t5=True),
    "t5_128": dict(shape=(2, 4, 4, 300, 300, 128), t5=True),
    "grouped128": dict(shape=(2, 8, 4, 700, 2100, 128)),
    "causal128": dict(shape=(2, 8, 4, 700, 900, 128), causal=True),
    "causal64": dict(shape=(2, 8, 8, 1100, 1100, 64), causal=True),
    "deterministic128": dict(shape=(2, 8, 4, 700, 2100, 128), deterministic=True),
    "deterministic64": dict(shape=(2, 8, 8, 700, 2100, 64), deterministic=True),
    "deterministic_causal128": dict(shape=(2, 8, 2, 1100, 1100, 128), deterministic=True, causal=True),
}
running = ["start", time.time()]  # the case in flight and when it began


def watchdog(limit):
    """Exit 3, naming the case, once one call has run for more than limit seconds."""
    while True:
        time.sleep(1)
        if time.time() - running[1] > limit:
            print(f"pid {os.getpid()}: HANG in {running[0]} after {time.time() - running[1]:.0f} s", flush=True)
            os._exit(3)


def call(case, dtype):
    """One forward (lse) and backward of the case, synchronised, gradients checked finite."""
    b, h, hkv, sq, sk, d = case["shape"]
    q = torch.randn(b, h, sq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype) for _ in range(2))
    kw = {"causal": True} if case.get("causal") else {}
    if case.get("t5"):
        kw["t5_bias"] = (torch.randn(h, 32, device="cuda"), 32, 128, True)
    if case.get("rotary"):
        kw["rotary"] = case["rotary"]
    if case.get("lens"):
        kw["seqlens"] = torch.tensor(case["lens"], dtype=torch.int32, device="cuda")
    out, lse = flashsci.attention(q, k, v, return_lse=True, **kw)
    grads = flashsci.attention_backward(torch.randn_like(out), q, k, v, out, lse,
                                        deterministic=case.get("deterministic", False), **kw)
    torch.cuda.synchronize()
    assert all(torch.isfinite(g).all() for g in grads[:3])


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else list(CASES)
    threading.Thread(target=watchdog, args=(float(os.environ.get("WATCH", 20)),), daemon=True).start()
    rng = random.Random(os.getpid())
    calls, end = 0, time.time() + seconds
    while time.time() < end:
        name, dtype = rng.choice(names), rng.choice([torch.float16, torch.bfloat16])
        running[:] = [f"{name} {dtype}", time.time()]
        call(CASES[name], dtype)
        calls += 1
    print(f"pid {os.getpid()}: {calls} calls in {seconds:.0f} s, no hang", flush=True)


if __name__ == "__main__":
    main()
