import torch, flashsci
from flashsci.profile.trace import capture
from flashsci.profile.report import summary
for D, H in ((80, 32), (128, 20), (64, 40)):
    print(D, flashsci._flashsci._launch_plan(4, H, 2048, 2048, D, True))
    q, k, v = (torch.randn(4, 2048, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    def f():
        with torch.profiler.record_function("inference"):
            for _ in range(5):
                flashsci.attention(q, k, v, causal=True, layout="bshd", rotary=True)
    f()
    _, t = capture(f)
    s = summary(t, "inference", top=6)
    for n, c, ms in s["top"]:
        print(f"   {ms/5:8.3f} ms  {c//5}  {n[:110]}")
