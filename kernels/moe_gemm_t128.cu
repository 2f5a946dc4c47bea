// The grouped MoE GEMM's tile of 128 tokens for the gate/up product (kernels/moe_gemm.cu has the
// tiles it varies; CPU twin and requirements as there): prefill steps whose mean expert holds
// many tokens (DUSTOFF_MOE_T128, default 96; a 2,048-token step of top-8 over 128 experts gives
// ~128). Measured (lent H100, compute_70 PTX, Qwen3-30B-A3B shape, docs/BENCHMARKS.md row M12):
// gate/up 796 against t64's 926 us at 2,048 tokens, even at 1,024; the down product of this
// tile was slower than the 128-row w48 tile (510 against 400 us), so it has no entry.
//
// Why: Nsight Compute on the 64-token tile of such a step (lent H100, compute_70 PTX) counted
// ~14 instructions issued per HMMA (the dequantization into shared memory, repeated for each of
// an expert's 64-token tiles, is the largest share), 39% of issue slots busy at 12 warps an SM
// (153 registers), stalls on fixed-latency dependencies and shared-memory loads. Here each
// 64-row weight chunk is dequantized once per 128 tokens by twice the threads (2 runs of 16 a
// thread instead of 4), and a warp's 32 x 32 output (2 x 2 fragments) loads 2 A and 2 B
// fragments for 4 MMAs where the t64 warp loads 1 + 4.
//
// Block (256 threads, 8 warps): 64 weight rows (gate/up: 32 gate rows then the same 32 up rows;
// SwiGLU in the epilogue) x 128 tokens of one expert, chunks of 128 columns. Thread q dequantizes
// runs 2 (q % 4), 2 (q % 4) + 1 of tile row q / 4 (the 8 runs of 16 of a row's chunk, in unit
// order) and stages 8 x 16 bytes of the [128, 128] F16 input; the next chunk's packed bytes and
// input are fetched into registers while this one is multiplied. Warp w computes tile rows
// 32 (w % 2) .. + 31 for tokens 32 (w / 2) .. + 31; a warp whose tokens lie past the expert's
// count multiplies nothing (DUSTOFF_MOE_GEMM_SKIP as in moe_gemm.cu). Dynamic shared memory:
// MGW_SMEM bytes (opt-in above 48 KB, legal on sm_70: one block an SM of a V100's 96 KB).
// __launch_bounds__(256, 2) caps a thread at 128 registers so that two blocks share an SM off
// sm_70 (H100: 12 warps an SM for t64, 16 here; uncapped, 151 registers and one block an SM,
// this tile measured 1,086 us at 2,048 tokens). ptxas spills a few bytes a thread under the cap
// (scripts/ptxas_table.py KNOWN_SPILLS); on a V100 the shared memory allows one block an SM
// anyway, so there the cap buys nothing (not measured: no V100 lent).
#include "common.cuh"
#include "quant.cuh"
#include "moe_gemm.cuh"

#define MGW_BM 64
#define MGW_BN 128
#define MGW_THREADS 256
#define MGW_SMEM ((MGW_BM + MGW_BN) * MG_LD * 2)

// Global -> registers: the thread's unit of chunk c (its runs 2 (q % 4), + 1 lie in one unit:
// RUNS is even) and its 8 x 16 bytes of the input tile (tokens past the count repeat the last).
template <class F>
__device__ __forceinline__ void mgw_fetch(const MoeGemmParams& p, const QRow& row, int c, int first, int count,
                                          typename F::Raw& rw, uint4 (&rx)[8]) {
    rw = F::load(row, c * (MG_BK / F::UE) + 2 * (threadIdx.x % 4) / F::RUNS);
    const long long c0 = (long long)c * MG_BK;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int q = threadIdx.x + MGW_THREADS * i, tok = min(q / 16, count - 1), part = q % 16;
        rx[i] = __ldg(reinterpret_cast<const uint4*>(p.x + (long long)(first + tok) * p.cols + c0 + part * 8));
    }
}

template <class F>
__device__ __forceinline__ void moe_gemm_t128_impl(const MoeGemmParams& p) {
    constexpr int LDO = MGW_BN + 4;
    static_assert(MGW_BM * LDO * 4 <= MGW_SMEM, "the accumulator tile fits the staging area");
    extern __shared__ __align__(128) unsigned char mgw_smem[];
    half_t* sw = reinterpret_cast<half_t*>(mgw_smem);                     // [64, MG_LD]
    half_t* sx = reinterpret_cast<half_t*>(mgw_smem + MGW_BM * MG_LD * 2);  // [128, MG_LD]
    int expert, first, count;
    if (!mg_tile(p, MGW_BN, expert, first, count)) return;
    const int warp = threadIdx.x / WARP, wm = warp % 2, wn = warp / 2;
    // This warp's 16-token fragments that hold tokens (warp-uniform; the MMAs are warp-wide).
    const int frags = p.all_frags ? 2 : max(0, min(2, (count - 32 * wn + 15) / 16));
    const int r0 = blockIdx.x * (MGW_BM / 2);
    const int my_row = threadIdx.x / 4, s = threadIdx.x % 4;
    QRow row;
    mg_row<true, MGW_BM>(p, (long long)expert * p.rows + r0, my_row, row);
    float acc[2][2][8];
#pragma unroll
    for (int m = 0; m < 2; ++m) wmma_zero(acc[m]);
    const int chunks = p.cols / MG_BK;
    typename F::Raw rw;
    uint4 rx[8];
    mgw_fetch<F>(p, row, 0, first, count, rw, rx);
    for (int c = 0; c < chunks; ++c) {
        __syncthreads();  // the previous chunk's fragments are loaded
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int j = 2 * s + k, u = c * (MG_BK / F::UE) + j / F::RUNS, run = j % F::RUNS;
            Stage16<F>::run(rw, u, run, reinterpret_cast<uint4*>(sw + my_row * MG_LD + (F::start(u, run) - c * MG_BK)));
        }
        stage_x_tile<MGW_THREADS>(sx, MG_LD, rx);
        __syncthreads();
        if (c + 1 < chunks) mgw_fetch<F>(p, row, c + 1, first, count, rw, rx);
#pragma unroll
        for (int u = 0; u < MG_BK / 16; ++u) {
            unsigned a[2][8];
#pragma unroll
            for (int m = 0; m < 2; ++m) wmma_load_a(a[m], sw + (32 * wm + 16 * m) * MG_LD + u * 16, MG_LD);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                if (j >= frags) break;
                unsigned b[8];
                wmma_load_b_col(b, sx + (32 * wn + 16 * j) * MG_LD + u * 16, MG_LD);
#pragma unroll
                for (int m = 0; m < 2; ++m) wmma_mma_rc(acc[m][j], a[m], b);
            }
        }
    }
    __syncthreads();  // the staging area becomes the accumulator tile
    float* o = reinterpret_cast<float*>(mgw_smem);  // [64 tile rows, LDO]: (row, token)
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            if (j < frags) wmma_store_c(o + (32 * wm + 16 * m) * LDO + 32 * wn + 16 * j, acc[m][j], LDO);
    __syncthreads();
    mg_write<true, MGW_BM, MGW_THREADS>(p, r0, first, count, [&](int r, int n) { return o[r * LDO + n]; });
}

// grid: (rows / 32, ceil(pairs / 128) + min(experts, pairs)), block 256, MGW_SMEM bytes of
// dynamic shared memory.
#define MOE_GEMM_T128_ENTRIES(name, F)                                                                         \
    extern "C" __global__ void __launch_bounds__(MGW_THREADS, 2) moe_gemm_gate_up_##name##_t128(const MoeGemmParams p) { \
        moe_gemm_t128_impl<F>(p);                                                                        \
    }

MOE_GEMM_T128_ENTRIES(q4_0, FQ4_0)
MOE_GEMM_T128_ENTRIES(q8_0, FQ8_0)
MOE_GEMM_T128_ENTRIES(q4_k, FQ4K)
MOE_GEMM_T128_ENTRIES(q5_k, FQ5K)
MOE_GEMM_T128_ENTRIES(q6_k, FQ6K)
