"""flashsci.profile without a GPU: the category rules on kernel names as CUDA profiles record them, and the trace
reader on a Chrome trace with host ranges, launches, kernels, a memcpy and dtype-converting copies."""
import pytest

from flashsci.profile.categories import CATEGORIES, category
from flashsci.profile.report import category_table, launch_listing, summary
from flashsci.profile.trace import parse

NAMES = [   # (kernel name as torch.profiler records it, category)
    ("void attention_fwd_sm80<64, 64, 0>(fs_sm80_args)", "attention"),
    ("attention_fwd_sm90<2, 128, __half>", "attention"),
    ("void backward_pre(fs_pass_args)", "attention"),
    ("void rotary_qk(fs_rotary_args)", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::half_t>>", "attention"),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::half_t>::Params)", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0", "attention"),
    ("void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*, void const*, void*, void*, unsigned int)", "attention"),
    ("void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*, unsigned int, unsigned int, unsigned int)", "attention"),
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "gemm"),
    ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_relu_f16_256x128_32x3_nn_align8>(Params)", "gemm"),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn", "gemm"),
    ("void gemm_sm90<__nv_bfloat16, 2>(CUtensorMap, CUtensorMap, fs_gemm_params)", "gemm"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::Half, float, c10::Half>(c10::Half*, ...)", "softmax"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::Half, float, false>(int, float, ...)", "normalisation"),
    ("void at::native::(anonymous namespace)::rms_norm_kernel<c10::BFloat16>(...)", "normalisation"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>(...)", "memory"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>>", "memory"),
    ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel>(long, ...)", "memory"),
    ("memcpy HtoD (Pageable -> Device)", "memory"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, ...)>", "element-wise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, ...>>>", "element-wise"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>>", "element-wise"),
    ("void activation_kernel<__nv_bfloat16, 2>(fs_act_params, float*)", "element-wise"),
    ("convert_bias_grad(float const*, void*, fs_dtype, int)", "element-wise"),
    ("void head_copy<__nv_bfloat16, float, 8>(fs_head_copy)", "attention"),
    ("void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<...>", "other"),
]


@pytest.mark.parametrize("name,expected", NAMES)
def test_category_rules(name, expected):
    assert category(name) == expected


def trace_events():
    """Host: forward [0, 100] holding attention [10, 20], backward [100, 200]; four launches; two kernels, a memcpy and a
    memset; a Half <- float copy_ inside forward, a float <- float, a float <- Half and two integer / bool copy_ calls
    inside backward (only the float conversions count)."""
    k = lambda corr, name, dur, cat="kernel": {"cat": cat, "name": name, "ts": 1000 + corr, "dur": dur,
                                                 "args": {"correlation": corr}}
    launch = lambda corr, ts: {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 1,
                               "args": {"correlation": corr}}
    copy = lambda ts, types: {"cat": "cpu_op", "name": "aten::copy_", "ts": ts, "dur": 1,
                              "args": {"Input type": types}}
    return [
        {"cat": "user_annotation", "name": "forward", "ts": 0, "dur": 100},
        {"cat": "user_annotation", "name": "attention", "ts": 10, "dur": 10},
        {"cat": "user_annotation", "name": "backward", "ts": 100, "dur": 100},
        launch(1, 15), launch(2, 50), launch(3, 150), launch(4, 160),
        k(1, "cunn_SoftMaxForward<4, c10::Half>", 30.0), k(2, "nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 50.0),
        k(3, "Memcpy DtoD (Device -> Device)", 4.0, "gpu_memcpy"), k(4, "Memset (Device)", 2.0, "gpu_memset"),
        copy(30, ["c10::Half", "float", "Scalar"]), copy(120, ["float", "float", "Scalar"]),
        copy(130, ["float", "c10::Half", "Scalar"]), copy(140, ["int", "long int", "Scalar"]),
        copy(145, ["bool", "long int", "Scalar"]),
    ]


def test_trace_reader_and_summary():
    t = parse(trace_events())
    by_name = {k["name"]: k for k in t.kernels}
    assert by_name["cunn_SoftMaxForward<4, c10::Half>"]["labels"] == {"forward", "attention"}
    assert by_name["nvjet_tst_64x8_64x16_4x1_v_bz_TNT"]["labels"] == {"forward"}
    assert by_name["memcpy Memcpy DtoD (Device -> Device)"]["category"] == "memory"
    assert by_name["memset Memset (Device)"]["labels"] == {"backward"}
    assert len(t.conversions) == 2
    fwd, bwd, everything = summary(t, "forward"), summary(t, "backward"), summary(t, batches=2)
    assert fwd["total_ms"] == pytest.approx(0.08) and fwd["gemm_fraction"] == pytest.approx(50 / 80)
    assert fwd["categories"]["softmax"] == pytest.approx(0.03) and fwd["conversions"] == 1
    assert bwd["categories"]["memory"] == pytest.approx(0.006) and bwd["conversions"] == 1
    assert everything["per_batch_ms"] == pytest.approx(0.043) and everything["top"][0] == (
        "nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 1, pytest.approx(0.05))
    table = category_table([("run", everything)])
    assert len(table) == 3 and table[0].count("|") == len(CATEGORIES) + 5
    lines = launch_listing(t, 12)
    assert len(lines) == len(t.kernels) + 1 and lines[-1].split()[:2] == ["86.0", "us"]
    assert all(len(line.split("us  ", 1)[1]) <= 12 for line in lines[:-1])


def test_recorded_protein_model_kernels():
    """Every kernel a profile of the three protein models recorded on an H200 (tests/data), in its category."""
    import os
    path = os.path.join(os.path.dirname(__file__), "data", "kernels_h200_protein_models.tsv")
    rows = [line.rstrip("\n").split("\t", 1) for line in open(path) if not line.startswith("#")]
    assert len(rows) > 100 and {c for c, _ in rows} <= set(CATEGORIES)
    wrong = [(c, category(n), n[:80]) for c, n in rows if category(n) != c]
    assert not wrong, wrong
