// The grouped MoE GEMM's tile of 8 tokens (kernels/moe_gemm.cu has the tiles it varies; CPU
// twin and requirements as there): batched decode while the mean expert holds at most
// DUSTOFF_MOE_T8 tokens (default 2).
#include "common.cuh"
#include "quant.cuh"
#include "moe_gemm.cuh"

// The K-split warp product of the 8-token tiles on one staged
// chunk of BK columns: over the k-steps (BK / 32) wk .. + BK / 32 - 1, acc[j] += A [32 rows at
// a + 16 u, row-major] x B [8-token fragment j: tokens at b + 8 j ld + 16 u] (m32n8k16); the
// fragments from `frags` on (no tokens) are skipped.
template <int N8, int BK>
__device__ __forceinline__ void wmma_k_half_n8(float (&acc)[N8][8], const half_t* a, const half_t* b, int ld, int wk,
                                               int frags) {
#pragma unroll
    for (int i = 0; i < BK / 32; ++i) {
        const int u = (BK / 32) * wk + i;
        unsigned af[8];
        wmma_load_a_m32(af, a + 16 * u, ld);
#pragma unroll
        for (int j = 0; j < N8; ++j) {
            if (j >= frags) break;
            unsigned bf[8];
            wmma_load_b_col_n8(bf, b + 8 * j * ld + 16 * u, ld);
            wmma_mma_rc_m32n8(acc[j], af, bf);
        }
    }
}

// A warp's 32 x 8 N8 accumulators of wmma_k_half_n8 to o (row-major f32, ldo), fragment j at
// column 8 j; those from `frags` on are not stored.
template <int N8>
__device__ __forceinline__ void wmma_store_n8(float* o, const float (&acc)[N8][8], int ldo, int frags) {
#pragma unroll
    for (int j = 0; j < N8; ++j)
        if (j < frags) wmma_store_c_m32n8(o + 8 * j, acc[j], ldo);
}

// ---- Tiles of 8-token fragments (batched decode: at 64 sequences an expert holds ~4 tokens, so
// 3/4 of a t16 tile's input rows repeat its last token, and each of its 4 warps loads every
// input fragment). The block owns 64 weight rows x 8 N8 tokens of one expert; warp w computes
// rows 32 (w % 2) .. + 31 over the k-steps 4 (w / 2) .. + 3 of each chunk with wmma m32n8k16
// (one A fragment of 32 rows and N8 B fragments of 8 tokens a k-step), and the two K halves
// are summed in the epilogue (half 0 + half 1: deterministic). Shared memory a chunk (N8 = 1):
// the staged weights written and read once (16 + 16 KB), the input written (2 KB) and read
// (4 KB), against t16's 16 + 16 KB and 4 + 16 KB (Nsight Compute, H100, compute_70 PTX: t16 at
// 92% of the L1/shared throughput in batched decode, the stall most counted the shared-memory
// wait). Measured there: the weights' staging and fragment loads, not the input's, fill the
// L1 pipe (t8 and t16 both at ~87% of the LSU data-pipe wavefronts); t8 gains where tiles are
// mostly padding (32 sequences: +3.6%) and loses at 8 tokens an expert. A 16-token variant of
// two 8-token fragments (k16) measured within 1% of t16 and was removed.
template <class F, int N8, bool GATE_UP>
__device__ __forceinline__ void moe_gemm_n8_impl(const MoeGemmParams& p) {
    using G = MG<F, 1>;
    constexpr int BM = G::BM, BN = 8 * N8, LDO = BN + 4, XL = BN * 16 / MG_THREADS;
    constexpr int SW = BM * MG_LD * 2, SX = BN * MG_LD * 2, SO = 2 * BM * LDO * 4;
    // Staged W and x during the loop, then (after a barrier) the accumulators [2, BM, LDO] f32.
    __shared__ __align__(128) unsigned char smem[SW + SX > SO ? SW + SX : SO];
    half_t* sw = reinterpret_cast<half_t*>(smem);       // [BM, MG_LD]
    half_t* sx = reinterpret_cast<half_t*>(smem + SW);  // [BN, MG_LD]
    int expert, first, count;
    if (!mg_tile(p, BN, expert, first, count)) return;
    const int warp = threadIdx.x / WARP, wr = warp % 2, wk = warp / 2;
    // 8-token fragments that hold tokens of the tile (block-uniform, as in moe_gemm_impl).
    const int frags = p.all_frags ? N8 : (count + 7) / 8;
    const int r0 = blockIdx.x * (GATE_UP ? BM / 2 : BM);
    QRow rows[G::PER_THREAD];
    mg_rows<F, 1, GATE_UP>(p, expert, r0, rows);
    float acc[N8][8];
    wmma_zero(acc);
    const int chunks = p.cols / MG_BK;
    typename F::Raw rw[G::PER_THREAD];
    uint4 rx[XL];
    mg_fetch<F, 1, XL>(p, rows, 0, first, count, rw, rx);
    for (int c = 0; c < chunks; ++c) {
        __syncthreads();  // the previous chunk's fragments are loaded
        stage_tile_chunk<F, MG_THREADS, G::UPC>(sw, rw, c);
        stage_x_tile<MG_THREADS>(sx, MG_LD, rx);
        __syncthreads();
        if (c + 1 < chunks) mg_fetch<F, 1, XL>(p, rows, c + 1, first, count, rw, rx);
        wmma_k_half_n8<N8, MG_BK>(acc, sw + 32 * wr * MG_LD, sx, MG_LD, wk, frags);
    }
    __syncthreads();  // the staging area becomes the two K halves' accumulators
    float* o = reinterpret_cast<float*>(smem);
    wmma_store_n8(o + (wk * BM + 32 * wr) * LDO, acc, LDO, frags);
    __syncthreads();
    mg_write<GATE_UP, BM>(p, r0, first, count, [&](int r, int n) { return o[r * LDO + n] + o[(BM + r) * LDO + n]; });
}

// grid: as moe_gemm.cu's entries (tiles of 8 or 16 tokens), block 128.
#define MOE_GEMM_N8_ENTRY(name, F, kind, tile, N8, GATE_UP)                                    \
    extern "C" __global__ void __launch_bounds__(MG_THREADS) moe_gemm_##kind##_##name##_##tile( \
        const MoeGemmParams p) {                                                                \
        moe_gemm_n8_impl<F, N8, GATE_UP>(p);                                                    \
    }
#define MOE_GEMM_N8_ENTRIES(name, F)                 \
    MOE_GEMM_N8_ENTRY(name, F, gate_up, t8, 1, true) \
    MOE_GEMM_N8_ENTRY(name, F, down, t8, 1, false)

MOE_GEMM_N8_ENTRIES(q4_0, FQ4_0)
MOE_GEMM_N8_ENTRIES(q8_0, FQ8_0)
MOE_GEMM_N8_ENTRIES(q4_k, FQ4K)
MOE_GEMM_N8_ENTRIES(q5_k, FQ5K)
MOE_GEMM_N8_ENTRIES(q6_k, FQ6K)
