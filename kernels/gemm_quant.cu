// Tensor-core GEMM on packed quantized weights for steps of 9+ tokens (batched decode, prefill):
// out[t, r] (+)= sum_c W[r, c] x[t, c], W in a GGML block format (layout: quant.cuh), x the
// step input cast to F16 [ceil16(n_tok), cols] (cast_f32_f16; rows past n_tok are read, their
// results dropped). No F16 copy of W: each block dequantizes its weight tile from the packed
// blocks into shared memory (quant.cuh Stage16: Q4_K, Q6_K and Q8_0 in F16 arithmetic, the
// other formats as dequant_<fmt>_f16 writes them; CPU twin src/model/quant/staged.rs), then
// wmma m16n16k16 (F16 in, F32 accumulation; inline PTX, valid on compute_70).
//
// A block of 4 warps owns 64 rows, up to 64 tokens (tile blockIdx.z of 64 tokens: longer steps
// take gridDim.z > 1, each tile dequantizing the same weights again, mostly from the L2) and
// one range of 128-column chunks (split-K over gridDim.y
// for matrices of few rows; partial sums to part[k, n_tok, rows], added in k order by
// splitk_reduce_q below: deterministic, no atomics). Per chunk: the 64 x 128 weight
// tile (every format covers 128 columns with whole units: 4 units of 32, or 2 Q6_K units of 64)
// and the [NT16 * 16, 128] input tile are staged in shared memory; the next chunk's packed
// bytes and input are fetched into registers while this one is multiplied. Warp w computes
// rows 16 w .. 16 w + 15 for all tokens.
// Requires (checked by the launcher): rows % 64 == 0, cols % 128 == 0.
#include "common.cuh"
#include "quant.cuh"

// ---- The 64-row tile: parameters, geometry, and the fetch and staging of one 128-column chunk.
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

template <class F, int NT16>
__device__ __forceinline__ void gemm_q_impl(const GemmQParams& p) {
    constexpr int BN = NT16 * 16, LDO = BN + 4;
    constexpr int SW = QG_BM * QG_LD * 2, SX = BN * QG_LD * 2, SO = 4 * 16 * LDO * 4;
    // Staged W and x during the loop, then (after a barrier) the warps' accumulators.
    __shared__ __align__(32) unsigned char smem[SW + SX > SO ? SW + SX : SO];
    half_t* sw = reinterpret_cast<half_t*>(smem);       // [64, QG_LD]
    half_t* sx = reinterpret_cast<half_t*>(smem + SW);  // [BN, QG_LD]
    const int warp = threadIdx.x / WARP;
    const int r0 = blockIdx.x * QG_BM, t0 = blockIdx.z * BN;
    const int chunks = p.cols / QG_BK, kb = blockIdx.y, nk = gridDim.y;
    const int c_begin = (int)((long long)chunks * kb / nk), c_end = (int)((long long)chunks * (kb + 1) / nk);
    QRow rows[QG<F>::PER_THREAD];
    qg_rows<F>(p, r0, rows);
    float acc[NT16][8];
#pragma unroll
    for (int j = 0; j < NT16; ++j)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[j][i] = 0.0f;
    qg_chunks<F, NT16>(p, rows, c_begin, c_end, t0, sw, sx,
                       [&] { wmma_k_tile<NT16, QG_BK>(acc, sw + warp * 16 * QG_LD, sx, QG_LD); });
    wmma_store_rows<NT16>(p, smem, LDO, acc, r0 + warp * 16, t0, nk, kb);
}

// grid: (rows / 64, k splits, ceil(n_tok / 64)), block 128. The suffix: tokens per block tile
// (the padded count for <= 64 tokens; t64 for more).
#define GEMMQ_ENTRIES(name, F)                                                                               \
    extern "C" __global__ void __launch_bounds__(QG_THREADS) gemmq_##name##_t16(const GemmQParams p) { gemm_q_impl<F, 1>(p); } \
    extern "C" __global__ void __launch_bounds__(QG_THREADS) gemmq_##name##_t32(const GemmQParams p) { gemm_q_impl<F, 2>(p); } \
    extern "C" __global__ void __launch_bounds__(QG_THREADS) gemmq_##name##_t48(const GemmQParams p) { gemm_q_impl<F, 3>(p); } \
    extern "C" __global__ void __launch_bounds__(QG_THREADS) gemmq_##name##_t64(const GemmQParams p) { gemm_q_impl<F, 4>(p); }

FOR_EACH_QFORMAT(GEMMQ_ENTRIES)

// ---- Batch tile (steps of 9+ tokens, rows % 128 == 0): a block of 8 warps owns 128 weight
// rows and up to 64 tokens (tile blockIdx.z of 16 NT16 tokens: longer steps take gridDim.z > 1). The 64-row tile above stages a [64, 128] F16 input chunk
// (16 KB) for each 64 x 128 weight tile (4.6 KB of Q4_K): it moves more input than weights
// and loads 5 fragments for 4 MMAs. Here each staged input chunk serves 128 rows, and warp w
// computes rows 32 (w % 4) .. + 31 for tokens 16 WN (w / 4) .. + 16 WN - 1 (WN = NT16 / 2
// fragments): 2 + WN fragment loads for 2 WN MMAs. The weights are staged through the bank-
// spread slots of the grouped MoE GEMM (quant.cuh tile_slot; Stage16 as every tile here). A
// warp's token fragments past n_tok are neither multiplied nor stored; tokens past n_tok read
// the last token's row. Split-K over gridDim.y as above. Dynamic shared memory: QR_SMEM(NT16) bytes.
#define QR_BM 128
#define QR_THREADS 256
#define QR_SMEM(NT16) ((QR_BM + 16 * (NT16)) * QG_LD * 2)

template <class F> struct QR {
    enum { UPC = QG_BK / F::UE, PER_THREAD = QR_BM * UPC / QR_THREADS };
};

// Global -> registers: the packed units of chunk c (slot q: tile_slot) and the input tile
// (16 NT16 tokens x 256 bytes: 16-byte loads).
template <class F, int NT16>
__device__ __forceinline__ void qr_fetch(const GemmQParams& p, const QRow* rows, int c, int t0,
                                         typename F::Raw (&rw)[QR<F>::PER_THREAD], uint4 (&rx)[NT16]) {
    constexpr int UPC = QR<F>::UPC;
#pragma unroll
    for (int i = 0; i < QR<F>::PER_THREAD; ++i) {
        int tr, unit;
        tile_slot<F, UPC>(threadIdx.x + QR_THREADS * i, tr, unit);
        rw[i] = F::load(rows[i], c * UPC + unit);
    }
    const long long c0 = (long long)c * QG_BK;
#pragma unroll
    for (int i = 0; i < NT16; ++i) {
        const int q = threadIdx.x + QR_THREADS * i, tok = min(t0 + q / 16, p.n_tok - 1), part = q % 16;
        rx[i] = __ldg(reinterpret_cast<const uint4*>(p.x + (long long)tok * p.cols + c0 + part * 8));
    }
}

template <class F, int NT16>
__device__ __forceinline__ void gemm_qr_impl(const GemmQParams& p) {
    using G = QR<F>;
    constexpr int WN = NT16 / 2, LDO = 16 * WN + 4;
    static_assert(8 * 32 * LDO * 4 <= QR_SMEM(NT16), "the warps' output tiles fit the staging area");
    extern __shared__ __align__(128) unsigned char qr_smem[];
    half_t* sw = reinterpret_cast<half_t*>(qr_smem);                     // [128, QG_LD]
    half_t* sx = reinterpret_cast<half_t*>(qr_smem + QR_BM * QG_LD * 2);  // [16 NT16, QG_LD]
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, wm = warp % 4, wn = warp / 4;
    const int r0 = blockIdx.x * QR_BM, t0 = blockIdx.z * 16 * NT16;
    const int chunks = p.cols / QG_BK, kb = blockIdx.y, nk = gridDim.y;
    const int c_begin = (int)((long long)chunks * kb / nk), c_end = (int)((long long)chunks * (kb + 1) / nk);
    // This warp's token fragments that hold tokens (warp-uniform; the MMAs are warp-wide).
    const int frags = max(0, min(WN, (p.n_tok - t0 - 16 * WN * wn + 15) / 16));
    QRow rows[G::PER_THREAD];
#pragma unroll
    for (int i = 0; i < G::PER_THREAD; ++i) {
        int tr, unit;
        tile_slot<F, G::UPC>(threadIdx.x + QR_THREADS * i, tr, unit);
        rows[i] = q_row(p.qs, p.aux, r0 + tr, p.qs_row, p.aux_row);
    }
    float acc[2][WN][8];
#pragma unroll
    for (int m = 0; m < 2; ++m) wmma_zero(acc[m]);
    typename F::Raw rw[G::PER_THREAD];
    uint4 rx[NT16];
    if (c_begin < c_end) qr_fetch<F, NT16>(p, rows, c_begin, t0, rw, rx);
    for (int c = c_begin; c < c_end; ++c) {
        __syncthreads();  // the previous chunk's fragments are loaded
        stage_tile_chunk<F, QR_THREADS, G::UPC>(sw, rw, c);
        stage_x_tile<QR_THREADS>(sx, QG_LD, rx);
        __syncthreads();
        if (c + 1 < c_end) qr_fetch<F, NT16>(p, rows, c + 1, t0, rw, rx);
#pragma unroll
        for (int u = 0; u < QG_BK / 16; ++u) {
            unsigned a[2][8];
#pragma unroll
            for (int m = 0; m < 2; ++m) wmma_load_a(a[m], sw + (32 * wm + 16 * m) * QG_LD + u * 16, QG_LD);
#pragma unroll
            for (int j = 0; j < WN; ++j) {
                if (j >= frags) break;
                unsigned b[8];
                wmma_load_b_col(b, sx + (WN * wn + j) * 16 * QG_LD + u * 16, QG_LD);
#pragma unroll
                for (int m = 0; m < 2; ++m) wmma_mma_rc(acc[m][j], a[m], b);
            }
        }
    }
    __syncthreads();  // the staging area becomes each warp's [32, LDO] f32 output tile
    float* o = reinterpret_cast<float*>(qr_smem) + warp * 32 * LDO;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < WN; ++j)
            if (j < frags) wmma_store_c(o + 16 * m * LDO + 16 * j, acc[m][j], LDO);
    __syncwarp();
    // Consecutive lanes write consecutive rows of one token (coalesced).
    for (int e = lane; e < 32 * 16 * frags; e += WARP) {
        const int m = e % 32, n = t0 + 16 * WN * wn + e / 32;
        if (n < p.n_tok) gemm_store_one(p, r0 + 32 * wm + m, n, o[m * LDO + e / 32], nk, kb);
    }
}

// grid: (rows / 128, k splits, ceil(n_tok / (16 NT16))), block 256, QR_SMEM(NT16) bytes of
// dynamic shared memory. The suffix: tokens per block tile (t32: 9..=32 tokens, t64: more).
#define GEMMQR_ENTRIES(name, F)                                                                                   \
    extern "C" __global__ void __launch_bounds__(QR_THREADS) gemmq_##name##_r128_t32(const GemmQParams p) { gemm_qr_impl<F, 2>(p); } \
    extern "C" __global__ void __launch_bounds__(QR_THREADS) gemmq_##name##_r128_t64(const GemmQParams p) { gemm_qr_impl<F, 4>(p); }

FOR_EACH_QFORMAT(GEMMQR_ENTRIES)

// out[n, r] (+)= sum_k part[k, n, r] (k ascending) + bias[r]. grid: ceil(n_tok * rows / 256),
// block 256; nk = the GEMM's gridDim.y.
struct SplitReduceParams {
    const float* part;  // [nk, n_tok, rows]
    float* out;         // [n_tok, out_stride]
    const float* bias;  // optional [rows]
    int rows;
    int n_tok;
    int out_stride;
    int accumulate;
    int nk;
};

extern "C" __global__ void splitk_reduce_q(const SplitReduceParams p) { splitk_reduce(p); }

// ---- Prefill tile (steps above 64 tokens): a block of 8 warps owns 64 weight rows and 128
// tokens, so each 64 x 128 weight tile is dequantized once per 128 tokens (twice the reuse of
// the tiles above) by twice the threads. Per 128-column chunk: thread q dequantizes runs
// 2 (q % 4), 2 (q % 4) + 1 of row q / 4 (the 8 runs of 16 of a row's chunk, in unit order) and
// stages 8 x 16 bytes of the [128, 128] F16 input; the next chunk's packed bytes and input are
// fetched into registers while this one is multiplied. Warp w computes rows 16 (w % 4) .. + 15
// for tokens 64 (w / 4) .. + 63 (4 accumulator tiles). Tokens past n_tok read the last token's
// row (no padded input) and are not written. Dynamic shared memory: QW_SMEM bytes (opt-in above
// 48 KB, legal on sm_70). No split-K (the token tiles fill the GPU): gridDim.y == 1.
#define QW_BN 128
#define QW_THREADS 256
#define QW_SMEM ((QG_BM + QW_BN) * QG_LD * 2)

// The thread's unit of chunk c (its two runs 2 (q % 4), + 1 lie in one unit: RUNS is even) and
// its 8 x 16 bytes of the input tile.
template <class F>
__device__ __forceinline__ void qw_fetch(const GemmQParams& p, const QRow& row, int c, int t0, typename F::Raw& rw,
                                         uint4 (&rx)[8]) {
    rw = F::load(row, c * QG<F>::UPC + 2 * (threadIdx.x % 4) / F::RUNS);
    const long long c0 = (long long)c * QG_BK;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int q = threadIdx.x + QW_THREADS * i, tok = min(t0 + q / 16, p.n_tok - 1), part = q % 16;
        rx[i] = __ldg(reinterpret_cast<const uint4*>(p.x + (long long)tok * p.cols + c0 + part * 8));
    }
}

template <class F>
__device__ __forceinline__ void gemm_qw_impl(const GemmQParams& p) {
    extern __shared__ __align__(32) unsigned char qw_smem[];
    half_t* sw = reinterpret_cast<half_t*>(qw_smem);                     // [64, QG_LD]
    half_t* sx = reinterpret_cast<half_t*>(qw_smem + QG_BM * QG_LD * 2);  // [128, QG_LD]
    const int warp = threadIdx.x / WARP;
    const int wm = warp % 4, wn = warp / 4;
    const int r0 = blockIdx.x * QG_BM, t0 = blockIdx.z * QW_BN;
    const int chunks = p.cols / QG_BK;
    const int my_row = threadIdx.x / 4, s = threadIdx.x % 4;
    const QRow row = q_row(p.qs, p.aux, r0 + my_row, p.qs_row, p.aux_row);
    float acc[4][8];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[j][i] = 0.0f;
    typename F::Raw rw;
    uint4 rx[8];
    qw_fetch<F>(p, row, 0, t0, rw, rx);
    for (int c = 0; c < chunks; ++c) {
        __syncthreads();  // the previous chunk's fragments are loaded
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int j = 2 * s + k, u = c * QG<F>::UPC + j / F::RUNS, run = j % F::RUNS;
            Stage16<F>::run(rw, u, run, reinterpret_cast<uint4*>(sw + my_row * QG_LD + (F::start(u, run) - c * QG_BK)));
        }
        stage_x_tile<QW_THREADS>(sx, QG_LD, rx);
        __syncthreads();
        if (c + 1 < chunks) qw_fetch<F>(p, row, c + 1, t0, rw, rx);
        wmma_k_tile<4, QG_BK>(acc, sw + wm * 16 * QG_LD, sx + wn * 64 * QG_LD, QG_LD);
    }
    wmma_store_rows<4>(p, qw_smem, 64 + 4, acc, r0 + wm * 16, t0 + wn * 64, 1, 0);
}

// grid: (rows / 64, 1, ceil(n_tok / 128)), block 256, QW_SMEM bytes of dynamic shared memory.
#define GEMMQW_ENTRY(name, F) \
    extern "C" __global__ void __launch_bounds__(QW_THREADS) gemmq_##name##_w128(const GemmQParams p) { gemm_qw_impl<F>(p); }

FOR_EACH_QFORMAT(GEMMQW_ENTRY)
