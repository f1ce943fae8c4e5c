/* The CUDA runtime layer of the host module: devices, streams, memory and kernel launch. In a build
 * without the CUDA toolkit the same functions exist and raise a clear error. CUDA is first touched by
 * the first GPU call, never at import. */
#include "flashsci.h"

#ifdef FLASHSCI_WITH_CUDA
#include <cuda_runtime_api.h>

#include "attention/head_copy.h"
#include "attention/launchers.h"
#include "gemm/activation_launch.h"
#include "gemm/launchers.h"

#define FS_MAX_DEVICES 64

static fs_gpu_props props_cache[FS_MAX_DEVICES];
static int props_known[FS_MAX_DEVICES];
static cudaEvent_t sync_event[FS_MAX_DEVICES];

/* Raise RuntimeError for a failed CUDA call; returns -1. */
static int cuda_fail(cudaError_t err, const char *what)
{
    if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice)
        PyErr_Format(PyExc_RuntimeError, "flashsci: no CUDA driver or GPU was found (%s: %s); CUDA arrays need an NVIDIA "
                     "GPU and its driver", what, cudaGetErrorName(err));
    else
        PyErr_Format(PyExc_RuntimeError, "flashsci: %s failed: %s (%s)", what, cudaGetErrorString(err),
                     cudaGetErrorName(err));
    cudaGetLastError(); /* clear it: errors that are not sticky must not fail the next call */
    return -1;
}

int fs_gpu_built(void) { return 1; }

int fs_gpu_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: clear the sticky-free error */
        return 0;
    }
    return n;
}

int fs_gpu_props_get(int device, fs_gpu_props *props)
{
    if (device < 0 || device >= FS_MAX_DEVICES) {
        PyErr_Format(PyExc_ValueError, "flashsci: CUDA device %d is out of range", device);
        return -1;
    }
    if (!props_known[device]) {
        struct cudaDeviceProp p;
        cudaError_t err = cudaGetDeviceProperties(&p, device);
        if (err != cudaSuccess) return cuda_fail(err, "cudaGetDeviceProperties");
        props_cache[device].sm_count = p.multiProcessorCount;
        props_cache[device].major = p.major;
        props_cache[device].minor = p.minor;
        props_cache[device].smem_optin = p.sharedMemPerBlockOptin;
        snprintf(props_cache[device].name, sizeof props_cache[device].name, "%s", p.name);
        props_known[device] = 1;
    }
    *props = props_cache[device];
    return 0;
}

int fs_gpu_device_enter(int device, int *previous)
{
    cudaError_t err = cudaGetDevice(previous);
    if (err != cudaSuccess) return cuda_fail(err, "cudaGetDevice");
    if (*previous != device && (err = cudaSetDevice(device)) != cudaSuccess) return cuda_fail(err, "cudaSetDevice");
    return 0;
}

void fs_gpu_device_leave(int previous, int device)
{
    if (previous != device) cudaSetDevice(previous);
}

int fs_gpu_stream_wait(uintptr_t waiter, uintptr_t producer, int device)
{
    cudaError_t err;
    if (waiter == producer) return 0;
    if (!sync_event[device] &&
        (err = cudaEventCreateWithFlags(&sync_event[device], cudaEventDisableTiming)) != cudaSuccess)
        return cuda_fail(err, "cudaEventCreateWithFlags");
    if ((err = cudaEventRecord(sync_event[device], (cudaStream_t)producer)) != cudaSuccess)
        return cuda_fail(err, "cudaEventRecord");
    if ((err = cudaStreamWaitEvent((cudaStream_t)waiter, sync_event[device], 0)) != cudaSuccess)
        return cuda_fail(err, "cudaStreamWaitEvent");
    return 0;
}

int fs_gpu_pointer_device(const void *ptr, int *device)
{
    struct cudaPointerAttributes a;
    cudaError_t err = cudaPointerGetAttributes(&a, ptr);
    if (err != cudaSuccess) return cuda_fail(err, "cudaPointerGetAttributes");
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) {
        PyErr_Format(PyExc_ValueError, "flashsci: pointer %p from __cuda_array_interface__ is not CUDA device memory",
                     ptr);
        return -1;
    }
    *device = a.device;
    return 0;
}

void *fs_gpu_malloc_async(size_t bytes, uintptr_t stream, int device)
{
    void *ptr = NULL;
    int prev;
    if (fs_gpu_device_enter(device, &prev) < 0) return NULL;
    cudaError_t err = cudaMallocAsync(&ptr, bytes ? bytes : 1, (cudaStream_t)stream);
    fs_gpu_device_leave(prev, device);
    if (err != cudaSuccess) {
        cudaGetLastError();
        if (err == cudaErrorMemoryAllocation) PyErr_Format(PyExc_MemoryError, "flashsci: out of CUDA memory allocating %zu bytes", bytes);
        else cuda_fail(err, "cudaMallocAsync");
        return NULL;
    }
    return ptr;
}

void fs_gpu_free_async(void *ptr, uintptr_t stream, int device)
{
    int prev;
    if (cudaGetDevice(&prev) != cudaSuccess) return;
    if (prev != device) cudaSetDevice(device);
    if (cudaFreeAsync(ptr, (cudaStream_t)stream) != cudaSuccess) cudaGetLastError(); /* e.g. at shutdown */
    if (prev != device) cudaSetDevice(prev);
}

/* Before a launch: the device's properties, a compute capability of 8.0 or newer (what names the op in the
 * error), and the device made current (*prev: the one to restore). */
static int launch_begin(int device, const char *what, fs_gpu_props *props, int *prev)
{
    if (fs_gpu_props_get(device, props) < 0) return -1;
    if (props->major < 8) {
        PyErr_Format(PyExc_ValueError, "flashsci: CUDA %s needs compute capability 8.0 or newer; device %d (%s) is %d.%d",
                     what, device, props->name, props->major, props->minor);
        return -1;
    }
    return fs_gpu_device_enter(device, prev);
}

/* What a forward launch needs besides the problem (run_attention's context). */
typedef struct {
    int device, sm_count, major, hopper;
    cudaStream_t stream;
    fs_sm80_plan *plan;
} launch_ctx;

/* The forward of p on the kernel chosen in ctx (p's head dim one a kernel is built for). */
static cudaError_t run_attention(const fs_attn_params *p, void *ctx)
{
    const launch_ctx *c = (const launch_ctx *)ctx;
    return c->hopper ? fs_attention_sm90(p, c->device, c->sm_count, c->stream, c->plan)
                     : fs_attention_sm80(p, c->device, c->sm_count, c->major, c->stream, c->plan);
}

/* Launch attention on device, or with plan non-NULL describe the launch as a dict in *plan. Hopper devices take the
 * sm_90a kernel for the problems it covers (and tests have not forced the portable one), head dims 80, 96 and 112 on
 * its D = 128 kernel directly (zeros read past the data's columns). Elsewhere a head dim without a kernel of its own
 * runs at the next one through zero-padded copies (fs_attention_forward_padded); on Hopper, one between 64 and 128 at
 * 128 on the sm_90a kernel. */
static int attention_launch(const fs_attn_params *p, int device, uintptr_t stream, const fs_kernel_choice *choice,
                            PyObject **plan)
{
    fs_gpu_props props;
    int prev;
    if (launch_begin(device, "attention", &props, &prev) < 0) return -1;
    fs_sm80_plan pl;
    fs_attn_params run = *p; /* the problem the kernels see: the padded head dim, rotary done by the copies */
    const int hopper_ok = props.major == 9 && !choice->attention_sm80, direct = hopper_ok && fs_attention_sm90_covers(p, props.sm_count);
    if (!direct) run.D = fs_attention_run_dim(p->D);
    if (run.D != p->D) run.rotary = 0;
    if (hopper_ok && run.D != p->D && p->D > 64 && p->D < 128) {
        /* Hopper, D in (64, 128) the kernel does not read directly: padded to 128 for the wgmma kernel rather than to
         * 96 for the portable one (at D = 72: 56% of the FLOPs useful against 75%, on a kernel about twice as fast) */
        fs_attn_params wide = run;
        wide.D = 128;
        if (fs_attention_sm90_covers(&wide, props.sm_count)) run.D = 128;
    }
    const int hopper = direct || (hopper_ok && fs_attention_sm90_covers(&run, props.sm_count));
    const int head_dim_run = direct && p->D > 64 ? 128 : run.D; /* the kernel's head dim */
    launch_ctx ctx = {device, props.sm_count, props.major, hopper, (cudaStream_t)stream, plan ? &pl : NULL};
    cudaError_t err = plan || run.D == p->D ? run_attention(plan ? &run : p, &ctx)
                                            : fs_attention_forward_padded(p, run.D, device, (cudaStream_t)stream,
                                                                          run_attention, &ctx);
    fs_gpu_device_leave(prev, device);
    if (err != cudaSuccess) return cuda_fail(err, plan ? "attention launch plan" : "attention kernel launch");
    if (plan) {
        const double waves = pl.blocks_per_sm ? (double)pl.blocks / ((double)pl.blocks_per_sm * props.sm_count) : 0.0;
        static const char *rotary[] = {"none", "kernel", "prepass"};
        *plan = Py_BuildValue("{s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:L,s:i,s:i,s:d,s:s,s:i}", "kernel", hopper ? "sm90" : "sm80",
                              "variant", pl.small ? "small" : "big", "kv_groups", pl.kv_groups,
                              "Br", pl.br, "Bc", pl.bc, "threads", pl.threads, "smem", pl.smem, "q_tiles", pl.n_qtiles,
                              "kv_splits", pl.n_splits, "cluster", pl.cluster, "blocks", pl.blocks, "blocks_per_sm", pl.blocks_per_sm,
                              "sm_count", props.sm_count, "waves", waves,
                              "rotary", run.D != p->D && p->rotary ? "copy" : rotary[pl.rotary], "head_dim_run", head_dim_run);
        if (!*plan) return -1;
    }
    return 0;
}

int fs_gpu_attention(const fs_attn_params *p, int device, uintptr_t stream, const fs_kernel_choice *choice)
{
    return attention_launch(p, device, stream, choice, NULL);
}

int fs_gpu_attention_backward(const fs_attn_bwd_params *g, int device, uintptr_t stream, const fs_kernel_choice *choice)
{
    fs_gpu_props props;
    int prev;
    if (launch_begin(device, "attention backward", &props, &prev) < 0) return -1;
    const int sm90 = props.major == 9 && !choice->attention_sm80;
    cudaError_t err = fs_attention_backward_gpu(g, device, sm90, (cudaStream_t)stream);
    fs_gpu_device_leave(prev, device);
    return err == cudaSuccess ? 0 : cuda_fail(err, "attention backward launch");
}

int fs_gpu_attention_no_keys(const fs_attn_params *p, int device, uintptr_t stream)
{
    int prev;
    if (fs_gpu_device_enter(device, &prev) < 0) return -1;
    cudaError_t err = fs_attention_no_keys(p, (cudaStream_t)stream);
    fs_gpu_device_leave(prev, device);
    return err == cudaSuccess ? 0 : cuda_fail(err, "attention kernel launch");
}

PyObject *fs_gpu_attention_plan(const fs_attn_params *p, int device, const fs_kernel_choice *choice)
{
    PyObject *plan = NULL;
    return attention_launch(p, device, 0, choice, &plan) < 0 ? NULL : plan;
}

/* Launch a GEMM on device, or with pl non-NULL fill *pl instead (and *hopper, *sm_count: the kernel and the SMs it
 * plans for). Hopper devices take the sm_90a kernel when it was built (and tests have not forced the portable one).
 * With declined non-NULL, a launch that would not keep p->pre sets it to 1 and returns 0 (nothing launched). */
static int gemm_launch(const fs_gemm_params *p, int device, uintptr_t stream, const fs_kernel_choice *choice,
                       fs_gemm_plan *pl, int *hopper, int *sm_count, int *declined)
{
    fs_gpu_props props;
    int prev;
    if (launch_begin(device, "linear", &props, &prev) < 0) return -1;
    const int sm90 = props.major == 9 && fs_gemm_sm90_built() && !choice->gemm_sm80;
    cudaError_t err = sm90 ? fs_gemm_sm90(p, device, props.sm_count, choice->gemm_bn, (cudaStream_t)stream, pl)
                           : fs_gemm_sm80(p, device, (cudaStream_t)stream, pl);
    fs_gpu_device_leave(prev, device);
    if (declined) *declined = err == FS_GEMM_PRE_DECLINED && p->pre && !pl;
    if (declined && *declined) return 0;
    if (err != cudaSuccess) return cuda_fail(err, pl ? "linear launch plan" : "linear kernel launch");
    if (hopper) *hopper = sm90;
    if (sm_count) *sm_count = props.sm_count;
    return 0;
}

int fs_gpu_gemm(const fs_gemm_params *p, int device, uintptr_t stream, const fs_kernel_choice *choice)
{
    return gemm_launch(p, device, stream, choice, NULL, NULL, NULL, NULL);
}

int fs_gpu_gemm_keeping_pre(const fs_gemm_params *p, int device, uintptr_t stream, const fs_kernel_choice *choice)
{
    int declined = 0;
    return gemm_launch(p, device, stream, choice, NULL, NULL, NULL, &declined) < 0 ? -1 : !declined;
}

PyObject *fs_gpu_gemm_plan(const fs_gemm_params *p, int device, const fs_kernel_choice *choice)
{
    fs_gemm_plan pl;
    int hopper, sm_count;
    if (gemm_launch(p, device, 0, choice, &pl, &hopper, &sm_count, NULL) < 0) return NULL;
    return Py_BuildValue("{s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:L,s:i,s:i,s:i,s:i}", "kernel", hopper ? "sm90" : "sm80", "BM", pl.bm,
                         "BN", pl.bn, "BK", pl.bk, "stages", pl.stages, "threads", pl.threads, "smem", pl.smem, "tiles",
                         pl.tiles, "grid", pl.grid, "sm_count", sm_count, "split", pl.split, "keeps_pre", pl.keeps_pre);
}

/* The elementwise passes of a differentiable linear layer on device. */
int fs_gpu_activation(const fs_act_params *a, int device, uintptr_t stream)
{
    fs_gpu_props props;
    int prev;
    if (launch_begin(device, "linear backward", &props, &prev) < 0) return -1;
    const cudaError_t err = fs_activation_gpu(a, device, (cudaStream_t)stream);
    fs_gpu_device_leave(prev, device);
    return err == cudaSuccess ? 0 : cuda_fail(err, "linear elementwise kernel launch");
}

int fs_gpu_zero(void *ptr, size_t pitch, size_t width, size_t rows, int device, uintptr_t stream)
{
    int prev;
    if (width == 0 || rows == 0) return 0;
    if (fs_gpu_device_enter(device, &prev) < 0) return -1;
    const cudaError_t err = cudaMemset2DAsync(ptr, pitch, 0, width, rows, (cudaStream_t)stream);
    fs_gpu_device_leave(prev, device);
    return err == cudaSuccess ? 0 : cuda_fail(err, "cudaMemset2DAsync");
}

#else /* no CUDA toolkit at build time */

/* Raise the error every GPU entry point gives in a CPU-only build; returns -1. */
static int no_cuda(void)
{
    PyErr_SetString(PyExc_RuntimeError,
                    "flashsci: this build of flashsci has no CUDA support (built without the CUDA toolkit); "
                    "reinstall with nvcc on PATH to use CUDA tensors");
    return -1;
}

int fs_gpu_built(void) { return 0; }
int fs_gpu_device_count(void) { return 0; }
int fs_gpu_props_get(int device, fs_gpu_props *props) { (void)device; (void)props; return no_cuda(); }
int fs_gpu_device_enter(int device, int *previous) { (void)device; (void)previous; return no_cuda(); }
void fs_gpu_device_leave(int previous, int device) { (void)previous; (void)device; }
int fs_gpu_stream_wait(uintptr_t w, uintptr_t p, int d) { (void)w; (void)p; (void)d; return no_cuda(); }
int fs_gpu_pointer_device(const void *ptr, int *device) { (void)ptr; (void)device; return no_cuda(); }
void *fs_gpu_malloc_async(size_t b, uintptr_t s, int d) { (void)b; (void)s; (void)d; no_cuda(); return NULL; }
void fs_gpu_free_async(void *ptr, uintptr_t s, int d) { (void)ptr; (void)s; (void)d; }
int fs_gpu_attention(const fs_attn_params *p, int d, uintptr_t s, const fs_kernel_choice *c)
{
    (void)p; (void)d; (void)s; (void)c;
    return no_cuda();
}
int fs_gpu_attention_no_keys(const fs_attn_params *p, int d, uintptr_t s)
{
    (void)p; (void)d; (void)s;
    return no_cuda();
}
int fs_gpu_attention_backward(const fs_attn_bwd_params *g, int d, uintptr_t s, const fs_kernel_choice *c)
{
    (void)g; (void)d; (void)s; (void)c;
    return no_cuda();
}
PyObject *fs_gpu_attention_plan(const fs_attn_params *p, int d, const fs_kernel_choice *c)
{
    (void)p; (void)d; (void)c;
    no_cuda();
    return NULL;
}
int fs_gpu_gemm(const fs_gemm_params *p, int d, uintptr_t s, const fs_kernel_choice *c)
{
    (void)p; (void)d; (void)s; (void)c;
    return no_cuda();
}
int fs_gpu_gemm_keeping_pre(const fs_gemm_params *p, int d, uintptr_t s, const fs_kernel_choice *c)
{
    (void)p; (void)d; (void)s; (void)c;
    return no_cuda();
}
PyObject *fs_gpu_gemm_plan(const fs_gemm_params *p, int d, const fs_kernel_choice *c)
{
    (void)p; (void)d; (void)c;
    no_cuda();
    return NULL;
}
int fs_gpu_activation(const fs_act_params *a, int d, uintptr_t s)
{
    (void)a; (void)d; (void)s;
    return no_cuda();
}
int fs_gpu_zero(void *ptr, size_t p, size_t w, size_t r, int d, uintptr_t s)
{
    (void)ptr; (void)p; (void)w; (void)r; (void)d; (void)s;
    return no_cuda();
}

#endif
