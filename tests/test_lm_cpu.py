"""The profiling study's transformer LM (flashsci.bench.models.lm) on the CPU in float64: naive, SDPA and flashsci
attention give the same logits and the same gradients (the fused attention with the rotary in the kernel, and the
fused SwiGLU forward and backward, against the torch formulas), to 1e-7: the rotary angles are float32 on both sides,
computed differently."""
import pytest

torch = pytest.importorskip("torch")
from flashsci.bench.models.lm import LM  # noqa: E402


def models():
    out = {}
    for attention in ("naive", "sdpa", "flashsci"):
        torch.manual_seed(0)
        out[attention] = LM((64, 2, 4), attention).double()
    return out


def test_same_logits_and_gradients():
    ids = torch.randint(10000, (2, 33), generator=torch.Generator().manual_seed(1))
    ms = models()
    with torch.no_grad():
        ref = ms["naive"](ids)
        for name in ("sdpa", "flashsci"):
            assert (ms[name](ids) - ref).abs().max() <= 1e-7 * ref.abs().max(), name
    grads = {}
    for name, m in ms.items():
        m.loss(ids).backward()
        grads[name] = {n: p.grad for n, p in m.named_parameters()}
    for name in ("sdpa", "flashsci"):
        for n, g in grads["naive"].items():
            assert (grads[name][n] - g).abs().max() <= 1e-6 * max(g.abs().max().item(), 1e-12), (name, n)


def test_head_dim_80_as_the_27b_model():
    torch.manual_seed(0)
    ids = torch.randint(10000, (1, 20))
    a, b = LM((160, 1, 2), "naive").double(), LM((160, 1, 2), "flashsci").double()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        ref = a(ids)
        assert (b(ids) - ref).abs().max() <= 1e-7 * ref.abs().max()
