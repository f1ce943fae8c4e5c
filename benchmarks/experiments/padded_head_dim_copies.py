"""The padded head-dim path kernel by kernel: one causal forward and one backward of the 2.7B LM's attention
(4, 32, S, 80, rotary, bf16) under torch.profiler, every kernel in launch order with its time, against the same call
at D = 128 (native) and SDPA at D = 80; then whole-call times by CUDA events (median of 20)."""
import torch
import flashsci
import flashsci.torch_ops
from flashsci.profile.trace import capture

S = 2048


def inputs(D, grad=True):
    return [torch.randn(4, S, 32, D, device="cuda", dtype=torch.bfloat16, requires_grad=grad) for _ in range(3)]


def fwd_bwd(q, k, v):
    o = flashsci.torch_ops.attention(q, k, v, causal=True, layout="bshd", rotary_base=10000.0)
    o.backward(torch.randn_like(o))


def timed(fn, n=20):
    ts = []
    for _ in range(n + 3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts[3:])[n // 2]


for D in (80, 128):
    q, k, v = inputs(D)
    fwd_bwd(q, k, v)
    _, t = capture(lambda: fwd_bwd(q, k, v))
    print(f"D = {D}: kernels of one forward + backward")
    tot = 0.0
    for e in t.kernels:
        tot += e["us"]
        print(f"   {e['us']:8.1f} us  {e['name'][:100]}")
    print(f"   {tot:8.1f} us  total")
    print(f"D = {D}: forward+backward {timed(lambda: fwd_bwd(q, k, v)):.3f} ms")
q, k, v = inputs(80)
def sdpa():
    o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    o.backward(torch.randn_like(o))
print(f"SDPA D = 80 (no rotary): forward+backward {timed(sdpa):.3f} ms")
