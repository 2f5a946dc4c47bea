// Tensor-core GEMM for decode batches (2..64 tokens): out[t, r] (+)= sum_c W[r, c] x[t, c].
// W is F16 [rows, cols] row-major (read once from memory: the step is bandwidth bound), x is F16
// [>= ceil16(n_tok), cols] (the f32 activations cast by cast_f32_f16; rows past n_tok are read
// but their results are dropped: each output column depends on its own token only).
//
// wmma m16n16k16 (F16 in, F32 accumulation) written as inline PTX (no toolkit headers; valid on
// compute_70). A block of TC_WARPS warps owns 16 rows of W and all NT16 * 16 tokens; its warps
// split the columns in chunks of TC_KC (warp w takes chunks w, w + TC_WARPS, ...). Each chunk
// of W and x is fetched with coalesced 16-byte loads into registers (the next chunk's while this
// one is multiplied), staged in the warp's own shared memory and fed to wmma from there (wmma
// loads straight from global memory touch 32 bytes per row and ran at ~1.2 TB/s on the H200).
// The warps' accumulators are added through shared memory in warp order (deterministic).
// Requires (checked by the launcher): rows % 16 == 0, cols % 32 == 0, w and x 32-byte aligned.
#include "common.cuh"

struct TcParams {
    const half_t* w;   // [rows, cols] f16
    const half_t* x;   // [ceil16(n_tok), cols] f16
    float* out;        // [n_tok, out_stride] f32
    const float* bias; // optional [rows] f32, or null
    int rows;
    int cols;
    int n_tok;         // <= NT16 * 16
    int out_stride;
    int accumulate;    // 1: out += W x; 0: out = W x
};

// Warps of a block by token tiles: as many as the 48 KB of static shared memory allow, since
// the warps' loads in flight are what keeps memory busy for the matrices of few rows (o, down).
template <int NT16>
struct TcWarps {
    static constexpr int N = NT16 == 1 ? 16 : NT16 == 2 ? 12 : NT16 == 3 ? 8 : 7;
};

// One warp's staging area: a 16-row weight tile and an NT16 * 16-token input tile of TC_KC
// columns each, rows TC_LD halves apart (padded: fewer bank conflicts in the wmma loads).
#define TC_KC 32
#define TC_LD (TC_KC + 8)

// Global -> registers: the weight tile (16 rows x 64 bytes: 2 x 16-byte loads per lane) and the
// input tile (NT16 * 16 tokens x 64 bytes: 2 * NT16 loads per lane), coalesced 16-byte loads.
template <int NT16>
__device__ __forceinline__ void tc_fetch(const TcParams& p, const half_t* wb, int kc, uint4 (&ra)[2],
                                         uint4 (&rb)[2 * NT16]) {
    const int lane = threadIdx.x % WARP;
    const long long c0 = (long long)kc * TC_KC;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int q = lane + WARP * i, row = q / 4, part = q % 4;
        ra[i] = __ldg(reinterpret_cast<const uint4*>(wb + (long long)row * p.cols + c0 + part * 8));
    }
#pragma unroll
    for (int i = 0; i < 2 * NT16; ++i) {
        const int q = lane + WARP * i, tok = q / 4, part = q % 4;
        rb[i] = __ldg(reinterpret_cast<const uint4*>(p.x + (long long)tok * p.cols + c0 + part * 8));
    }
}

template <int NT16>
__device__ __forceinline__ void gemm_tc_impl(const TcParams& p) {
    constexpr int TC_WARPS = TcWarps<NT16>::N;
    constexpr int STAGE = (16 + NT16 * 16) * TC_LD;  // halves per warp
    constexpr int LD = NT16 * 16 + 4;                // floats per row of the sum buffer
    constexpr int STAGE_BYTES = TC_WARPS * STAGE * 2, RED_BYTES = TC_WARPS * 16 * LD * 4;
    // The staging tiles during the loop, then (after a barrier) the warps' accumulators.
    __shared__ __align__(32) unsigned char smem[STAGE_BYTES > RED_BYTES ? STAGE_BYTES : RED_BYTES];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    half_t* sa = reinterpret_cast<half_t*>(smem) + warp * STAGE;  // [16, TC_LD]
    half_t* sb = sa + 16 * TC_LD;                                  // [NT16 * 16, TC_LD]
    const int r0 = blockIdx.x * 16;
    const int nkc = p.cols / TC_KC;
    const half_t* wb = p.w + (long long)r0 * p.cols;
    float acc[NT16][8];
#pragma unroll
    for (int j = 0; j < NT16; ++j)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[j][i] = 0.0f;
    uint4 ra[2], rb[2 * NT16];
    // Warp w takes column chunks w, w + TC_WARPS, ...; the next chunk's loads are in flight
    // while this one's products run. kc is warp-uniform.
    if (warp < nkc) tc_fetch<NT16>(p, wb, warp, ra, rb);
    for (int kc = warp; kc < nkc; kc += TC_WARPS) {
        __syncwarp();  // the previous chunk's wmma loads are done with the tiles
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int q = lane + WARP * i;
            *reinterpret_cast<uint4*>(sa + (q / 4) * TC_LD + (q % 4) * 8) = ra[i];
        }
#pragma unroll
        for (int i = 0; i < 2 * NT16; ++i) {
            const int q = lane + WARP * i;
            *reinterpret_cast<uint4*>(sb + (q / 4) * TC_LD + (q % 4) * 8) = rb[i];
        }
        __syncwarp();
        if (kc + TC_WARPS < nkc) tc_fetch<NT16>(p, wb, kc + TC_WARPS, ra, rb);
        wmma_k_tile<NT16, TC_KC>(acc, sa, sb, TC_LD);
    }
    __syncthreads();  // every warp is done with the staging area before it becomes the sum buffer
    float* red = reinterpret_cast<float*>(smem);  // [TC_WARPS][16][LD]
#pragma unroll
    for (int j = 0; j < NT16; ++j) wmma_store_c(red + warp * 16 * LD + j * 16, acc[j], LD);
    __syncthreads();
    // Thread e sums element (m = e % 16, n = e / 16) over the warps: 16 consecutive rows of one
    // token per half-warp, so the global writes come in 64-byte runs.
    for (int e = threadIdx.x; e < 16 * NT16 * 16; e += blockDim.x) {
        const int m = e % 16, n = e / 16;
        if (n < p.n_tok) {
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < TC_WARPS; ++w) v += red[(w * 16 + m) * LD + n];
            const int row = r0 + m;
            if (p.bias) v += p.bias[row];
            float* o = p.out + (long long)n * p.out_stride + row;
            *o = p.accumulate ? *o + v : v;
        }
    }
}

// grid: rows / 16, block: TcWarps<NT16>::N * 32 (512, 384, 256, 224 threads). The suffix is the padded token count.
extern "C" __global__ void __launch_bounds__(16 * WARP) gemm_tc_f16_t16(const TcParams p) { gemm_tc_impl<1>(p); }
extern "C" __global__ void __launch_bounds__(12 * WARP) gemm_tc_f16_t32(const TcParams p) { gemm_tc_impl<2>(p); }
extern "C" __global__ void __launch_bounds__(8 * WARP) gemm_tc_f16_t48(const TcParams p) { gemm_tc_impl<3>(p); }
extern "C" __global__ void __launch_bounds__(7 * WARP) gemm_tc_f16_t64(const TcParams p) { gemm_tc_impl<4>(p); }

// ---------------------------------------------------------------------------------------------
// Wide-tile variant (rows % 64 == 0, cols % 64 == 0): a block of 4 (or 8) warps owns 64 (128) rows of W and
// one range of column chunks; the x tile of each chunk ([NT16 * 16 tokens, 64 columns]) is
// loaded once into shared memory and used by all 4 warps (the 16-row kernel above fetches it
// once per 16 rows: at 64 tokens that is 4 bytes of x from the L2 per byte of W). Warp w
// computes rows 16 w .. 16 w + 15 for every token. The next chunk's W and x are fetched into
// registers while this one is multiplied.
// Split-K (gridDim.y > 1, for matrices of few rows, so that the grid still fills the GPU):
// block (i, k) writes its partial sums to part[k, n_tok, rows]; splitk_reduce_f32 adds them in
// k order (deterministic) with the bias and the accumulate flag.
#define T2_BK 64
// Halves per staged row (144 bytes). A 160-byte stride (rows 8 banks apart) measured no faster
// on the H200 (kernel_breakdown, 2026-11-29).
#define T2_LD (T2_BK + 8)

struct Tc2Params {
    const half_t* w;    // [rows, cols] f16
    const half_t* x;    // [ceil16(n_tok), cols] f16
    float* out;         // [n_tok, out_stride] f32 (gridDim.y == 1)
    const float* bias;  // optional [rows] f32 (gridDim.y == 1)
    float* part;        // [gridDim.y, n_tok, rows] f32 (gridDim.y > 1)
    int rows;
    int cols;
    int n_tok;
    int out_stride;
    int accumulate;
    int nk;             // k splits (gridDim.y of the GEMM)
};

// WARPS warps, 16 rows each: a block tile of 16 * WARPS rows, 32 * WARPS threads.
template <int NT16, int WARPS>
struct T2 {
    static constexpr int BM = 16 * WARPS, THREADS = 32 * WARPS;
    static constexpr int W = BM * T2_BK / 8 / THREADS;                     // uint4 per thread: 4
    static constexpr int X = (NT16 * 16 * T2_BK / 8 + THREADS - 1) / THREADS;
};

template <int NT16, int WARPS>
__device__ __forceinline__ void t2_fetch(const Tc2Params& p, int r0, int c, uint4 (&rw)[T2<NT16, WARPS>::W],
                                         uint4 (&rx)[T2<NT16, WARPS>::X]) {
    using C = T2<NT16, WARPS>;
    const long long c0 = (long long)c * T2_BK;
#pragma unroll
    for (int i = 0; i < C::W; ++i) {
        const int q = threadIdx.x + C::THREADS * i, row = q / 8, part = q % 8;
        rw[i] = __ldg(reinterpret_cast<const uint4*>(p.w + (long long)(r0 + row) * p.cols + c0 + part * 8));
    }
#pragma unroll
    for (int i = 0; i < C::X; ++i) {
        const int q = threadIdx.x + C::THREADS * i, tok = q / 8, part = q % 8;
        if (tok < NT16 * 16) rx[i] = __ldg(reinterpret_cast<const uint4*>(p.x + (long long)tok * p.cols + c0 + part * 8));
    }
}

template <int NT16, int WARPS>
__device__ __forceinline__ void gemm_tc64_impl(const Tc2Params& p) {
    using C = T2<NT16, WARPS>;
    constexpr int T2_BM = C::BM, T2_THREADS = C::THREADS;
    constexpr int BN = NT16 * 16, LDO = BN + 4;
    constexpr int SW = T2_BM * T2_LD * 2, SX = BN * T2_LD * 2, SO = WARPS * 16 * LDO * 4;
    // Staged W and x during the loop, then (after a barrier) the warps' accumulators.
    __shared__ __align__(32) unsigned char smem[SW + SX > SO ? SW + SX : SO];
    half_t* sw = reinterpret_cast<half_t*>(smem);       // [64, T2_LD]
    half_t* sx = reinterpret_cast<half_t*>(smem + SW);  // [BN, T2_LD]
    const int warp = threadIdx.x / WARP;
    const int r0 = blockIdx.x * T2_BM;
    const int chunks = p.cols / T2_BK, kb = blockIdx.y, nk = gridDim.y;
    const int c_begin = (int)((long long)chunks * kb / nk), c_end = (int)((long long)chunks * (kb + 1) / nk);
    float acc[NT16][8];
#pragma unroll
    for (int j = 0; j < NT16; ++j)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[j][i] = 0.0f;
    uint4 rw[C::W], rx[C::X];
    if (c_begin < c_end) t2_fetch<NT16, WARPS>(p, r0, c_begin, rw, rx);
    for (int c = c_begin; c < c_end; ++c) {
        __syncthreads();  // the previous chunk's fragments are loaded
#pragma unroll
        for (int i = 0; i < C::W; ++i) {
            const int q = threadIdx.x + T2_THREADS * i;
            *reinterpret_cast<uint4*>(sw + (q / 8) * T2_LD + (q % 8) * 8) = rw[i];
        }
#pragma unroll
        for (int i = 0; i < C::X; ++i) {
            const int q = threadIdx.x + T2_THREADS * i;
            if (q / 8 < BN) *reinterpret_cast<uint4*>(sx + (q / 8) * T2_LD + (q % 8) * 8) = rx[i];
        }
        __syncthreads();
        if (c + 1 < c_end) t2_fetch<NT16, WARPS>(p, r0, c + 1, rw, rx);
        wmma_k_tile<NT16, T2_BK>(acc, sw + warp * 16 * T2_LD, sx, T2_LD);
    }
    wmma_store_rows<NT16>(p, smem, LDO, acc, r0 + warp * 16, 0, nk, kb);
}

// grid: (rows / 64, k splits), block: 128 (rows % 128 != 0); the _w8 entries: grid
// (rows / 128, k splits), block 256.
extern "C" __global__ void __launch_bounds__(128) gemm_tc64_f16_t16(const Tc2Params p) { gemm_tc64_impl<1, 4>(p); }
extern "C" __global__ void __launch_bounds__(128) gemm_tc64_f16_t32(const Tc2Params p) { gemm_tc64_impl<2, 4>(p); }
extern "C" __global__ void __launch_bounds__(128) gemm_tc64_f16_t48(const Tc2Params p) { gemm_tc64_impl<3, 4>(p); }
extern "C" __global__ void __launch_bounds__(128) gemm_tc64_f16_t64(const Tc2Params p) { gemm_tc64_impl<4, 4>(p); }
extern "C" __global__ void __launch_bounds__(256) gemm_tc128_f16_t16(const Tc2Params p) { gemm_tc64_impl<1, 8>(p); }
extern "C" __global__ void __launch_bounds__(256) gemm_tc128_f16_t32(const Tc2Params p) { gemm_tc64_impl<2, 8>(p); }
extern "C" __global__ void __launch_bounds__(256) gemm_tc128_f16_t48(const Tc2Params p) { gemm_tc64_impl<3, 8>(p); }
extern "C" __global__ void __launch_bounds__(256) gemm_tc128_f16_t64(const Tc2Params p) { gemm_tc64_impl<4, 8>(p); }

// out[n, r] (+)= sum_k part[k, n, r] (k ascending) + bias[r]. grid: ceil(n_tok * rows / 256), block 256.
extern "C" __global__ void splitk_reduce_f32(const Tc2Params p) { splitk_reduce(p); }
