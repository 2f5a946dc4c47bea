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

#define MG_BK 128
#define MG_LD (MG_BK + 8)  // halves per staged row (272 bytes: rows 4 banks apart)
#define MG_THREADS 128

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

struct MoeGemmParams {
    const u8_t* qs;       // slab [n_experts * rows] rows: qs part (gate, or down)
    const u8_t* aux;      // slab aux part
    const u8_t* qs2;      // gate/up: the up slab (same format and shape); down: null
    const u8_t* aux2;
    const half_t* x;      // [n_pairs, cols] f16 input rows by grouped position
    const int* offsets;   // [n_experts + 1] grouped positions per expert
    half_t* act;          // gate/up output [n_pairs, rows] f16
    float* y;             // down output [n_pairs, rows] f32
    int rows;             // output rows per expert (gate/up: expert width; down: model width)
    int cols;             // row length, multiple of 128
    int n_experts;
    int n_pairs;
    int qs_row;           // bytes of one row in qs
    int aux_row;          // bytes of one row in aux
    int all_frags;        // 1: multiply every fragment of a tile (DUSTOFF_MOE_GEMM_SKIP=0)
};

template <class F, int WM> struct MG {
    enum { BM = 64 * WM, UPC = MG_BK / F::UE, PER_THREAD = BM * UPC / MG_THREADS };
};

// The block's tile: expert, first grouped position, token count; false past the last tile.
__device__ __forceinline__ bool mg_tile(const MoeGemmParams& p, int bn, int& expert, int& first, int& count) {
    __shared__ int s_tile[3];
    if (threadIdx.x < WARP) {
        const int lane = threadIdx.x, y = blockIdx.y;
        int run = 0;  // tiles of the experts before this group of 32
        bool found = false;
        for (int b0 = 0; b0 < p.n_experts && !found; b0 += WARP) {
            const int e = b0 + lane;
            const int o0 = e < p.n_experts ? p.offsets[e] : 0;
            const int cnt = e < p.n_experts ? p.offsets[e + 1] - o0 : 0;
            const int tiles = (cnt + bn - 1) / bn;
            int inc = tiles;  // inclusive prefix sum over the lanes
#pragma unroll
            for (int o = 1; o < WARP; o <<= 1) {
                const int v = __shfl_up_sync(FULL_MASK, inc, o);
                if (lane >= o) inc += v;
            }
            const int lo = run + inc - tiles;
            const bool mine = y >= lo && y < run + inc;
            if (mine) {
                const int t0 = (y - lo) * bn;
                s_tile[0] = e;
                s_tile[1] = o0 + t0;
                s_tile[2] = min(bn, cnt - t0);
            }
            found = __any_sync(FULL_MASK, mine);
            run += __shfl_sync(FULL_MASK, inc, WARP - 1);
        }
        if (lane == 0 && !found) s_tile[0] = -1;
    }
    __syncthreads();
    expert = s_tile[0];
    first = s_tile[1];
    count = s_tile[2];
    return expert >= 0;
}

// Global -> registers: the packed units of chunk c (slot q: tile_slot) and the input tile (BN
// tokens x 256 bytes: XL = BN / 8 16-byte loads a thread; rows past the tile's count repeat its
// last row, their results are dropped).
template <class F, int WM, int XL>
__device__ __forceinline__ void mg_fetch(const MoeGemmParams& p, const QRow* rows, int c, int first, int count,
                                         typename F::Raw (&rw)[MG<F, WM>::PER_THREAD], uint4 (&rx)[XL]) {
    constexpr int UPC = MG<F, WM>::UPC;
#pragma unroll
    for (int i = 0; i < MG<F, WM>::PER_THREAD; ++i) {
        int tr, unit;
        tile_slot<F, UPC>(threadIdx.x + MG_THREADS * i, tr, unit);
        rw[i] = F::load(rows[i], c * UPC + unit);
    }
    const long long c0 = (long long)c * MG_BK;
#pragma unroll
    for (int i = 0; i < XL; ++i) {
        const int q = threadIdx.x + MG_THREADS * i, tok = min(q / 16, count - 1), part = q % 16;
        rx[i] = __ldg(reinterpret_cast<const uint4*>(p.x + (long long)(first + tok) * p.cols + c0 + part * 8));
    }
}

// The packed rows of the thread's staging slots (tile_slot) in expert `expert`'s tile at output
// row r0: gate/up tiles hold BM / 2 gate rows, then the same rows of the up slab.
template <class F, int WM, bool GATE_UP>
__device__ __forceinline__ void mg_rows(const MoeGemmParams& p, int expert, int r0, QRow (&rows)[MG<F, WM>::PER_THREAD]) {
    using G = MG<F, WM>;
    constexpr int OUT_ROWS = GATE_UP ? G::BM / 2 : G::BM;
    const long long base = (long long)expert * p.rows + r0;
#pragma unroll
    for (int i = 0; i < G::PER_THREAD; ++i) {
        int tr, unit;  // tile row
        tile_slot<F, G::UPC>(threadIdx.x + MG_THREADS * i, tr, unit);
        if (GATE_UP && tr >= OUT_ROWS) {
            rows[i] = q_row(p.qs2, p.aux2, base + tr - OUT_ROWS, p.qs_row, p.aux_row);
        } else {
            rows[i] = q_row(p.qs, p.aux, base + tr, p.qs_row, p.aux_row);
        }
    }
}

// The tile's outputs: v(r, n) the product of tile row r (gate/up: r < BM / 2 gate, the rest up)
// and token n < count. Consecutive threads write consecutive rows of one token (coalesced).
template <bool GATE_UP, int BM, class V>
__device__ __forceinline__ void mg_write(const MoeGemmParams& p, int r0, int first, int count, V v) {
    constexpr int OUT_ROWS = GATE_UP ? BM / 2 : BM;
    for (int e = threadIdx.x; e < OUT_ROWS * count; e += MG_THREADS) {
        const int r = e % OUT_ROWS, n = e / OUT_ROWS;
        const long long dst = (long long)(first + n) * p.rows + r0 + r;
        if (GATE_UP) {
            p.act[dst] = f2h_sat(silu(v(r, n)) * v(OUT_ROWS + r, n));
        } else {
            p.y[dst] = v(r, n);
        }
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

// ---- Tiles of 8-token fragments (batched decode: at 64 sequences an expert holds ~4 tokens, so
// 3/4 of a t16 tile's input rows repeat its last token, and each of its 4 warps loads every
// input fragment). The block owns 64 weight rows x 8 N8 tokens of one expert; warp w computes
// rows 32 (w % 2) .. + 31 over the k-steps 4 (w / 2) .. + 3 of each chunk with wmma m32n8k16
// (one A fragment of 32 rows and N8 B fragments of 8 tokens a k-step), and the two K halves
// are summed in the epilogue (half 0 + half 1: deterministic). Shared memory a chunk (N8 = 1):
// the staged weights written and read once (16 + 16 KB), the input written (2 KB) and read
// (4 KB), against t16's 16 + 16 KB and 4 + 16 KB (Nsight Compute, H100, compute_70 PTX: t16 at
// 92% of the L1/shared throughput in batched decode, the stall most counted the shared-memory
// wait). N8 = 2 (16 tokens): input 4 KB written, 8 KB read.
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
#pragma unroll
        for (int i = 0; i < MG_BK / 32; ++i) {
            const int u = (MG_BK / 32) * wk + i;
            unsigned a[8];
            wmma_load_a_m32(a, sw + 32 * wr * MG_LD + 16 * u, MG_LD);
#pragma unroll
            for (int j = 0; j < N8; ++j) {
                if (j >= frags) break;
                unsigned b[8];
                wmma_load_b_col_n8(b, sx + 8 * j * MG_LD + 16 * u, MG_LD);
                wmma_mma_rc_m32n8(acc[j], a, b);
            }
        }
    }
    __syncthreads();  // the staging area becomes the two K halves' accumulators
    float* o = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int j = 0; j < N8; ++j)
        if (j < frags) wmma_store_c_m32n8(o + (wk * BM + 32 * wr) * LDO + 8 * j, acc[j], LDO);
    __syncthreads();
    mg_write<GATE_UP, BM>(p, r0, first, count, [&](int r, int n) { return o[r * LDO + n] + o[(BM + r) * LDO + n]; });
}

// Entry points per format: gate/up (+ SwiGLU) and down; tiles of 64 rows x 8, 16 (t16, and k16
// of 8-token fragments) or 64 tokens and of 128 rows x 48 tokens. grid: (rows / (BM / 2) (gate/up) or rows / BM (down),
// ceil(pairs / BN) + min(experts, pairs)), block 128.
#define MOE_GEMM_ENTRY(name, F, kind, tile, WM, NT16, GATE_UP)                                   \
    extern "C" __global__ void __launch_bounds__(MG_THREADS) moe_gemm_##kind##_##name##_##tile( \
        const MoeGemmParams p) {                                                                \
        moe_gemm_impl<F, WM, NT16, GATE_UP>(p);                                                 \
    }
#define MOE_GEMM_N8_ENTRY(name, F, kind, tile, N8, GATE_UP)                                    \
    extern "C" __global__ void __launch_bounds__(MG_THREADS) moe_gemm_##kind##_##name##_##tile( \
        const MoeGemmParams p) {                                                                \
        moe_gemm_n8_impl<F, N8, GATE_UP>(p);                                                    \
    }
#define MOE_GEMM_ENTRIES(name, F)                         \
    MOE_GEMM_ENTRY(name, F, gate_up, t16, 1, 1, true)     \
    MOE_GEMM_ENTRY(name, F, gate_up, t64, 1, 4, true)     \
    MOE_GEMM_ENTRY(name, F, gate_up, w48, 2, 3, true)     \
    MOE_GEMM_N8_ENTRY(name, F, gate_up, t8, 1, true)      \
    MOE_GEMM_N8_ENTRY(name, F, gate_up, k16, 2, true)     \
    MOE_GEMM_ENTRY(name, F, down, t16, 1, 1, false)       \
    MOE_GEMM_ENTRY(name, F, down, t64, 1, 4, false)       \
    MOE_GEMM_ENTRY(name, F, down, w48, 2, 3, false)       \
    MOE_GEMM_N8_ENTRY(name, F, down, t8, 1, false)        \
    MOE_GEMM_N8_ENTRY(name, F, down, k16, 2, false)

// The formats of the Q4_K_M / Q5_K_M / Q8_0 / Q4_0 mixes; other formats take the grouped GEMV.
MOE_GEMM_ENTRIES(q4_0, FQ4_0)
MOE_GEMM_ENTRIES(q8_0, FQ8_0)
MOE_GEMM_ENTRIES(q4_k, FQ4K)
MOE_GEMM_ENTRIES(q5_k, FQ5K)
MOE_GEMM_ENTRIES(q6_k, FQ6K)
