/* Where a Hopper attention launch spends its time (fp16, bhsd, random inputs over 8 sets): the launch time by CUDA
 * events, then from one traced launch (globaltimer stamps) the spread of block starts, each block's first item, the
 * duration of later items (full query tiles, and light ones whose tile has idle warpgroups), when each block's last item
 * ends and how many items each block took; then, in clock cycles per consumer warpgroup, the phases of the full items
 * after a block's first (the hand-off, Q, K_0, S_0, the first softmax, the steps, the last P V, finish) and what an
 * item takes beyond its steps. The kernel's trace hooks (empty in the library) are defined here, before the fp16
 * instantiations are included.
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DFLASHSCI_SM90A -Ikernels -o /tmp/trace_sm90 \
 *        benchmarks/trace_sm90.cu kernels/attention/sm90/{dispatch,prepare,forward_bf16}.cu \
 *        kernels/common/workspace.cu kernels/attention/rotary/rotary.cu -lcuda
 *   /tmp/trace_sm90 B H S D [causal]
 * -DKERNEL_SRC='"path"' traces another copy of the fp16 instantiations (variants side by side on one machine). */
#include <cuda_runtime.h>

/* per block, [block][0][0]: its start (thread 0), the hand-off of the end marker and its end (consumer thread 128),
 * globaltimer ns; [block][1 + i][cw]: item i as the first thread of consumer warpgroup cw (0, 1) sees it, the FS_TR_
 * fields: hand-off and end (its O store issued) in globaltimer ns, its (b H + h) << 32 | q0 and n_kv, then clock64
 * stamps of its phases. The first FS_TRACE_ITEMS items of a block. */
#define FS_TRACE_ITEMS 64
enum {
    FS_TR_READ, FS_TR_END, FS_TR_ID, FS_TR_NKV,
    FS_TR_C_READ,      /* the item read from its slot */
    FS_TR_C_QREGS,     /* Q landed (D = 128: in registers) */
    FS_TR_C_K0,        /* K_0 landed */
    FS_TR_C_S0_TURN,   /* the issue turn for S_0 */
    FS_TR_C_S0_DONE,   /* S_0 landed */
    FS_TR_C_LOOP_TURN, /* the issue turn for S_1 and P_0 V_0 */
    FS_TR_C_LAST_TURN, /* the issue turn for the last P V */
    FS_TR_C_LAST_DONE, /* the last P V landed */
    FS_TR_C_END,       /* O stored (finish) */
    FS_TR_FIELDS
};
__device__ unsigned long long fs_sm90_trace[1024][FS_TRACE_ITEMS + 1][2][FS_TR_FIELDS];
static __device__ __forceinline__ unsigned long long trace_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* the hooks (kernel.cuh, mainloop.cuh): the block's start, a consumer's start (its item count), an item read (trace_t0; the end marker's hand-off), a clock
 * stamp of a phase, an item's end, the block's end */
#define FS_SM90_TRACE_BLOCK_START() if (threadIdx.x == 0) fs_sm90_trace[blockIdx.x][0][0][0] = trace_now()
#define FS_SM90_TRACE_CLOCK(f)                                                                                         \
    do {                                                                                                               \
        if ((threadIdx.x & 127) == 0 && cw < 2 && trace_n < FS_TRACE_ITEMS)                                            \
            fs_sm90_trace[blockIdx.x][1 + trace_n][cw][f] = clock64();                                                 \
    } while (0)
#define FS_SM90_TRACE_ITEM_READ(n_kv)                                                                                  \
    const unsigned long long trace_t0 = trace_now();                                                                   \
    FS_SM90_TRACE_CLOCK(FS_TR_C_READ);                                                                                 \
    if (n_kv < 0 && threadIdx.x == 128) fs_sm90_trace[blockIdx.x][0][0][1] = trace_t0
#define FS_SM90_TRACE_ITEM_END(w, n_kv)                                                                                \
    FS_SM90_TRACE_CLOCK(FS_TR_C_END);                                                                                  \
    if ((threadIdx.x & 127) == 0 && cw < 2 && trace_n < FS_TRACE_ITEMS) {                                              \
        unsigned long long *r = fs_sm90_trace[blockIdx.x][1 + trace_n][cw];                                            \
        r[FS_TR_READ] = trace_t0;                                                                                      \
        r[FS_TR_END] = trace_now();                                                                                    \
        r[FS_TR_ID] = (unsigned long long)(w.b * p.H + w.h) << 32 | (unsigned)w.q0;                                    \
        r[FS_TR_NKV] = n_kv;                                                                                           \
    }                                                                                                                  \
    trace_n++
#define FS_SM90_TRACE_BLOCK_END() if (threadIdx.x == 128) fs_sm90_trace[blockIdx.x][0][0][2] = trace_now()
#define FS_SM90_TRACE_CONSUMER() int trace_n = 0

#ifndef KERNEL_SRC
#define KERNEL_SRC "attention/sm90/forward_fp16.cu"
#endif
#include KERNEL_SRC

#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

/* Random fp16 values in [-1, 1) on the device. */
__global__ void fill(__half *x, size_t n, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
        x[i] = __float2half((float)(h & 0xffff) / 32768.f - 1.f);
    }
}

typedef unsigned long long u64;
static u64 trace[1024][FS_TRACE_ITEMS + 1][2][FS_TR_FIELDS];

int main(int argc, char **argv)
{
    if (argc < 5) { printf("usage: %s B H S D [causal]\n", argv[0]); return 2; }
    const int B = atoi(argv[1]), H = atoi(argv[2]), S = atoi(argv[3]), D = atoi(argv[4]), causal = argc > 5 && atoi(argv[5]);
    int dev = 0, sms = 0;
    CK(cudaSetDevice(dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const size_t n = (size_t)B * H * S * D;
    const int sets = 8; /* input sets rotated over, beyond L2 */
    std::vector<__half *> q(sets), k(sets), v(sets), o(sets);
    for (int i = 0; i < sets; i++) {
        CK(cudaMalloc(&q[i], n * 2)); CK(cudaMalloc(&k[i], n * 2)); CK(cudaMalloc(&v[i], n * 2)); CK(cudaMalloc(&o[i], n * 2));
        fill<<<512, 256>>>(q[i], n, 3 * i + 1); fill<<<512, 256>>>(k[i], n, 3 * i + 2); fill<<<512, 256>>>(v[i], n, 3 * i + 3);
    }
    fs_attn_params p;
    memset(&p, 0, sizeof p);
    p.B = B; p.H = H; p.kv_group = 1; p.Sq = S; p.Sk = S; p.D = D; p.scale = 1.0 / sqrt((double)D); p.causal = causal; p.dtype = FS_F16;
    p.q_ss = p.k_ss = p.v_ss = p.o_ss = D; p.q_sh = p.k_sh = p.v_sh = p.o_sh = (int64_t)S * D;
    p.q_sb = p.k_sb = p.v_sb = p.o_sb = (int64_t)H * S * D;
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    auto run = [&](int i) {
        p.q = q[i % sets]; p.k = k[i % sets]; p.v = v[i % sets]; p.o = o[i % sets];
        CK(fs_attention_sm90(&p, dev, sms, st, NULL));
        CK(cudaGetLastError());
    };
    for (int i = 0; i < 20; i++) run(i);
    CK(cudaStreamSynchronize(st));
    /* event time per launch, median of 7 batches of 20 */
    std::vector<float> ts;
    for (int r = 0; r < 7; r++) {
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < 20; i++) run(i);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        ts.push_back(ms * 1000.f / 20);
    }
    std::sort(ts.begin(), ts.end());
    printf("%dx%dx%dx%d causal %d: %.1f us per launch (events, back to back)\n", B, H, S, D, causal, ts[3]);
    for (int rep = 0; rep < 3; rep++) {
        static u64 zero[1024][FS_TRACE_ITEMS + 1][2][FS_TR_FIELDS];
        CK(cudaMemcpyToSymbol(fs_sm90_trace, zero, sizeof zero));
        run(rep + 1);
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpyFromSymbol(trace, fs_sm90_trace, sizeof trace));
        u64 t0 = ~0ull, tend = 0;
        int blocks = 0, nkv_max = 0;
        for (int b = 0; b < 1024 && trace[b][0][0][0]; b++, blocks++) {
            t0 = std::min(t0, trace[b][0][0][0]);
            tend = std::max(tend, trace[b][0][0][2]);
            for (int i = 1; i <= FS_TRACE_ITEMS && trace[b][i][0][FS_TR_END]; i++) nkv_max = std::max(nkv_max, (int)trace[b][i][0][FS_TR_NKV]);
        }
        std::vector<double> start, first_item, last_end, dur_full, dur_light, dur_first;
        std::vector<int> count;
        /* phases of the full items after a block's first (full key range), clock cycles, per consumer warpgroup */
        const char *phase_name[] = {"hand-off (after last O)", "Q landed", "K_0 wait", "S_0 turn wait", "S_0 GEMM",
                                    "softmax_0 + turn", "per middle step", "last P V", "finish (O out)", "item",
                                    "item - n_kv steps"};
        enum { NPH = 11 };
        std::vector<double> ph[2][NPH], wg_lag;
        auto cyc = [](u64 later, u64 earlier) { return (double)(long long)(later - earlier); }; /* signed: may be < 0 */
        for (int b = 0; b < blocks; b++) {
            start.push_back((trace[b][0][0][0] - t0) * 1e-3);
            int c = 0;
            double prev_end = 0;
            for (int i = 1; i <= FS_TRACE_ITEMS && trace[b][i][0][FS_TR_END]; i++, c++) {
                const u64 *r = trace[b][i][0];
                const double s0 = (r[FS_TR_READ] - t0) * 1e-3, s1 = (r[FS_TR_END] - t0) * 1e-3;
                const int q0 = (int)(r[FS_TR_ID] & 0xffffffffu), nkv = (int)r[FS_TR_NKV];
                if (i == 1) { first_item.push_back(s0); dur_first.push_back(s1 - s0); }
                else (q0 + 64 * sm90_nwg(D) > S ? dur_light : dur_full).push_back(s1 - (prev_end > s0 ? prev_end : s0));
                prev_end = s1;
                if (i == 1 || nkv != nkv_max || nkv < 2 || q0 + 64 * sm90_nwg(D) > S) continue;
                for (int w = 0; w < 2; w++) {
                    const u64 *x = trace[b][i][w], *prev = trace[b][i - 1][w];
                    if (!x[FS_TR_C_END] || !prev[FS_TR_C_END]) continue;
                    const double step = cyc(x[FS_TR_C_LAST_TURN], x[FS_TR_C_LOOP_TURN]) / (nkv - 1),
                                 item = cyc(x[FS_TR_C_END], prev[FS_TR_C_END]);
                    const double v[NPH] = {cyc(x[FS_TR_C_READ], prev[FS_TR_C_END]), cyc(x[FS_TR_C_QREGS], x[FS_TR_C_READ]),
                                           cyc(x[FS_TR_C_K0], x[FS_TR_C_QREGS]), cyc(x[FS_TR_C_S0_TURN], x[FS_TR_C_K0]),
                                           cyc(x[FS_TR_C_S0_DONE], x[FS_TR_C_S0_TURN]), cyc(x[FS_TR_C_LOOP_TURN], x[FS_TR_C_S0_DONE]),
                                           step, cyc(x[FS_TR_C_LAST_DONE], x[FS_TR_C_LAST_TURN]),
                                           cyc(x[FS_TR_C_END], x[FS_TR_C_LAST_DONE]), item, item - nkv * step};
                    for (int k = 0; k < NPH; k++) ph[w][k].push_back(v[k]);
                }
                if (trace[b][i][1][FS_TR_C_END])
                    wg_lag.push_back(cyc(trace[b][i][1][FS_TR_C_S0_TURN], trace[b][i][0][FS_TR_C_S0_TURN]));
            }
            count.push_back(c);
            last_end.push_back(prev_end);
        }
        auto stat = [](const char *name, std::vector<double> x) {
            if (x.empty()) return;
            std::sort(x.begin(), x.end());
            double m = 0; for (double y : x) m += y;
            printf("  %-24s n %4zu  min %7.2f  p10 %7.2f  med %7.2f  p90 %7.2f  max %7.2f  mean %7.2f\n", name, x.size(), x[0],
                   x[x.size() / 10], x[x.size() / 2], x[x.size() * 9 / 10], x.back(), m / x.size());
        };
        printf("launch %d: %d blocks, span %.2f us (first block start to last block end)\n", rep, blocks, (tend - t0) * 1e-3);
        stat("block start", start);
        stat("first item received", first_item);
        stat("first item duration", dur_first);
        stat("full item (after 1st)", dur_full);
        stat("light item", dur_light);
        stat("last item end", last_end);
        std::vector<double> cnt(count.begin(), count.end());
        stat("items per block", cnt);
        if (rep == 0) {
            printf("  phases of full items after the first (%d key tiles), clock cycles, consumer warpgroup 0 | 1:\n", nkv_max);
            for (int k = 0; k < NPH; k++) {
                if (ph[0][k].empty()) break;
                std::vector<double> x0 = ph[0][k], x1 = ph[1][k];
                std::sort(x0.begin(), x0.end());
                std::sort(x1.begin(), x1.end());
                printf("  %-24s med %7.0f  p90 %7.0f | med %7.0f  p90 %7.0f\n", phase_name[k], x0[x0.size() / 2],
                       x0[x0.size() * 9 / 10], x1.empty() ? 0. : x1[x1.size() / 2], x1.empty() ? 0. : x1[x1.size() * 9 / 10]);
            }
            stat("wg 1 S_0 turn - wg 0's", wg_lag);
        }
    }
    return 0;
}
