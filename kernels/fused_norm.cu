// RMSNorm fused into the matrix product that reads its output (the layer's attention norm
// before QKV, its FFN norm before gate/up): one launch fewer per norm, and at one token a
// decode step is bound by the gaps between its ~300-450 launches as much as by its bytes.
// - rmsnorm_q8_f32: h = rmsnorm(x) (f32, [n_tok, dim]) and h quantized to the two int8 planes
//   of the int8-activation GEMV (layout and rounding: quant.cuh, "int8 activations"; the same
//   arithmetic as gemv_q8.cu's quantize_x_q8, so the planes equal rmsnorm_f32 + quantize_x_q8
//   bit for bit);
// - rmsnorm_f16_f32: h and h cast to F16 (saturated) for the tensor-core GEMM / cuBLAS (equal
//   to rmsnorm_f32 + cast_f32_f16 bit for bit);
// - gemv_norm_f16_n* / gemv_norm_swiglu_f16_n*: the F16 decode GEMV (and its SwiGLU form) on
//   rmsnorm(x) without materializing it: each block sums x^2 from the very loads its dot
//   products make (its threads cover every column once), so out = rsqrt(mean(x^2) + eps) *
//   (W (x * g)) costs no extra pass and no extra launch. Deterministic (fixed reduction order).
#include "common.cuh"
#include "quant.cuh"

struct NormQ8Params {
    const float* x;   // [n_tok, dim] f32 (the residual stream)
    const float* w;   // [dim] f32 norm weight
    float* h;         // [n_tok, dim] f32 normed output
    u8_t* qx;         // [n_tok, dim] int8 hi codes
    u8_t* ql;         // [n_tok, dim] int8 lo codes
    float2* xs;       // [n_tok, dim / 16] (d, d * sum(q) + dl * sum(l))
    half_t* x16;      // [n_tok, dim] f16 (rmsnorm_f16_f32 only)
    int n_tok;
    int dim;          // a multiple of 32
    float eps;
};

// The row's 1 / rms with rmsnorm_f32's sums (same block size, same order: same bits).
__device__ __forceinline__ float row_scale(const float* x, int dim, float eps, float* scratch) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = x[i];
        ss = fmaf(v, v, ss);
    }
    ss = block_sum(ss, scratch);
    return rsqrtf(ss / (float)dim + eps);
}

// grid: n_tok, block: the block size rmsnorm_f32 takes for `dim` (a multiple of 32).
// Thread i takes float4 groups i, i + blockDim, ...; 8 consecutive threads hold one block of
// 32 values (every thread runs every round, so the shuffles see whole warps).
extern "C" __global__ void rmsnorm_q8_f32(const NormQ8Params p) {
    __shared__ float scratch[32];
    const int t = blockIdx.x;
    const float* x = p.x + (long long)t * p.dim;
    const float scale = row_scale(x, p.dim, p.eps, scratch);
    const int n4 = p.dim / 4;
    for (int base = 0; base < n4; base += blockDim.x) {
        const int c4 = base + threadIdx.x;
        const bool live = c4 < n4;
        const int c = live ? 4 * c4 : 0;
        float vv[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) vv[k] = x[c + k] * scale * p.w[c + k];
        const Q8Quad r = q8_quad(make_float4(vv[0], vv[1], vv[2], vv[3]));
        if (!live) continue;
        *reinterpret_cast<float4*>(p.h + (long long)t * p.dim + c) = make_float4(vv[0], vv[1], vv[2], vv[3]);
        reinterpret_cast<unsigned*>(p.qx + (long long)t * p.dim)[c4] = r.wh;
        reinterpret_cast<unsigned*>(p.ql + (long long)t * p.dim)[c4] = r.wl;
        if ((c4 & 3) == 0) p.xs[(long long)t * (p.dim / 16) + c4 / 4] = r.xs;
    }
}

// grid: n_tok, block as rmsnorm_q8_f32.
extern "C" __global__ void rmsnorm_f16_f32(const NormQ8Params p) {
    __shared__ float scratch[32];
    const int t = blockIdx.x;
    const float* x = p.x + (long long)t * p.dim;
    const float scale = row_scale(x, p.dim, p.eps, scratch);
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x) {
        const float v = x[i] * scale * p.w[i];
        p.h[(long long)t * p.dim + i] = v;
        p.x16[(long long)t * p.dim + i] = f2h_sat(v);
    }
}

struct GemvNormParams {
    const half_t* w;   // [rows, cols] f16 (SwiGLU: [2 rows, cols], gate rows then up rows)
    const float* x;    // [n_tok, cols] f32, not yet normed
    const float* g;    // [cols] f32 norm weight
    float* out;        // [n_tok, out_stride] f32
    const float* bias; // optional [rows] f32, or null
    int rows;
    int cols;          // a multiple of 8
    int n_tok;         // <= NT of the entry point
    int out_stride;
    int accumulate;    // 1: out += ...; 0: out = ...
    float eps;
};

#define GN_THREADS 256
#define GN_ROWS 2

// acc + the dot product of 8 halves (one uint4) with 8 floats, in column order.
__device__ __forceinline__ float gn_dot8(const uint4 w, const float* x, float acc) {
    float a, b;
    h2x2f(w.x, a, b); acc = fmaf(a, x[0], acc); acc = fmaf(b, x[1], acc);
    h2x2f(w.y, a, b); acc = fmaf(a, x[2], acc); acc = fmaf(b, x[3], acc);
    h2x2f(w.z, a, b); acc = fmaf(a, x[4], acc); acc = fmaf(b, x[5], acc);
    h2x2f(w.w, a, b); acc = fmaf(a, x[6], acc); acc = fmaf(b, x[7], acc);
    return acc;
}

// tot[r][t] = sum_c W[r, c] x[t, c] g[c] for NR rows (null: past the end) and, in ss[t], the
// token's sum of x^2 (every column once: thread i takes 8-column groups i, i + 256, ...).
template <int NT, int NR>
__device__ __forceinline__ void gn_rows(const GemvNormParams& p, const uint4* const* wrow, float (*tot)[NT],
                                        float* ss) {
    __shared__ float red[GN_THREADS / WARP][(NR + 1) * NT];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int n8 = p.cols / 8;
    float acc[NR][NT], sq[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        sq[t] = 0.0f;
#pragma unroll
        for (int r = 0; r < NR; ++r) acc[r][t] = 0.0f;
    }
    for (int j = threadIdx.x; j < n8; j += GN_THREADS) {
        uint4 wv[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) wv[r] = wrow[r] ? __ldg(wrow[r] + j) : make_uint4(0, 0, 0, 0);
        const float4* gv = reinterpret_cast<const float4*>(p.g) + 2 * j;
        const float4 g0 = __ldg(gv), g1 = __ldg(gv + 1);
        const float gg[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t < p.n_tok) {
                const float4* xv = reinterpret_cast<const float4*>(p.x + (long long)t * p.cols) + 2 * j;
                const float4 x0 = xv[0], x1 = xv[1];
                const float xx[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                float xg[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    sq[t] = fmaf(xx[e], xx[e], sq[t]);
                    xg[e] = xx[e] * gg[e];
                }
#pragma unroll
                for (int r = 0; r < NR; ++r) acc[r][t] = gn_dot8(wv[r], xg, acc[r][t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            const float v = warp_sum(acc[r][t]);
            if (lane == 0) red[warp][r * NT + t] = v;
        }
        const float v = warp_sum(sq[t]);
        if (lane == 0) red[warp][NR * NT + t] = v;
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            float v = 0.0f;
            for (int w = 0; w < GN_THREADS / WARP; ++w) v += red[w][r * NT + t];
            tot[r][t] = v;
        }
        float v = 0.0f;
        for (int w = 0; w < GN_THREADS / WARP; ++w) v += red[w][NR * NT + t];
        ss[t] = v;
    }
}

// NR output rows a block (GN_ROWS; the _r4 / _r8 one-token entries 4 / 8: DUSTOFF_GEMV_ROWS).
template <int NT, int NR = GN_ROWS>
__device__ __forceinline__ void gemv_norm_impl(const GemvNormParams& p) {
    const int row0 = blockIdx.x * NR;
    const uint4* wrow[NR];
    f16_row_ptrs<NR, false>(p.w, p.rows, p.cols, row0, wrow);
    float tot[NR][NT], ss[NT];
    gn_rows<NT, NR>(p, wrow, tot, ss);
    gemv_own_output<NR, NT>(row0, p.rows, p.n_tok, [&](int rr, int tt) {
        const float scale = rsqrtf(ss[tt] / (float)p.cols + p.eps);
        gemv_store(p.out, p.out_stride, p.bias, p.accumulate, tt, row0 + rr, tot[rr][tt] * scale);
    });
}

template <int NT, int NR = GN_ROWS>
__device__ __forceinline__ void gemv_norm_swiglu_impl(const GemvNormParams& p) {
    const int row0 = blockIdx.x * NR;
    const uint4* wrow[2 * NR];
    f16_row_ptrs<NR, true>(p.w, p.rows, p.cols, row0, wrow);
    float tot[2 * NR][NT], ss[NT];
    gn_rows<NT, 2 * NR>(p, wrow, tot, ss);
    gemv_own_output<NR, NT>(row0, p.rows, p.n_tok, [&](int rr, int tt) {
        const float scale = rsqrtf(ss[tt] / (float)p.cols + p.eps);
        const float gt = tot[rr][tt] * scale, u = tot[NR + rr][tt] * scale;
        p.out[(long long)tt * p.out_stride + row0 + rr] = silu(gt) * u;
    });
}

// grid: ceil(rows / GN_ROWS), block: GN_THREADS.
extern "C" __global__ void __launch_bounds__(GN_THREADS) gemv_norm_f16_n1(const GemvNormParams p) { gemv_norm_impl<1>(p); }
extern "C" __global__ void __launch_bounds__(GN_THREADS) gemv_norm_f16_n2(const GemvNormParams p) { gemv_norm_impl<2>(p); }
extern "C" __global__ void __launch_bounds__(GN_THREADS) gemv_norm_f16_n4(const GemvNormParams p) { gemv_norm_impl<4>(p); }
extern "C" __global__ void __launch_bounds__(GN_THREADS) gemv_norm_f16_n8(const GemvNormParams p) { gemv_norm_impl<8>(p); }
extern "C" __global__ void __launch_bounds__(GN_THREADS) gemv_norm_swiglu_f16_n1(const GemvNormParams p) { gemv_norm_swiglu_impl<1>(p); }
extern "C" __global__ void __launch_bounds__(GN_THREADS) gemv_norm_swiglu_f16_n2(const GemvNormParams p) { gemv_norm_swiglu_impl<2>(p); }
extern "C" __global__ void __launch_bounds__(GN_THREADS) gemv_norm_swiglu_f16_n4(const GemvNormParams p) { gemv_norm_swiglu_impl<4>(p); }
extern "C" __global__ void __launch_bounds__(GN_THREADS) gemv_norm_swiglu_f16_n8(const GemvNormParams p) { gemv_norm_swiglu_impl<8>(p); }
// grid: ceil(rows / 4) and ceil(rows / 8).
extern "C" __global__ void __launch_bounds__(GN_THREADS) gemv_norm_f16_n1_r4(const GemvNormParams p) { gemv_norm_impl<1, 4>(p); }
extern "C" __global__ void __launch_bounds__(GN_THREADS) gemv_norm_f16_n1_r8(const GemvNormParams p) { gemv_norm_impl<1, 8>(p); }
extern "C" __global__ void __launch_bounds__(GN_THREADS) gemv_norm_swiglu_f16_n1_r4(const GemvNormParams p) { gemv_norm_swiglu_impl<1, 4>(p); }
extern "C" __global__ void __launch_bounds__(GN_THREADS) gemv_norm_swiglu_f16_n1_r8(const GemvNormParams p) { gemv_norm_swiglu_impl<1, 8>(p); }
