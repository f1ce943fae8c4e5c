/* Device workspace for the CUDA launchers (attention/sm80: KV-split partials and counters; attention/sm90:
 * the work-claiming counter), ordered on the launch's stream. */
#ifndef FLASHSCI_WORKSPACE_H
#define FLASHSCI_WORKSPACE_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#define FS_COUNTER_BYTES 16384 /* the workspace's first bytes: counters, zero between launches */

#ifdef __cplusplus
extern "C" {
#endif

/* At least bytes of workspace on device (current) ordered on stream, its first FS_COUNTER_BYTES zero when the
 * stream reaches the next launch. Kernels leave every counter they use back at zero. */
cudaError_t fs_workspace_get(int device, cudaStream_t stream, size_t bytes, void **ptr);

/* Give back workspace from fs_workspace_get after the launch that uses it has been enqueued. */
cudaError_t fs_workspace_release(cudaStream_t stream, void *ptr);

#ifdef __cplusplus
}
#endif
#endif
