/* C CPU attention: the reference path for NumPy users, CPU tensors and machines without a GPU. */
#ifndef FLASHSCI_ATTENTION_CPU_H
#define FLASHSCI_ATTENTION_CPU_H

#include "attention/params.h"
#include "common/cpu_pool.h"

#define FS_CPU_MAX_D 512

/* Run attention on the CPU with up to num_threads threads; returns 0, -1 when out of memory, or -2 when poll
 * (cpu_pool.h; may be NULL) stopped it. */
int fs_attention_cpu(const fs_attn_params *p, int num_threads, fs_cpu_poll poll, void *poll_ctx);

/* The gradients of attention on the CPU (the reference backward: every option, float64 accumulation for float64
 * inputs, float32 otherwise); the same return values. */
int fs_attention_backward_cpu(const fs_attn_bwd_params *g, int num_threads, fs_cpu_poll poll, void *poll_ctx);

#endif
