"""CUDA linear / swiglu gradients (flashsci.linear_backward, swiglu_backward and the differentiable torch ops) against
float64 autograd: each gradient's max error <= 2x the error of torch's own fp16/bf16 autograd (F.linear + the
activation) against the same reference, on protein-model FFN shapes and tails, both GEMM kernels (the Hopper one
where the device is an sm_90, the portable sm80 one forced), gradients poisoned before each run."""
import math

import pytest

import flashsci

torch = pytest.importorskip("torch")
import flashsci.torch_ops  # noqa: E402,F401  (registers torch.ops.flashsci)
from test_linear_gpu import ACTS, torch_act  # noqa: E402

pytestmark = pytest.mark.gpu
F = torch.nn.functional
ops = torch.ops.flashsci

# (M, K, N): ESM2-3B FFN (trimmed in M), ESM2-650M, ESM-C-600M SwiGLU, tails in every dimension; (9000, 1280, 1000):
# several rounds of tiles in every product, with a tail of rows and of output columns
SHAPES = [(1024, 2560, 10240), (2048, 10240, 2560), (777, 1280, 5120), (100, 200, 136), (3, 64, 8), (130, 72, 264),
          (9000, 1280, 1000)]


def grads(fn, inputs, dy):
    """Gradients of sum(fn(*inputs) * dy) with respect to inputs."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    out = fn(*leaves)
    return torch.autograd.grad(out, leaves, dy.to(out.dtype))


def assert_within(ours, theirs, ref, what):
    """Each of ours within 2x torch's own error against the float64 reference, or at most one step of the dtype's
    spacing (at the gradient's largest value) further from it than torch's: the neighbour of torch's value, where a
    float32 sum of rounded terms fell on the other side of a rounding midpoint (tiny shapes, whose errors are single
    roundings: SwiGLU at 5 x 64 -> 24 reached 2.3x torch's error once, bf16 dw_up 0.0695 against 0.0297)."""
    for name, a, b, r in zip(what, ours, theirs, ref):
        err, torch_err = (a.double() - r).abs().max().item(), (b.double() - r).abs().max().item()
        one_step = (2.0 ** -7 if a.dtype == torch.bfloat16 else 2.0 ** -10) * r.abs().max().item()
        assert err <= max(2 * torch_err, torch_err + one_step) + 1e-6, f"{name}: error {err:.3g}, torch {torch_err:.3g}"


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mkn", SHAPES, ids=str)
def test_linear_grads(mkn, dtype, act, gemm_kernel):
    m, k, n = mkn
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    w = (torch.randn(n, k, device="cuda") / math.sqrt(k)).to(dtype)
    b = torch.randn(n, device="cuda", dtype=dtype)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    if act == "relu":
        # at relu's kink the sign of an fp32 rounding error picks the derivative (cuBLAS and the Hopper kernel round
        # alike there, the portable kernel's mma.sync does not): no gradient flows through |h| < 1e-3
        dy = dy * (F.linear(x.double(), w.double(), b.double()).abs() > 1e-3)
    ref = grads(lambda x, w, b: torch_act(F.linear(x, w, b), act), (x.double(), w.double(), b.double()), dy.double())
    theirs = grads(lambda x, w, b: torch_act(F.linear(x, w, b), act), (x, w, b), dy)
    ours = grads(lambda x, w, b: ops.linear(x, w, b, act), (x, w, b), dy)
    assert_within(ours, theirs, ref, ("dx", "dw", "db"))


@pytest.mark.parametrize("width", [128, 192, 256])
def test_split_last_round_hopper_widths(width):
    """The backward's products at every transposed Hopper tile width, on shapes whose last round of tiles is split
    along K (the plan says so) or not: gradients within 2x torch's error, SwiGLU's halves included."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper GEMM runs on sm_90 devices only")
    flashsci._flashsci._set_gemm_kernel(f"sm90:{width}")
    try:
        splits = set()
        for m, k, n in [(4000, 1280, 1000), (9000, 520, 2056), (712, 264, 136)]:
            splits.add(flashsci._flashsci._gemm_plan(n, k, m, transposed=2)["split"] > 1)   # dW = dh^T x
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = (torch.randn(n, k, device="cuda") / math.sqrt(k)).to(torch.bfloat16)
            b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            ref = grads(lambda x, w, b: F.gelu(F.linear(x, w, b)), (x.double(), w.double(), b.double()), dy.double())
            theirs = grads(lambda x, w, b: F.gelu(F.linear(x, w, b)), (x, w, b), dy)
            ours = grads(lambda x, w, b: ops.linear(x, w, b, "gelu"), (x, w, b), dy)
            assert_within(ours, theirs, ref, ("dx", "dw", "db"))
            wu = (torch.randn(n, k, device="cuda") / math.sqrt(k)).to(torch.bfloat16)
            ref = grads(lambda x, w, u: F.silu(F.linear(x, w)) * F.linear(x, u), (x.double(), w.double(), wu.double()), dy.double())
            theirs = grads(lambda x, w, u: F.silu(F.linear(x, w)) * F.linear(x, u), (x, w, wu), dy)
            ours = grads(lambda x, w, u: ops.swiglu(x, w, u), (x, w, wu), dy)
            assert_within(ours, theirs, ref, ("dx", "dw_gate", "dw_up"))
        assert True in splits   # at least one of the shapes split its dW product's last round at this width
    finally:
        flashsci._flashsci._set_gemm_kernel("auto")


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mkn", [(2048, 1152, 3072), (16384, 64, 328), (300, 136, 200), (5, 64, 24)], ids=str)
def test_swiglu_preactivation(mkn, dtype, packed, gemm_kernel):
    """swiglu(..., preactivation=h) (Hopper, many tiles: one product whose tiles hold g and u side by side, both
    stored to h before silu(g) u; else the gate and up products into h, then the elementwise pass; N's tail in the
    second shape): h holds x Wg^T | x Wu^T as accurately as torch's products (assert_within), and y is silu(g) u of
    h's rounded values (to one rounding of y); h and y poisoned first."""
    check_swiglu_preactivation(*mkn, dtype, packed)


def check_swiglu_preactivation(m, k, n, dtype, packed):
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    wg, wu = ((torch.randn(n, k, device="cuda") / math.sqrt(k)).to(dtype) for _ in range(2))
    h = torch.full((m, 2 * n), float("nan"), device="cuda", dtype=dtype)
    y = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    if packed:
        flashsci.swiglu(x, torch.cat([wg, wu]), out=y, preactivation=h)
    else:
        flashsci.swiglu(x, wg, wu, out=y, preactivation=h)
    ref = torch.cat([x.double() @ wg.double().T, x.double() @ wu.double().T], 1)
    assert_within((h,), (torch.cat([x @ wg.T, x @ wu.T], 1),), (ref,), ("pre-activation",))
    g, u = h.double().split(n, 1)
    assert_one_rounding(y, F.silu(g) * u)


def assert_one_rounding(y, expect):
    """y is expect rounded to y's dtype, give or take one step of its spacing (their float32 math differs slightly)."""
    step = 2.0 ** -7 if y.dtype == torch.bfloat16 else 2.0 ** -10
    bad = (y.double() - expect).abs() > step * expect.abs() + 1e-6
    assert not bad.any(), f"{int(bad.sum())} values off, e.g. {y[bad][:3].tolist()} for {expect[bad][:3].tolist()}"


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mkn", [(2048, 1280, 5120), (16384, 64, 328), (100, 200, 136), (130, 72, 264)], ids=str)
def test_linear_preactivation(mkn, dtype, act, gemm_kernel):
    """linear(..., preactivation=h) (Hopper, many tiles and an activation its producer warpgroup applies: h stored
    from the staged tile before it is activated; else the product into h, then the activation as an elementwise pass;
    tails): h as accurate as torch's F.linear (assert_within), y the activation of h's rounded values; h and y
    poisoned first."""
    check_linear_preactivation(*mkn, dtype, act)


@pytest.mark.parametrize("width", [128, 160, 192, 256])
def test_preactivation_hopper_widths(width):
    """The kept pre-activation at every Hopper tile width forced (32- and 64-column boxes; SwiGLU takes 128 or 256,
    whose halves are whole boxes, whatever is forced), many tiles with tails in M and N, and few tiles."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper GEMM runs on sm_90 devices only")
    flashsci._flashsci._set_gemm_kernel(f"sm90:{width}")
    try:
        for m, k, n in [(16300, 72, 328), (300, 136, 200)]:
            check_linear_preactivation(m, k, n, torch.bfloat16, "gelu")
            check_linear_preactivation(m, k, n, torch.float16, "silu")
            check_swiglu_preactivation(m, k, n, torch.bfloat16, packed=False)
            check_swiglu_preactivation(m, k, n, torch.float16, packed=True)
    finally:
        flashsci._flashsci._set_gemm_kernel("auto")


def check_linear_preactivation(m, k, n, dtype, act):
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    w = (torch.randn(n, k, device="cuda") / math.sqrt(k)).to(dtype)
    b = torch.randn(n, device="cuda", dtype=dtype)
    h = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    y = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    flashsci.linear(x, w, b, activation=act, out=y, preactivation=h)
    assert_within((h,), (F.linear(x, w, b),), (F.linear(x.double(), w.double(), b.double()),), ("pre-activation",))
    assert_one_rounding(y, torch_act(h.double(), act))


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mkn", [(2048, 1152, 3072), (300, 136, 200), (5, 64, 24)], ids=str)
def test_swiglu_grads(mkn, dtype, packed, gemm_kernel):
    m, k, n = mkn
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    wg, wu = ((torch.randn(n, k, device="cuda") / math.sqrt(k)).to(dtype) for _ in range(2))
    dy = torch.randn(m, n, device="cuda", dtype=dtype)

    def ref_fn(x, wg, wu):
        return F.silu(x @ wg.T) * (x @ wu.T)

    ref = grads(ref_fn, (x.double(), wg.double(), wu.double()), dy.double())
    theirs = grads(ref_fn, (x, wg, wu), dy)
    if packed:
        dx, dw = grads(lambda x, w: ops.swiglu(x, w), (x, torch.cat([wg, wu])), dy)
        ours = (dx, dw[:n], dw[n:])
    else:
        ours = grads(lambda x, wg, wu: ops.swiglu(x, wg, wu), (x, wg, wu), dy)
    assert_within(ours, theirs, ref, ("dx", "dw_gate", "dw_up"))


def test_c_api_poisoned_outputs_and_strides(gemm_kernel):
    """linear_backward into given (NaN-poisoned) arrays from strided rows; a float32 dbias; no NaN left behind."""
    m, k, n = 300, 264, 136
    xb = torch.randn(m, k + 24, device="cuda", dtype=torch.bfloat16)
    x = xb[:, :k]
    w = (torch.randn(n, k, device="cuda") / math.sqrt(k)).bfloat16()
    h = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    y = flashsci.linear(x, w, activation="gelu_tanh", preactivation=h)
    torch.testing.assert_close(y, flashsci.linear(x, w, activation="gelu_tanh"), atol=2e-2, rtol=2e-2)
    dy = torch.randn_like(y)
    dx, dw = torch.full_like(x, float("nan")), torch.full_like(w, float("nan"))
    db = torch.full((n,), float("nan"), device="cuda")
    r = flashsci.linear_backward(dy, x, w, preactivation=h, activation="gelu_tanh", bias_grad=True, dx=dx, dweight=dw,
                                 dbias=db)
    assert r[0] is dx and r[1] is dw and r[2] is db
    ref = grads(lambda x, w: torch_act(x @ w.T, "gelu_tanh"), (x.double(), w.double()), dy.double())
    for got, want in zip((dx, dw), ref):
        assert not got.isnan().any()
        assert (got.double() - want).abs().max().item() <= 0.05 * want.abs().max().item()
    want_db = grads(lambda b: torch_act(h.double() + b, "gelu_tanh"), (torch.zeros(n, device="cuda", dtype=torch.float64),),
                    dy.double())[0]
    assert (db.double() - want_db).abs().max().item() <= 1e-3 * want_db.abs().max().item() + 1e-3


def test_no_rows(gemm_kernel):
    x, w = torch.empty(0, 64, device="cuda", dtype=torch.bfloat16), torch.randn(32, 64, device="cuda", dtype=torch.bfloat16)
    h, dy = torch.empty(0, 32, device="cuda", dtype=torch.bfloat16), torch.empty(0, 32, device="cuda", dtype=torch.bfloat16)
    dw, db = torch.full_like(w, float("nan")), torch.full((32,), float("nan"), device="cuda", dtype=torch.bfloat16)
    dx, dw, db = flashsci.linear_backward(dy, x, w, preactivation=h, activation="gelu", bias_grad=True, dweight=dw, dbias=db)
    assert dx.shape == (0, 64) and not dw.any() and not db.any()


def test_no_output_features(gemm_kernel):
    """N = 0: dx is zeros (a sum over nothing), dweight and dbias empty."""
    x, w = torch.randn(40, 64, device="cuda", dtype=torch.bfloat16), torch.empty(0, 64, device="cuda", dtype=torch.bfloat16)
    dx = torch.full_like(x, float("nan"))
    dx, dw, db = flashsci.linear_backward(torch.empty(40, 0, device="cuda", dtype=torch.bfloat16), x, w, bias_grad=True, dx=dx)
    assert not dx.any() and dw.shape == (0, 64) and db.shape == (0,)
