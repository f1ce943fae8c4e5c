/* Attention backward on sm_80+, the bfloat16 main kernels (one translation unit per dtype: the two compile in parallel).
 * Build: part of the extension; alone for SASS and resource checks:
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_80,code=sm_80 -Ikernels -Xptxas -v -c kernels/attention/sm80/backward_bf16.cu */
#include "attention/sm80/backward_launch.cuh"

cudaError_t fs_sm80_backward_bf16(const fs_attn_bwd_params *g, const fs_bwd_work *w, int device, cudaStream_t stream)
{
    return bwd_launch_dtype<__nv_bfloat16>(g, w, device, stream);
}
