// The packed tensor-core GEMM's parameters, the 64-row tile's geometry and its fetch and
// staging of one 128-column chunk (layout and requirements: gemm_quant.cu, whose tiles use
// them). The loader pastes this file in place of its include line (after common.cuh and
// quant.cuh).
#pragma once

#define QG_BM 64
#define QG_BK 128
#define QG_LD (QG_BK + 8)  // halves per staged row (272 bytes: rows 4 banks apart)
#define QG_THREADS 128

struct GemmQParams {
    const u8_t* qs;     // [rows, qs_row] bytes
    const u8_t* aux;    // [rows, aux_row] bytes
    const half_t* x;    // [ceil16(n_tok), cols] f16 (n_tok > 64: [ceil64(n_tok), cols])
    float* out;         // [n_tok, out_stride] f32 (gridDim.y == 1)
    const float* bias;  // optional [rows] f32 (gridDim.y == 1)
    float* part;        // [gridDim.y, n_tok, rows] f32 (gridDim.y > 1)
    int rows;
    int cols;
    int n_tok;
    int out_stride;
    int accumulate;
    int qs_row;
    int aux_row;
};

// Units of one row in a 128-column chunk, and per thread in a 64-row tile.
template <class F> struct QG {
    enum { UPC = QG_BK / F::UE, PER_THREAD = QG_BM * UPC / QG_THREADS };
};

// Global -> registers: the packed units of chunk c (thread q takes unit q % UPC of row q / UPC)
// and the input tile (NT16 * 16 tokens x 256 bytes: 16-byte loads).
template <class F, int NT16>
__device__ __forceinline__ void qg_fetch(const GemmQParams& p, const QRow* rows, int c, int t0,
                                         typename F::Raw (&rw)[QG<F>::PER_THREAD], uint4 (&rx)[NT16 * 2]) {
    fetch_tile_units<F, QG_THREADS, QG<F>::UPC>(rows, c, rw);
    const long long c0 = (long long)c * QG_BK;
#pragma unroll
    for (int i = 0; i < NT16 * 2; ++i) {
        const int q = threadIdx.x + QG_THREADS * i, tok = q / 16, part = q % 16;
        rx[i] = __ldg(reinterpret_cast<const uint4*>(p.x + (long long)(t0 + tok) * p.cols + c0 + part * 8));
    }
}

// The packed rows of the thread's units (unit q % UPC of row q / UPC) in the 64-row tile at r0.
template <class F>
__device__ __forceinline__ void qg_rows(const GemmQParams& p, int r0, QRow (&rows)[QG<F>::PER_THREAD]) {
#pragma unroll
    for (int i = 0; i < QG<F>::PER_THREAD; ++i) {
        const int q = threadIdx.x + QG_THREADS * i;
        rows[i] = q_row(p.qs, p.aux, r0 + q / QG<F>::UPC, p.qs_row, p.aux_row);
    }
}

// Chunk c's fetched units as F16 into their rows of sw [64, QG_LD].
template <class F>
__device__ __forceinline__ void qg_stage(half_t* sw, const typename F::Raw (&rw)[QG<F>::PER_THREAD], int c) {
#pragma unroll
    for (int i = 0; i < QG<F>::PER_THREAD; ++i) {
        const int q = threadIdx.x + QG_THREADS * i, row = q / QG<F>::UPC;
        const int u = c * QG<F>::UPC + q % QG<F>::UPC;
#pragma unroll
        for (int k = 0; k < F::RUNS; ++k)
            Stage16<F>::run(rw[i], u, k, reinterpret_cast<uint4*>(sw + row * QG_LD + (F::start(u, k) - c * QG_BK)));
    }
}

// The 64-row tile's chunk loop over chunks c_begin .. c_end - 1: the next chunk's packed units
// and input tile are fetched into registers while mma() multiplies the staged one (sw [64,
// QG_LD], sx [16 NT16, QG_LD] F16).
template <class F, int NT16, class M>
__device__ __forceinline__ void qg_chunks(const GemmQParams& p, const QRow (&rows)[QG<F>::PER_THREAD], int c_begin,
                                          int c_end, int t0, half_t* sw, half_t* sx, M mma) {
    typename F::Raw rw[QG<F>::PER_THREAD];
    uint4 rx[NT16 * 2];
    if (c_begin < c_end) qg_fetch<F, NT16>(p, rows, c_begin, t0, rw, rx);
    for (int c = c_begin; c < c_end; ++c) {
        __syncthreads();  // the previous chunk's fragments are loaded
        qg_stage<F>(sw, rw, c);
        stage_x_tile<QG_THREADS>(sx, QG_LD, rx);
        __syncthreads();
        if (c + 1 < c_end) qg_fetch<F, NT16>(p, rows, c + 1, t0, rw, rx);
        mma();
    }
}

// Entries gemmq_<name>_<P>16 .. _<P>64 of IMPL<F, NT16> (tiles of 1..4 16-token fragments).
#define GEMMQ_TILE_ENTRIES(name, F, IMPL, P)                                                                           \
    extern "C" __global__ void __launch_bounds__(QG_THREADS) gemmq_##name##_##P##16(const GemmQParams p) { IMPL<F, 1>(p); } \
    extern "C" __global__ void __launch_bounds__(QG_THREADS) gemmq_##name##_##P##32(const GemmQParams p) { IMPL<F, 2>(p); } \
    extern "C" __global__ void __launch_bounds__(QG_THREADS) gemmq_##name##_##P##48(const GemmQParams p) { IMPL<F, 3>(p); } \
    extern "C" __global__ void __launch_bounds__(QG_THREADS) gemmq_##name##_##P##64(const GemmQParams p) { IMPL<F, 4>(p); }
