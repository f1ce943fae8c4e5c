/* Running the C CPU kernels from the host: the GIL released while they run, and Ctrl-C honoured. The calling thread
 * asks Python's signal handlers every FS_CPU_POLL_NS between tasks; a handler that raises (KeyboardInterrupt) stops
 * the run, no new task starts, and its exception is what the call raises. */
#include "flashsci.h"

#include "attention/cpu/attention_cpu.h"
#include "gemm/cpu/activation_cpu.h"
#include "gemm/cpu/gemm_cpu.h"

/* fs_cpu_poll: run the signal handlers with the GIL; nonzero (stop) when one raised, its exception left set. */
static int signal_raised(void *unused)
{
    (void)unused;
    PyGILState_STATE g = PyGILState_Ensure();
    const int raised = PyErr_CheckSignals() < 0;
    PyGILState_Release(g);
    return raised;
}

/* The exception for a CPU kernel's return code rc (0, -1 out of memory, -2 stopped by a signal handler). */
static int cpu_status(int rc)
{
    if (rc == -1) PyErr_NoMemory();
    if (rc == -2 && !PyErr_Occurred()) PyErr_SetString(PyExc_KeyboardInterrupt, "flashsci: the CPU kernel was stopped");
    return rc < 0 ? -1 : 0;
}

int fs_cpu_run_attention(const fs_attn_params *p, int threads)
{
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fs_attention_cpu(p, threads, signal_raised, NULL);
    Py_END_ALLOW_THREADS
    return cpu_status(rc);
}

int fs_cpu_run_gemm(const fs_gemm_params *p, int threads)
{
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fs_gemm_cpu(p, threads, signal_raised, NULL);
    Py_END_ALLOW_THREADS
    return cpu_status(rc);
}

int fs_cpu_run_activation(const fs_act_params *a, int threads)
{
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fs_activation_cpu(a, threads, signal_raised, NULL);
    Py_END_ALLOW_THREADS
    return cpu_status(rc);
}

int fs_cpu_run_backward(const fs_attn_bwd_params *g, int threads)
{
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fs_attention_backward_cpu(g, threads, signal_raised, NULL);
    Py_END_ALLOW_THREADS
    return cpu_status(rc);
}
