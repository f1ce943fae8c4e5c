/* Tensor-core flash attention forward for Hopper (sm_90a): TMA loads from a producer warp, wgmma for both
 * Q K^T and P V, fp16/bf16 in, fp32 accumulation, online softmax, one pass over K/V.
 *
 * Build: part of the extension when the architecture list holds 90a (CMakeLists.txt); alone:
 *   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -c kernels/attention_sm90.cu
 * Run:   bash benchmarks/gpu_check.sh
 *
 * Notation (FlashAttention-2/3): a persistent block walks work items (b, h, query tile Q_i of Br = 64 NWG
 * rows). Warpgroup 0 is the producer: one thread issues TMA loads of Q_i and of the K_j, V_j tiles (Bc rows)
 * into a ring of STAGES stages, each completing on a "full" mbarrier and refilled once the consumers
 * arrive on its "empty" one. Warpgroups 1..NWG consume, 64 query rows each (the M of one wgmma):
 *   S_j = Q_i K_j^T      wgmma m64 n(Bc) k16, B = K from shared memory (K-major); A = Q from shared memory too
 *                        at D = 64 and in the option kernels, from registers (loaded once per item) at D = 128
 *   softmax              m_i <- max(m_i, rowmax(S_j) c);  P_j = exp2(S_j c - m_i);
 *                        l_i <- alpha l_i + rowsum(P_j), alpha = exp2(m_old - m_i)   (c = scale log2 e)
 *   O_i <- alpha O_i + P_j V_j   wgmma m64 n(D) k16, A = P from registers (the S accumulator layout is the
 *                        A fragment layout), B = V from shared memory (MN-major: the transpose bit)
 * Per tile, S_{j+1} = Q K_{j+1}^T and O += P_j V_j are issued together (one wait for both GEMMs' operands);
 * the consumer warpgroups take turns issuing (ping-pong on named barriers, FlashAttention-3), so one
 * warpgroup's softmax runs while another's GEMMs hold the tensor cores. A warpgroup whose rows all lie past the
 * sequence keeps the barriers and turns of the item but issues nothing. The softmax of S_{j+1} is written
 * to overlap P_j V_j as well, but ptxas schedules the wait for P_j V_j ahead of it (the exponentials follow
 * WARPGROUP.DEPBAR.LE 0 in the SASS): that overlap does not happen in this version (benchmarks/NOTES.md).
 * Tiles are 64-column halves of 128-byte rows with the 128-byte swizzle, as TMA writes them and as the
 * wgmma descriptors name them; TMA zero-fills rows past the sequence ends. O leaves the same way: written
 * into a swizzled staging tile by stmatrix, stored by TMA (which drops rows past Sq) once the next item's S_0 is issued.
 *
 * Scope: D = 64 and 128; of the protein options packed variable length, seqlens, key padding masks and the T5 bias
 * (FEAT instantiations: per-sequence offsets and lengths, the T5 table of the item's head in shared memory, expanded
 * for every head by a small kernel ahead of the launch, sm90_t5_expand; of a padding mask, each batch's list of the
 * key tiles that keep a key, tiles counted from its first kept key, visited in order (the others skipped), and per
 * thread and listed tile a word of the keys it drops, sm90_kpm_prepare); the T5 bias alone at D = 128 (ProtT5) on the
 * plain kernel with the bias added (T5 instantiations: sm90_t5_init);
 * rotary through a pre-pass that rotates q and k into the workspace (rotary.cu); no additive bias, no KV split (the
 * sm80 kernel takes the rest). K/V may have fewer heads than Q (grouped-query attention: item (b, h) loads K/V head
 * h / kv_group), K/V broadcast over heads included (one shared head).
 *
 * History (H200 fp16, TF/s on the S = 512 ... 16384 sweep, non-causal D = 64 / D = 128; FA2 = 250-299 /
 * 272-339, cuDNN 365-439 / 505-576):
 *   v1  2 warpgroups (Br = 128), Bc = 128, cp.async ring filled by all threads, a block barrier per tile,
 *       wgmma waited after each GEMM                                      213-274 / 272-367
 *   v2  producer warpgroup with TMA and full/empty mbarriers (setmaxnreg 24 / 240), persistent grid,
 *       S_{j+1} and P_j V_j issued together; D = 64 dispatched here too      352-431 / 435-533
 *   v3  ping-pong: the consumer warpgroups issue their GEMMs in turn; D = 64 with Bc = 192 on long
 *       non-causal key ranges                                               352-447 / 457-587
 *       (same run: cuDNN 359-442 / 512-588; causal 214-387 / 251-504 against cuDNN 266-425 / 339-524)
 *       Tried and dropped (NOTES.md): D = 128 with Bc = 176 or 3 stages (no gain); one tile stream across
 *       work items with a double-buffered Q and the P V wait moved to another basic block (the softmax then
 *       overlaps P V in the SASS): 7-12% slower on every shape.
 *   v4  O through a staging tile per consumer warpgroup and a TMA store (the direct 4-byte stores took 8-19%
 *       of the time at D = 128, S = 1024, measured by leaving them out)     361-443 / 534-604
 *       (same run: cuDNN 369-441 / 514-575, i.e. 0.95-0.97x its time at D = 128)
 *   v5  packed variable length, seqlens, T5 bias (FEAT); the next item's sequence lengths load during the
 *       current one; T5 buckets computed once per block. ESM2-3B heads on UniProt length buckets: 107-405
 *       TF/s (sm80 FEAT: 89-260); ProtT5-XL heads with the T5 bias 0.84-0.89x the plain kernel's speed
 *   v5.1 FEAT in uniform registers: the SASS of v5 kept the ring's stage and phase in ordinary registers and
 *       moved every wgmma descriptor across with R2UR (the item's tile count came from memory, the main loop
 *       sat in a conditional, the packed-store test was per thread); redux.sync on the loaded values and an
 *       early exit for items without keys put them back in the uniform datapath. Option kernel with
 *       seqlens = full lengths 3-19% slower than the plain one over two runs (was 10-13%); T5 bias 0.85-0.93x
 *       the plain kernel's speed (was 0.78-0.90)
 *   v5.2 the consumer warpgroup index through redux.sync at D = 64 (the Q descriptors uniform too): 2.5-3% at
 *       D = 64. Bc = 64 for the protein options at D = 64 when 128-key tiles would visit a quarter more keys
 *       (ESM2-3B heads, a 96 x 170 UniProt bucket packed: 250.6 -> 223.7 us, 1.15 -> 1.29x torch's varlen_attn)
 *       Tried and dropped (NOTES.md): exponentials on the FMA pipe, row sums by the tensor cores; both slower.
 *   v5.3 the producer hands each work item to the consumers through a shared-memory slot (item_full / item_read);
 *       causal and packed launches claim items on demand from a counter in the stream's workspace (by stride the
 *       busiest block took 3-6% above the mean on the causal sweep): D = 128 causal S = 8192 965 -> 870 us,
 *       S = 1024 186 -> 181 us; D = 64 causal S = 1024 235 -> 220 us; the UniProt random-order packed batches
 *       18-36% faster (171 -> 132 us on the first), 1.46-1.57x torch's varlen_attn (was 0.94-1.26x)
 *       Tried and dropped (NOTES.md): the first warpgroup's diagonal tile on its first 64 keys (wgmmas of two
 *       shapes under a branch: ptxas serialises every wgmma, C7511 / C7515).
 *   v6  three consumer warpgroups at D = 64 (Br = 192, Bc = 128, setmaxnreg 160; FlashAttention-3's count): two
 *       softmaxes overlap each warpgroup's GEMMs. Warpgroups past the sequence end stay idle, and heads whose last
 *       query tile has idle ones claim their items. H100, µs, v5.3 -> v6 (two rounds each): ESM2-3B 217, 221 ->
 *       201, 195; ESM-C 111, 110 -> 103, 98; 16x32x1024 336, 337 -> 303, 293; 2x32x8192 2253, 2268 -> 2007, 1986
 *       (v5.3 with Bc = 192 there, now dropped); causal 2x32x8192 1230, 1258 -> 1108, 1117
 *   v6.1 causal items in sections of heads whose K/V fit in half of L2, heaviest first within a section (all heads
 *       at once re-read each head's K/V from memory per query tile): H100, causal 16x16x1024x128 260, 254 -> 170,
 *       169 us (cuDNN 181-200), 16x32x1024x64 259, 255 -> 242, 238
 *   v6.2 the protein options (FEAT) at D = 64 on three consumer warpgroups as well (Br = 192, Bc = 64 or 128; 205 KiB
 *       of shared memory at Bc = 128 with the T5 tables, no spills). H100, packed ESM2-3B heads on the UniProt
 *       batches (benchmarks/varlen_quick.py, two rounds each, us): length-sorted 96x170 178, 178 -> 129, 129 (one
 *       item per sequence instead of two), 15x1035 482, 488 -> 435, 435, 4x4096 1593, 1602 -> 1454, 1476; random
 *       order 15x1061 128, 128 -> 115, 112, 10x1511 200, 204 -> 176, 176: 1.50-2.24x torch's varlen_attn (1.38-1.60x)
 *   v6.3 the T5 tables repeat their end entries FS_SM90_T5_PAD places beyond the span, so the per-element bias on
 *       tiles near the diagonal loads at fixed offsets from one address, with no clamp (SASS: 4624 -> 4376
 *       instructions at D = 128). H100, ProtT5-XL heads with ProtT5's buckets (benchmarks/t5_cost.py, three rounds,
 *       us): 32x32x512 326, 318, 315 -> 305, 309, 317; 16x32x1024 568, 589, 592 -> 574, 567, 548; 8x32x2048 997,
 *       1001, 998 -> 991, 984, 990 (plain kernel 241-258 / 471-491 / 917-925)
 *   v6.4 D = 128 (plain kernel): Q_i in registers as the A operand of S = Q K^T (wgmma RS), loaded once per item, its
 *       tile released at once. Shared-memory reads per tile fall by a fifth (80 -> 64 KiB per warpgroup), where
 *       ncu had the shared pipe the busiest (74-75%) and the board sits at its 700 W cap. H100, attn_quick.py, two
 *       rounds, us: 2x16x8192 1881, 1877 -> 1797, 1854; 1x16x16384 3750, 3711 -> 3638, 3701; 8x32x1024 and
 *       16x16x1024 level within the machine's +-3%. The option kernel would spill with it (64 bytes) and keeps Q
 *       in shared memory.
 *   v6.5 T5 tables expanded once per launch into the workspace (sm90_t5_expand, one block per head) and copied per
 *       item by the producer with Q, completing on q_full, into one of two slots; before, each consumer warpgroup
 *       built its table per item from the bucket table and global loads, and ncu's warp samples put 9% of ProtT5's
 *       time at S = 512 there. H100, benchmarks/t5_cost.py, ProtT5's buckets, three rounds, us: 32x32x512 322, 318,
 *       321 -> 300, 302, 298; 16x32x1024 559, 558, 562 -> 519, 517, 520; 8x32x2048 981, 980, 977 -> 958, 960, 976.
 *       Dispatched below one item per SM too (sm90_pays): H100, 1x8x2048x128 80.5 -> 30.8 us (the sm80 kernel),
 *       1x20x1024x64 32.7 -> 18.7
 *   v6.6 rotary (q and k rotated by a pre-pass, rotary.cu) and key padding masks (KPM instantiations: each batch's
 *       key range ends at its last kept key, and the keys dropped before it come from sm90_kpm_prepare as one word
 *       per thread and tile, selected to -inf in the softmax) move here from the sm80 kernel. H100 fp16: ESM2-3B with
 *       rotary 466 -> 245 us; padded UniProt batches of ESM2-3B heads with a mask 329-2725 -> 158-1499 us (SDPA with
 *       the mask 306-2290). Measured first inside the FEAT kernels: the packed batches without a mask ran 1-3% slower
 *       there, so the mask has its own instantiations and the others' SASS is unchanged
 *   v6.7 plain non-causal launches whose last query tiles leave warpgroups idle (light tiles, 0.63 of a full tile's time
 *       for a third of its rows at D = 64) put the light tiles of the last grid / 3 heads at the end of the item order,
 *       where they fill the blocks that end early (benchmarks/trace_sm90.cu: the blocks ended 7 us apart), as many heads
 *       as keep their K/V in L2 meanwhile (all 32 heads of 1 x 32 x 16384: 4466 -> 4670 us). Producer
 *       only; the consumers' SASS is unchanged. H100, graph replay, three rounds, us: ESM-C 92.8, 89.9, 90.9 -> 87.6,
 *       87.9, 91.4; ESM2-3B 198.6, 193.2, 190.9 -> 180.9, 197.8, 191.0; 16x32x1024 314.8, 315.6, 316.0 -> 305.3,
 *       309.5, 306.3; 4x32x4096 level. Tried and dropped (NOTES.md, session 19): three heads' light tiles as one item
 *       (the main loop 3.5% slower from codegen, the shared ring too shallow), a tail kernel ahead of or behind the
 *       main one by programmatic dependent launch (cold or latency-bound tail items)
 *   v6.8 each wgmma descriptor built once per stage and advanced by adding offset >> 4 (SASS: 2744 -> 2616 instructions
 *       in the plain D = 128 kernel, uniform LOP3/SHF 104 -> 20). H100, ab_quick.sh, two rounds, us: 2x32x8192x64 2205,
 *       2197 -> 2139, 2152; 4x32x4096x64 1159, 1144 -> 1125, 1142; D = 128 level. Tried and dropped (NOTES.md, session
 *       21): L2 prefetch of the coming K/V tiles and the next item's by cp.async.bulk.prefetch.tensor from the producer
 *       (ProtT5-XL 262 -> 350 us); three consumer warpgroups at D = 128 with Bc = 64 (7-10% slower); a third V stage
 *       at D = 128 (level, causal 2-3% slower); session 23: the next item's S_0 issued in the turn of the last P V at
 *       D = 128, the ring's stage kept uniform (3-11% slower, shorter items losing more), or with two turns and the old
 *       O stored under S_0 (level to 4% slower; branch wip/stream-items)
 *   v6.9 the plain D = 64 kernel on two consumer warpgroups (Br = 128) where three leave SMs idle and two still give
 *       each item an SM (sm90_two_wg64), and dispatched below one item per SM from 256 keys (sm90_pays). H100, graph
 *       replay, us: 1x8x2048x64 29.5 -> 23.6, 2x8x1024x64 18.1 -> 14.5, 2x8x1024x64 causal 19.1 -> 15.6, 1x1x512x64
 *       (the sm80 kernel before) 8.9 -> 8.0, 8x8x256x64 9.6 -> 8.0 (cuDNN 24, 15, 15.5, 9.0, 9.1). Not built (NOTES.md,
 *       session 24): K/V multicast over 2-block clusters at D = 128; with the V loads left out altogether (half the
 *       L2 -> SM bytes, wrong results) ProtT5-XL ran no faster (252, 253 -> 259, 244 us)
 *   v6.10 grouped K/V heads (the producer loads K/V head h / kv_group; multi-query K/V by expand now here, 2.3-2.5x the
 *       sm80 kernel). Dropped (session 25): a quarter or an eighth of the D = 128 exponentials on the FMA pipe, 3-7%
 *       slower (ProtT5-XL 253, 259 -> 276, 267 us), and the row max in four chains, level
 *   v6.11 key padding: each batch's tiles that keep a key as a list, counted from its first kept key, so all-padding
 *       tiles are skipped wherever they lie (before: only those after the last kept key). H100 fp16, UniProt batches of
 *       ESM2-3B heads padded on the left, random order (benchmarks/kpm_quick.py, two rounds): 220-860 -> 143-283 us with
 *       the list on tiles from key 0, then up to 15% less counted from the first kept key (3-8% above right padding)
 *   v6.12 the item boundary shortened (benchmarks/trace_sm90.cu, now with clock stamps of an item's phases, found 2950
 *       cycles of a D = 128 item beyond its steps, half of them in finish): 1 / l while the last P V runs, on the FMA pipe
 *       (rcp.approx queued behind the other warpgroup's exponentials), O into the staging tile by stmatrix, its TMA store
 *       issued after the next S_0 (no warpgroup barrier between the last P V and S_0), Q into registers by ldmatrix.
 *       H100 fp16, traced, cycles beyond an item's steps 2961 -> 1947 at 32x16x512x128 (item 14051 -> 13086), launch
 *       144.1 -> 137.7 us; 32x32x512x64 launch 168.9 -> 165.9 us; 16x16x1024x128 238.3 -> 232.9 us
 *   v6.13 plain D = 128 items taken by stride: the producer hands over the next item and loads its Q a whole item ahead
 *       (Q sits in registers), not after the current item's last V load. H100 fp16, traced at 32x16x512x128: Q's wait
 *       p90 1140 -> 510 cycles, item 13129 -> 12935, launch 136.7 -> 133.8 us; graph replay, three A/Bs of two rounds:
 *       32x16x512x128 -1.5 to -6%, ProtT5-XL -0.4 to -5%, S = 8192 +0.3 to +1.3%. Claimed items (causal) keep the
 *       late hand-over, yet 4x16x4096x128 causal measured 488, 493 -> 500, 501 us (likely the consumers' registers,
 *       allocated anew around the producer's new loop)
 *   v6.14 plain D = 128: the producer's early loop hands over at one place (the item's tiles up to `ahead`, the
 *       hand-over, the rest), and the consumers keep S in one array per item instead of one per tile. SASS 2992 ->
 *       2680 instructions (producer 946 -> 685, consumers 1995 -> 1942); the other kernels keep their instruction
 *       counts (the one array renames registers and moves 2 MOVs in them). H100 fp16, graph replay, two rounds, us:
 *       ProtT5-XL 248.9, 254.3 -> 242.3, 236.2 (1.03-1.04 -> 1.06-1.07x cuDNN's speed); 2x16x8192x128 1819, 1833 ->
 *       1790, 1780; 4x16x4096x128 causal 505, 505 -> 495, 495; 32x16x512x128 133.4, 136.5 -> 133.9, 137.6. Which of
 *       the two changes carries the gain was not separated
 *   v6.15 the T5 bias without the other options at D = 128 on the plain kernel (T5: Q in registers, the early hand-over,
 *       which the FEAT kernel cannot hold without spilling). On tiles whose positions reach into the bias's span the
 *       bias (tables of bias / scale) is loaded into S's registers ahead of the tile's issue turn, as the value its
 *       Q K^T accumulates on; the other tiles shift by the table's end entry. The bias added in the softmax, as FEAT
 *       does, was 8% slower here: with Q in registers ptxas issued each of the 34 table loads just ahead of its FFMA.
 *       H100 fp16, benchmarks/t5_cost.py, ProtT5's buckets, three rounds, us: 32x32x512 291, 288, 290 -> 282, 283, 282
 *       (0.945-0.954 of the plain kernel's speed); 16x32x1024 510, 511, 511 -> 501, 501, 501; 8x32x2048 936, 942, 938
 *       -> 958, 948, 963 (0.915-0.935). Tried and dropped: 8-byte loads from a table of pairs, one per register pair (32
 *       loads where ptxas made 34 and 30 moves), up to 4% slower at S = 512 and 1024; a branch giving the first wgmma
 *       of a tile without the bias RZ as its input (a constant accumulate flag), level
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "attention_cuda.h"
#include "attention_seq.cuh"
#include "launch.cuh"
#include "tma.cuh"
#include "workspace.h"

#ifdef FS_SM90_TRACE /* benchmarks/trace_sm90.cu only: per block, [block][0][0]: its start (thread 0), the hand-off of
 * the end marker and its end (consumer thread 128), globaltimer ns; [block][1 + i][cw]: item i as the first thread of
 * consumer warpgroup cw (0, 1) sees it, the FS_TR_ fields: hand-off and end (its O store issued) in globaltimer ns, its
 * (b H + h) << 32 | q0 and n_kv, then clock64 stamps of its phases. The first FS_TRACE_ITEMS items of a block. */
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
FS_DEV unsigned long long trace_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define FS_TRACE_CLOCK(f)                                                                                              \
    do {                                                                                                               \
        if ((threadIdx.x & 127) == 0 && cw < 2 && trace_n < FS_TRACE_ITEMS)                                            \
            fs_sm90_trace[blockIdx.x][1 + trace_n][cw][f] = clock64();                                                 \
    } while (0)
#else
#define FS_TRACE_CLOCK(f) do {} while (0)
#endif

/* ---- tile configuration, one place: per (D, Bc, consumer warpgroups NWG; Br = 64 NWG) the K/V ring stages and
 * the registers setmaxnreg gives each consumer thread (the producer warpgroup keeps 24). NWG: sm90_nwg, or 2 at D = 64
 * below one item per SM (sm90_two_wg64); Bc = 128, or 64 for the protein options on short key ranges
 * (sm90_narrow_keys) ---- */
template <int D, int BC, int NWG> struct fs_sm90_tile;
/*                                                 STAGES  REGS */
template <> struct fs_sm90_tile<64, 64, 3>   { enum { STAGES = 6, REGS = 160 }; };
template <> struct fs_sm90_tile<64, 128, 3>  { enum { STAGES = 4, REGS = 160 }; };
template <> struct fs_sm90_tile<64, 128, 2>  { enum { STAGES = 4, REGS = 240 }; };
template <> struct fs_sm90_tile<128, 128, 2> { enum { STAGES = 2, REGS = 240 }; };

#define FS_SM90_T5_MAX 2048 /* T5 bias entries of a table (FEAT) */
#define FS_SM90_T5_PAD 192   /* entries each side of a T5 table repeating its end values (sm90_softmax, sm90_t5_init) */
#define FS_SM90_T5_STRIDE (FS_SM90_T5_MAX + 2 * FS_SM90_T5_PAD) /* floats; a multiple of 4 (16-byte bulk copies) */
#define FS_SM90_T5_MIN_SCALE 1e-6 /* |scale| at least for the T5 kernels, whose tables hold bias / scale */
#define FS_SM90_WORK_BYTES 64 /* the work item the producer hands to the consumers (sm90_work) */

/* shared memory: Q tile, K ring, V ring, an O staging tile per consumer warpgroup (1024-byte aligned), with the
 * protein options (FEAT) two T5 tables (for the items of alternate Q tile loads), the mbarriers, the current work item,
 * the coordinates of each staging tile's store; plus 1 KiB alignment slack */
template <int D, int BC, int NWG, bool BIAS> constexpr int sm90_smem()
{
    using t = fs_sm90_tile<D, BC, NWG>;
    return (2 * 64 * NWG + 2 * t::STAGES * BC) * D * 2 + (BIAS ? 2 * 4 * FS_SM90_T5_STRIDE : 0) + (4 + 4 * t::STAGES) * 8 +
           FS_SM90_WORK_BYTES + NWG * 16 + 1024;
}

typedef struct {
    fs_attn_params p;
    float scale_log2; /* scale * log2(e) */
    int n_qtiles, items;
    int section; /* causal: heads per section of the item order (sm90_section) */
    int late_heads; /* plain, non-causal, light last tiles: the last late_heads heads' light tiles end the order (0: none) */
    int *claims; /* NULL: block b takes items b, b + grid, ...; else [next, blocks done], zero between launches:
                    after its first item a block claims the next unclaimed one */
    int t5_lneg, t5_n; /* FEAT, T5: bias of relative positions -t5_lneg .. t5_n - 1 - t5_lneg (fs_t5_span) */
    int t5_row;        /* FEAT, T5: floats per head in t5_rows, a multiple of 4 */
    const float *t5_rows; /* FEAT, T5: each head's table as shared memory holds it (sm90_t5_expand) */
    /* FEAT, key padding (sm90_kpm_prepare): a batch's key tiles start at its first kept key f, tile t at f + t Bc, and
     * those that keep a key, in order, are its list; per batch f, then per tile t the count of the list's tiles
     * before t (t = 0 .. kpm_tiles); per (batch, list entry, lane % 4) the keys of the entry's tile the mask drops
     * and its first key */
    const int *kpm_count;
    const uint2 *kpm_list; /* {dropped keys, first key} */
    int kpm_tiles;         /* key tiles per batch, at most */
} fs_sm90_args;

#ifdef FS_WGMMA
/* Work item t: (b, h, query tile from row q0 of its sequence), reading n_kv K/V tiles of Bc rows. Non-causal:
 * the tiles of one head adjacent (K/V shared in L2); causal: sections of a.section heads whose K and V fit in
 * about half of L2, each section's heaviest tiles (last rows) first. FEAT: the sequence's rows start at qo / ko
 * of the packed tensors (tb = 0 names their one batch) and hold q_len / k_len rows; a packed item past its
 * sequence is skipped, a padded one (seqlens) has no tiles and writes zeros. Key padding: n_kv counts the tiles with a
 * kept key, which the item visits in order (a.kpm_list), the others skipped. n_kv = -1 marks the end of a block's
 * items. */
typedef struct {
    int b, h, q0, n_kv, tb, skip;
    fs_seq seq;
} sm90_work;
static_assert(sizeof(sm90_work) <= FS_SM90_WORK_BYTES, "the work item fits its shared-memory slot");
template <bool FEAT, bool KPM> FS_DEV sm90_work sm90_item(const fs_sm90_args &a, int t, int br, int bc)
{
    const fs_attn_params &p = a.p;
    if (!FEAT && a.late_heads) { /* the last late_heads heads: their full tiles head by head, then their light ones */
        const int nq = a.n_qtiles, late0 = p.B * p.H - a.late_heads, u = t - late0 * nq;
        const int light = u - a.late_heads * (nq - 1); /* >= 0: the light tile of head late0 + light */
        if (u >= 0) {
            const int bh = late0 + (light >= 0 ? light : u / (nq - 1)), b = bh / p.H, tile = light >= 0 ? nq - 1 : u % (nq - 1);
            return sm90_work{b, bh % p.H, tile * br, (p.Sk + bc - 1) / bc, b, 0, fs_seq{0, 0, p.Sq, p.Sk}};
        }
    }
    const int bh_count = p.B * p.H, first = t / (a.section * a.n_qtiles) * a.section; /* causal: the section's */
    const int heads = min(a.section, bh_count - first), r = t - first * a.n_qtiles;   /* first head, its heads */
    const int bh = p.causal ? first + r % heads : t / a.n_qtiles, b = bh / p.H;
    const int q0 = (p.causal ? a.n_qtiles - 1 - r / heads : t % a.n_qtiles) * br;
    fs_seq seq = FEAT ? seq_geometry(p, b) : fs_seq{0, 0, p.Sq, p.Sk};
    const int kv_end = q0 >= seq.q_len ? 0 : p.causal ? min(seq.k_len, min(q0 + br, seq.q_len)) : seq.k_len;
    const int tiles = (kv_end + bc - 1) / bc;
    int n_kv = tiles;
    if (KPM) { /* the listed tiles that start before kv_end */
        const int *count = a.kpm_count + b * (a.kpm_tiles + 2), ahead = (kv_end - count[0] + bc - 1) / bc;
        n_kv = count[1 + min(max(ahead, 0), a.kpm_tiles)];
    }
    return sm90_work{b, bh % p.H, q0, n_kv, FEAT && p.cu_seqlens_q ? 0 : b,
                     FEAT && p.cu_seqlens_q && q0 >= seq.q_len, seq};
}

/* T5 kernels: the T5 bias of the S tile at key k0 of a consumer warpgroup's rows rw0 .. rw0 + 63 (rw0 and k0 uniform
 * over the warpgroup), from t5 (bias / scale of relative position col - row, clamped to -t5_lneg .. t5_n - 1 - t5_lneg,
 * at t5[col - row]). Where the tile's positions reach into the span, this thread's elements (rows row0, row0 + 8) go
 * into s as the initial value that S = Q K^T accumulates on, and the call returns true with add = 0; a tile wholly
 * before or after the span returns false with add = ends[0] or ends[1], the shift of its scores. Loaded ahead of the
 * tile's issue turn, the loads land while the warpgroup waits for it (in the softmax, with Q in registers, ptxas issued
 * each load just ahead of its use: 8% slower at S = 512). No clamp per element: the positions reach at most 8 NS + 62
 * past the span, where the table repeats its end entries. */
template <int NS>
FS_DEV bool sm90_t5_init(float (&s)[NS * 4], const float *t5, int t5_lneg, int t5_n, int k0, int rw0, int row0, int t4,
                         const float (&ends)[2], float &add)
{
    static_assert(8 * NS + 62 <= FS_SM90_T5_PAD, "a tile's positions stay within the T5 table's padding");
    const int lo = k0 - (rw0 + 63), hi = k0 + NS * 8 - 1 - rw0;
    const bool before = hi <= -t5_lneg, after = lo >= t5_n - 1 - t5_lneg;
    add = before ? ends[0] : after ? ends[1] : 0.f;
    if (before || after) return false;
    /* element (n, r, c) has rel = base + 8 (n - r) + c */
    const float *base = t5 + (k0 + 2 * t4 - row0);
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int c = 0; c < 2; c++) s[4 * n + 2 * r + c] = base[8 * (n - r) + c];
    return true;
}

/* How a kernel adds the T5 bias: not at all; in the softmax, from t5 where the item has a table (FEAT); as S's
 * initial value on tiles where it varies and as one shift elsewhere (T5: sm90_t5_init). */
enum { SM90_NO_T5, SM90_T5_IF_SET, SM90_T5_ALWAYS };

/* Online softmax of one S tile in place (NS column groups of 8, rows g and g + 8 of this thread's warp): masks,
 * then m_i <- max(m_i, rowmax(S) c); S <- P = exp2(S c - m_i); l_i <- alpha l_i + rowsum(P); returns
 * alpha = exp2(m_old - m_i) per row for the caller to rescale O with. Rows with every key masked so far keep
 * m_i = -inf and use 0 in its place (P = 0, no NaN). P stays fp32: packing it to the A fragments of P V waits
 * until the previous P V has read them. FEAT: keys past k_len are masked, so are the columns set in drop
 * (bit 2 n + c for this thread's column 8 n + 2 t4 + c: sm90_kpm_prepare). BIAS = SM90_T5_IF_SET: t5 (NULL: none)
 * adds the T5 bias (log2 units) of relative position col - row, clamped to -t5_lneg .. t5_n - 1 - t5_lneg, at
 * t5[col - row]; a tile whose positions all clamp to one entry only shifts the exponent, and the others' reach no
 * further than 8 NS + 7 past that span, where the table repeats its end entries (FS_SM90_T5_PAD): no clamp per
 * element. BIAS = SM90_T5_ALWAYS: S holds the bias where it varies over the tile (sm90_t5_init), and t5_add (log2
 * units) shifts the tile's scores. */
template <int NS, int BIAS, bool KPM>
FS_DEV void sm90_softmax(float (&s)[NS * 4], const fs_attn_params &p, int k0, int k_len, int row0, int t4, float scale_log2,
                         const float *t5, int t5_lneg, int t5_n, float t5_add, uint32_t drop, float (&m_i)[2],
                         float (&l_i)[2], float (&alpha)[2])
{
    const bool prescale = scale_log2 <= 0.f; /* a non-positive scale flips the max: scale before it */
    const float mul = prescale ? 1.f : scale_log2;
    if (prescale)
#pragma unroll
        for (int i = 0; i < NS * 4; i++) s[i] *= scale_log2;
    /* keys past the sequence and, for causal, keys after the query (col > row) */
    if (k0 + NS * 8 > k_len || (p.causal && k0 + NS * 8 - 1 > row0)) {
#pragma unroll
        for (int i = 0; i < NS * 4; i++) {
            const int col = k0 + (i >> 2) * 8 + 2 * t4 + (i & 1), row = row0 + ((i >> 1) & 1) * 8;
            if (col >= k_len || (p.causal && col > row)) s[i] = -INFINITY;
        }
    }
    if (KPM && drop)
#pragma unroll
        for (int i = 0; i < NS * 4; i++)
            if (drop >> (2 * (i >> 2) + (i & 1)) & 1) s[i] = -INFINITY;
    /* scores in log2 units are x = S tile_mul + tile_add */
    float tile_mul = mul, tile_add = BIAS == SM90_T5_ALWAYS ? t5_add : 0.f;
    static_assert(8 * NS + 7 <= FS_SM90_T5_PAD, "a tile's positions stay within the T5 table's padding");
    if (BIAS == SM90_T5_IF_SET && t5) {
        const int top = t5_n - 1 - t5_lneg;
        const int lo = min(max(k0 - (row0 + 8), -t5_lneg), top), hi = min(max(k0 + NS * 8 - 1 - row0, -t5_lneg), top);
        if (lo == hi) {
            tile_add = t5[lo];
        } else {
            /* element (n, r, c) has rel = base + 8 (n - r) + c: one table load per distinct dd = n - r and c */
            const float *t5_base = t5 + (k0 + 2 * t4 - row0);
#pragma unroll
            for (int dd = -1; dd < NS; dd++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const float bias = t5_base[8 * dd + c];
#pragma unroll
                    for (int r = 0; r < 2; r++)
                        if (dd + r >= 0 && dd + r < NS) s[4 * (dd + r) + 2 * r + c] = fmaf(s[4 * (dd + r) + 2 * r + c], mul, bias);
                }
            tile_mul = 1.f;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < NS; n++) mx = fmaxf(mx, fmaxf(s[4 * n + 2 * r], s[4 * n + 2 * r + 1]));
        if (BIAS) mx = fmaf(mx, tile_mul, tile_add); /* lanes of a row may differ in tile_mul / tile_add */
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
        const float m_new = fmaxf(m_i[r], BIAS ? mx : mx * mul), m_use = m_new == -INFINITY ? 0.f : m_new;
        alpha[r] = exp2_approx(m_i[r] - m_use);
        m_i[r] = m_new;
        const float shift = BIAS ? tile_add - m_use : -m_use;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < NS; n++) {
            s[4 * n + 2 * r] = exp2_approx(fmaf(s[4 * n + 2 * r], tile_mul, shift));
            s[4 * n + 2 * r + 1] = exp2_approx(fmaf(s[4 * n + 2 * r + 1], tile_mul, shift));
            sum += s[4 * n + 2 * r] + s[4 * n + 2 * r + 1];
        }
        l_i[r] = l_i[r] * alpha[r] + sum;
    }
}

/* 1 / x for a positive normal x on the FMA pipe: a bit-pattern estimate (relative error at most 5.1%) and three Newton
 * steps (at most 9e-8). An item's last row sums are inverted while its last P V runs, when the other warpgroup's
 * exponentials fill the special-function unit: there rcp.approx took the P V's latency and 360 cycles more
 * (benchmarks/trace_sm90.cu). */
FS_DEV float rcp_newton(float x)
{
    float y = __int_as_float(0x7ef311c3 - __float_as_int(x));
#pragma unroll
    for (int i = 0; i < 3; i++) y = fmaf(y, fmaf(-x, y, 1.f), y);
    return y;
}

/* Named barriers 1..NWG order the consumer warpgroups' GEMM issues (ping-pong, FlashAttention-3): warpgroup w
 * issues after warpgroup w - 1 has, so one warpgroup's softmax runs while the next one's GEMMs hold the
 * tensor cores. bar.sync waits for the 128 arrivals of the previous warpgroup besides its own 128. */
FS_DEV void issue_turn_wait(int cw) { asm volatile("bar.sync %0, 256;\n" ::"r"(1 + cw) : "memory"); }
template <int NWG> FS_DEV_T void issue_turn_pass(int cw) { asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + (cw + 1) % NWG) : "memory"); }
/* Named barrier 1 + NWG + cw: the 128 threads of consumer warpgroup cw alone. */
template <int NWG> FS_DEV_T void warpgroup_sync(int cw) { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + NWG + cw) : "memory"); }

/* P (fp32, accumulator layout) to the A fragments of P V: pk[n][r] holds columns 8n + 2 t4, + 1 of row g + 8r. */
template <int NS, typename T> FS_DEV_T void sm90_pack_p(const float (&s)[NS * 4], uint32_t (&pk)[NS][2])
{
#pragma unroll
    for (int n = 0; n < NS; n++) {
        pk[n][0] = pack2<T>(s[4 * n], s[4 * n + 1]);
        pk[n][1] = pack2<T>(s[4 * n + 2], s[4 * n + 3]);
    }
}
#endif

template <int D, int BC, int NWG, typename T, bool FEAT, bool KPM, bool T5>
__global__ void __launch_bounds__((NWG + 1) * 128, 1)
attention_fwd_sm90(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                   const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_o, const fs_sm90_args a)
{
#ifdef FS_WGMMA
    using tile = fs_sm90_tile<D, BC, NWG>;
    /* setmaxnreg moves registers within the block's launch allocation: its threads times the per-thread count, at most
     * 64 Ki / threads rounded down to 8 (168 at 384 threads). A consumer's .inc past it never returns */
    constexpr int THREADS = (NWG + 1) * 128;
    static_assert(128 * 24 + 128 * NWG * tile::REGS <= THREADS * (65536 / THREADS / 8 * 8),
                  "setmaxnreg: the warpgroups' registers fit the block's allocation");
    constexpr int STAGES = tile::STAGES;
    constexpr int BR = 64 * NWG, NS = BC / 8, NO = D / 8, HALVES = D / 64, ARRIVALS = 4 * NWG;
    /* D = 128: the consumers hold Q_i in registers for the item (S = Q K^T then reads only K from shared memory) */
    constexpr bool Q_REGS = D == 128 && !FEAT;
    /* the T5 bias: FEAT kernels add it where p.t5_table is set, T5 ones (the plain kernel and the bias) always */
    constexpr int BIAS = T5 ? SM90_T5_ALWAYS : FEAT ? SM90_T5_IF_SET : SM90_NO_T5;
    extern __shared__ unsigned char smem_raw[];
    /* TMA's 128-byte swizzle and the wgmma descriptors address 1024-byte atoms: align the base (through redux.sync,
     * a uniform register: otherwise ptxas keeps it in an ordinary one and moves it over (R2UR) in the main loop) */
    T *sQ = reinterpret_cast<T *>(smem_raw + __reduce_max_sync(0xffffffffu, (1024 - (smem_addr(smem_raw) & 1023)) & 1023));
    T *sK = sQ + BR * D, *sV = sK + STAGES * BC * D; /* stage s at s BC D; 64-column halves BC rows apart */
    T *sO = sV + STAGES * BC * D; /* 64 x D per consumer warpgroup */
    /* FEAT, T5: two tables of FS_SM90_T5_STRIDE, the one of the item whose Q tile loads in phase q_phase at q_phase */
    float *s_t5 = reinterpret_cast<float *>(sO + BR * D);
    uint64_t *q_full = reinterpret_cast<uint64_t *>(s_t5 + (BIAS ? 2 * FS_SM90_T5_STRIDE : 0)), *q_empty = q_full + 1;
    uint64_t *k_full = q_empty + 1, *k_empty = k_full + STAGES, *v_full = k_empty + STAGES, *v_empty = v_full + STAGES;
    /* the current work item: written by the producer thread, which then arrives on item_full; every consumer thread
     * arrives on item_read once it has read it (an arrive orders the arriving thread's own accesses only) */
    uint64_t *item_full = v_empty + STAGES, *item_read = item_full + 1;
    sm90_work *s_work = reinterpret_cast<sm90_work *>(item_read + 1);
    int4 *s_ostore = reinterpret_cast<int4 *>(reinterpret_cast<unsigned char *>(s_work) + FS_SM90_WORK_BYTES); /* per
                                               * consumer warpgroup: its staging tile's store coordinates (row, h, b) */
    const fs_attn_params &p = a.p;
    const bool t5_on = BIAS == SM90_T5_ALWAYS || (BIAS == SM90_T5_IF_SET && p.t5_table);
    const int wg = threadIdx.x >> 7;
#ifdef FS_SM90_TRACE
    int trace_n = 0;
    if (threadIdx.x == 0) fs_sm90_trace[blockIdx.x][0][0][0] = trace_now();
#endif
    if (threadIdx.x == 0) {
        mbar_init(q_full, 1);
        mbar_init(q_empty, ARRIVALS); /* lane 0 of each consumer warp */
        mbar_init(item_full, 1);
        mbar_init(item_read, 128 * NWG);
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&k_full[s], 1);
            mbar_init(&k_empty[s], ARRIVALS);
            mbar_init(&v_full[s], 1);
            mbar_init(&v_empty[s], ARRIVALS);
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) { /* producer: one thread claims the items and issues every TMA load */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (threadIdx.x == 0) {
            int s = 0, phase = 0, q_phase = 0, item_phase = 0;
            /* rows row0.. of (b, h) into a tile of `rows` rows once `empty` has completed the phase of the given
             * parity, completing on `full`: one box per 64-column half */
            auto load = [&](T *tile, const CUtensorMap *map, int rows, int row0, int b, int h, uint64_t *full,
                            uint64_t *empty, int parity) {
                mbar_wait(empty, parity);
                mbar_expect_tx(full, rows * D * 2);
                for (int c = 0; c < HALVES; c++) tma_load_4d(tile + c * rows * 64, map, c * 64, row0, h, b, full);
            };
            /* the block's first item is blockIdx.x, the next ones the following by stride or (claims) the next
             * unclaimed ones: causal items come heaviest first, so claiming on demand is longest-first list scheduling
             * (static stride: up to 6% above the mean load) */
            auto next = [&](int t) { return a.claims ? (int)gridDim.x + atomicAdd(a.claims, 1) : t + (int)gridDim.x; };
            /* item t, or the first one from t on that is not past its packed sequence (n_kv = -1: past the last) */
            auto claim = [&](int &t) {
                for (;; t = next(t)) {
                    sm90_work w = sm90_work{};
                    w.n_kv = -1;
                    if (t < a.items) {
                        w = sm90_item<FEAT, KPM>(a, t, BR, BC);
                        if (FEAT && w.skip) continue;
                    }
                    return w;
                }
            };
            /* w into the slot once the consumers have read the last item, then its Q once the consumers are done with
             * the last item's (its last Q K^T; at D = 128 once it is in their registers) */
            auto hand_over = [&](const sm90_work &w) {
                mbar_wait(item_read, item_phase ^ 1);
                *s_work = w;
                mbar_arrive(item_full);
                item_phase ^= 1;
                if (w.n_kv <= 0) return; /* the end, or no key to read (O = 0): nothing to load */
                if (t5_on) { /* the head's T5 table lands with Q: the consumers were done with the one in
                                           * its slot, two Q tiles back, when they released the last Q tile; its bytes
                                           * are added before the Q load's arrival can complete the phase */
                    mbar_wait(q_empty, q_phase ^ 1);
                    mbar_add_tx(q_full, a.t5_row * 4);
                    bulk_load(s_t5 + q_phase * FS_SM90_T5_STRIDE, a.t5_rows + (int64_t)w.h * a.t5_row, a.t5_row * 4, q_full);
                }
                load(sQ, &map_q, BR, (int)w.seq.qo + w.q0, w.tb, w.h, q_full, q_empty, q_phase ^ 1);
                q_phase ^= 1;
            };
            /* tile j of an item's K/V (KPM: listed tile j), K/V head hkv */
            auto load_kv = [&](const sm90_work &w, int hkv, int j) {
                const int k0 = (int)w.seq.ko + (KPM ? (int)a.kpm_list[(w.b * a.kpm_tiles + j) * 4].y : j * BC);
                load(sK + s * BC * D, &map_k, BC, k0, w.tb, hkv, &k_full[s], &k_empty[s], phase ^ 1);
                load(sV + s * BC * D, &map_v, BC, k0, w.tb, hkv, &v_full[s], &v_empty[s], phase ^ 1);
                if (++s == STAGES) { s = 0; phase ^= 1; }
            };
            int t = blockIdx.x;
            if constexpr (Q_REGS) {
                /* Q's tile is free from the start of an item: the next item is handed over, and its Q loaded, once this
                 * item's tile `ahead` is loaded. Stride: a whole item ahead, after tile STAGES - 1, whose load waited
                 * for the last item's last V to empty (the consumers are taking this item by then, and the hand-over
                 * holds back no load they wait for). Claims: after the last tile, as below, so that an item goes to
                 * the block free soonest. Claimed a whole item ahead, causal S = 2048-8192 ran 2-4% slower (traced: the
                 * blocks ended 40 us apart, against 20); 2 tiles before the last, as slow (the steps there 7% longer,
                 * likely the claim's atomic holding back the next loads) */
                sm90_work w = sm90_work{}; /* the item whose tiles load (none ahead of the first); one hand-over site:
                                            * with it inside the tile loop the producer took 261 more instructions */
                for (bool first = true;; first = false) {
                    const int hkv = w.h / p.kv_group, ahead = a.claims ? w.n_kv - 1 : min(STAGES - 1, w.n_kv - 1);
                    int j = 0;
                    for (; j <= ahead; j++) load_kv(w, hkv, j);
                    if (!first) t = next(t);
                    hand_over(claim(t));
                    for (; j < w.n_kv; j++) load_kv(w, hkv, j);
                    w = *s_work; /* the item handed over */
                    if (w.n_kv < 0) break;
                }
            } else { /* the next item once this one's tiles are loaded, when the consumers are about done with Q (claim's
                      * body written out: calling claim here made the FEAT producers spill 20 bytes) */
                for (;; t = next(t)) {
                    sm90_work w = sm90_work{};
                    w.n_kv = -1;
                    if (t < a.items) {
                        w = sm90_item<FEAT, KPM>(a, t, BR, BC);
                        if (FEAT && w.skip) continue; /* past its packed sequence: not handed over */
                    }
                    hand_over(w);
                    if (w.n_kv < 0) break;
                    const int hkv = w.h / p.kv_group;
                    for (int j = 0; j < w.n_kv; j++) load_kv(w, hkv, j);
                }
            }
            if (a.claims) { /* the last block done leaves the counters at zero for the next launch */
                __threadfence();
                if (atomicAdd(a.claims + 1, 1) == (int)gridDim.x - 1) {
                    a.claims[0] = 0;
                    a.claims[1] = 0;
                }
            }
        }
    } else { /* consumers */
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"((int)tile::REGS));
        /* D = 64: wg through redux.sync lands in a uniform register, and with it the Q descriptors of S = Q K^T (no
         * R2UR next to the wgmmas: 2.5-3% faster); D = 128 measured 1-2% slower that way */
        const int cw = (D == 64 ? (int)__reduce_max_sync(0xffffffffu, (unsigned)wg) : wg) - 1;
        const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
        if (cw == NWG - 1) issue_turn_pass<NWG>(cw); /* the first warpgroup issues first */
        const uint32_t q_addr = smem_addr(sQ) + cw * 64 * 128, k_base = smem_addr(sK), v_base = smem_addr(sV);
        int s = 0, phase = 0, q_phase = 0, item_phase = 0;
        /* Q_REGS: Q_i as A fragments (qf[kk]: k-step kk, the P layout of issue_pv) */
        uint32_t qf[Q_REGS ? D / 16 : 1][4];
        /* the fragments from the landed Q tile, one ldmatrix.x4 per k-step: matrix i = lane / 8 holds rows 8 (i & 1) ..
         * + 7 of the warp's 16 and 16-byte chunk 2 (kk % 4) + i / 2 of 64-column half kk / 4, at chunk ^ (row % 8) */
        auto load_q = [&]() {
            const uint32_t row = warp * 16 + 8 * ((lane >> 3) & 1) + (lane & 7), hi = lane >> 4;
#pragma unroll
            for (int kk = 0; kk < (Q_REGS ? D / 16 : 0); kk++)
                ldmatrix_x4(q_addr + (kk >> 2) * BR * 128 + row * 128 + (((2 * (kk & 3) + hi) ^ (lane & 7)) << 4), qf[kk]);
        };
        /* S = Q_i K^T on stage s (landed): D/16 k-steps, each 32 bytes further along a 128-byte row (next half at kk = 4);
         * biased (uniform over the warpgroup): S = sc + Q_i K^T, on the T5 bias sc holds (sm90_t5_init) */
        auto issue_s = [&](float (&sc)[NS * 4], bool biased) {
            const uint64_t dk0 = desc_sw128(k_base + s * BC * D * 2, 16, 1024); /* + offset >> 4: the address field
                                                                                  * holds addr >> 4, below 2^14 */
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                const uint64_t dk = dk0 + (((kk >> 2) * BC * 128 + 32 * (kk & 3)) >> 4);
                if constexpr (Q_REGS) wgmma_rs_kmajor<BC, T>(sc, qf[kk], dk, kk > 0 || biased);
                else wgmma_ss<BC, T>(sc, desc_sw128(q_addr + (kk >> 2) * BR * 128 + 32 * (kk & 3), 16, 1024), dk, kk > 0 || biased);
            }
            wgmma_commit();
        };
        /* O_i += P V on stage sv (landed): Bc/16 k-steps of 16 V rows (2 KiB) each */
        auto issue_pv = [&](float (&o)[NO * 4], const uint32_t (&pk)[NS][2], int sv) {
            const uint64_t dv0 = desc_sw128(v_base + sv * BC * D * 2, BC * 128, 1024);
#pragma unroll
            for (int kk = 0; kk < BC / 16; kk++) {
                const uint32_t af[4] = {pk[2 * kk][0], pk[2 * kk][1], pk[2 * kk + 1][0], pk[2 * kk + 1][1]};
                wgmma_rs<D, T>(o, af, dv0 + kk * 16 * 128 / 16);
            }
            wgmma_commit();
        };
        /* 1 / l_i per row (l summed over the four lanes of a row) and lse = (m_i + log2 l_i) ln 2, once the last
         * softmax is done (the main loop: while the last P V runs); FEAT: rows past a padded sequence's length get
         * 1 / l = 0 (zeros) and lse -inf, those past a packed one's no lse */
        auto row_scale = [&](const sm90_work &w, int row0, const float (&m_i)[2], const float (&l_i)[2], float (&inv)[2]) {
            const bool packed = FEAT && p.cu_seqlens_q;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float l = l_i[r];
                l += __shfl_xor_sync(0xffffffff, l, 1);
                l += __shfl_xor_sync(0xffffffff, l, 2);
                const int row = row0 + 8 * r;
                if (FEAT && row >= w.seq.q_len) l = 0.f;
                inv[r] = l > 0.f ? rcp_newton(l) : 0.f; /* l >= 1 where a key counts: its row max weighs 1 */
                if (p.lse && t4 == 0 && row < (packed ? w.seq.q_len : p.Sq))
                    static_cast<float *>(p.lse)[w.b * p.lse_sb + w.h * p.lse_sh + w.seq.qo + row] =
                        l > 0.f ? (m_i[r] + __log2f(l)) * 0.69314718055994531f : -INFINITY;
            }
        };
        /* O leaves through the warpgroup's staging tile (64 rows, boxes of 64 columns, 128-byte swizzle: 16-byte chunk k
         * of row r at k ^ (r % 8), and r % 8 = g), stored by TMA, which drops rows past Sq (H200: 8-19% of the time at
         * D = 128, S = 1024 went to the direct 4-byte stores this replaced). The warpgroup's first thread issues the store
         * after the next barrier that every thread of the warpgroup passes (o_pending; store_o): on the main path the
         * next item's S_0 issue turn, so that no warpgroup barrier and no store issue lie between an item's last P V and
         * the next item's S_0 (benchmarks/trace_sm90.cu: about 330 of the 2700 cycles an item boundary took). On the
         * main path the tile is free by the time O is written: the first thread waits for the last store to have read
         * it ahead of the last P V's issue turn (in_turn); elsewhere finish waits itself. */
        bool o_pending = false;
        auto store_o = [&]() {
            if (o_pending && (threadIdx.x & 127) == 0) {
                const int4 c = s_ostore[cw];
                for (int h = 0; h < HALVES; h++) tma_store_4d(&map_o, sO + cw * 64 * D + h * 64 * 64, h * 64, c.x, c.y, c.z);
                bulk_commit();
            }
            o_pending = false;
        };
        /* the same where no barrier of the warpgroup came since the tile was written: one of its own first */
        auto store_o_synced = [&]() {
            if (o_pending) {
                warpgroup_sync<NWG>(cw);
                store_o();
            }
        };
        /* O_i / l_i out (inv: row_scale); FEAT: rows past a packed sequence's length are not written */
        auto finish = [&](const sm90_work &w, int row0, const float (&o)[NO * 4], const float (&inv)[2], bool in_turn) {
            const bool packed = FEAT && p.cu_seqlens_q;
            if (!packed || __reduce_max_sync(0xffffffffu, (unsigned)(w.q0 + cw * 64 + 64 <= w.seq.q_len))) {
                unsigned char *tile = reinterpret_cast<unsigned char *>(sO + cw * 64 * D);
                if (!in_turn) {
                    store_o_synced();
                    if ((threadIdx.x & 127) == 0) bulk_wait_read();
                    warpgroup_sync<NWG>(cw);
                }
                /* column groups n, n + 1 by one stmatrix: matrix i = lane / 8 holds rows 8 (i & 1) .. + 7 of the warp's 16
                 * and 16-byte chunk n % 8 + i / 2 of 64-column half n / 8 */
                const uint32_t row_addr = smem_addr(tile) + (warp * 16 + 8 * ((lane >> 3) & 1) + (lane & 7)) * 128;
#pragma unroll
                for (int n = 0; n < NO; n += 2)
                    stmatrix_x4(row_addr + (n / 8) * 8192 + (((n % 8 + (lane >> 4)) ^ (lane & 7)) << 4),
                                pack2<T>(o[4 * n] * inv[0], o[4 * n + 1] * inv[0]), pack2<T>(o[4 * n + 2] * inv[1], o[4 * n + 3] * inv[1]),
                                pack2<T>(o[4 * n + 4] * inv[0], o[4 * n + 5] * inv[0]), pack2<T>(o[4 * n + 6] * inv[1], o[4 * n + 7] * inv[1]));
                fence_proxy_async();
                if ((threadIdx.x & 127) == 0) s_ostore[cw] = make_int4((int)w.seq.qo + w.q0 + cw * 64, w.h, w.tb, 0);
                o_pending = true;
            } else { /* the last rows of a packed sequence: a TMA box would run into the next one's */
                T *gO = static_cast<T *>(p.o) + w.h * p.o_sh + w.seq.qo * p.o_ss;
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int row = row0 + 8 * r;
                    if (row >= w.seq.q_len) continue;
#pragma unroll
                    for (int n = 0; n < NO; n++)
                        *reinterpret_cast<uint32_t *>(gO + (int64_t)row * p.o_ss + n * 8 + 2 * t4) =
                            pack2<T>(o[4 * n + 2 * r] * inv[r], o[4 * n + 2 * r + 1] * inv[r]);
                }
            }
        };
        /* A warpgroup whose 64 rows all lie past the sequence (the last query tile of a head when 64 NWG does not
         * divide Sq) issues no GEMM but keeps every barrier of the item, in the main loop's order: it waits for each
         * stage to land before releasing it (an early arrival would count toward the stage's previous use) and passes
         * its issue turns on, so the other warpgroups' GEMMs follow each other without its share of tensor time */
        auto idle_item = [&](int n_kv) {
            mbar_wait(q_full, q_phase);
            q_phase ^= 1;
            int sv = s, phase_v = phase;
            for (int j = 0; j <= n_kv; j++) {
                if (j > 0) mbar_wait(&v_full[sv], phase_v);
                if (j < n_kv) mbar_wait(&k_full[s], phase);
                issue_turn_wait(cw);
                if (j == 0) store_o();
                issue_turn_pass<NWG>(cw);
                if (lane == 0) {
                    if (j < n_kv) mbar_arrive(&k_empty[s]);
                    if (j == (Q_REGS ? 0 : n_kv - 1)) mbar_arrive(q_empty); /* as the main path releases Q */
                    if (j > 0) mbar_arrive(&v_empty[sv]);
                }
                if (j < n_kv) {
                    sv = s;
                    phase_v = phase;
                    if (++s == STAGES) { s = 0; phase ^= 1; }
                }
            }
        };
        for (;;) {
            /* the item from the producer. n_kv comes from shared memory: redux.sync lands it in a uniform register,
             * and an item with no key to visit leaves through its own branch (O = 0, l = 0) rather than the main
             * loop sitting in a conditional: with both, ptxas keeps the ring's stage and phase and the wgmma
             * descriptors built from them in the uniform datapath instead of 4-5 R2UR moves per wgmma */
            mbar_wait(item_full, item_phase);
            item_phase ^= 1;
            const sm90_work w = *s_work;
            mbar_arrive(item_read);
            const int n_kv = __reduce_max_sync(0xffffffffu, w.n_kv), k_len = w.seq.k_len;
#ifdef FS_SM90_TRACE
            const unsigned long long trace_t0 = trace_now();
            FS_TRACE_CLOCK(FS_TR_C_READ);
            if (n_kv < 0 && threadIdx.x == 128) fs_sm90_trace[blockIdx.x][0][0][1] = trace_t0;
#endif
            if (n_kv < 0) break;
            const int row0 = w.q0 + cw * 64 + warp * 16 + g; /* this thread's rows in its sequence: row0, row0 + 8 */
            float o[NO * 4], m_i[2] = {-INFINITY, -INFINITY}, l_i[2] = {0.f, 0.f}, alpha[2];
#pragma unroll
            for (int i = 0; i < NO * 4; i++) o[i] = 0.f;
            float inv[2];
            if (FEAT && n_kv == 0) {
                row_scale(w, row0, m_i, l_i, inv);
                finish(w, row0, o, inv, false);
                continue;
            }
            if (__reduce_max_sync(0xffffffffu, (unsigned)(w.q0 + cw * 64 >= w.seq.q_len))) {
                idle_item(n_kv);
                if (FEAT) { /* zeros for a padded sequence's rows */
                    row_scale(w, row0, m_i, l_i, inv);
                    finish(w, row0, o, inv, false);
                }
                continue;
            }
            /* this head's T5 bias by relative position (FEAT: log2 units; T5: bias / scale), end entries repeated; it
             * lands with Q (built here by each warpgroup instead, the table took 9% of ProtT5's time at S = 512) */
            const float *t5 = t5_on ? s_t5 + q_phase * FS_SM90_T5_STRIDE + FS_SM90_T5_PAD + a.t5_lneg : nullptr;
            /* T5: the bias of the tile at key k0 into sc ahead of its Q K^T (returns true), or its one entry as the
             * softmax's shift (add, log2 units: t5_ends, the table's end entries, loaded once Q has landed); rw0 uniform,
             * so that the choice is the warpgroup's */
            const int rw0 = BIAS == SM90_T5_ALWAYS ? (int)__reduce_max_sync(0xffffffffu, (unsigned)(w.q0 + cw * 64)) : 0;
            float t5_ends[2] = {0.f, 0.f};
            auto t5_init = [&](float (&sc)[NS * 4], int k0, float &add) {
                add = 0.f;
                return BIAS == SM90_T5_ALWAYS && sm90_t5_init<NS>(sc, t5, a.t5_lneg, a.t5_n, k0, rw0, row0, t4, t5_ends, add);
            };
            { /* the item's K/V tiles */
                uint32_t pk[NS][2];
                mbar_wait(q_full, q_phase);
                q_phase ^= 1;
                load_q();
                if (BIAS == SM90_T5_ALWAYS)
                    for (int e = 0; e < 2; e++) t5_ends[e] = t5[e ? a.t5_n - 1 - a.t5_lneg : -a.t5_lneg] * a.scale_log2;
                if constexpr (Q_REGS) { /* Q is in registers: its tile may take the next item's */
                    __syncwarp();
                    if (lane == 0) mbar_arrive(q_empty);
                }
                FS_TRACE_CLOCK(FS_TR_C_QREGS);

                float sc[NS * 4]; /* S_j, then P_j: one array for the item's tiles (an array per tile: 24 more
                                   * instructions in the plain D = 128 consumers) */
                /* tile 0: S_0, its softmax (O is still zero) */
                {
                    const uint2 kt = KPM ? __ldg(a.kpm_list + (w.b * a.kpm_tiles) * 4 + t4) : make_uint2(0, 0);
                    float t5_add;
                    const bool biased = t5_init(sc, 0, t5_add);
                    mbar_wait(&k_full[s], phase);
                    FS_TRACE_CLOCK(FS_TR_C_K0);
                    issue_turn_wait(cw);
                    FS_TRACE_CLOCK(FS_TR_C_S0_TURN);
                    wgmma_fence();
                    issue_s(sc, biased);
                    issue_turn_pass<NWG>(cw);
                    store_o(); /* the last item's O, under S_0 */
                    wgmma_wait<0>();
                    FS_TRACE_CLOCK(FS_TR_C_S0_DONE);
                    if (lane == 0) {
                        mbar_arrive(&k_empty[s]);
                        if (!Q_REGS && n_kv == 1) mbar_arrive(q_empty); /* the item's last Q K^T is done: Q may be refilled */
                    }
                    sm90_softmax<NS, BIAS, KPM>(sc, p, KPM ? (int)kt.y : 0, k_len, row0, t4, a.scale_log2, t5, a.t5_lneg, a.t5_n,
                                                t5_add, kt.x, m_i, l_i, alpha);
                    sm90_pack_p<NS, T>(sc, pk);
                }
                int sv = s, phase_v = phase; /* the stage whose V the pending P V reads */
                if (++s == STAGES) { s = 0; phase ^= 1; }
                /* tile j: S_j and P_{j-1} V_{j-1} issued together; the softmax of S_j, then O rescaled once P V landed
                 * (ptxas puts that wait ahead of the softmax: see the header) */
                for (int j = 1; j < n_kv; j++) {
                    const uint2 kt = KPM ? __ldg(a.kpm_list + (w.b * a.kpm_tiles + j) * 4 + t4) : make_uint2(0, 0);
                    float t5_add;
                    const bool biased = t5_init(sc, j * BC, t5_add); /* sc: P_{j-1} is packed in pk */
                    mbar_wait(&v_full[sv], phase_v); /* loaded before K_j */
                    mbar_wait(&k_full[s], phase);
                    issue_turn_wait(cw);
                    if (j == 1) FS_TRACE_CLOCK(FS_TR_C_LOOP_TURN);
                    wgmma_fence();
                    issue_s(sc, biased);
                    issue_pv(o, pk, sv);
                    issue_turn_pass<NWG>(cw);
                    wgmma_wait<1>(); /* S_j landed */
                    if (lane == 0) {
                        mbar_arrive(&k_empty[s]);
                        if (!Q_REGS && j == n_kv - 1) mbar_arrive(q_empty);
                    }
                    sm90_softmax<NS, BIAS, KPM>(sc, p, KPM ? (int)kt.y : j * BC, k_len, row0, t4, a.scale_log2, t5, a.t5_lneg,
                                                a.t5_n, t5_add, kt.x, m_i, l_i, alpha);
                    wgmma_wait<0>(); /* P_{j-1} V_{j-1} landed */
                    if (lane == 0) mbar_arrive(&v_empty[sv]);
#pragma unroll
                    for (int n = 0; n < NO; n++) {
                        o[4 * n] *= alpha[0];
                        o[4 * n + 1] *= alpha[0];
                        o[4 * n + 2] *= alpha[1];
                        o[4 * n + 3] *= alpha[1];
                    }
                    sm90_pack_p<NS, T>(sc, pk);
                    sv = s;
                    phase_v = phase;
                    if (++s == STAGES) { s = 0; phase ^= 1; }
                }
                mbar_wait(&v_full[sv], phase_v);
                if ((threadIdx.x & 127) == 0) bulk_wait_read(); /* the staging tile free for finish: see store_o */
                issue_turn_wait(cw);
                FS_TRACE_CLOCK(FS_TR_C_LAST_TURN);
                wgmma_fence();
                issue_pv(o, pk, sv);
                issue_turn_pass<NWG>(cw);
                row_scale(w, row0, m_i, l_i, inv);
                wgmma_wait<0>();
                FS_TRACE_CLOCK(FS_TR_C_LAST_DONE);
                if (lane == 0) mbar_arrive(&v_empty[sv]);
            }

            finish(w, row0, o, inv, true);
#ifdef FS_SM90_TRACE
            FS_TRACE_CLOCK(FS_TR_C_END);
            if ((threadIdx.x & 127) == 0 && cw < 2 && trace_n < FS_TRACE_ITEMS) {
                unsigned long long *r = fs_sm90_trace[blockIdx.x][1 + trace_n][cw];
                r[FS_TR_READ] = trace_t0;
                r[FS_TR_END] = trace_now();
                r[FS_TR_ID] = (unsigned long long)(w.b * p.H + w.h) << 32 | (unsigned)w.q0;
                r[FS_TR_NKV] = n_kv;
            }
            trace_n++;
#endif
        }
        store_o_synced(); /* the last item's O */
        if ((threadIdx.x & 127) == 0) bulk_wait(); /* the last stores done before the block exits */
#ifdef FS_SM90_TRACE
        if (threadIdx.x == 128) fs_sm90_trace[blockIdx.x][0][0][2] = trace_now();
#endif
    }
#endif
}

/* Each head's T5 table as the attention kernel reads it from shared memory (sm90_softmax, sm90_t5_init), into out (row
 * floats per head): entry i is the bias times mul (FEAT: log2 e; T5: 1 / scale) of relative position
 * clamp(i - FS_SM90_T5_PAD, 0, t5_n - 1) - t5_lneg. One block per head, launched ahead of the attention kernel, whose
 * producer copies a row per work item. */
__global__ void sm90_t5_expand(const fs_attn_params p, int t5_lneg, int t5_n, int row, float mul, float *out)
{
    const int h = blockIdx.x;
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        const int pos = min(max(i - FS_SM90_T5_PAD, 0), t5_n - 1);
        const int bucket = fs_t5_bucket(pos - t5_lneg, p.t5_buckets, p.t5_max_distance, p.t5_bidirectional);
        out[(int64_t)h * row + i] = load_float(p.t5_table, h * p.t5_sh + bucket * p.t5_sn, p.t5_dtype) * mul;
    }
}

#define FS_KPM_THREADS 256 /* sm90_kpm_prepare's block */

/* The keys the tile of BC keys from key f + t BC drops, bit 2 n + c for column 8 n + 2 t4 + c; any: it keeps one. */
template <int BC>
FS_DEV uint32_t sm90_kpm_word(const fs_attn_params &p, const uint8_t *row, int f, int t, int tiles, int t4, bool &any)
{
    uint32_t word = 0;
    any = false;
#pragma unroll
    for (int bit = 0; bit < BC / 4; bit++) {
        const int col = f + t * BC + 8 * (bit >> 1) + 2 * t4 + (bit & 1);
        const bool in = t < tiles && col < p.Sk, keep = in && row[(int64_t)col * p.kpm_sk];
        any |= keep;
        if (in && !keep) word |= 1u << bit;
    }
    return word;
}

/* Each batch's key padding mask as the attention kernel reads it (sm90_item, the producer, sm90_softmax), one block
 * of FS_KPM_THREADS threads per batch b, launched ahead of it. b's key tiles (BC keys) start at its first kept key f
 * (Sk if none), so that padding before it costs no tile, and those that keep a key form b's list, in order:
 * count[b (tiles + 2)] = f, count[b (tiles + 2) + 1 + t] = the list's tiles before tile t (t = tiles: all of them);
 * list[(b tiles + i) 4 + t4] = {the keys of entry i's tile the mask drops, bit 2 n + c for column 8 n + 2 t4 + c
 * (lane t4 of a row's quad), the tile's first key}. A thread takes one (tile, t4) word of each chunk of
 * FS_KPM_THREADS / 4 tiles. */
template <int BC>
__global__ void sm90_kpm_prepare(const fs_attn_params p, int tiles, int *count, uint2 *list)
{
    __shared__ int warp_kept[FS_KPM_THREADS / 32], base, first;
    const uint8_t *row = p.kpm + blockIdx.x * p.kpm_sb;
    int *cnt = count + blockIdx.x * (tiles + 2);
    uint2 *out = list + (int64_t)blockIdx.x * tiles * 4;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t4 = lane & 3;
    if (threadIdx.x == 0) {
        base = 0;
        first = p.Sk;
    }
    __syncthreads();
    /* the first chunk's word for f = 0 (key 0 kept: right padding, no padding), loaded while f is found */
    bool any0;
    const uint32_t word0 = sm90_kpm_word<BC>(p, row, 0, threadIdx.x / 4, tiles, t4, any0);
    /* f: each thread's first kept key among keys j = threadIdx.x mod FS_KPM_THREADS, eight loads in flight at a time */
    for (int j0 = threadIdx.x; j0 < p.Sk; j0 += 8 * FS_KPM_THREADS) {
        bool keep[8];
#pragma unroll
        for (int u = 0; u < 8; u++) keep[u] = j0 + u * FS_KPM_THREADS < p.Sk && row[(int64_t)(j0 + u * FS_KPM_THREADS) * p.kpm_sk];
        int f = p.Sk;
#pragma unroll
        for (int u = 7; u >= 0; u--)
            if (keep[u]) f = j0 + u * FS_KPM_THREADS;
        if (f < p.Sk) {
            atomicMin(&first, f);
            break;
        }
    }
    __syncthreads();
    const int f = first;
    for (int i0 = 0; i0 < tiles * 4; i0 += FS_KPM_THREADS) {
        const int t = (i0 + (int)threadIdx.x) / 4;
        bool any = any0;
        const uint32_t word = i0 == 0 && f == 0 ? word0 : sm90_kpm_word<BC>(p, row, f, t, tiles, t4, any);
        /* the tile is kept if any of its quad's lanes keeps a key; its list entry follows the kept tiles before it */
        const bool kept = (__ballot_sync(0xffffffffu, any) >> (lane & ~3)) & 15u;
        const unsigned firsts = __ballot_sync(0xffffffffu, kept && t4 == 0);
        __syncthreads(); /* base as the last chunk left it, warp_kept read */
        if (lane == 0) warp_kept[warp] = __popc(firsts);
        __syncthreads();
        int pos = base + __popc(firsts & ((1u << (lane & ~3)) - 1));
        for (int w = 0; w < warp; w++) pos += warp_kept[w];
        if (t < tiles) {
            if (t4 == 0) cnt[1 + t] = pos;
            if (kept) out[pos * 4 + t4] = make_uint2(word, (unsigned)(f + t * BC));
        }
        __syncthreads(); /* every thread has read base */
        if (threadIdx.x == FS_KPM_THREADS - 1) base = pos + kept;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        cnt[0] = f;
        cnt[1 + tiles] = base;
    }
}

/* A 4-D tensor map over one of q, k, v as (D, S, H, B) read in boxes of 64 columns x rows; a size-1 dim gets
 * a nominal stride (TMA wants every stride a nonzero multiple of 16 bytes). */
static cudaError_t sm90_map(CUtensorMap *map, const void *base, int bf16, int S, int H, int B, int D, int64_t ss,
                            int64_t sh, int64_t sb, int rows)
{
    const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)S, (cuuint64_t)H, (cuuint64_t)B};
    cuuint64_t strides[3] = {(cuuint64_t)ss * 2, (cuuint64_t)sh * 2, (cuuint64_t)sb * 2};
    cuuint64_t extent = (cuuint64_t)D * 2;
    for (int i = 0; i < 3; i++) {
        if (dims[i + 1] == 1) strides[i] = extent;
        extent = strides[i] * dims[i + 1];
    }
    const cuuint32_t box[4] = {64, (cuuint32_t)rows, 1, 1};
    return fs_make_tensor_map(map, base, bf16, 4, dims, strides, box);
}

/* The rows and batches TMA addresses q / o (query side) or k / v with: the padded batch, or all packed rows as
 * one batch. */
static void sm90_extent(const fs_attn_params *p, int query_side, int *S, int *B)
{
    *S = p->cu_seqlens_q ? (int)(query_side ? p->total_q : p->total_k) : query_side ? p->Sq : p->Sk;
    *B = p->cu_seqlens_q ? 1 : p->B;
}

/* Whether blocks claim their items as they go (a.claims) rather than by stride: where items differ in cost,
 * causal ones (1 to Sk / Bc key tiles; by stride the busiest block gets 3-6% above the mean on the causal sweep),
 * packed sequences of mixed lengths and padding masks, and heads whose last query tile leaves warpgroups idle (Br
 * not dividing Sq; at NWG = 3 each block of a stride takes the same query tile of every head it visits: S = 1024
 * with Br = 192, 8-12% faster claimed). */
static int sm90_claims(const fs_attn_params *p, int br)
{
    return p->causal || p->cu_seqlens_q || p->kpm || p->Sq % br;
}

/* Heads per section of the causal item order, and at most the late heads of v6.7: as many as have their K and V in
 * 24 MiB, about half the L2 of an H100 or H200. Heaviest-first over all heads at once (v5.3) streamed every head's K/V
 * from memory for each of its query tiles: 16 x 16 x 1024 x 128 took 260 us on the H100 against cuDNN's 190. */
static int sm90_section(const fs_attn_params *p)
{
    const long long fit = (24LL << 20) / (4LL * p->Sk * p->D), heads = (long long)p->B * p->H;
    return fit < 1 ? 1 : fit < heads ? (int)fit : (int)heads;
}

/* Launch one tile shape on a persistent grid (one block per SM, at most one per work item), or only describe it.
 * FEAT: the kernel with packed sequences, seqlens and the T5 bias; KPM: with a key padding mask too; T5: the plain
 * kernel with the T5 bias. */
template <int D, int BC, int NWG, typename T, bool FEAT, bool KPM = false, bool T5 = false>
static cudaError_t launch(const fs_attn_params *p, int device, int sm_count, cudaStream_t stream, fs_sm80_plan *plan)
{
    constexpr int BR = 64 * NWG, THREADS = 128 * (NWG + 1), SMEM = sm90_smem<D, BC, NWG, FEAT || T5>();
    static fs_kernel handle;
    const void *kernel = (const void *)attention_fwd_sm90<D, BC, NWG, T, FEAT, KPM, T5>;
    fs_sm90_args a;
    a.p = *p;
    a.scale_log2 = (float)(p->scale * 1.4426950408889634);
    a.n_qtiles = (p->Sq + BR - 1) / BR;
    a.section = sm90_section(p);
    a.t5_lneg = a.t5_n = a.t5_row = 0;
    a.t5_rows = NULL;
    if (p->t5_table) { /* t5_n <= FS_SM90_T5_MAX: fs_attention_sm90_covers */
        fs_t5_span(p, &a.t5_lneg, &a.t5_n);
        a.t5_row = (a.t5_n + 2 * FS_SM90_T5_PAD + 3) / 4 * 4;
    }
    const long long items = (long long)p->B * p->H * a.n_qtiles;
    if (items > 0x7fffffffLL - 2LL * sm_count) return cudaErrorInvalidConfiguration; /* claims count to items + grid */
    a.items = (int)items;
    a.claims = NULL;
    const int grid = items < sm_count ? (int)items : sm_count;
    /* light last tiles (idle warpgroups) of the last grid / 3 heads at the end of the order, where their 8 us fill the
     * blocks that end early (ESM-C: 0.63 of a full tile's time; the blocks ended 7 us apart, benchmarks/trace_sm90.cu);
     * at most the heads whose K/V stay in L2 meanwhile (a.section: with all 32 heads' light tiles last, 1 x 32 x 16384
     * took 4670 us against 4466) */
    const int late = grid / 3 < a.section ? grid / 3 : a.section;
    a.late_heads = !FEAT && !p->causal && p->Sq % BR && a.n_qtiles > 1 ? (late > 0 ? late : 1) : 0;
    if (plan) {
        *plan = fs_sm80_plan{0, 1, BR, BC, THREADS, SMEM, a.n_qtiles, 1, 1, grid, 0, p->rotary ? 2 : 0};
        return cudaSuccess;
    }
    /* workspace: the claim counters, then (T5) the expanded tables, (key padding) each batch's tile counts and list,
     * (rotary) q and k rotated by the pre-pass */
    const int claims = sm90_claims(p, BR);
    a.kpm_tiles = (p->Sk + BC - 1) / BC;
    const size_t kpm_at = FS_COUNTER_BYTES + (size_t)p->H * a.t5_row * 4;
    const size_t kpm_list_at = kpm_at + ((size_t)p->B * (a.kpm_tiles + 2) * 4 + 15) / 16 * 16;
    const size_t kpm_bytes = p->kpm ? kpm_list_at - kpm_at + (size_t)p->B * a.kpm_tiles * 4 * 8 : 0;
    const size_t rot_at = (kpm_at + kpm_bytes + 255) / 256 * 256;
    void *ws = NULL;
    cudaError_t err = fs_kernel_prepare(kernel, &handle, SMEM, device);
    if (err == cudaSuccess && (claims || p->t5_table || p->kpm || p->rotary))
        err = fs_workspace_get(device, stream, rot_at + (p->rotary ? fs_rotary_bytes(p) : 0), &ws);
    if (err != cudaSuccess) return err;
    unsigned char *wsb = static_cast<unsigned char *>(ws);
    if (claims) a.claims = static_cast<int *>(ws);
    a.kpm_count = NULL;
    a.kpm_list = NULL;
    if (p->kpm) {
        static fs_kernel prepare;
        int *count = reinterpret_cast<int *>(wsb + kpm_at);
        uint2 *list = reinterpret_cast<uint2 *>(wsb + kpm_list_at);
        fs_attn_params pk = *p;
        void *kargs[] = {&pk, &a.kpm_tiles, &count, &list};
        err = fs_kernel_prepare((const void *)sm90_kpm_prepare<BC>, &prepare, 0, device);
        if (err == cudaSuccess) err = fs_launch(&prepare, device, (unsigned)p->B, FS_KPM_THREADS, 0, stream, kargs);
        a.kpm_count = count;
        a.kpm_list = list;
    }
    fs_attn_params rotated; /* from here on p describes the rotated copies */
    if (p->rotary && err == cudaSuccess) {
        err = fs_rotary_qk(p, device, stream, wsb + rot_at, &rotated);
        a.p = rotated;
        p = &rotated;
    }
    if (err == cudaSuccess && p->t5_table) {
        static fs_kernel expand;
        float *rows = reinterpret_cast<float *>(wsb + FS_COUNTER_BYTES);
        fs_attn_params pt = *p;
        float mul = T5 ? (float)(1.0 / p->scale) : FS_LOG2E; /* T5 tables hold bias / scale: sm90_t5_init */
        void *targs[] = {&pt, &a.t5_lneg, &a.t5_n, &a.t5_row, &mul, &rows};
        err = fs_kernel_prepare((const void *)sm90_t5_expand, &expand, 0, device);
        if (err == cudaSuccess) err = fs_launch(&expand, device, (unsigned)p->H, 256, 0, stream, targs);
        a.t5_rows = rows;
    }
    const int bf16 = p->dtype == FS_BF16;
    int sq, sk, nb;
    sm90_extent(p, 1, &sq, &nb);
    sm90_extent(p, 0, &sk, &nb);
    CUtensorMap mq, mk, mv, mo;
    if (err == cudaSuccess) err = sm90_map(&mq, p->q, bf16, sq, p->H, nb, D, p->q_ss, p->q_sh, p->q_sb, BR);
    const int hkv = fs_kv_heads(p);
    if (err == cudaSuccess) err = sm90_map(&mk, p->k, bf16, sk, hkv, nb, D, p->k_ss, p->k_sh, p->k_sb, BC);
    if (err == cudaSuccess) err = sm90_map(&mv, p->v, bf16, sk, hkv, nb, D, p->v_ss, p->v_sh, p->v_sb, BC);
    if (err == cudaSuccess) err = sm90_map(&mo, p->o, bf16, sq, p->H, nb, D, p->o_ss, p->o_sh, p->o_sb, 64);
    void *args[] = {&mq, &mk, &mv, &mo, &a};
    if (err == cudaSuccess) err = fs_launch(&handle, device, grid, THREADS, SMEM, stream, args);
    if (ws) {
        cudaError_t rerr = fs_workspace_release(stream, ws);
        if (err == cudaSuccess) err = rerr;
    }
    return err;
}

/* The protein options: packed sequences, seqlens, key padding, the T5 bias (the FEAT kernels). */
static bool sm90_feat(const fs_attn_params *p)
{
    return p->cu_seqlens_q || p->seqlens || p->kpm || p->t5_table;
}

/* The T5 bias without the other options at D = 128 (ProtT5) runs on the plain kernel with the bias added (T5): Q in
 * registers and the early hand-over, which the FEAT kernel cannot hold without spilling (NOTES.md, session 29). */
static bool sm90_t5_plain(const fs_attn_params *p)
{
    return p->t5_table && p->D == 128 && !p->cu_seqlens_q && !p->seqlens && !p->kpm && fabs(p->scale) >= FS_SM90_T5_MIN_SCALE;
}

/* Consumer warpgroups: three (Br = 192) at D = 64 (plain S = 4096, 8192: 8-12% faster than two warpgroups with
 * Bc = 128 or 192; packed UniProt batches 4-28%), two at D = 128, where O alone takes 64 of the 160 registers per
 * thread that three consumer warpgroups leave. */
static constexpr int sm90_nwg(int d)
{
    return d == 64 ? 3 : 2;
}

/* Work items of a launch with Br = br: B H query tiles (packed sequences aside). */
static long long sm90_items(const fs_attn_params *p, int br)
{
    return (long long)p->B * p->H * ((p->Sq + br - 1) / br);
}

/* The plain D = 64 kernel on two consumer warpgroups (Br = 128) where three leave SMs idle and two still give every
 * item an SM of its own: the problem takes one item's time either way, and a 128-row item is the shorter. */
static bool sm90_two_wg64(const fs_attn_params *p, int sm_count)
{
    return sm90_items(p, 192) < sm_count && sm90_items(p, 128) <= sm_count;
}

/* Bc = 64 for the protein options at D = 64 where 128-key tiles would visit a quarter more keys than 64-key
 * ones: at most 64 keys, or 129-192 (the ESM2 length buckets of 170 or so). */
static int sm90_narrow_keys(const fs_attn_params *p)
{
    const long long pad64 = ((long long)p->Sk + 63) / 64 * 64, pad128 = ((long long)p->Sk + 127) / 128 * 128;
    return p->D == 64 && (pad128 - pad64) * 4 >= pad64;
}

/* The protein options take Bc = 128, or 64 (above); a key padding mask its own instantiations (Bc = 128), which keep
 * its per-tile load and selects out of the others (in them, measured on the packed UniProt batches, 1-3% slower). */
template <typename T>
static cudaError_t launch_dtype(const fs_attn_params *p, int device, int sm_count, cudaStream_t stream, fs_sm80_plan *plan)
{
    const bool feat = sm90_feat(p);
    constexpr int W64 = sm90_nwg(64), W128 = sm90_nwg(128);
    if (p->kpm)
        return p->D == 128 ? launch<128, 128, W128, T, true, true>(p, device, sm_count, stream, plan)
                           : launch<64, 128, W64, T, true, true>(p, device, sm_count, stream, plan);
    if (sm90_t5_plain(p)) return launch<128, 128, W128, T, false, false, true>(p, device, sm_count, stream, plan);
    if (p->D == 128)
        return feat ? launch<128, 128, W128, T, true>(p, device, sm_count, stream, plan)
                    : launch<128, 128, W128, T, false>(p, device, sm_count, stream, plan);
    if (!feat)
        return sm90_two_wg64(p, sm_count) ? launch<64, 128, 2, T, false>(p, device, sm_count, stream, plan)
                                          : launch<64, 128, W64, T, false>(p, device, sm_count, stream, plan);
    return sm90_narrow_keys(p) ? launch<64, 64, W64, T, true>(p, device, sm_count, stream, plan)
                               : launch<64, 128, W64, T, true>(p, device, sm_count, stream, plan);
}

#ifdef FLASHSCI_SM90A
/* Every stride of a dim longer than 1 nonzero (TMA cannot broadcast) and below 2^39 elements. */
static int strides_ok(int S, int H, int B, int64_t ss, int64_t sh, int64_t sb)
{
    const int64_t lim = 1LL << 39;
    return (S == 1 || (ss > 0 && ss < lim)) && (H == 1 || (sh > 0 && sh < lim)) && (B == 1 || (sb > 0 && sb < lim));
}

/* Whether the Hopper kernel beats the sm80 one on a problem of `items` work items. With one item per SM or more it
 * does. With fewer, it runs each item's keys on one SM, where the sm80 kernel splits long key ranges over SMs, so
 * it is taken only for self-attention-like shapes (Sq >= Sk / 2, Sk <= 4096: what was measured). There, at D = 128,
 * it wins on every size measured from one head of 256 keys up (1.4-2.6x on the H100: the sm80 kernel's D = 128
 * tiles are register-bound). At D = 64, plain and non-causal, on two consumer warpgroups (sm90_two_wg64) it wins from
 * 256 keys (H100: 1 x 1 x 512 8.9 -> 8.1 us, 8 x 8 x 256 9.7 -> 8.1, 1 x 20 x 512 14.4 -> 9.4), except where few
 * query tiles (under a quarter of the SMs) see more than 512 keys, which the sm80 kernel splits over a cluster
 * (1 x 2 x 1024: 13.0 against 11.9); on a single key tile the sm80 kernel wins (1 x 1 x 64: 5.4 against 3.7).
 * Causal and protein-option problems at D = 64 keep session 16's rule: from two thirds of an item per SM (Br = 192)
 * and 512 keys (NOTES.md, sessions 16 and 24). */
static int sm90_pays(const fs_attn_params *p, long long items, int sm_count)
{
    if (items >= sm_count) return 1;
    if (2LL * p->Sq < p->Sk || p->Sk > 4096) return 0;
    if (p->D == 128) return 1;
    if (!p->causal && !sm90_feat(p) && !p->rotary && p->Sk >= 256) /* Br = 128 items: sm90_two_wg64 */
        return p->Sk <= 512 || 4 * sm90_items(p, 128) >= sm_count;
    return 3 * items >= 2LL * sm_count && p->Sk >= 512;
}
#endif

extern "C" int fs_attention_sm90_covers(const fs_attn_params *p, int sm_count)
{
#ifdef FLASHSCI_SM90A
    const int br = 64 * sm90_nwg(p->D), hkv = fs_kv_heads(p);
    int sq, sk, nb, lneg = 0, t5_n = 0;
    sm90_extent(p, 1, &sq, &nb);
    sm90_extent(p, 0, &sk, &nb);
    if (p->t5_table) fs_t5_span(p, &lneg, &t5_n);
    return (p->dtype == FS_F16 || p->dtype == FS_BF16) && (p->D == 64 || p->D == 128) && p->Sq > 0 && p->Sk > 0 &&
           !p->bias && t5_n <= FS_SM90_T5_MAX && sq > 0 && sk > 0 &&
           (!p->cu_seqlens_q || (p->total_q < INT32_MAX && p->total_k < INT32_MAX)) &&
           strides_ok(sq, p->H, nb, p->q_ss, p->q_sh, p->q_sb) && strides_ok(sk, hkv, nb, p->k_ss, p->k_sh, p->k_sb) &&
           strides_ok(sk, hkv, nb, p->v_ss, p->v_sh, p->v_sb) && strides_ok(sq, p->H, nb, p->o_ss, p->o_sh, p->o_sb) &&
           sm90_pays(p, sm90_items(p, br), sm_count);
#else
    (void)p; (void)sm_count;
    return 0;
#endif
}

extern "C" cudaError_t fs_attention_sm90(const fs_attn_params *p, int device, int sm_count, cudaStream_t stream, fs_sm80_plan *plan)
{
    return p->dtype == FS_F16 ? launch_dtype<__half>(p, device, sm_count, stream, plan)
                              : launch_dtype<__nv_bfloat16>(p, device, sm_count, stream, plan);
}
