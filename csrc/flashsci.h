/* Host-side declarations shared by the csrc/ files: module state, imported tensors, GPU runtime layer. */
#ifndef FLASHSCI_HOST_H
#define FLASHSCI_HOST_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "attention/params.h"
#include "common/dtype.h"
#include "dlpack.h"
#include "gemm/activation.h"
#include "gemm/params.h"

#define FS_MAX_NDIM 8
#define FS_MAX_DIM (1LL << 30)   /* the largest size of any dimension: every tile count of the kernels fits 32 bits */
#define FS_MAX_KEYS (1 << 24)    /* keys per row that float32 accumulation sums exactly to rounding */

/* Kernel choices that tests and benchmarks set (_set_attention_kernel, _set_gemm_kernel); zero: the dispatcher's. */
typedef struct {
    int attention_sm80; /* the portable attention kernel on Hopper too */
    int gemm_sm80;      /* the portable GEMM on Hopper too */
    int gemm_bn;        /* the Hopper GEMM's tile width (128, 160, 192, 256) */
} fs_kernel_choice;

/* Per-module state (multi-phase init): cached types, interned names and torch handles. */
typedef struct {
    PyObject *array_type;           /* flashsci.Array, outputs for frameworks other than torch/NumPy */
    PyObject *torch_tensor_type;    /* torch.Tensor once the user has imported torch, else NULL */
    PyObject *torch_dtype[FS_NUM_DTYPES];
    PyObject *torch_current_stream; /* torch._C._cuda_getCurrentRawStream, NULL on CPU-only torch */
    PyObject *torch_empty_like;     /* torch.empty_like: the cheapest allocation for a contiguous output */
    PyObject *torch_grad_enabled;   /* torch.is_grad_enabled: requires_grad only matters while autograd records */
    PyObject *torch_c_api;          /* torch.Tensor.__dlpack_c_exchange_api__ (torch >= 2.10), else NULL */
    const DLPackExchangeAPI *torch_api; /* its table, when it can read tensors and name the current stream */
    PyObject *s_dtype, *s_shape, *s_stride, *s_data_ptr, *s_is_cuda, *s_is_cpu, *s_get_device,
        *s_new_empty, *s_requires_grad, *s_device, *s_dlpack, *s_dlpack_device, *s_cai, *s_stream,
        *s_max_version, *s_cuda_stream, *s_cuda_stream_proto, *s_c_exchange_api, *s_is_neg;
    PyObject *kw_names;             /* tuple of attention()'s keyword names, interned */
    int num_threads;                /* CPU threads for CPU kernels */
    fs_kernel_choice choice;
} fs_state;

/* The module's state. */
static inline fs_state *fs_get_state(PyObject *module) { return (fs_state *)PyModule_GetState(module); }

typedef enum { FS_SRC_NUMPY, FS_SRC_TORCH, FS_SRC_DLPACK, FS_SRC_CAI, FS_SRC_ARRAY } fs_source;

/* An array read from a user object through one of the interop routes. */
typedef struct {
    char *data;                     /* first element (byte offset applied) */
    int ndim;
    int64_t shape[FS_MAX_NDIM];
    int64_t strides[FS_MAX_NDIM];   /* in elements */
    fs_dtype dtype;
    int is_cuda, device;            /* device is the CUDA ordinal, 0 on the CPU */
    int readonly, requires_grad;
    fs_source source;
    int c_exchange;                 /* read through the DLPack C exchange table, no Python calls */
    PyObject *obj;                  /* the user's object, borrowed */
    const char *name;               /* the argument's name, for messages (a static string) */
    DLManagedTensor *dl;            /* DLPack ownership, released by fs_tensor_release */
    DLManagedTensorVersioned *dlv;
    int has_stream;                 /* __cuda_array_interface__ v3 'stream' key */
    uintptr_t stream;
} fs_tensor;

/* tensor.c */
typedef enum { FS_ROUTE_AUTO, FS_ROUTE_DLPACK, FS_ROUTE_CAI, FS_ROUTE_TORCH_ATTRS } fs_route;
int fs_torch_refresh(fs_state *st);
/* Read obj's array fields; allowed is a bit set of the dtypes this argument accepts (FS_FLOATS, ...). */
int fs_tensor_import(fs_state *st, PyObject *obj, const char *name, uintptr_t stream, fs_route route,
                     unsigned allowed, fs_tensor *t);
void fs_tensor_release(fs_tensor *t);
int fs_torch_data_ptr(fs_state *st, PyObject *tensor, char **data);
int fs_torch_current_stream(fs_state *st, int device, uintptr_t *stream);
int fs_parse_stream(fs_state *st, PyObject *obj, uintptr_t *stream);
PyObject *fs_tensor_describe(const fs_tensor *t);
int fs_wait_producers(fs_tensor *const *arrays, int n, uintptr_t stream);

/* varlen.c */
PyObject *fs_attention_varlen(PyObject *module, PyObject *args, PyObject *kwargs);

/* array.c */
int fs_array_add_type(PyObject *module, fs_state *st);
PyObject *fs_array_new(fs_state *st, int ndim, const int64_t *shape, fs_dtype dtype, int is_cuda, int device,
                       uintptr_t stream);
void *fs_array_data(PyObject *array);

/* checks.c: shared checks (0, or -1 with TypeError/ValueError set) and output allocation */
const char *fs_device_str(const fs_tensor *t, char *buf, size_t n);
const char *fs_shape_str(const int64_t *shape, int ndim, char *buf, size_t n);
void fs_byte_extent(const fs_tensor *t, uintptr_t *lo, uintptr_t *hi);
int64_t fs_numel(const fs_tensor *t);                        /* elements (0 for an empty tensor) */
/* A Python int as a long long in [lo, hi]: 0; 1 where it lies outside (past a long long too), no exception set; -1
 * with one set. The callers word the ValueError. */
int fs_int_in(PyObject *x, long long lo, long long hi, long long *value);
int fs_check_sizes(const fs_tensor *t, const char *name);
/* Bytes of a new array of shape and dtype into *bytes; ValueError when they pass 2**63. */
int fs_nbytes(int ndim, const int64_t *shape, fs_dtype dtype, size_t *bytes);
/* How to make t contiguous, in its framework's words. */
const char *fs_contiguous_hint(const fs_tensor *t);
int fs_check_alignment(const fs_tensor *t, const char *name, int dims_are_rows);
int fs_check_aux(const fs_tensor *x, const char *name, const fs_tensor *q);
int fs_is_contiguous(const fs_tensor *t);
PyObject *fs_new_output(fs_state *st, const fs_tensor *q, int ndim, const int64_t *shape, fs_dtype dtype,
                        uintptr_t stream, char **data);
int fs_check_out(const fs_tensor *o, fs_tensor *const *t, const char *const *names, int n, const int64_t *shape,
                 int ndim, fs_dtype dtype);
int fs_output_array(fs_state *st, PyObject *given, const char *name, const fs_tensor *q, int ndim, const int64_t *shape,
                    fs_dtype dtype, fs_tensor *const *inputs, const char *const *names, int n, uintptr_t stream,
                    fs_tensor *t, PyObject **obj);

/* options.c: option values parsed from Python objects (0, or -1 with TypeError/ValueError set) */
int fs_parse_scale(PyObject *obj, int *has_scale, double *scale);
int fs_parse_rotary(PyObject *obj, int *on, float *base);
int fs_parse_max_seqlen(PyObject *obj, const char *name, long long *value);
typedef struct { PyObject *table; int buckets, max_distance, bidirectional; } fs_t5_args;
int fs_parse_t5(PyObject *t5, fs_t5_args *a);
int fs_parse_activation(PyObject *obj, fs_activation *act);

/* attention_checks.c: the attention entry points' array checks and limits */
extern const char *const fs_qkv_names[3];
int fs_check_qkv(fs_tensor *const t[3], int ndim, const char *layout);
/* (B, H, S, D) positions of a 4-D tensor's dimensions in layout bshd (1) or bhsd (0). */
void fs_layout_dims(int bshd, int *ib, int *ih, int *is);
/* q, k, v of the padded entry points (4-D in the layout): fs_check_qkv, then matching B and D, heads, lengths. */
int fs_check_padded_qkv(int bshd, fs_tensor *const t[3]);
int fs_check_kv_heads(fs_tensor *const t[3], int ih);
int fs_kv_group(int64_t hq, int64_t hk, int64_t k_sh, int64_t v_sh);
/* The optional arrays of attention, checked against p (sizes) and filled into out's fields. */
int fs_check_kpm(const fs_tensor *m, const fs_tensor *q, const fs_attn_params *p, fs_attn_params *out);
int fs_check_seqlens(const fs_tensor *l, const fs_tensor *q, const fs_attn_params *p, fs_attn_params *out);
int fs_check_bias(const fs_tensor *x, const fs_tensor *q, const fs_attn_params *p, fs_attn_params *out);
int fs_check_t5(const fs_tensor *x, const fs_tensor *q, const fs_t5_args *a, fs_attn_params *p);
/* cu_seqlens: int32 (B + 1,); on the CPU also its values against total tokens and max_seqlen. */
int fs_check_cu_seqlens(const fs_tensor *c, const char *name, const fs_tensor *q, int64_t total, long long max_seqlen);
int fs_check_scale(double scale, fs_dtype dtype);          /* finite in the precision dtype computes in */
int fs_check_keys(int64_t keys, fs_dtype dtype, const char *what); /* at most FS_MAX_KEYS unless float64 */
int fs_check_rotary(int on, int64_t D);

/* params.c: the attention problem from checked tensors. An operand's data and (batch, head, sequence) strides in
 * elements: padded 4-D tensors in either layout, or packed (total, H, D) ones (batch stride 0). */
typedef struct { char *data; int64_t sb, sh, ss; } fs_operand;
fs_operand fs_operand_padded(const fs_tensor *t, int bshd);
fs_operand fs_operand_packed(const fs_tensor *t);
/* The options every attention entry point parses: causal, scale (has_scale = 0: 1 / sqrt(D)), rotary. */
typedef struct {
    int causal, has_scale;
    double scale;
    int rotary;
    float rotary_base;
} fs_attn_options;
/* p from sizes, operands and options; everything else (lse, masks, lengths, biases) zero for the caller to set. */
void fs_attn_params_build(fs_attn_params *p, const fs_attn_options *opt, int B, int H, int Hkv, int Sq, int Sk, int D,
                          fs_dtype dtype, fs_operand q, fs_operand k, fs_operand v, fs_operand o);

/* cpu.c: run a CPU kernel (fs_attention_cpu, fs_gemm_cpu) with the GIL released; Ctrl-C stops it with
 * KeyboardInterrupt. 0, or -1 with an exception set. */
int fs_cpu_run_attention(const fs_attn_params *p, int threads);
int fs_cpu_run_gemm(const fs_gemm_params *p, int threads);
int fs_cpu_run_activation(const fs_act_params *a, int threads);
int fs_cpu_run_backward(const fs_attn_bwd_params *g, int threads);

/* backward.c */
PyObject *fs_attention_backward(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fs_attention_varlen_backward(PyObject *module, PyObject *args, PyObject *kwargs);

/* attention.c */
/* Run checked parameters: the CUDA kernels on stream (after the streams arrays[0..n) named), else the
 * CPU kernel with the GIL released. */
int fs_run_attention(fs_state *st, const fs_attn_params *p, fs_tensor *const *arrays, int n, uintptr_t stream);
PyObject *fs_attention(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

/* linear.c, and the checks and runners linear_backward.c shares */
PyObject *fs_linear(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fs_swiglu(PyObject *module, PyObject *args, PyObject *kwargs);
/* A [..., cols] tensor's leading dims as rows: their count and one row stride (ValueError if they do not collapse). */
int fs_as_rows(const fs_tensor *t, const char *name, int64_t *rows, int64_t *ld);
int fs_check_like_x(const fs_tensor *t, const char *name, const fs_tensor *x); /* x's dtype and device */
int fs_check_weight(const fs_tensor *w, const char *name, const fs_tensor *x, int64_t K);
int fs_check_linear_device(const fs_tensor *x, fs_dtype out_dtype, int64_t N, int64_t K);
int fs_run_gemm(fs_state *st, const fs_gemm_params *p, fs_tensor *const *arrays, int n, uintptr_t stream);
int fs_run_activation(fs_state *st, const fs_act_params *a, fs_tensor *const *arrays, int n, uintptr_t stream);

/* linear_backward.c */
PyObject *fs_linear_backward(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fs_swiglu_backward(PyObject *module, PyObject *args, PyObject *kwargs);

/* introspect.c: the hooks tests and benchmarks use (_inspect, _launch_plan, _gemm_plan, _set_attention_kernel,
 * _set_gemm_kernel) */
PyObject *fs_hook_inspect(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fs_hook_launch_plan(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fs_hook_gemm_plan(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fs_hook_set_attention_kernel(PyObject *module, PyObject *arg);
PyObject *fs_hook_set_gemm_kernel(PyObject *module, PyObject *arg);

/* gpu.c: the CUDA runtime, or stubs that raise in a build without CUDA. All return 0 or -1 with an
 * exception set, unless noted. */
int fs_gpu_built(void);                                   /* 1 if compiled with CUDA */
int fs_gpu_device_count(void);                            /* 0 without a driver or device; never raises */
typedef struct { int sm_count, major, minor; size_t smem_optin; char name[256]; } fs_gpu_props;
int fs_gpu_props_get(int device, fs_gpu_props *props);
int fs_gpu_device_enter(int device, int *previous);      /* make device current, remember the old one */
void fs_gpu_device_leave(int previous, int device);
int fs_gpu_stream_wait(uintptr_t waiter, uintptr_t producer, int device);
int fs_gpu_pointer_device(const void *ptr, int *device);
void *fs_gpu_malloc_async(size_t bytes, uintptr_t stream, int device);
void fs_gpu_free_async(void *ptr, uintptr_t stream, int device);
int fs_gpu_attention(const fs_attn_params *p, int device, uintptr_t stream, const fs_kernel_choice *choice);
/* The gradients of g on device. */
int fs_gpu_attention_backward(const fs_attn_bwd_params *g, int device, uintptr_t stream, const fs_kernel_choice *choice);
/* Every query row of p written as zeros with lse -inf: the result when there is no key at all. */
int fs_gpu_attention_no_keys(const fs_attn_params *p, int device, uintptr_t stream);
PyObject *fs_gpu_attention_plan(const fs_attn_params *p, int device, const fs_kernel_choice *choice); /* dict */
int fs_gpu_gemm(const fs_gemm_params *p, int device, uintptr_t stream, const fs_kernel_choice *choice);
/* The GEMM for p (p->pre set) launched keeping the pre-activation itself: 1; 0 where its kernel does not keep it
 * (nothing launched: the caller runs the products, then the activation pass); -1 with an exception set. */
int fs_gpu_gemm_keeping_pre(const fs_gemm_params *p, int device, uintptr_t stream, const fs_kernel_choice *choice);
int fs_gpu_activation(const fs_act_params *a, int device, uintptr_t stream);
/* rows of width bytes, pitch bytes apart, set to 0 (cudaMemset2DAsync) */
int fs_gpu_zero(void *ptr, size_t pitch, size_t width, size_t rows, int device, uintptr_t stream);
PyObject *fs_gpu_gemm_plan(const fs_gemm_params *p, int device, const fs_kernel_choice *choice);       /* dict */

#endif
