"""What an LM layer's layout costs the attention backward: one causal backward (default: the xl LM's 4 x 25 x 4096 x 64,
bf16) on bhsd tensors, on the bshd views of a packed (B, S, 3, H, D) qkv writing one packed gradient (the LM's
attention_qkvpacked), the same with rotary in the kernel, and cuDNN's (SDPA) on bhsd tensors and on the bhsd views of
bshd ones (the stock LM's q.transpose(1, 2)), in turns by CUDA events; then the kernels of the packed rotary call and
of cuDNN's under torch.profiler.
    python benchmarks/experiments/backward_layout_cost.py [--shape B,H,S,D]"""
import argparse

import torch

import flashsci
from flashsci.bench.timing import event_turns_us, flops
from flashsci.profile.report import launch_listing
from flashsci.profile.trace import capture

ap = argparse.ArgumentParser()
ap.add_argument("--shape", default="4,25,4096,64")
args = ap.parse_args()
B, H, S, D = (int(x) for x in args.shape.split(","))
F = torch.nn.functional
bf = dict(device="cuda", dtype=torch.bfloat16)

qkv = torch.randn(B, S, 3, H, D, **bf)
dout_bshd = torch.randn(B, S, H, D, **bf)
dqkv = torch.empty_like(qkv)
q_s, k_s, v_s = qkv.unbind(2)                               # bshd views, rows 3 H D apart
dq_s, dk_s, dv_s = dqkv.unbind(2)
q_h, k_h, v_h = (x.transpose(1, 2).contiguous() for x in (q_s, k_s, v_s))
dout_h = dout_bshd.transpose(1, 2).contiguous()
out_h, lse_h = flashsci.attention(q_h, k_h, v_h, causal=True, return_lse=True)
out_s, lse_s = flashsci.attention(q_s, k_s, v_s, causal=True, layout="bshd", return_lse=True)
out_r, lse_r = flashsci.attention(q_s, k_s, v_s, causal=True, layout="bshd", rotary=10000.0, return_lse=True)


def cudnn_forward(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    leaves = tuple(x.detach().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(*leaves, is_causal=True), leaves


o_ch, leaves_ch = cudnn_forward(q_h, k_h, v_h)
o_cs, leaves_cs = cudnn_forward(*(x.contiguous().transpose(1, 2) for x in (q_s, k_s, v_s)))
fns = {
    "flashsci bhsd": lambda: flashsci.attention_backward(dout_h, q_h, k_h, v_h, out_h, lse_h, causal=True),
    "flashsci packed bshd": lambda: flashsci.attention_backward(dout_bshd, q_s, k_s, v_s, out_s, lse_s, causal=True,
                                                                layout="bshd", dq=dq_s, dk=dk_s, dv=dv_s),
    "flashsci packed bshd rotary": lambda: flashsci.attention_backward(dout_bshd, q_s, k_s, v_s, out_r, lse_r,
                                                                       causal=True, layout="bshd", rotary=10000.0,
                                                                       dq=dq_s, dk=dk_s, dv=dv_s),
    "cudnn bhsd": lambda: torch.autograd.grad(o_ch, leaves_ch, dout_h, retain_graph=True),
    "cudnn bshd views": lambda: torch.autograd.grad(o_cs, leaves_cs, dout_h, retain_graph=True),
}
print(torch.cuda.get_device_name(), f"{B} x {H} x {S} x {D} causal, bf16")
f = 2.5 * flops(B, H, S, S, D, True)
for turn in range(2):
    t = event_turns_us(torch, fns, [()])
    print(f"turn {turn}: " + ", ".join(f"{k} {v:.0f} us ({f / v / 1e6:.0f} TF/s)" for k, v in t.items()))
for name in ("flashsci packed bshd rotary", "cudnn bshd views"):
    fns[name]()
    _, trace = capture(fns[name])
    print(f"{name}: kernels of one call")
    print("\n".join(launch_listing(trace, 110)))
