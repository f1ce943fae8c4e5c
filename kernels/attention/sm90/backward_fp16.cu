/* Hopper attention backward, the fp16 instantiations (one translation unit per dtype: the two compile in parallel).
 * Build: part of the extension when the architecture list holds 90a; alone:
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DFLASHSCI_SM90A -Ikernels -Xptxas -v -c kernels/attention/sm90/backward_fp16.cu */
#include "attention/sm90/backward_launch.cuh"

cudaError_t fs_sm90_backward_fp16(const fs_attn_bwd_params *g, const fs_sm90_bwd_work *w, int device, cudaStream_t stream)
{
    return bwd90_launch_dtype<__half>(g, w, device, stream);
}
