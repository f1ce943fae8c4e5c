"""A linear layer's backward with GELU, kernel by kernel: flashsci.linear_backward (dh = dy gelu'(h) with the bias
gradient, dx = dh W, dW = dh^T x) under torch.profiler at the linear_train benchmark's GELU shapes (16k tokens, bf16),
every kernel in launch order with its time; then the product alone (no activation, no bias) for comparison.
    python benchmarks/experiments/linear_backward_pass_profile.py"""
import math

import torch

import flashsci
from flashsci.profile.report import launch_listing
from flashsci.profile.trace import capture

print(torch.cuda.get_device_name())
for name, m, k, n in [("ESM2-3B fc1", 16384, 2560, 10240), ("ESM2-650M fc1", 16384, 1280, 5120)]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") / math.sqrt(k)).to(torch.bfloat16)
    h, dy = (torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for label, fn in (("gelu + bias", lambda: flashsci.linear_backward(dy, x, w, preactivation=h, activation="gelu", bias_grad=True)),
                      ("products only", lambda: flashsci.linear_backward(dy, x, w))):
        fn()
        _, t = capture(fn)
        print(f"{name}, {label}:")
        print("\n".join(launch_listing(t, 110)))

# the whole training step (forward + autograd.grad), flashsci's differentiable op against torch's F.gelu(F.linear)
import flashsci.torch_ops  # noqa: E402
for name, m, k, n in [("ESM2-3B fc1", 16384, 2560, 10240)]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") / math.sqrt(k)).to(torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    leaves = [t.detach().requires_grad_() for t in (x, w, b)]
    steps = (("flashsci", lambda: torch.autograd.grad(torch.ops.flashsci.linear(*leaves, "gelu"), leaves, dy)),
             ("torch", lambda: torch.autograd.grad(torch.nn.functional.gelu(torch.nn.functional.linear(*leaves)), leaves, dy)))
    for label, fn in steps:
        fn()
        _, t = capture(fn)
        print(f"{name}, training step, {label}:")
        print("\n".join(launch_listing(t, 110)))
