/* Hopper attention forward, the bfloat16 instantiations (one translation unit per dtype: the two compile in parallel).
 * Build: part of the extension when the architecture list holds 90a; alone:
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DFLASHSCI_SM90A -Ikernels -Xptxas -v -c kernels/attention/sm90/forward_bf16.cu */
#include "attention/sm90/launch.cuh"

cudaError_t fs_sm90_forward_bf16(fs_sm90_variant v, const fs_attn_params *p, int device, int sm_count, cudaStream_t stream,
                                 fs_sm80_plan *plan)
{
    return launch_variant<__nv_bfloat16>(v, p, device, sm_count, stream, plan);
}
