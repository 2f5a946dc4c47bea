// Decode GEMV: out[t, r] (+)= sum_c W[r, c] * x[t, c] for a few tokens t (1..NT).
// W is F16 [rows, cols] row-major (fused matrices are stored concatenated along rows: QKV as
// [q_dim + 2 kv_dim, dim], gate/up as [2 ffn, dim], so one launch reads the shared input once).
// One warp per row, 16-byte loads of 8 weights, f32 input and f32 accumulation. Each weight is
// read once for all NT tokens. Requires cols % 8 == 0 (checked by the launcher).
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

#define GEMV_WARPS 4

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

template <int NT>
__device__ __forceinline__ void gemv_impl(const GemvParams& p) {
    const int lane = threadIdx.x % WARP;
    const int row = blockIdx.x * GEMV_WARPS + threadIdx.x / WARP;
    if (row >= p.rows) return;
    const uint4* wrow = reinterpret_cast<const uint4*>(p.w + (long long)row * p.cols);
    const int n8 = p.cols / 8;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
#pragma unroll 4
    for (int j = lane; j < n8; j += WARP) gemv_acc8<NT>(p, __ldg(wrow + j), j, acc);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const float s = warp_sum(acc[t]);
        if (lane == 0 && t < p.n_tok) {
            float* o = p.out + (long long)t * p.out_stride + row;
            float v = s + (p.bias ? p.bias[row] : 0.0f);
            *o = p.accumulate ? *o + v : v;
        }
    }
}

// grid: ceil(rows / GEMV_WARPS), block: 32 * GEMV_WARPS.
extern "C" __global__ void __launch_bounds__(WARP * GEMV_WARPS) gemv_f16_n1(const GemvParams p) { gemv_impl<1>(p); }
extern "C" __global__ void __launch_bounds__(WARP * GEMV_WARPS) gemv_f16_n2(const GemvParams p) { gemv_impl<2>(p); }
extern "C" __global__ void __launch_bounds__(WARP * GEMV_WARPS) gemv_f16_n4(const GemvParams p) { gemv_impl<4>(p); }
extern "C" __global__ void __launch_bounds__(WARP * GEMV_WARPS) gemv_f16_n8(const GemvParams p) { gemv_impl<8>(p); }

// SwiGLU fused into the gate/up GEMV: W is [2 * rows, cols] (gate rows, then up rows); warp r
// computes gate row r and up row rows + r and writes out[t, r] = silu(gate) * up (never
// accumulates, no bias). Same sums, in the same order, as gemv_f16 + silu_mul_f32.
template <int NT>
__device__ __forceinline__ void gemv_swiglu_impl(const GemvParams& p) {
    const int lane = threadIdx.x % WARP;
    const int row = blockIdx.x * GEMV_WARPS + threadIdx.x / WARP;
    if (row >= p.rows) return;
    const uint4* grow = reinterpret_cast<const uint4*>(p.w + (long long)row * p.cols);
    const uint4* urow = reinterpret_cast<const uint4*>(p.w + (long long)(p.rows + row) * p.cols);
    const int n8 = p.cols / 8;
    float ga[NT], ua[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        ga[t] = 0.0f;
        ua[t] = 0.0f;
    }
#pragma unroll 2
    for (int j = lane; j < n8; j += WARP) {
        const uint4 gv = __ldg(grow + j), uv = __ldg(urow + j);
        gemv_acc8<NT>(p, gv, j, ga);
        gemv_acc8<NT>(p, uv, j, ua);
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const float g = warp_sum(ga[t]);
        const float u = warp_sum(ua[t]);
        if (lane == 0 && t < p.n_tok) p.out[(long long)t * p.out_stride + row] = g / (1.0f + expf(-g)) * u;
    }
}

extern "C" __global__ void __launch_bounds__(WARP * GEMV_WARPS) gemv_swiglu_f16_n1(const GemvParams p) { gemv_swiglu_impl<1>(p); }
extern "C" __global__ void __launch_bounds__(WARP * GEMV_WARPS) gemv_swiglu_f16_n2(const GemvParams p) { gemv_swiglu_impl<2>(p); }
extern "C" __global__ void __launch_bounds__(WARP * GEMV_WARPS) gemv_swiglu_f16_n4(const GemvParams p) { gemv_swiglu_impl<4>(p); }
extern "C" __global__ void __launch_bounds__(WARP * GEMV_WARPS) gemv_swiglu_f16_n8(const GemvParams p) { gemv_swiglu_impl<8>(p); }
