// What the grouped MoE GEMMs of moe_gemm.cu and moe_gemm_n8.cu share: the parameters, the
// tile geometry, the block's (expert, token tile) lookup, the chunk fetch, the packed rows of a
// tile and its output (layout and requirements: moe_gemm.cu). The loader pastes this file in
// place of its include line (after common.cuh and quant.cuh).
#pragma once

#define MG_BK 128
#define MG_LD (MG_BK + 8)  // halves per staged row (272 bytes: rows 4 banks apart)
#define MG_THREADS 128

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

// The packed row of tile row tr of a BM-row tile whose first output row is row `base` of the
// slabs (expert * rows + r0): gate/up tiles hold BM / 2 gate rows, then the same rows of the up
// slab.
template <bool GATE_UP, int BM>
__device__ __forceinline__ void mg_row(const MoeGemmParams& p, long long base, int tr, QRow& row) {
    constexpr int OUT_ROWS = GATE_UP ? BM / 2 : BM;
    if (GATE_UP && tr >= OUT_ROWS) {
        row = q_row(p.qs2, p.aux2, base + tr - OUT_ROWS, p.qs_row, p.aux_row);
    } else {
        row = q_row(p.qs, p.aux, base + tr, p.qs_row, p.aux_row);
    }
}

// The packed rows of the thread's staging slots (tile_slot) in expert `expert`'s tile at output
// row r0 (mg_row).
template <class F, int WM, bool GATE_UP>
__device__ __forceinline__ void mg_rows(const MoeGemmParams& p, int expert, int r0, QRow (&rows)[MG<F, WM>::PER_THREAD]) {
    using G = MG<F, WM>;
    const long long base = (long long)expert * p.rows + r0;
#pragma unroll
    for (int i = 0; i < G::PER_THREAD; ++i) {
        int tr, unit;  // tile row
        tile_slot<F, G::UPC>(threadIdx.x + MG_THREADS * i, tr, unit);
        mg_row<GATE_UP, G::BM>(p, base, tr, rows[i]);
    }
}

// The tile's outputs: v(r, n) the product of tile row r (gate/up: r < BM / 2 gate, the rest up)
// and token n < count. Consecutive threads write consecutive rows of one token (coalesced); a
// block of THREADS threads.
template <bool GATE_UP, int BM, int THREADS = MG_THREADS, class V>
__device__ __forceinline__ void mg_write(const MoeGemmParams& p, int r0, int first, int count, V v) {
    constexpr int OUT_ROWS = GATE_UP ? BM / 2 : BM;
    for (int e = threadIdx.x; e < OUT_ROWS * count; e += THREADS) {
        const int r = e % OUT_ROWS, n = e / OUT_ROWS;
        const long long dst = (long long)(first + n) * p.rows + r0 + r;
        if (GATE_UP) {
            p.act[dst] = f2h_sat(silu(v(r, n)) * v(OUT_ROWS + r, n));
        } else {
            p.y[dst] = v(r, n);
        }
    }
}
