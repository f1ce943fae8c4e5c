"""The 2.7B LM's attention at short contexts, kernel by kernel: one causal forward + backward (4, S, 32, 80, bshd,
rotary in the kernel, bf16) through flashsci's torch op and through SDPA (rotary applied by torch beforehand, as the
LM's stock model does) under torch.profiler, every kernel in launch order with its time, S = 512 and 1024; then whole
calls by CUDA events (median of 30). Another LM size's heads by --heads / --dim (the xl model: --heads 25 --dim 64).
    python benchmarks/experiments/short_seq_backward_profile.py [--heads H] [--dim D] [S ...]"""
import argparse

import torch

import flashsci
import flashsci.torch_ops
from flashsci.bench.timing import median_event_time_us
from flashsci.profile.report import launch_listing
from flashsci.profile.trace import capture

ap = argparse.ArgumentParser()
ap.add_argument("--heads", type=int, default=32)
ap.add_argument("--dim", type=int, default=80)
ap.add_argument("contexts", type=int, nargs="*", default=[512, 1024])
args = ap.parse_args()
B, H, D = 4, args.heads, args.dim


def rotate(x, cos, sin):
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


print(torch.cuda.get_device_name())
for S in args.contexts:
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    ang = torch.arange(S, device="cuda")[:, None] * 10000.0 ** (-torch.arange(0, D, 2, device="cuda") / D)
    cos, sin = (f(ang)[None, :, None, :].to(torch.bfloat16) for f in (torch.cos, torch.sin))

    def ours():
        o = flashsci.torch_ops.attention(q, k, v, causal=True, layout="bshd", rotary_base=10000.0)
        o.backward(dout)

    def sdpa():
        qr, kr = rotate(q, cos, sin), rotate(k, cos, sin)
        o = torch.nn.functional.scaled_dot_product_attention(qr.transpose(1, 2), kr.transpose(1, 2), v.transpose(1, 2),
                                                             is_causal=True)
        o.transpose(1, 2).backward(dout)

    for name, fn in (("flashsci", ours), ("sdpa", sdpa)):
        fn()
        _, t = capture(fn)
        print(f"S = {S} {name}: kernels of one forward + backward")
        print("\n".join(launch_listing(t, 110)))
    for turn in range(2):
        t_ours, t_sdpa = (median_event_time_us(torch, fn, 1, iters=30) / 1e3 for fn in (ours, sdpa))
        print(f"S = {S}: flashsci {t_ours:.3f} ms, sdpa {t_sdpa:.3f} ms (whole forward + backward)")
