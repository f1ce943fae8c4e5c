/* Attention forward on sm_80+, the bfloat16 instantiations (one translation unit per dtype: the two compile in
 * parallel). Build: part of the extension; alone for SASS and resource checks:
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_80,code=sm_80 -Ikernels -Xptxas -v -c kernels/attention/sm80/forward_bf16.cu */
#include "attention/sm80/launch.cuh"

cudaError_t fs_sm80_forward_bf16(const fs_attn_params *p, int device, int sm_count, int major, cudaStream_t stream,
                                 fs_sm80_plan *plan)
{
    return launch_dtype<__nv_bfloat16>(p, device, sm_count, major, stream, plan);
}
