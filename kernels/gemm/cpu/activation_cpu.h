/* C CPU reference of the elementwise passes around a differentiable linear layer (gemm/activation.h). */
#ifndef FLASHSCI_GEMM_ACTIVATION_CPU_H
#define FLASHSCI_GEMM_ACTIVATION_CPU_H

#include "common/cpu_pool.h"
#include "gemm/activation.h"

/* Run p on the CPU with up to num_threads threads; returns 0, -1 when out of memory, or -2 when poll stopped it. */
int fs_activation_cpu(const fs_act_params *p, int num_threads, fs_cpu_poll poll, void *poll_ctx);

/* d act(h) / dh in double, as torch differentiates each activation. */
double fs_activate_grad(fs_activation act, double h);

#endif
