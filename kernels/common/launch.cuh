/* Host-side kernel launch shared by the CUDA launchers: the dynamic shared-memory limit is raised and the
 * driver's function handle fetched once per kernel and device, then every launch goes straight to the
 * driver's cuLaunchKernel, or cuLaunchKernelEx for thread-block clusters (benchmarks/launch_cost.cu: the runtime's
 * cudaLaunchKernel looks the function up again on every call). */
#ifndef FLASHSCI_LAUNCH_CUH
#define FLASHSCI_LAUNCH_CUH

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <string.h>

#define FS_LAUNCH_DEVICES 64

/* One kernel's handles, one per device; a zero-initialised static per launch site. */
typedef struct { CUfunction fn[FS_LAUNCH_DEVICES]; } fs_kernel;

typedef CUresult (*fs_cu_launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    CUstream, void **, void **);
typedef CUresult (*fs_cu_launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);

/* A driver API function through the runtime's entry point (no link against libcuda); NULL if missing. */
static inline void *fs_driver_fn(const char *name)
{
    void *ptr = NULL;
    cudaDriverEntryPointQueryResult q;
    return cudaGetDriverEntryPointByVersion(name, &ptr, 12000, cudaEnableDefault, &q) == cudaSuccess &&
                   q == cudaDriverEntryPointSuccess ? ptr : NULL;
}

/* cuLaunchKernel, fetched once. */
static inline fs_cu_launch_fn fs_cu_launch(void)
{
    static fs_cu_launch_fn fn;
    if (!fn) fn = (fs_cu_launch_fn)fs_driver_fn("cuLaunchKernel");
    return fn;
}

/* cuLaunchKernelEx, fetched once. */
static inline fs_cu_launch_ex_fn fs_cu_launch_ex(void)
{
    static fs_cu_launch_ex_fn fn;
    if (!fn) fn = (fs_cu_launch_ex_fn)fs_driver_fn("cuLaunchKernelEx");
    return fn;
}

/* Before the first launch of kernel (its runtime symbol) on a device: raise its dynamic shared-memory limit to
 * smem_limit (capped at the device's opt-in maximum) and cache its driver handle in k. */
static inline cudaError_t fs_kernel_prepare(const void *kernel, fs_kernel *k, int smem_limit, int device)
{
    if (device < 0 || device >= FS_LAUNCH_DEVICES) return cudaErrorInvalidDevice;
    if (k->fn[device]) return cudaSuccess;
    int optin = 0;
    cudaFunction_t fn;
    cudaError_t err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_limit < optin ? smem_limit : optin);
    if (err == cudaSuccess) err = cudaGetFuncBySymbol(&fn, kernel);
    if (err == cudaSuccess) k->fn[device] = (CUfunction)fn;
    return err;
}

/* Launch a prepared kernel on the current device: grid x threads, smem bytes of dynamic shared memory. The
 * runtime's error codes equal the driver's. */
static inline cudaError_t fs_launch(const fs_kernel *k, int device, unsigned grid, unsigned threads, int smem,
                                    cudaStream_t stream, void **args)
{
    fs_cu_launch_fn launch = fs_cu_launch();
    if (!launch) return cudaErrorInitializationError;
    return (cudaError_t)launch(k->fn[device], grid, 1, 1, threads, 1, 1, (unsigned)smem, (CUstream)stream, args, NULL);
}

/* fs_launch in thread-block clusters of `cluster` consecutive blocks (compute capability 9.0 on; grid a multiple). */
static inline cudaError_t fs_launch_cluster(const fs_kernel *k, int device, unsigned grid, unsigned threads, int smem,
                                            unsigned cluster, cudaStream_t stream, void **args)
{
    fs_cu_launch_ex_fn launch = fs_cu_launch_ex();
    if (!launch) return cudaErrorInitializationError;
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = cluster;
    attr.value.clusterDim.y = attr.value.clusterDim.z = 1;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = grid;
    cfg.gridDimY = cfg.gridDimZ = cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.blockDimX = threads;
    cfg.sharedMemBytes = (unsigned)smem;
    cfg.hStream = (CUstream)stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    return (cudaError_t)launch(&cfg, k->fn[device], args, NULL);
}

#endif
