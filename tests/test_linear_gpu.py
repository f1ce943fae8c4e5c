"""CUDA linear / swiglu against torch: max error <= 2x the error of torch's own fp16/bf16 result against a
float64 reference, on the benchmark's shapes and fuzzed ones, both kernels (the Hopper one where the device is
an sm_90, and the portable sm80 one forced), outputs poisoned before each run."""
import math
import random

import pytest

import flashsci

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
F = torch.nn.functional

ACTS = [None, "relu", "gelu", "gelu_tanh", "silu"]
# (M, K, N, mode) of the protein models: ESM2-3B, ProtT5-XL, ESM-C-600M, small M (large ones trimmed in M)
MODEL_SHAPES = [(2048, 2560, 7680, None), (2048, 2560, 10240, "gelu"), (2048, 10240, 2560, None), (2048, 1024, 16384, "relu"),
         (2048, 16384, 1024, None), (2048, 1152, 3072, "swiglu"), (256, 2560, 10240, "gelu"), (1024, 2560, 10240, None),
         (16137, 1280, 1280, "gelu"), (256, 512, 5120, "swiglu")]   # the last: 192-wide Hopper tiles


def torch_act(y, act):
    if act == "relu":
        return F.relu(y)
    if act == "gelu":
        return F.gelu(y)
    if act == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    if act == "silu":
        return F.silu(y)
    return y


def check(m, k, n, act=None, bias=True, dtype=torch.float16, out_dtype=None, swiglu=False, packed=True,
          x_pad=0, lead=None, bias_dtype=None):
    dev = "cuda"
    xb = torch.randn(m, k + x_pad, device=dev, dtype=dtype)
    x = xb[:, :k]                                   # rows k + x_pad apart when x_pad > 0
    if lead:
        x = x.reshape(*lead, k) if x_pad == 0 else x.unflatten(0, lead)
    w = torch.randn(2 * n if swiglu else n, k, device=dev, dtype=dtype) / math.sqrt(k)
    b = torch.randn(n, device=dev, dtype=bias_dtype or dtype) if bias and not swiglu else None
    xd, wd = x.double(), w.double()
    if swiglu:
        ref = F.silu(xd @ wd[:n].T) * (xd @ wd[n:].T)
        theirs = F.silu(x @ w[:n].T) * (x @ w[n:].T)
    else:
        ref = torch_act(xd @ wd.T + (b.double() if b is not None else 0), act)
        theirs = torch_act(F.linear(x, w, b.to(dtype) if b is not None else None), act)
    torch_err = (theirs.double() - ref).abs().max().item()
    od = out_dtype or dtype
    out = torch.full((*x.shape[:-1], n), float("nan"), device=dev, dtype=od)
    if swiglu:
        res = flashsci.swiglu(x, w, out=out, out_dtype=out_dtype) if packed else \
            flashsci.swiglu(x, w[:n], w[n:], out=out, out_dtype=out_dtype)
    else:
        res = flashsci.linear(x, w, b, activation=act, out=out, out_dtype=out_dtype)
    assert res is out
    assert torch.isfinite(out).all(), "unwritten (NaN-poisoned) or non-finite output"
    err = (out.double() - ref).abs().max().item()
    what = (m, k, n, act, dtype, od, swiglu, x_pad, lead)
    assert err <= 2 * torch_err + 1e-6, f"{what}: err {err:.3e} > 2 x torch {torch_err:.3e}"
    # the allocating call gives the same values
    fresh = flashsci.swiglu(x, w, out_dtype=out_dtype) if swiglu else flashsci.linear(x, w, b, activation=act, out_dtype=out_dtype)
    assert fresh.dtype == od and fresh.shape == out.shape and torch.equal(fresh, out)


@pytest.mark.parametrize("cfg", MODEL_SHAPES, ids=str)
def test_model_shapes(cfg, gemm_kernel):
    m, k, n, mode = cfg
    if mode == "swiglu":
        check(m, k, n, swiglu=True)
    else:
        check(m, k, n, act=mode, bias=mode != "relu")


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_activations(act, dtype, gemm_kernel):
    check(300, 264, 328, act=act, dtype=dtype)


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_out_dtypes(out_dtype, gemm_kernel):
    check(200, 128, 136, act="gelu", dtype=torch.bfloat16, out_dtype=out_dtype)


@pytest.mark.parametrize("packed", [True, False])
def test_swiglu_tails(packed, gemm_kernel):
    check(77, 72, 200, swiglu=True, packed=packed)


def test_bias_fp32_on_fp16(gemm_kernel):
    check(129, 64, 72, act="silu", bias_dtype=torch.float32)


def test_square_8192(gemm_kernel):
    check(8192, 8192, 8192, bias=False)


@pytest.mark.parametrize("seed", range(60))
def test_fuzzed_shapes(seed, gemm_kernel):
    rng = random.Random(seed * 104729 + 7)
    m = rng.choice([1, 2, 7, 63, 64, 65, 127, 129, 255, 300, 777, 1500])
    k = 8 * rng.randint(1, 90)
    n = 8 * rng.randint(1, 90)
    swiglu = rng.random() < 0.25
    check(m, k, n, act=rng.choice(ACTS), bias=rng.random() < 0.6, dtype=rng.choice([torch.float16, torch.bfloat16]),
          out_dtype=rng.choice([None, None, torch.float32]), swiglu=swiglu, packed=rng.random() < 0.5,
          x_pad=rng.choice([0, 0, 8, 24]), lead=(1, m) if rng.random() < 0.3 else None,
          bias_dtype=rng.choice([None, torch.float32]))


@pytest.mark.parametrize("n", [200, 512])
def test_out_with_row_stride(n, gemm_kernel):
    """out= a view with padded rows: the Hopper kernel's TMA stores follow the row stride and leave the padding."""
    x = torch.randn(300, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, 256, device="cuda", dtype=torch.bfloat16) / 16
    base = torch.full((300, n + 24), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = base[:, 8:n + 8]
    assert flashsci.linear(x, w, activation="relu", out=out) is out
    ref = F.relu(x.double() @ w.double().T)
    torch_err = (F.relu(F.linear(x, w)).double() - ref).abs().max().item()
    assert (out.double() - ref).abs().max().item() <= 2 * torch_err + 1e-6
    assert torch.isnan(base[:, :8]).all() and torch.isnan(base[:, n + 8:]).all()


def test_cpu_path_agrees():
    x = torch.randn(150, 96, dtype=torch.float16)
    w = torch.randn(80, 96, dtype=torch.float16) / 10
    b = torch.randn(80, dtype=torch.float16)
    cpu = flashsci.linear(x, w, b, activation="gelu", out_dtype=torch.float32)
    gpu = flashsci.linear(x.cuda(), w.cuda(), b.cuda(), activation="gelu", out_dtype=torch.float32)
    assert (gpu.cpu() - cpu).abs().max().item() < 2e-3


def test_dispatch_plan():
    cap = torch.cuda.get_device_capability()
    plan = flashsci._flashsci._gemm_plan(8192, 7680, 2560)
    assert plan["kernel"] == ("sm90" if cap == (9, 0) else "sm80")
    if cap == (9, 0):
        assert (plan["BM"], plan["BN"]) == (128, 256) and plan["grid"] == plan["sm_count"]
        small = flashsci._flashsci._gemm_plan(256, 7680, 2560)   # 60 big tiles < SMs: 128 x 128 tiles
        assert small["BN"] == 128 and small["tiles"] == 120
        mid = flashsci._flashsci._gemm_plan(256, 10240, 2560)   # 160-wide tiles: 128 in one round (192: 108)
        assert mid["BN"] == 160 and mid["tiles"] == 128
        assert flashsci._flashsci._gemm_plan(256, 10240, 2560, swiglu=True)["BN"] != 80   # SwiGLU: no 160-wide tile
        # the backward's dW = dh^T x at ESM2-3B fc1 (10240 x 2560 from 16k tokens): the last round's few tiles are
        # split along K so that every SM takes a chunk; the forward product is never split
        dw = flashsci._flashsci._gemm_plan(10240, 2560, 16384, transposed=2)
        tail = dw["tiles"] % dw["sm_count"]
        assert dw["split"] > 1 and tail * dw["split"] <= dw["sm_count"] and dw["grid"] == dw["sm_count"]
        assert plan["split"] == 1 and flashsci._flashsci._gemm_plan(10240, 2560, 16384)["split"] == 1
        # the backward's products at 1600 columns with long K (the LM grid's xl SwiGLU, 16k tokens): 256-wide tiles,
        # whose K steps cost less per column than 128-wide ones
        assert flashsci._flashsci._gemm_plan(16384, 1600, 12800, transposed=1)["BN"] == 256
        assert flashsci._flashsci._gemm_plan(12800, 1600, 16384, transposed=2)["BN"] == 256


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_160_wide_tiles(dtype, gemm_kernel):
    """M <= 256 and N near 132 x 80: the 160-wide tile (TMA stores in 32-column boxes), with tails in M, N and K."""
    if gemm_kernel == "auto" and torch.cuda.get_device_capability() == (9, 0):
        assert flashsci._flashsci._gemm_plan(200, 9592, 520)["BN"] == 160
    check(200, 520, 9592, act="gelu", dtype=dtype)
    check(256, 2560, 10240, bias=False, dtype=dtype, x_pad=8)


@pytest.mark.parametrize("width", [128, 160, 192, 256])
def test_hopper_tile_widths(width):
    """Every Hopper tile width forced in turn (the staging tile's 64- and 32-column TMA boxes, the activation warps,
    direct stores for other output dtypes and unaligned rows) on fuzzed shapes with tails in M, N and K."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper GEMM runs on sm_90 devices only")
    flashsci._flashsci._set_gemm_kernel(f"sm90:{width}")
    try:
        assert flashsci._flashsci._gemm_plan(1000, 1000, 1000)["BN"] == width
        rng = random.Random(width)
        halves = [torch.float16, torch.bfloat16]
        for _ in range(12):
            m, k, n = rng.choice([1, 65, 200, 333, 1100]), 8 * rng.randint(1, 70), 8 * rng.randint(1, 70)
            check(m, k, n, act=rng.choice(ACTS), bias=rng.random() < 0.6, dtype=rng.choice(halves),
                  out_dtype=rng.choice([None, None, torch.float32]), swiglu=rng.random() < 0.25, x_pad=rng.choice([0, 8]),
                  bias_dtype=rng.choice([None, torch.float32, *halves]))
        # one K step per tile and 4 to 8 tiles per CTA: the producer reuses each bias buffer while the ring runs ahead
        check(4000, 64, 4096, act="relu", dtype=torch.bfloat16, bias_dtype=torch.float16)
        test_out_with_row_stride(200, "auto")
    finally:
        flashsci._flashsci._set_gemm_kernel("auto")


def test_cuda_graph_capture():
    x = torch.randn(512, 256, device="cuda", dtype=torch.float16)
    w = torch.randn(384, 256, device="cuda", dtype=torch.float16) / 16
    b = torch.randn(384, device="cuda", dtype=torch.float16)
    out = torch.empty(512, 384, device="cuda", dtype=torch.float16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        flashsci.linear(x, w, b, activation="relu", out=out)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        flashsci.linear(x, w, b, activation="relu", out=out)
    x.copy_(torch.randn_like(x))
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert (out.float() - F.relu(F.linear(x, w, b)).float()).abs().max().item() < 2e-2


class TestCudaErrors:
    def test_fp32_refused(self):
        x = torch.randn(8, 16, device="cuda")
        with pytest.raises(TypeError, match="CUDA linear supports float16 and bfloat16 inputs, got float32"):
            flashsci.linear(x, torch.randn(8, 16, device="cuda"))

    def test_multiple_of_8(self):
        x = torch.randn(8, 20, device="cuda", dtype=torch.float16)
        with pytest.raises(ValueError, match="multiples of 8 .*got N=8, K=20"):
            flashsci.linear(x, torch.randn(8, 20, device="cuda", dtype=torch.float16))

    def test_misaligned_rows(self):
        xb = torch.randn(8, 36, device="cuda", dtype=torch.float16)
        with pytest.raises(ValueError, match="not a multiple of 16 bytes|not 16-byte aligned"):
            flashsci.linear(xb[:, 4:36], torch.randn(8, 32, device="cuda", dtype=torch.float16))

    def test_devices_differ(self):
        x = torch.randn(8, 16, device="cuda", dtype=torch.float16)
        with pytest.raises(ValueError, match="weight is on cpu but x is on cuda:0"):
            flashsci.linear(x, torch.randn(8, 16, dtype=torch.float16))

    def test_requires_grad(self):
        x = torch.randn(8, 16, device="cuda", dtype=torch.float16, requires_grad=True)
        with pytest.raises(ValueError, match="x requires grad"):
            flashsci.linear(x, torch.randn(8, 16, device="cuda", dtype=torch.float16))
