/* Device workspace shared by the CUDA launchers (workspace.h). Outside graph capture, one cached buffer per
 * (device, stream): every use of it is ordered on its stream, so reuse is race-free and costs no allocation.
 * Under capture the graph owns a stream-ordered allocation instead (a cached pointer baked into a graph could be
 * freed later). */
#include "common/workspace.h"

#define FS_WS_SLOTS 16
typedef struct { int device; cudaStream_t stream; void *ptr; size_t bytes; } fs_ws_slot;
static fs_ws_slot ws_slots[FS_WS_SLOTS];
static int ws_next_evict;

/* Whether stream is being captured into a graph. */
static int stream_capturing(cudaStream_t stream)
{
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(stream, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone;
}

extern "C" cudaError_t fs_workspace_get(int device, cudaStream_t stream, size_t bytes, void **ptr)
{
    if (stream_capturing(stream)) {
        cudaError_t err = cudaMallocAsync(ptr, bytes, stream);
        return err != cudaSuccess ? err : cudaMemsetAsync(*ptr, 0, FS_COUNTER_BYTES, stream);
    }
    fs_ws_slot *slot = NULL;
    for (int i = 0; i < FS_WS_SLOTS && !slot; i++)
        if (ws_slots[i].ptr && ws_slots[i].device == device && ws_slots[i].stream == stream) slot = &ws_slots[i];
    for (int i = 0; i < FS_WS_SLOTS && !slot; i++)
        if (!ws_slots[i].ptr) slot = &ws_slots[i];
    if (!slot) { /* all slots taken by other streams: free one (cudaFree waits for its pending work) */
        slot = &ws_slots[ws_next_evict++ % FS_WS_SLOTS];
        cudaError_t err = cudaFree(slot->ptr);
        slot->ptr = NULL;
        if (err != cudaSuccess) return err;
    }
    if (slot->ptr && slot->bytes < bytes) {
        cudaError_t err = cudaFreeAsync(slot->ptr, stream);
        slot->ptr = NULL;
        if (err != cudaSuccess) return err;
    }
    if (!slot->ptr) {
        bytes = bytes < (1u << 20) ? (1u << 20) : bytes + bytes / 4;
        cudaError_t err = cudaMallocAsync(&slot->ptr, bytes, stream);
        if (err != cudaSuccess) { slot->ptr = NULL; return err; }
        slot->device = device;
        slot->stream = stream;
        slot->bytes = bytes;
        if ((err = cudaMemsetAsync(slot->ptr, 0, FS_COUNTER_BYTES, stream)) != cudaSuccess) return err;
    }
    *ptr = slot->ptr;
    return cudaSuccess;
}

/* Only the capture-time allocation is freed. */
extern "C" cudaError_t fs_workspace_release(cudaStream_t stream, void *ptr)
{
    return stream_capturing(stream) ? cudaFreeAsync(ptr, stream) : cudaSuccess;
}
