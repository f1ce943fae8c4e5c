/* C CPU GEMM with epilogues: the reference path for NumPy users, CPU tensors and machines without a GPU. */
#ifndef FLASHSCI_GEMM_CPU_H
#define FLASHSCI_GEMM_CPU_H

#include "common/cpu_pool.h"
#include "gemm/params.h"

/* Run the GEMM on the CPU with up to num_threads threads; returns 0, -1 when out of memory, or -2 when poll
 * (cpu_pool.h; may be NULL) stopped it. */
int fs_gemm_cpu(const fs_gemm_params *p, int num_threads, fs_cpu_poll poll, void *poll_ctx);

/* The activation in double, exactly as torch defines it (gelu: erf form; gelu_tanh: tanh approximation). */
double fs_activate(fs_activation act, double v);

#endif
