"""Probe the transposed GEMM products one by one (sm80 forced, then each Hopper width), each in a child process with
a timeout, printing the max error against torch."""
import subprocess
import sys

CASE = r'''
import sys, torch, flashsci
kernel, mode = sys.argv[1], sys.argv[2]
flashsci._flashsci._set_gemm_kernel(kernel)
m, k, n = 300, 200, 264
x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
if mode == "fwd_pre":
    h = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    y = flashsci.linear(x, w, activation="gelu", preactivation=h); torch.cuda.synchronize()
    print(mode, kernel, (h.float() - (x.float() @ w.float().T)).abs().max().item())
elif mode == "dx":
    dx, dw, db = flashsci.linear_backward(dy, x, w); torch.cuda.synchronize()
    print(mode, kernel, (dx.float() - dy.float() @ w.float()).abs().max().item(), (dw.float() - dy.float().T @ x.float()).abs().max().item())
elif mode == "act":
    h = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    dx, dw, db = flashsci.linear_backward(dy, x, w, preactivation=h, activation="gelu", bias_grad=True); torch.cuda.synchronize()
    print(mode, kernel, db.float().abs().max().item())
elif mode == "swiglu":
    wu = torch.randn(n, k, device="cuda", dtype=torch.bfloat16); h = torch.empty(m, 2 * n, device="cuda", dtype=torch.bfloat16)
    y = flashsci.swiglu(x, w, wu, preactivation=h)
    g = flashsci.swiglu_backward(torch.randn_like(y), x, w, wu, preactivation=h); torch.cuda.synchronize()
    print(mode, kernel, [t.float().abs().max().item() for t in g])
'''
for kernel in ["sm80", "sm90:128", "sm90:256"]:
    for mode in ["fwd_pre", "dx", "act", "swiglu"]:
        try:
            r = subprocess.run([sys.executable, "-c", CASE, kernel, mode], capture_output=True, text=True, timeout=40)
            print(r.stdout.strip() or r.stderr.strip()[-300:], flush=True)
        except subprocess.TimeoutExpired:
            print("TIMEOUT", kernel, mode, flush=True)
