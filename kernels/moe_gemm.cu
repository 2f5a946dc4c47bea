// Grouped tensor-core GEMM over the experts of a step (prefill, batches): the (token, slot)
// pairs are grouped by expert on the device (moe_group in moe.cu: offsets, entries), their input
// rows gathered as F16 (moe_gather_f16), then per expert that has tokens one GEMM with the
// expert's tokens as the N dimension:
//   gate/up: act[q, r] = f16(silu(gate_e[r] . x[q]) * (up_e[r] . x[q]))   (q: grouped position)
//   down:    y[q, r]   = down_e[r] . act[q]                              (f32)
// and moe_combine_f32 (moe.cu) sums each token's k rows of y in slot order (deterministic).
// CPU twin: the product of the staged F16 weights (src/model/quant/staged.rs) and the input
// rounded to F16, f64 sums (tests/gpu_parity/moe_gemm.rs); reference: src/backend/cpu/moe.rs.
//
// No F16 copy of the experts: each block dequantizes its weight tile from the packed blocks
// (quant.cuh Stage16, decode order of F::run) into shared memory, then wmma m16n16k16 (F16 in, F32
// accumulation; inline PTX from common.cuh, valid on compute_70).
//
// Block (128 threads, 4 warps): BM = 64 WM weight rows (gate/up: BM / 2 gate rows then the same
// BM / 2 up rows, so the SwiGLU is fused in the epilogue) x BN tokens of one expert, chunks of
// 128 columns. Tiles: 64 rows x 16 or 64 tokens (t16, t64), and 128 rows x 48 tokens (w48, the
// down product of prefill steps: ops::moe_gemm::Tile::for_step): a w48 warp holds 32 rows x 48
// tokens (2 x 3 fragments), so each fragment loaded from shared memory feeds more MMAs (5 loads
// for 6 against 5 for 4 in a t64 warp; the staging reads are what bound t64 on the H200, and a
// V100's 128 bytes a clock of shared memory carry fewer MMAs still), and the staged rows + tokens
// fit 48 KB (two blocks in a V100 SM's 96 KB).
// grid.y walks the (expert, token tile) list: block y finds its tile from the offsets (a warp
// prefix sum of ceil(count / BN) over the experts), so the grid is fixed by the step's pair
// count (ceil(pairs / BN) + experts bounds the tiles) and a captured graph stays valid whatever
// the router chose; blocks past the last tile and experts without tokens cost nothing.
// Warp w computes tile rows 16 WM w .. 16 WM (w + 1) - 1 for all BN tokens.
// Requires (checked by the launcher): cols % 128 == 0; rows % (BM / 2) (gate/up) or % BM (down).
#include "common.cuh"
#include "quant.cuh"
#include "moe_gemm.cuh"

// ---- Gather: x16[q] = f16(h[entries[q] / k]) for every grouped position q.
struct MoeGatherParams {
    const float* h;      // [n_tok, dim] f32 (normed hidden states)
    const int* entries;  // [n_pairs] pair (token * k + slot) at each grouped position
    half_t* x16;         // [n_pairs, dim] f16
    int n_pairs;
    int dim;  // multiple of 8
    int k;
};

// grid (ceil(dim / 1024), min(n_pairs, 65535)), block 128: 8 values a thread.
extern "C" __global__ void __launch_bounds__(128) moe_gather_f16(const MoeGatherParams p) {
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (c >= p.dim) return;
    for (int q = blockIdx.y; q < p.n_pairs; q += gridDim.y) {
        const int tok = p.entries[q] / p.k;
        const float4* src = reinterpret_cast<const float4*>(p.h + (long long)tok * p.dim + c);
        const float4 a = __ldg(src), b = __ldg(src + 1);
        uint4 o;
        o.x = f2h_sat(a.x) | (unsigned)f2h_sat(a.y) << 16;
        o.y = f2h_sat(a.z) | (unsigned)f2h_sat(a.w) << 16;
        o.z = f2h_sat(b.x) | (unsigned)f2h_sat(b.y) << 16;
        o.w = f2h_sat(b.z) | (unsigned)f2h_sat(b.w) << 16;
        *reinterpret_cast<uint4*>(p.x16 + (long long)q * p.dim + c) = o;
    }
}

template <class F, int WM, int NT16, bool GATE_UP>
__device__ __forceinline__ void moe_gemm_impl(const MoeGemmParams& p) {
    using G = MG<F, WM>;
    constexpr int BM = G::BM, BN = NT16 * 16, LDO = BN + 4;
    constexpr int SW = BM * MG_LD * 2, SX = BN * MG_LD * 2, SO = BM * LDO * 4;
    static_assert(SW + SX <= 48 * 1024, "static shared memory: at most 48 KB");
    // Staged W and x during the loop, then (after a barrier) the accumulators [BM, LDO] f32.
    __shared__ __align__(128) unsigned char smem[SW + SX > SO ? SW + SX : SO];
    half_t* sw = reinterpret_cast<half_t*>(smem);       // [BM, MG_LD]
    half_t* sx = reinterpret_cast<half_t*>(smem + SW);  // [BN, MG_LD]
    int expert, first, count;
    if (!mg_tile(p, BN, expert, first, count)) return;
    const int warp = threadIdx.x / WARP;
    // 16-token fragments that hold tokens of the tile: the rest (rows repeating the tile's last
    // token) are neither multiplied nor stored. Block-uniform, so no divergence; a nightly
    // job's mixed steps give an expert ~30 tokens, half of a 64-token tile.
    const int frags = p.all_frags ? NT16 : (count + 15) / 16;
    const int r0 = blockIdx.x * (GATE_UP ? BM / 2 : BM);
    QRow rows[G::PER_THREAD];
    mg_rows<F, WM, GATE_UP>(p, expert, r0, rows);
    float acc[WM][NT16][8];
#pragma unroll
    for (int m = 0; m < WM; ++m) wmma_zero(acc[m]);
    const int chunks = p.cols / MG_BK;
    typename F::Raw rw[G::PER_THREAD];
    uint4 rx[NT16 * 2];
    mg_fetch<F, WM, NT16 * 2>(p, rows, 0, first, count, rw, rx);
    for (int c = 0; c < chunks; ++c) {
        __syncthreads();  // the previous chunk's fragments are loaded
        stage_tile_chunk<F, MG_THREADS, G::UPC>(sw, rw, c);
        stage_x_tile<MG_THREADS>(sx, MG_LD, rx);
        __syncthreads();
        if (c + 1 < chunks) mg_fetch<F, WM, NT16 * 2>(p, rows, c + 1, first, count, rw, rx);
        // The product of common.cuh's wmma_k_tile, written out: through that function NVRTC 12.9
        // computes this kernel's fragment addresses otherwise (other PTX, not measured).
#pragma unroll
        for (int u = 0; u < MG_BK / 16; ++u) {
            unsigned a[WM][8];
#pragma unroll
            for (int m = 0; m < WM; ++m) wmma_load_a(a[m], sw + (warp * WM + m) * 16 * MG_LD + u * 16, MG_LD);
#pragma unroll
            for (int j = 0; j < NT16; ++j) {
                if (j >= frags) break;
                unsigned b[8];
                wmma_load_b_col(b, sx + j * 16 * MG_LD + u * 16, MG_LD);
#pragma unroll
                for (int m = 0; m < WM; ++m) wmma_mma_rc(acc[m][j], a[m], b);
            }
        }
    }
    __syncthreads();  // the staging area becomes the accumulator tile
    float* o = reinterpret_cast<float*>(smem);  // [BM tile rows, LDO]: (row, token)
#pragma unroll
    for (int m = 0; m < WM; ++m)
#pragma unroll
        for (int j = 0; j < NT16; ++j)
            if (j < frags) wmma_store_c(o + (warp * WM + m) * 16 * LDO + j * 16, acc[m][j], LDO);
    __syncthreads();
    mg_write<GATE_UP, BM>(p, r0, first, count, [&](int r, int n) { return o[r * LDO + n]; });
}

// Entry points per format: gate/up (+ SwiGLU) and down; tiles of 64 rows x 16 or 64 tokens and
// of 128 rows x 48 tokens (8-token fragments: moe_gemm_n8.cu; the 128-token gate/up tile of
// long prefill steps: moe_gemm_t128.cu). grid: (rows / (BM / 2) (gate/up) or rows / BM (down),
// ceil(pairs / BN) + min(experts, pairs)), block 128.
#define MOE_GEMM_ENTRY(name, F, kind, tile, WM, NT16, GATE_UP)                                   \
    extern "C" __global__ void __launch_bounds__(MG_THREADS) moe_gemm_##kind##_##name##_##tile( \
        const MoeGemmParams p) {                                                                \
        moe_gemm_impl<F, WM, NT16, GATE_UP>(p);                                                 \
    }
#define MOE_GEMM_ENTRIES(name, F)                         \
    MOE_GEMM_ENTRY(name, F, gate_up, t16, 1, 1, true)     \
    MOE_GEMM_ENTRY(name, F, gate_up, t64, 1, 4, true)     \
    MOE_GEMM_ENTRY(name, F, gate_up, w48, 2, 3, true)     \
    MOE_GEMM_ENTRY(name, F, down, t16, 1, 1, false)       \
    MOE_GEMM_ENTRY(name, F, down, t64, 1, 4, false)       \
    MOE_GEMM_ENTRY(name, F, down, w48, 2, 3, false)

// The formats of the Q4_K_M / Q5_K_M / Q8_0 / Q4_0 mixes; other formats take the grouped GEMV.
MOE_GEMM_ENTRIES(q4_0, FQ4_0)
MOE_GEMM_ENTRIES(q8_0, FQ8_0)
MOE_GEMM_ENTRIES(q4_k, FQ4K)
MOE_GEMM_ENTRIES(q5_k, FQ5K)
MOE_GEMM_ENTRIES(q6_k, FQ6K)
