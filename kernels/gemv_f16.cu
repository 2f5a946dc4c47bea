// Decode GEMV: out[t, r] (+)= sum_c W[r, c] * x[t, c] for a few tokens t (1..NT).
// W is F16 [rows, cols] row-major (fused matrices are stored concatenated along rows: QKV as
// [q_dim + 2 kv_dim, dim], gate/up as [2 ffn, dim], so one launch reads the shared input once).
// A block of GEMV_THREADS threads computes GEMV_ROWS rows, its warps splitting the columns
// (thread i takes 16-byte loads i, i + GEMV_THREADS, ...: coalesced, and several rows' loads in
// flight per thread), then the warps' partial sums are added in shared memory in warp order.
// f32 input and f32 accumulation; each weight is read once for all NT tokens. Requires
// cols % 8 == 0 (checked by the launcher).
#include "common.cuh"

struct GemvParams {
    const half_t* w;   // [rows, cols] f16
    const float* x;    // [n_tok, x_stride] f32
    float* out;        // [n_tok, out_stride] f32
    const float* bias; // optional [rows] f32, added to every token's output, or null
    int rows;
    int cols;
    int n_tok;         // <= NT of the entry point
    int x_stride;
    int out_stride;
    int accumulate;    // 1: out += W x (residual add); 0: out = W x
};

#define GEMV_THREADS 256
#define GEMV_ROWS 2

// acc[t] += dot(8 weights of wv, x[t, 8j .. 8j + 8]) for the tokens of the launch.
template <int NT>
__device__ __forceinline__ void gemv_acc8(const GemvParams& p, const uint4 wv, const int j, float* acc) {
    float wf[8];
    h2x2f(wv.x, wf[0], wf[1]);
    h2x2f(wv.y, wf[2], wf[3]);
    h2x2f(wv.z, wf[4], wf[5]);
    h2x2f(wv.w, wf[6], wf[7]);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        if (t < p.n_tok) {
            const float4* xv = reinterpret_cast<const float4*>(p.x + (long long)t * p.x_stride) + 2 * j;
            const float4 x0 = xv[0], x1 = xv[1];
            float a = acc[t];
            a = fmaf(wf[0], x0.x, a); a = fmaf(wf[1], x0.y, a);
            a = fmaf(wf[2], x0.z, a); a = fmaf(wf[3], x0.w, a);
            a = fmaf(wf[4], x1.x, a); a = fmaf(wf[5], x1.y, a);
            a = fmaf(wf[6], x1.z, a); a = fmaf(wf[7], x1.w, a);
            acc[t] = a;
        }
    }
}

// Sums of NR weight rows (row r at wrow[r], null when past the end) with the NT token inputs;
// every thread of the block gets the totals in tot[r][t] (from shared memory).
template <int NT, int NR>
__device__ __forceinline__ void gemv_rows(const GemvParams& p, const uint4* const* wrow, float (*tot)[NT]) {
    __shared__ float red[GEMV_THREADS / WARP][NR * NT];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int n8 = p.cols / 8;
    float acc[NR][NT];
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
    for (int j = threadIdx.x; j < n8; j += GEMV_THREADS) {
        uint4 wv[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) wv[r] = wrow[r] ? __ldg(wrow[r] + j) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int r = 0; r < NR; ++r) gemv_acc8<NT>(p, wv[r], j, acc[r]);
    }
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float v = warp_sum(acc[r][t]);
            if (lane == 0) red[warp][r * NT + t] = v;
        }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            float v = 0.0f;
            for (int w = 0; w < GEMV_THREADS / WARP; ++w) v += red[w][r * NT + t];
            tot[r][t] = v;
        }
}

// NR rows a block (GEMV_ROWS; the _r4 / _r8 one-token entries take 4 / 8, more loads in flight
// per thread and fewer blocks for the small matrices: DUSTOFF_GEMV_ROWS).
template <int NT, int NR = GEMV_ROWS>
__device__ __forceinline__ void gemv_impl(const GemvParams& p) {
    const int row0 = blockIdx.x * NR;
    const uint4* wrow[NR];
    f16_row_ptrs<NR, false>(p.w, p.rows, p.cols, row0, wrow);
    float tot[NR][NT];
    gemv_rows<NT, NR>(p, wrow, tot);
    gemv_own_output<NR, NT>(row0, p.rows, p.n_tok, [&](int rr, int tt) {
        gemv_store(p.out, p.out_stride, p.bias, p.accumulate, tt, row0 + rr, tot[rr][tt]);
    });
}

// grid: ceil(rows / GEMV_ROWS), block: GEMV_THREADS.
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_f16_n1(const GemvParams p) { gemv_impl<1>(p); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_f16_n2(const GemvParams p) { gemv_impl<2>(p); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_f16_n4(const GemvParams p) { gemv_impl<4>(p); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_f16_n8(const GemvParams p) { gemv_impl<8>(p); }
// grid: ceil(rows / 4) and ceil(rows / 8).
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_f16_n1_r4(const GemvParams p) { gemv_impl<1, 4>(p); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_f16_n1_r8(const GemvParams p) { gemv_impl<1, 8>(p); }

// SwiGLU fused into the gate/up GEMV: W is [2 * rows, cols] (gate rows, then up rows); block b
// computes gate rows and up rows b * GEMV_ROWS .. + GEMV_ROWS and writes out[t, r] =
// silu(gate) * up (never accumulates, no bias). Same sums, in the same order, as gemv_f16 +
// silu_mul_f32.
template <int NT>
__device__ __forceinline__ void gemv_swiglu_impl(const GemvParams& p) {
    const int row0 = blockIdx.x * GEMV_ROWS;
    const uint4* wrow[2 * GEMV_ROWS];
    f16_row_ptrs<GEMV_ROWS, true>(p.w, p.rows, p.cols, row0, wrow);
    float tot[2 * GEMV_ROWS][NT];
    gemv_rows<NT, 2 * GEMV_ROWS>(p, wrow, tot);
    gemv_own_output<GEMV_ROWS, NT>(row0, p.rows, p.n_tok, [&](int rr, int tt) {
        p.out[(long long)tt * p.out_stride + row0 + rr] = silu(tot[rr][tt]) * tot[GEMV_ROWS + rr][tt];
    });
}

extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_swiglu_f16_n1(const GemvParams p) { gemv_swiglu_impl<1>(p); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_swiglu_f16_n2(const GemvParams p) { gemv_swiglu_impl<2>(p); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_swiglu_f16_n4(const GemvParams p) { gemv_swiglu_impl<4>(p); }
extern "C" __global__ void __launch_bounds__(GEMV_THREADS) gemv_swiglu_f16_n8(const GemvParams p) { gemv_swiglu_impl<8>(p); }
