"""ReLU at its kink, both GEMM kernels (sm80 forced, then as dispatched) at ESM2-3B fc1's shape trimmed to 1,024 rows:
the fused forward against the one that keeps h, the gradients through h against through y, and the differentiable op
against both (where an fp32 rounding error's sign picks relu's derivative)."""
import math

import torch

import flashsci
import flashsci.torch_ops as T
for kern in ["sm80", "auto"]:
    flashsci._flashsci._set_gemm_kernel(kern)
    m, k, n = 1024, 2560, 10240
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") / math.sqrt(k)).bfloat16()
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    h = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    y1 = flashsci.linear(x, w, b, activation="relu")
    y2 = flashsci.linear(x, w, b, activation="relu", preactivation=h)
    torch.cuda.synchronize()
    print(kern, "y fused vs y from h", (y1.float() - y2.float()).abs().max().item(), "mask mismatch", ((y1 > 0) != (h > 0)).sum().item())
    g1 = flashsci.linear_backward(dy, x, w, preactivation=h, activation="relu", bias_grad=True)
    g2 = flashsci.linear_backward(dy, x, w, preactivation=y1, activation="relu", bias_grad=True)
    torch.cuda.synchronize()
    print(kern, [(a.float() - c.float()).abs().max().item() for a, c in zip(g1, g2)])
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
    yy = T.linear(xr, wr, br, "relu")
    print(kern, "op y vs fused", (yy.float() - y1.float()).abs().max().item())
    gg = torch.autograd.grad(yy, (xr, wr, br), dy)
    print(kern, "op grads vs h-based", [(a.float() - c.float()).abs().max().item() for a, c in zip(gg, g1)])
