// Decode GEMV on quantized weights: out[t, r] (+)= sum_c W[r, c] * x[t, c] for 1..NT tokens,
// W in a GGML block format (layout: quant.cuh), dequantized in registers (f32), f32 input and
// f32 accumulation; each weight byte is read once for all NT tokens.
// A warp per 4 rows (1 token) or 2 rows (2..8 tokens): lane i decodes units i, i + 32, ... of
// each row (the loads of 2 units issued before any is decoded, so several 16-byte loads are in
// flight per thread), then one warp_sum per row (fixed order: deterministic). The SwiGLU variant reads a gate row and its up row (stacked [2 rows, cols],
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

// Rows of weights one warp reads: 4 at one token (so each x value loaded serves 4 rows: the
// input is f32, 8x the bytes of a Q4 weight), 2 for more tokens (register budget).
template <int NT> struct RowsPerWarp { enum { N = NT == 1 ? 4 : 2 }; };

// Sums of NR weight rows with the NT inputs, reduced over the warp (every lane gets them).
// Per unit and run: the NR rows' codes are unpacked once, then each token's 16 inputs are
// loaded once and used for all NR rows (a byte permute, a subtraction and an fma per weight).
template <class F, int NT, int NR>
__device__ __forceinline__ void row_sums(const GemvQParams& p, const QRow* rows, float (*acc)[NT]) {
    const int lane = threadIdx.x % WARP;
    const int units = p.cols / F::UE;
    zero_acc<NR, NT>(acc);
    for (int u0 = lane; u0 < units; u0 += WARP * GEMVQ_UNROLL) {
        typename F::Raw raw[GEMVQ_UNROLL][NR];
        load_round<F, NR, GEMVQ_UNROLL, WARP>(raw, rows, u0, units);
#pragma unroll
        for (int k = 0; k < GEMVQ_UNROLL; ++k) {
            const int u = u0 + WARP * k;
            if (u >= units) break;
#pragma unroll
            for (int run = 0; run < F::RUNS; ++run) {
                // w = a * q + b per run: sum q x with the codes as floats, then
                // acc += a * sum(q x) + b * sum(x) (sum(x) shared by the NR rows).
                unsigned q[NR][4];
                float ca[NR], cb[NR];
#pragma unroll
                for (int r = 0; r < NR; ++r) F::codes(raw[k][r], u, run, q[r], ca[r], cb[r]);
                const int st = F::start(u, run);
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    if (t < p.n_tok) {
                        const float4* xv = reinterpret_cast<const float4*>(p.x + (long long)t * p.x_stride + st);
                        float4 v[4];
#pragma unroll
                        for (int i = 0; i < 4; ++i) v[i] = __ldg(xv + i);
                        run_dot_f32<NR, NT>(v, q, ca, cb, acc, t);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = warp_sum(acc[r][t]);
}

// Lane t R + r of a warp of R rows from row0 owns output (t, row0 + r): f(r, t) runs for it
// (t < n_tok, row0 + r < rows) with compile-time indices, so the sums it reads stay in registers.
template <int R, int NT, class Fn>
__device__ __forceinline__ void gemvq_own_output(int row0, int rows, int n_tok, Fn&& f) {
    const int lane = threadIdx.x % WARP;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t)
            if (lane == t * R + r && t < n_tok && row0 + r < rows) f(r, t);
}

// Warp w of block b computes output rows (b * GEMVQ_WARPS + w) * R .. + R.
template <class F, int NT>
__device__ __forceinline__ void gemv_q_impl(const GemvQParams& p) {
    constexpr int R = RowsPerWarp<NT>::N;
    const int row0 = (blockIdx.x * GEMVQ_WARPS + threadIdx.x / WARP) * R;
    if (row0 >= p.rows) return;  // whole warps only: no block-wide synchronization below
    QRow rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = q_row(p.qs, p.aux, min(row0 + r, p.rows - 1), p.qs_row, p.aux_row);
    float acc[R][NT];
    row_sums<F, NT, R>(p, rows, acc);
    gemvq_own_output<R, NT>(row0, p.rows, p.n_tok, [&](int r, int t) {
        gemv_store(p.out, p.out_stride, p.bias, p.accumulate, t, row0 + r, acc[r][t]);
    });
}

// Warp w of block b computes output rows (b * GEMVQ_WARPS + w) * R / 2 .. + R / 2 from their
// gate rows and up rows.
template <class F, int NT>
__device__ __forceinline__ void gemv_swiglu_q_impl(const GemvQParams& p) {
    constexpr int R = RowsPerWarp<NT>::N / 2;
    const int row0 = (blockIdx.x * GEMVQ_WARPS + threadIdx.x / WARP) * R;
    if (row0 >= p.rows) return;
    QRow rows[2 * R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = min(row0 + r, p.rows - 1);
        rows[r] = q_row(p.qs, p.aux, row, p.qs_row, p.aux_row);
        rows[R + r] = q_row(p.qs, p.aux, (long long)p.rows + row, p.qs_row, p.aux_row);
    }
    float acc[2 * R][NT];
    row_sums<F, NT, 2 * R>(p, rows, acc);
    gemvq_own_output<R, NT>(row0, p.rows, p.n_tok, [&](int r, int t) {
        p.out[(long long)t * p.out_stride + row0 + r] = silu(acc[r][t]) * acc[R + r][t];
    });
}

// grid: ceil(rows / (GEMVQ_WARPS * R)) with R = RowsPerWarp (halved for SwiGLU), block:
// 32 * GEMVQ_WARPS.
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
