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
    qg_chunks<F, NT16>(p, rows, c_begin, c_end, t0, sw, sx,
                       [&] { wmma_k_half_n8<N8, QG_BK>(acc, sw + 32 * wr * QG_LD, sx, QG_LD, wk, frags); });
    __syncthreads();  // the staging area becomes the two K halves' accumulators
    float* o = reinterpret_cast<float*>(smem);
    wmma_store_n8(o + (wk * QG_BM + 32 * wr) * LDO, acc, LDO, frags);
    __syncthreads();
    // Consecutive threads write consecutive rows of one token (coalesced).
    for (int e = threadIdx.x; e < QG_BM * 8 * frags; e += QG_THREADS) {
        const int m = e % QG_BM, n = e / QG_BM;
        if (t0 + n < p.n_tok) gemm_store_one(p, r0 + m, t0 + n, o[m * LDO + n] + o[(QG_BM + m) * LDO + n], nk, kb);
    }
}

// grid: (rows / 64, k splits, 1), block 128. The suffix: tokens per block tile (the padded count).
#define GEMMQK_ENTRIES(name, F) GEMMQ_TILE_ENTRIES(name, F, gemm_qk_impl, k)

FOR_EACH_QFORMAT(GEMMQK_ENTRIES)
