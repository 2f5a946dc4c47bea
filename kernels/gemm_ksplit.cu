// The packed tensor-core GEMM's K-split tile (kernels/gemm_quant.cu has the 64-row tiles it
// varies; CPU twin and requirements as there). A file of its own, loaded only when
// DUSTOFF_QGEMM_KSPLIT is set (or a launch asks for it), so that its PTX adds nothing to every
// first start on a V100.
#include "common.cuh"
#include "quant.cuh"
#include "gemm_quant.cuh"

// ---- K-split tile (steps of 9..=64 tokens; off by default, DUSTOFF_QGEMM_KSPLIT): in the
// 64-row tile above each of the 4 warps loads every input fragment of a chunk (t64: 64 of the
// 80 KB it reads from shared memory a chunk; Nsight Compute puts the grouped MoE GEMM's like tile
// at 92% of the L1/shared throughput on an H100). Here warp w computes rows 32 (w % 2) .. + 31
// over the k-steps 4 (w / 2) .. + 3 of each chunk with wmma m32n8k16 (one 32-row A fragment and
// 2 NT16 8-token B fragments a k-step), so each input element is read by 2 warps (t64: 16 + 32
// KB a chunk), and the two K halves are summed in the epilogue (half 0 + half 1). Staging, grid
// and split-K as the 64-row tile; 8-token fragments past n_tok are neither multiplied nor stored.
template <class F, int NT16>
__device__ __forceinline__ void gemm_qk_impl(const GemmQParams& p) {
    constexpr int N8 = 2 * NT16, BN = NT16 * 16, LDO = BN + 4;
    constexpr int SW = QG_BM * QG_LD * 2, SX = BN * QG_LD * 2, SO = 2 * QG_BM * LDO * 4;
    // Staged W and x during the loop, then (after a barrier) the accumulators [2, 64, LDO] f32.
    __shared__ __align__(32) unsigned char smem[SW + SX > SO ? SW + SX : SO];
    half_t* sw = reinterpret_cast<half_t*>(smem);       // [64, QG_LD]
    half_t* sx = reinterpret_cast<half_t*>(smem + SW);  // [BN, QG_LD]
    const int warp = threadIdx.x / WARP, wr = warp % 2, wk = warp / 2;
    const int r0 = blockIdx.x * QG_BM, t0 = blockIdx.z * BN;
    const int chunks = p.cols / QG_BK, kb = blockIdx.y, nk = gridDim.y;
    const int c_begin = (int)((long long)chunks * kb / nk), c_end = (int)((long long)chunks * (kb + 1) / nk);
    const int frags = max(0, min(N8, (p.n_tok - t0 + 7) / 8));  // block-uniform
    QRow rows[QG<F>::PER_THREAD];
    qg_rows<F>(p, r0, rows);
    float acc[N8][8];
    wmma_zero(acc);
    typename F::Raw rw[QG<F>::PER_THREAD];
    uint4 rx[NT16 * 2];
    if (c_begin < c_end) qg_fetch<F, NT16>(p, rows, c_begin, t0, rw, rx);
    for (int c = c_begin; c < c_end; ++c) {
        __syncthreads();  // the previous chunk's fragments are loaded
        qg_stage<F>(sw, rw, c);
        stage_x_tile<QG_THREADS>(sx, QG_LD, rx);
        __syncthreads();
        if (c + 1 < c_end) qg_fetch<F, NT16>(p, rows, c + 1, t0, rw, rx);
#pragma unroll
        for (int i = 0; i < QG_BK / 32; ++i) {
            const int u = (QG_BK / 32) * wk + i;
            unsigned a[8];
            wmma_load_a_m32(a, sw + 32 * wr * QG_LD + 16 * u, QG_LD);
#pragma unroll
            for (int j = 0; j < N8; ++j) {
                if (j >= frags) break;
                unsigned b[8];
                wmma_load_b_col_n8(b, sx + 8 * j * QG_LD + 16 * u, QG_LD);
                wmma_mma_rc_m32n8(acc[j], a, b);
            }
        }
    }
    __syncthreads();  // the staging area becomes the two K halves' accumulators
    float* o = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int j = 0; j < N8; ++j)
        if (j < frags) wmma_store_c_m32n8(o + (wk * QG_BM + 32 * wr) * LDO + 8 * j, acc[j], LDO);
    __syncthreads();
    // Consecutive threads write consecutive rows of one token (coalesced).
    for (int e = threadIdx.x; e < QG_BM * 8 * frags; e += QG_THREADS) {
        const int m = e % QG_BM, n = e / QG_BM;
        if (t0 + n < p.n_tok) gemm_store_one(p, r0 + m, t0 + n, o[m * LDO + n] + o[(QG_BM + m) * LDO + n], nk, kb);
    }
}

// grid: (rows / 64, k splits, 1), block 128. The suffix: tokens per block tile (the padded count).
#define GEMMQK_ENTRIES(name, F)                                                                               \
    extern "C" __global__ void __launch_bounds__(QG_THREADS) gemmq_##name##_k16(const GemmQParams p) { gemm_qk_impl<F, 1>(p); } \
    extern "C" __global__ void __launch_bounds__(QG_THREADS) gemmq_##name##_k32(const GemmQParams p) { gemm_qk_impl<F, 2>(p); } \
    extern "C" __global__ void __launch_bounds__(QG_THREADS) gemmq_##name##_k48(const GemmQParams p) { gemm_qk_impl<F, 3>(p); } \
    extern "C" __global__ void __launch_bounds__(QG_THREADS) gemmq_##name##_k64(const GemmQParams p) { gemm_qk_impl<F, 4>(p); }

FOR_EACH_QFORMAT(GEMMQK_ENTRIES)
