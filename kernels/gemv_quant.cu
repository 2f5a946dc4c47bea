// Decode GEMV on quantized weights: out[t, r] (+)= sum_c W[r, c] * x[t, c] for 1..NT tokens,
// W in a GGML block format (layout: quant.cuh), dequantized in registers (f32), f32 input and
// f32 accumulation; each weight byte is read once for all NT tokens.
// One warp per row: lane i decodes units i, i + 32, ... (U units' loads issued before any is
// decoded, so several 16-byte loads are in flight per thread), then one warp_sum (fixed order:
// deterministic). The SwiGLU variant reads a gate row and its up row (stacked [2 rows, cols],
// one format) and writes silu(gate) * up, as gemv_swiglu_f16 does for F16.
#include "common.cuh"
#include "quant.cuh"

struct GemvQParams {
    const u8_t* qs;    // [rows, qs_row] bytes
    const u8_t* aux;   // [rows, aux_row] bytes
    const float* x;    // [n_tok, x_stride] f32
    float* out;        // [n_tok, out_stride] f32
    const float* bias; // optional [rows] f32, or null
    int rows;          // output rows (SwiGLU: the gate rows; the up rows follow them)
    int cols;
    int n_tok;         // <= NT of the entry point
    int x_stride;
    int out_stride;
    int accumulate;    // 1: out += W x; 0: out = W x
    int qs_row;        // bytes of one row in qs
    int aux_row;       // bytes of one row in aux
};

#define GEMVQ_WARPS 4
#define GEMVQ_UNROLL 2

// acc[t] += sum of the unit's weights times x[t] at the unit's columns.
template <class F, int NT>
__device__ __forceinline__ void unit_dot(const GemvQParams& p, const typename F::Raw& raw, int u, float* acc) {
    float w[F::RUNS][16];
    int st[F::RUNS];
    F::decode(raw, u, w, st);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        if (t < p.n_tok) {
            const float* xt = p.x + (long long)t * p.x_stride;
            float a = acc[t];
#pragma unroll
            for (int r = 0; r < F::RUNS; ++r) {
                const float4* xv = reinterpret_cast<const float4*>(xt + st[r]);
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const float4 v = __ldg(xv + q);
                    a = fmaf(w[r][4 * q + 0], v.x, a);
                    a = fmaf(w[r][4 * q + 1], v.y, a);
                    a = fmaf(w[r][4 * q + 2], v.z, a);
                    a = fmaf(w[r][4 * q + 3], v.w, a);
                }
            }
            acc[t] = a;
        }
    }
}

// Sums of NR rows (QRow each) with the NT inputs, reduced over the warp (every lane gets them).
template <class F, int NT, int NR>
__device__ __forceinline__ void row_sums(const GemvQParams& p, const QRow* rows, float (*acc)[NT]) {
    const int lane = threadIdx.x % WARP;
    const int units = p.cols / F::UE;
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
    for (int u0 = lane; u0 < units; u0 += WARP * GEMVQ_UNROLL) {
        typename F::Raw raw[NR][GEMVQ_UNROLL];
#pragma unroll
        for (int k = 0; k < GEMVQ_UNROLL; ++k)
#pragma unroll
            for (int r = 0; r < NR; ++r)
                if (u0 + WARP * k < units) raw[r][k] = F::load(rows[r], u0 + WARP * k);
#pragma unroll
        for (int k = 0; k < GEMVQ_UNROLL; ++k)
#pragma unroll
            for (int r = 0; r < NR; ++r)
                if (u0 + WARP * k < units) unit_dot<F, NT>(p, raw[r][k], u0 + WARP * k, acc[r]);
    }
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = warp_sum(acc[r][t]);
}

template <class F, int NT>
__device__ __forceinline__ void gemv_q_impl(const GemvQParams& p) {
    const int row = blockIdx.x * GEMVQ_WARPS + threadIdx.x / WARP;
    if (row >= p.rows) return;  // whole warps only: no block-wide synchronization below
    const QRow rows[1] = {q_row(p.qs, p.aux, row, p.qs_row, p.aux_row)};
    float acc[1][NT];
    row_sums<F, NT, 1>(p, rows, acc);
    const int lane = threadIdx.x % WARP;
#pragma unroll
    for (int t = 0; t < NT; ++t)
        if (lane == t && t < p.n_tok) {
            float* o = p.out + (long long)t * p.out_stride + row;
            const float v = acc[0][t] + (p.bias ? p.bias[row] : 0.0f);
            *o = p.accumulate ? *o + v : v;
        }
}

template <class F, int NT>
__device__ __forceinline__ void gemv_swiglu_q_impl(const GemvQParams& p) {
    const int row = blockIdx.x * GEMVQ_WARPS + threadIdx.x / WARP;
    if (row >= p.rows) return;
    const QRow rows[2] = {q_row(p.qs, p.aux, row, p.qs_row, p.aux_row),
                          q_row(p.qs, p.aux, (long long)p.rows + row, p.qs_row, p.aux_row)};
    float acc[2][NT];
    row_sums<F, NT, 2>(p, rows, acc);
    const int lane = threadIdx.x % WARP;
#pragma unroll
    for (int t = 0; t < NT; ++t)
        if (lane == t && t < p.n_tok) {
            const float g = acc[0][t], u = acc[1][t];
            p.out[(long long)t * p.out_stride + row] = g / (1.0f + expf(-g)) * u;
        }
}

// grid: ceil(rows / GEMVQ_WARPS), block: 32 * GEMVQ_WARPS.
#define GEMVQ_ENTRIES(name, F)                                                                          \
    extern "C" __global__ void __launch_bounds__(WARP * GEMVQ_WARPS) gemv_##name##_n1(const GemvQParams p) { gemv_q_impl<F, 1>(p); } \
    extern "C" __global__ void __launch_bounds__(WARP * GEMVQ_WARPS) gemv_##name##_n2(const GemvQParams p) { gemv_q_impl<F, 2>(p); } \
    extern "C" __global__ void __launch_bounds__(WARP * GEMVQ_WARPS) gemv_##name##_n4(const GemvQParams p) { gemv_q_impl<F, 4>(p); } \
    extern "C" __global__ void __launch_bounds__(WARP * GEMVQ_WARPS) gemv_##name##_n8(const GemvQParams p) { gemv_q_impl<F, 8>(p); } \
    extern "C" __global__ void __launch_bounds__(WARP * GEMVQ_WARPS) gemv_swiglu_##name##_n1(const GemvQParams p) { gemv_swiglu_q_impl<F, 1>(p); } \
    extern "C" __global__ void __launch_bounds__(WARP * GEMVQ_WARPS) gemv_swiglu_##name##_n2(const GemvQParams p) { gemv_swiglu_q_impl<F, 2>(p); } \
    extern "C" __global__ void __launch_bounds__(WARP * GEMVQ_WARPS) gemv_swiglu_##name##_n4(const GemvQParams p) { gemv_swiglu_q_impl<F, 4>(p); } \
    extern "C" __global__ void __launch_bounds__(WARP * GEMVQ_WARPS) gemv_swiglu_##name##_n8(const GemvQParams p) { gemv_swiglu_q_impl<F, 8>(p); }

FOR_EACH_QFORMAT(GEMVQ_ENTRIES)
