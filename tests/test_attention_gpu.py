"""CUDA attention against torch: max error <= 2x the error of torch's own fp16/bf16 SDPA against a float64
reference, on the benchmark's configs and >= 200 fuzzed shapes, outputs poisoned before each run."""
import math
import os
import random

import numpy as np
import pytest

import flashsci

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
F = torch.nn.functional

SEED = [(1, 1, 32), (1, 1, 64), (1, 1, 128), (1, 1, 256), (1, 1, 512), (4, 8, 128), (8, 8, 128), (8, 8, 256), (16, 8, 512)]
PROTEIN = [(8, 40, 1024, 64), (8, 18, 1024, 64), (8, 32, 1024, 128), (1, 40, 6144, 64)]
SWEEP = [(16384 // s, 2048 // d, s, d) for s in (512, 2048, 8192, 16384) for d in (64, 128)]


def hopper_kernel():
    """Whether Hopper problems may take the sm90 kernel here: an sm_90 device and a build with sm_90a code."""
    return torch.cuda.get_device_capability()[0] == 9 and "90a" in flashsci.build_info()["cuda_architectures"]


def reference(q, k, v, causal, scale):
    """float64 attention in (B, H, S, D), head by head chunks to bound memory; returns (out, lse)."""
    q, k, v = (x.double() for x in (q, k, v))
    outs, lses = [], []
    for h in range(0, q.shape[1], 4):
        s = (q[:, h:h + 4] @ k[:, h:h + 4].transpose(-1, -2)) * scale
        if causal:
            mask = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
            s = s.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(s, -1)
        outs.append(torch.exp(s - lse[..., None]) @ v[:, h:h + 4])
        lses.append(lse)
    return torch.cat(outs, 1), torch.cat(lses, 1)


def check(b, h, sq, sk, d, causal=False, dtype=torch.float16, layout="bhsd", strided=False, scale=None, lse=False):
    dev = "cuda"
    def make(s):
        if strided:   # a view with gaps in every non-last dim: heads sliced and sequence taken every 2nd row
            return torch.randn(b, 2 * h, 2 * s, d, device=dev, dtype=dtype)[:, ::2, ::2]
        return torch.randn(b, h, s, d, device=dev, dtype=dtype)
    q, k, v = make(sq), make(sk), make(sk)
    if layout == "bshd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))   # same memory seen as (B, S, H, D)
    qb, kb, vb = (x.transpose(1, 2) if layout == "bshd" else x for x in (q, k, v))
    sc = 1.0 / math.sqrt(d) if scale is None else scale
    ref, ref_lse = reference(qb, kb, vb, causal, sc)
    theirs = F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal, scale=sc)
    torch_err = (theirs.double() - ref).abs().max().item()
    out = torch.full_like(q, float("nan")).contiguous()
    res = flashsci.attention(q, k, v, causal=causal, scale=scale, layout=layout, out=out, return_lse=lse)
    if lse:
        assert res[0] is out
        got_lse = res[1]
        assert got_lse.shape == (b, h, sq) and got_lse.dtype == torch.float32
        assert (got_lse.double() - ref_lse).abs().max().item() < 1e-3
    else:
        assert res is out
    ours = out.transpose(1, 2) if layout == "bshd" else out
    assert torch.isfinite(ours).all(), "unwritten (NaN-poisoned) or non-finite output"
    err = (ours.double() - ref).abs().max().item()
    assert err <= 2 * torch_err, f"{(b, h, sq, sk, d, causal, dtype, layout)}: err {err:.3e} > 2 x torch {torch_err:.3e}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cfg", SEED + PROTEIN + SWEEP, ids=str)
def test_benchmark_configs(cfg, causal, dtype):
    b, h, s, d = cfg if len(cfg) == 4 else (*cfg, 64)
    check(b, h, s, s, d, causal=causal, dtype=dtype)


@pytest.mark.parametrize("seed", range(220))
def test_fuzzed_shapes(seed):
    rng = random.Random(seed * 7919 + 1)
    d = rng.choice([32, 64, 96, 128, 256])
    check(rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 700), rng.randint(1, 700), d,
          causal=rng.random() < 0.4, dtype=rng.choice([torch.float16, torch.bfloat16]),
          layout=rng.choice(["bhsd", "bshd"]), strided=rng.random() < 0.3,
          scale=rng.choice([None, 0.05, 0.3]), lse=rng.random() < 0.3)


@pytest.mark.parametrize("d", [32, 64, 96, 128, 256])
def test_split_kv_path_with_lse(d):
    """One head, long keys: the grid is split over the KV range and merged by logsumexp (causal: over the keys the
    query tiles see, rows 0 .. Sq - 1 seeing keys up to their own index)."""
    check(1, 1, 100, 4000, d, lse=True)
    check(1, 2, 333, 2500, d, causal=True, lse=True, dtype=torch.bfloat16)
    check(1, 1, 4200, 4500, d, causal=True, lse=True, dtype=torch.bfloat16)


@pytest.mark.parametrize("d", [32, 64])
def test_kv_group_variant(d):
    """Problems that leave most SMs idle split each query tile's keys over 4 warp groups, merged in shared memory
    (the portable kernel, forced: on Hopper the first of these takes the sm90 kernel at D = 64)."""
    plan = flashsci._flashsci._launch_plan
    try:
        flashsci._flashsci._set_attention_kernel("sm80")
        assert plan(1, 1, 512, 512, d)["kv_groups"] == 4 and plan(1, 1, 512, 512, d)["threads"] == 512
        assert plan(1, 1, 64, 64, d)["kv_groups"] == 1
        check(1, 1, 512, 512, d, lse=True)
        check(1, 3, 77, 300, d, causal=True, lse=True)  # causal, Sq < Sk: some groups' keys lie past every row
        check(2, 2, 300, 190, d, layout="bshd", strided=True, scale=0.3, dtype=torch.bfloat16)
        check(1, 2, 40, 3000, d, lse=True)  # 4 groups and KV splits across blocks together
    finally:
        flashsci._flashsci._set_attention_kernel("auto")


@pytest.mark.parametrize("d", [32, 64, 96, 128, 256])
def test_cluster_split(d):
    """On Hopper, query tiles that leave most SMs idle and span 16-32 key tiles split their keys over a thread-block
    cluster, merged through distributed shared memory (empty splits included: causal, the first query tiles seeing
    few keys); elsewhere the same problems run unsplit or with KV groups."""
    hopper = hopper_kernel()
    sk = 1024 if d != 256 else 512  # 16 key tiles (Bc = 32 at D = 256)
    plan = flashsci._flashsci._launch_plan(1, 1, 100, sk, d)
    assert plan["kernel"] == "sm80" and plan["cluster"] == hopper
    if hopper:
        assert plan["kv_splits"] == 8 and plan["blocks"] == 2 * 8
    assert flashsci._flashsci._launch_plan(1, 1, 100, 4 * sk, d)["cluster"] == 0  # long keys: splits via global memory
    check(1, 1, 100, sk, d, lse=True)
    sq, sk_causal = (1100, 2300) if d != 256 else (600, 1300)  # 18 or 20 key tiles seen: clusters of 7, 8
    assert flashsci._flashsci._launch_plan(1, 1, sq, sk_causal, d, True)["cluster"] == hopper
    check(1, 1, sq, sk_causal, d, causal=True, lse=True, dtype=torch.bfloat16)
    check(2, 2, 150, sk + 77, d, layout="bshd", strided=True, scale=0.3)


def test_agrees_with_cpu_path():
    q, k, v = (torch.randn(2, 3, 150, 64, dtype=torch.float16) for _ in range(3))
    cpu = flashsci.attention(q, k, v, causal=True).double()
    gpu = flashsci.attention(q.cuda(), k.cuda(), v.cuda(), causal=True).double().cpu()
    ref, _ = reference(q, k, v, True, 0.125)
    assert (gpu - cpu).abs().max().item() <= 2 * max((gpu - ref).abs().max().item(), (cpu - ref).abs().max().item())


def test_runs_on_torch_current_stream_and_explicit_stream():
    q, k, v = (torch.randn(4, 8, 512, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    expect = F.scaled_dot_product_attention(q, k, v)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = flashsci.attention(q, k, v)
    s.synchronize()
    assert (out - expect).abs().max().item() < 2e-2
    s2 = torch.cuda.Stream()
    s2.wait_stream(torch.cuda.current_stream())
    out2 = flashsci.attention(q, k, v, stream=s2)
    s2.synchronize()
    assert (out2 - expect).abs().max().item() < 2e-2
    out3 = flashsci.attention(q, k, v, stream=s2.cuda_stream)
    s2.synchronize()
    assert torch.equal(out2, out3)


def test_cuda_graph_capture():
    q, k, v = (torch.randn(2, 4, 300, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        flashsci.attention(q, k, v, out=out)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        flashsci.attention(q, k, v, out=out)
    q.copy_(torch.randn_like(q))
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert (out - F.scaled_dot_product_attention(q, k, v)).abs().max().item() < 3e-2


def test_cupy_interop():
    cp = pytest.importorskip("cupy")
    q, k, v = (cp.random.standard_normal((2, 4, 200, 64)).astype(cp.float16) for _ in range(3))
    info = flashsci._flashsci._inspect(q, "cai")
    assert info["source"] == "cuda_array_interface" and info["data"] == q.data.ptr
    out = flashsci.attention(q, k, v)
    assert isinstance(out, flashsci.Array) and out.device == "cuda:0"
    got = cp.from_dlpack(out)
    ref = F.scaled_dot_product_attention(*(torch.from_dlpack(x) for x in (q, k, v)))
    assert (torch.from_dlpack(got) - ref).abs().max().item() < 2e-2
    cai = out.__cuda_array_interface__
    assert cai["data"][0] == got.data.ptr and cai["version"] == 3


def test_jax_interop():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        pytest.skip("JAX sees no GPU")
    x = np.random.default_rng().standard_normal((3, 2, 4, 100, 64)).astype(np.float16)
    q, k, v = (jax.device_put(x[i], gpus[0]) for i in range(3))
    out = flashsci.attention(q, k, v)
    got = np.asarray(jnp.from_dlpack(out)).astype(np.float64)
    ref = F.scaled_dot_product_attention(*(torch.from_numpy(x[i]).double() for i in range(3))).numpy()
    assert np.abs(got - ref).max() < 2e-2


class TestGpuErrors:
    def test_float32_on_gpu(self):
        q = torch.randn(1, 2, 16, 64, device="cuda")
        with pytest.raises(TypeError, match="CUDA attention supports float16 and bfloat16, got float32"):
            flashsci.attention(q, q, q)

    def test_head_dim(self):
        for d in (84, 264):   # 84 as a view of 88-wide rows: the rows stay 16-byte aligned
            q = torch.randn(1, 2, 16, 88 if d == 84 else d, device="cuda", dtype=torch.float16)[..., :d]
            with pytest.raises(ValueError, match=f"head dims that are multiples of 8 up to 256, got {d}"):
                flashsci.attention(q, q, q)

    def test_misaligned(self):
        q = torch.randn(1, 2, 16, 72, device="cuda", dtype=torch.float16)[..., 1:65]
        with pytest.raises(ValueError, match="not 16-byte aligned"):
            flashsci.attention(q, q, q)

    def test_misaligned_rows(self):
        """An input's rows 8 bytes apart: the message suggests .contiguous(); a result's (out=, dq=): another array."""
        q = torch.randn(1, 2, 16, 64, device="cuda", dtype=torch.float16)
        rows = torch.empty(1, 2, 16, 68, device="cuda", dtype=torch.float16)[..., :64]
        rows.copy_(q)
        with pytest.raises(ValueError, match=r"q: stride 68 .* not a multiple of 16 bytes.*\.contiguous\(\) first"):
            flashsci.attention(rows, q, q)
        with pytest.raises(ValueError, match=r"out: stride 68 .* not a multiple of 16 bytes.*or none for a new one"):
            flashsci.attention(q, q, q, out=rows)
        out, lse = flashsci.attention(q, q, q, return_lse=True)
        with pytest.raises(ValueError, match=r"dq: stride 68 .* not a multiple of 16 bytes.*or none for a new one"):
            flashsci.attention_backward(q, q, q, q, out, lse, dq=rows)

    def test_mixed_devices(self):
        q = torch.randn(1, 2, 16, 64, device="cuda", dtype=torch.float16)
        with pytest.raises(ValueError, match="k is on cpu but q is on cuda:0"):
            flashsci.attention(q, q.cpu(), q)

    def test_out_on_wrong_device(self):
        q = torch.randn(1, 2, 16, 64, device="cuda", dtype=torch.float16)
        with pytest.raises(ValueError, match="out is on cpu but q is on cuda:0"):
            flashsci.attention(q, q, q, out=torch.empty(1, 2, 16, 64, dtype=torch.float16))

    def test_no_leak_on_gpu(self):
        """Device memory flat over 100k calls, torch outputs and flashsci.Array outputs (split path too)."""
        q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16)
        long_k = torch.randn(1, 2, 3000, 64, device="cuda", dtype=torch.float16)   # takes the split-KV path
        wrapped = [DLPackOnly(x) for x in (q, q, q)]
        for _ in range(1000):
            flashsci.attention(q, q, q)
            flashsci.attention(q, long_k, long_k)
            flashsci.attention(*wrapped)
        torch.cuda.synchronize()
        before, free_before = torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0]
        for _ in range(100000):
            flashsci.attention(q, q, q)
        for _ in range(5000):
            flashsci.attention(q, long_k, long_k)
            flashsci.attention(*wrapped)
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == before
        if "PYTEST_XDIST_WORKER" not in os.environ:   # other test processes share the device's free memory
            assert free_before - torch.cuda.mem_get_info()[0] < 64 << 20


class DLPackOnly:
    """A foreign CUDA array that speaks only DLPack (as CuPy or JAX do), wrapping a torch tensor."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None, max_version=None, **kw):
        return self.t.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def test_cuda_array_interface_stream_is_honoured():
    """A CAI v3 producer on another stream: flashsci makes its own stream wait for the producer's."""
    side = torch.cuda.Stream()
    x = torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.float16)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)          # keep the producer stream busy ...
        q = x * 2                               # ... then produce q on it

    class OnSide:
        @property
        def __cuda_array_interface__(self):
            d = dict(q.__cuda_array_interface__)
            d["stream"] = side.cuda_stream
            return d

    out = flashsci.attention(OnSide(), x, x)    # flashsci.Array on the legacy default stream
    got = torch.from_dlpack(out)
    torch.cuda.synchronize()
    expect = F.scaled_dot_product_attention(x * 2, x, x)
    assert (got - expect).abs().max().item() < 2e-2


def test_hopper_dispatch():
    """On sm_90 devices large fp16/bf16 problems at D = 64 and 128 run on the wgmma kernel (a persistent grid of
    at most one block per SM), and D = 80, 96 (read directly) and 72 (padded) on its D = 128 kernel; small ones on
    sm80."""
    plans = [flashsci._flashsci._launch_plan(8, h, 1024, 1024, d, False) for h, d in ((32, 128), (40, 64))]
    assert flashsci._flashsci._launch_plan(1, 1, 128, 128, 64, False)["kernel"] == "sm80"
    hopper = hopper_kernel()
    for d in (72, 80, 96):
        plan = flashsci._flashsci._launch_plan(4, 32, 1024, 1024, d, True)
        assert (plan["kernel"], plan["head_dim_run"]) == (("sm90", 128) if hopper else ("sm80", 96)), d
    for plan in plans:
        assert plan["kernel"] == ("sm90" if hopper else "sm80")
        if hopper:
            assert plan["blocks"] == plan["sm_count"] and plan["waves"] <= 1.0
    # fewer work items than SMs: the Hopper kernel for self-attention at D = 128 and for D = 64 from 256 keys; the
    # sm80 one on a single key tile, for a few query tiles on long keys (KV splits) and for few queries on long keys
    plan = flashsci._flashsci._launch_plan
    for args, small_on_hopper in [((1, 1, 512, 512, 128), True), ((1, 8, 2048, 2048, 64), True),
                                  ((8, 8, 256, 256, 64), True), ((1, 1, 512, 512, 64), True),
                                  ((8, 8, 128, 128, 64), False), ((1, 2, 1024, 1024, 64), False),
                                  ((1, 1, 512, 512, 64, True), False),
                                  ((1, 1, 100, 4000, 128), False), ((1, 1, 8192, 8192, 128), False)]:
        assert plan(*args)["kernel"] == ("sm90" if hopper and small_on_hopper else "sm80"), args


def test_forced_portable_kernel():
    """_set_attention_kernel('sm80') runs the portable kernel on Hopper too (tests of the sm80 paths), 'auto' restores
    dispatch; anything else is refused."""
    try:
        flashsci._flashsci._set_attention_kernel("sm80")
        assert flashsci._flashsci._launch_plan(8, 40, 1024, 1024, 64)["kernel"] == "sm80"
        check(1, 8, 1000, 1000, 128, lse=True)
        check(2, 8, 1024, 1024, 64, causal=True, dtype=torch.bfloat16)
    finally:
        flashsci._flashsci._set_attention_kernel("auto")
    check(1, 8, 1000, 1000, 128, lse=True)
    check(2, 8, 1024, 1024, 64, causal=True, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="_set_attention_kernel takes 'auto' or 'sm80', got 'sm90'"):
        flashsci._flashsci._set_attention_kernel("sm90")
    with pytest.raises(TypeError, match="_set_attention_kernel takes"):
        flashsci._flashsci._set_attention_kernel(80)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout,strided", [("bhsd", False), ("bshd", True)])
def test_hopper_kernel_shapes(layout, strided, causal, dtype, d):
    """Enough heads to take the sm90 path on Hopper: odd lengths, Sq != Sk both ways, strides, scale, lse, and
    many work items per persistent block."""
    check(4, 40, 333, 517, d, causal=causal, dtype=dtype, layout=layout, strided=strided, scale=0.07, lse=True)
    check(3, 45, 1000, 77, d, causal=causal, dtype=dtype, layout=layout)
    check(2, 70, 129, 1100, d, causal=causal, dtype=dtype, layout=layout, strided=strided, lse=True)


@pytest.mark.parametrize("scale", [-0.2, 0.0])
@pytest.mark.parametrize("d", [64, 128])
def test_non_positive_scale(d, scale):
    """A negative scale makes a row's smallest score its largest, and zero weighs every key alike (the kernels then
    scale before the row max). The large problem takes the sm90 kernel on Hopper, the small one the portable kernel.
    torch's SDPA gave NaN for causal rows at a negative scale, so its error is taken on the same problem written with
    a positive scale: q times the scale's sign (exact), scale |c| (1 for zero)."""
    for b, h, sq, sk, causal, dtype in ((4, 40, 333, 517, True, torch.float16), (1, 2, 77, 300, False, torch.bfloat16)):
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for s in (sq, sk, sk))
        ref, ref_lse = reference(q, k, v, causal, scale)
        theirs = F.scaled_dot_product_attention(q * (-1.0 if scale < 0 else 0.0), k, v, is_causal=causal,
                                                scale=abs(scale) or 1.0)
        torch_err = (theirs.double() - ref).abs().max().item()
        out = torch.full_like(q, float("nan"))
        _, lse = flashsci.attention(q, k, v, causal=causal, scale=scale, out=out, return_lse=True)
        assert torch.isfinite(out).all()
        err = (out.double() - ref).abs().max().item()
        assert err <= 2 * torch_err, f"{(b, h, sq, sk, d, causal, dtype)}: err {err:.3e} > 2 x torch {torch_err:.3e}"
        assert (lse.double() - ref_lse).abs().max().item() < 1e-3


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq", [200, 300, 1000])
def test_hopper_idle_warpgroups(sq, causal, d):
    """The last query tile of each head with one or two consumer warpgroups wholly past Sq (Br = 192 at D = 64:
    200 and 1000 leave two idle, 300 one; Br = 128 at D = 128: 200 none, 300 one): they issue nothing but keep the
    ring's barriers and the issue turns, and those heads claim their items. Also Sk longer than the ring."""
    plan = flashsci._flashsci._launch_plan(3, 50, sq, 1100, d, causal)
    if plan["kernel"] == "sm90":
        assert plan["Br"] == (192 if d == 64 else 128)
    check(3, 50, sq, 1100, d, causal=causal, dtype=torch.bfloat16, lse=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_hopper_two_warpgroups_d64(dtype):
    """Plain D = 64 problems that three consumer warpgroups (Br = 192) would leave SMs idle on, and whose 128-row
    items still fit one per SM, run on two (Br = 128): odd lengths, an idle warpgroup on the last tile (Sq = 1950),
    Sq != Sk, strides, causal, lse. Problems with more items keep three."""
    plan = flashsci._flashsci._launch_plan
    if hopper_kernel():
        for args, br in [((1, 8, 2048, 2048, 64), 128), ((1, 8, 1950, 1950, 64, True), 128),
                         ((1, 20, 1024, 1024, 64), 192), ((8, 40, 1024, 1024, 64), 192)]:
            assert plan(*args)["kernel"] == "sm90" and plan(*args)["Br"] == br, args
    check(1, 8, 2048, 2048, 64, dtype=dtype, lse=True)
    check(1, 8, 1950, 1950, 64, dtype=dtype, layout="bshd", strided=True)
    check(2, 8, 1000, 1300, 64, dtype=dtype, causal=True, scale=0.2, lse=True)
    check(1, 11, 1400, 900, 64, dtype=dtype)


@pytest.mark.parametrize("d", [64, 128])
def test_hopper_out_view(d):
    """out= a view with gaps between heads: the sm90 kernel's TMA stores follow its strides, drop the rows past
    Sq inside each head, and leave the gaps alone."""
    q, k, v = (torch.randn(2, 70, s, d, device="cuda", dtype=torch.bfloat16) for s in (200, 333, 333))
    base = torch.full((2, 140, 200, d), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = base[:, ::2]
    assert flashsci.attention(q, k, v, out=out) is out
    ref, _ = reference(q, k, v, False, 1 / math.sqrt(d))
    torch_err = (F.scaled_dot_product_attention(q, k, v).double() - ref).abs().max().item()
    assert (out.double() - ref).abs().max().item() <= 2 * torch_err
    assert torch.isnan(base[:, 1::2]).all()


def test_hopper_broadcast_heads():
    """K and V expanded over heads (stride 0, torch's expand) are read as one K/V head that every query head shares,
    which the Hopper kernel's TMA maps can address."""
    q = torch.randn(4, 40, 300, 64, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(4, 1, 300, 64, device="cuda", dtype=torch.float16).expand(4, 40, 300, 64) for _ in range(2))
    out = flashsci.attention(q, k, v)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    mine = (out.double() - ref).abs().max().item()
    theirs = (F.scaled_dot_product_attention(q, k, v).double() - ref).abs().max().item()
    assert mine <= 2 * theirs + 1e-6


GQA = [  # (b, hq, hkv, sq, sk, d, causal): each kernel and variant with K/V heads shared by groups of query heads
    (2, 32, 8, 1024, 1024, 64, False),   # Hopper, three consumer warpgroups
    (2, 32, 8, 1024, 1024, 64, True),
    (1, 8, 2, 2048, 2048, 64, False),    # Hopper, two consumer warpgroups (fewer items than SMs)
    (2, 16, 4, 1000, 1000, 128, False),  # Hopper, D = 128, a part-filled last query tile
    (2, 16, 4, 1024, 1024, 128, True),
    (4, 40, 1, 300, 300, 64, False),     # one K/V head (multi-query)
    (2, 6, 3, 77, 300, 32, True),        # portable kernel: D = 32, Sq < Sk
    (2, 12, 4, 200, 200, 96, False),     # D = 96
    (1, 4, 2, 100, 100, 256, False),     # D = 256
    (1, 2, 1, 40, 3000, 64, False),      # KV splits over blocks
    (1, 4, 2, 512, 512, 64, False),      # 4 KV groups per block (portable kernel, forced below)
]


def gqa_check(b, hq, hkv, sq, sk, d, causal, dtype, layout):
    """K and V with hkv heads, q head h reading K/V head h // (hq / hkv): the result must equal flashsci's on K/V
    repeated to hq heads bit for bit (the same kernel reads the same values) and be within 2x torch's error."""
    q, k, v = (torch.randn(b, n, s, d, device="cuda", dtype=dtype) for n, s in ((hq, sq), (hkv, sk), (hkv, sk)))
    kr, vr = (x.repeat_interleave(hq // hkv, dim=1) for x in (k, v))
    sc = 1.0 / math.sqrt(d)
    ref, _ = reference(q, kr, vr, causal, sc)
    torch_err = (F.scaled_dot_product_attention(q, kr, vr, is_causal=causal).double() - ref).abs().max().item()
    view = (lambda x: x.transpose(1, 2)) if layout == "bshd" else (lambda x: x)
    out = torch.full_like(view(q), float("nan"))
    grouped, lse = flashsci.attention(view(q), view(k), view(v), causal=causal, layout=layout, out=out, return_lse=True)
    full, full_lse = flashsci.attention(view(q), view(kr), view(vr), causal=causal, layout=layout, return_lse=True)
    assert grouped is out and torch.equal(grouped, full) and torch.equal(lse, full_lse)
    err = (view(grouped).double() - ref).abs().max().item()
    assert err <= 2 * torch_err, f"{(b, hq, hkv, sq, sk, d, causal)}: err {err:.3e} > 2 x torch {torch_err:.3e}"


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cfg", GQA, ids=str)
def test_grouped_kv_heads(cfg, dtype, layout):
    gqa_check(*cfg, dtype, layout)


@pytest.mark.parametrize("cfg", GQA, ids=str)
def test_grouped_kv_heads_portable_kernel(cfg):
    """The same on the portable kernel, forced on Hopper (its small-tile, 4-group and split variants)."""
    try:
        flashsci._flashsci._set_attention_kernel("sm80")
        gqa_check(*cfg, torch.float16, "bhsd")
    finally:
        flashsci._flashsci._set_attention_kernel("auto")


def test_hopper_claimed_items_repeat():
    """Causal launches on Hopper claim their work items through a counter in the stream's workspace that the last
    block puts back to zero: back-to-back launches, a second stream and graph replays each compute every item."""
    q, k, v = (torch.randn(4, 40, 700, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref, _ = reference(q, k, v, True, 0.125)
    bound = 2 * (F.scaled_dot_product_attention(q, k, v, is_causal=True).double() - ref).abs().max().item()
    out = torch.empty_like(q)

    def ok():
        torch.cuda.synchronize()
        return (out.double() - ref).abs().max().item() <= bound   # NaN (an item left out) compares False

    for _ in range(3):
        out.fill_(float("nan"))
        flashsci.attention(q, k, v, causal=True, out=out)
        assert ok()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out.fill_(float("nan"))
        flashsci.attention(q, k, v, causal=True, out=out)
    torch.cuda.current_stream().wait_stream(s)
    assert ok()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        flashsci.attention(q, k, v, causal=True, out=out)
    for _ in range(3):
        out.fill_(float("nan"))
        g.replay()
        assert ok()
