// Decode GEMV on quantized weights with int8 activations (the default for 1..8 tokens):
// - quantize_x_q8: the step input x [n_tok, x_stride] f32 -> qx, ql [n_tok, cols] int8 (hi
//   and lo planes) and xs [n_tok, cols / 16] float2 (layout and rounding: quant.cuh, "int8
//   activations"), once per matrix input (the parts of a mixed QKV, gate/up share it);
// - gemvq8_<fmt>_n{1,2,4,8} / gemvq8_swiglu_<fmt>_n*: out[t, r] (+)= sum_c W[r, c] x[t, c]
//   with W packed (quant.cuh), 16 weights x 16 inputs per 8 dp4a, f32 accumulation.
// A warp per 4 rows (1 token) or 2 rows (2..8 tokens); lane i takes units i, i + 32, ... of each
// row (2 units' loads in flight before decoding), each token's 16 int8 inputs (one 16-byte load
// and one 8-byte scale load, twice 16 bytes of codes) serve all the warp's rows; one warp_sum per output (fixed order:
// deterministic). The SwiGLU variant reads gate rows then up rows (stacked [2 rows, cols]).
#include "common.cuh"
#include "quant.cuh"

struct QuantizeXParams {
    const float* x;  // [n_tok, x_stride] f32
    u8_t* qx;        // [n_tok, cols] int8 hi codes
    u8_t* ql;        // [n_tok, cols] int8 lo codes
    float2* xs;      // [n_tok, cols / 16] (d, d * sum(q) + dl * sum(l))
    int n_tok;
    int cols;        // a multiple of 32
    int x_stride;    // a multiple of 4
};

// 8 threads per block of 32 values (one float4 each); grid: ceil(n_tok * cols / 4 / 256).
// Every thread of a warp takes part in the shuffles (no early return: the groups of 8 are whole).
extern "C" __global__ void __launch_bounds__(256) quantize_x_q8(const QuantizeXParams p) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long total = (long long)p.n_tok * (p.cols / 4);
    const bool live = i < total;
    const long long j = live ? i : 0;
    const int per_tok = p.cols / 4;
    const int t = (int)(j / per_tok), c4 = (int)(j % per_tok);
    const float4 v = *reinterpret_cast<const float4*>(p.x + (long long)t * p.x_stride + 4 * c4);
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    const float dl = __fmul_rn(d, Q8X_LO);
    const float idl = dl > 0.0f ? 1.0f / dl : 0.0f;
    const float vv[4] = {v.x, v.y, v.z, v.w};
    int q[4], l[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        q[k] = __float2int_rn(__fmul_rn(vv[k], id));
        const float r = __fmaf_rn(-d, (float)q[k], vv[k]);
        l[k] = max(-127, min(127, __float2int_rn(__fmul_rn(r, idl))));
    }
    int s = q[0] + q[1] + q[2] + q[3], sl = l[0] + l[1] + l[2] + l[3];
    s += __shfl_xor_sync(FULL_MASK, s, 1);
    s += __shfl_xor_sync(FULL_MASK, s, 2);
    sl += __shfl_xor_sync(FULL_MASK, sl, 1);
    sl += __shfl_xor_sync(FULL_MASK, sl, 2);
    if (!live) return;
    const unsigned wh = (q[0] & 0xff) | (q[1] & 0xff) << 8 | (q[2] & 0xff) << 16 | (unsigned)(q[3] & 0xff) << 24;
    const unsigned wl = (l[0] & 0xff) | (l[1] & 0xff) << 8 | (l[2] & 0xff) << 16 | (unsigned)(l[3] & 0xff) << 24;
    reinterpret_cast<unsigned*>(p.qx + (long long)t * p.cols)[c4] = wh;
    reinterpret_cast<unsigned*>(p.ql + (long long)t * p.cols)[c4] = wl;
    if ((c4 & 3) == 0) {
        const float sum = __fmaf_rn(dl, (float)sl, __fmul_rn(d, (float)s));
        p.xs[(long long)t * (p.cols / 16) + c4 / 4] = make_float2(d, sum);
    }
}

struct GemvQ8Params {
    const u8_t* qs;    // [rows, qs_row] bytes
    const u8_t* aux;   // [rows, aux_row] bytes
    const u8_t* qx;    // [n_tok, cols] int8 hi codes
    const u8_t* ql;    // [n_tok, cols] int8 lo codes
    const float2* xs;  // [n_tok, cols / 16]
    float* out;        // [n_tok, out_stride] f32
    const float* bias; // optional [rows] f32, or null
    int rows;          // output rows (SwiGLU: the gate rows; the up rows follow them)
    int cols;
    int n_tok;         // <= NT of the entry point
    int out_stride;
    int accumulate;    // 1: out += W x; 0: out = W x
    int qs_row;
    int aux_row;
};

#define GEMVQ8_WARPS 4
#define GEMVQ8_UNROLL 2
// Weight rows per warp: 4 at one token, 2 at more (the entries below); the _n1r2 entries
// (DUSTOFF_QGEMV_ROWS=2) read 2 rows per warp at one token, with twice the warps.

// Sums of NR weight rows with the NT int8 inputs, reduced over the warp.
template <class F, int NT, int NR>
__device__ __forceinline__ void row_sums_q8(const GemvQ8Params& p, const QRow* rows, float (*acc)[NT]) {
    const int lane = threadIdx.x % WARP;
    const int units = p.cols / F::UE;
    const int xs_row = p.cols / 16;
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
    for (int u0 = lane; u0 < units; u0 += WARP * GEMVQ8_UNROLL) {
        typename F::Raw raw[GEMVQ8_UNROLL][NR];
#pragma unroll
        for (int k = 0; k < GEMVQ8_UNROLL; ++k)
#pragma unroll
            for (int r = 0; r < NR; ++r)
                if (u0 + WARP * k < units) raw[k][r] = F::load(rows[r], u0 + WARP * k);
#pragma unroll
        for (int k = 0; k < GEMVQ8_UNROLL; ++k) {
            const int u = u0 + WARP * k;
            if (u >= units) break;
#pragma unroll
            for (int run = 0; run < F::RUNS; ++run) {
                unsigned c[NR][4];
                float ca[NR], cb[NR];
#pragma unroll
                for (int r = 0; r < NR; ++r) codes_q8<F>(raw[k][r], u, run, c[r], ca[r], cb[r]);
                const int st = F::start(u, run);
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    if (t < p.n_tok) {
                        const uint4 qh = ld16(p.qx + (long long)t * p.cols + st);
                        const uint4 ql = ld16(p.ql + (long long)t * p.cols + st);
                        const float2 xs = __ldg(p.xs + (long long)t * xs_row + st / 16);
#pragma unroll
                        for (int r = 0; r < NR; ++r) acc[r][t] += dot_codes_q8<F>(c[r], ca[r], cb[r], qh, ql, xs);
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

// Warp w of block b computes output rows (b * GEMVQ8_WARPS + w) * R .. + R.
template <class F, int NT, int R>
__device__ __forceinline__ void gemv_q8_impl(const GemvQ8Params& p) {
    const int row0 = (blockIdx.x * GEMVQ8_WARPS + threadIdx.x / WARP) * R;
    if (row0 >= p.rows) return;  // whole warps only: no block-wide synchronization below
    QRow rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = q_row(p.qs, p.aux, min(row0 + r, p.rows - 1), p.qs_row, p.aux_row);
    float acc[R][NT];
    row_sums_q8<F, NT, R>(p, rows, acc);
    const int lane = threadIdx.x % WARP;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t)
            if (lane == t * R + r && t < p.n_tok && row0 + r < p.rows) {
                const int row = row0 + r;
                float* o = p.out + (long long)t * p.out_stride + row;
                const float v = acc[r][t] + (p.bias ? p.bias[row] : 0.0f);
                *o = p.accumulate ? *o + v : v;
            }
}

// Warp w of block b computes output rows (b * GEMVQ8_WARPS + w) * R / 2 .. + R / 2 from their
// gate rows and up rows.
template <class F, int NT, int R>
__device__ __forceinline__ void gemv_swiglu_q8_impl(const GemvQ8Params& p) {
    const int row0 = (blockIdx.x * GEMVQ8_WARPS + threadIdx.x / WARP) * R;
    if (row0 >= p.rows) return;
    QRow rows[2 * R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = min(row0 + r, p.rows - 1);
        rows[r] = q_row(p.qs, p.aux, row, p.qs_row, p.aux_row);
        rows[R + r] = q_row(p.qs, p.aux, (long long)p.rows + row, p.qs_row, p.aux_row);
    }
    float acc[2 * R][NT];
    row_sums_q8<F, NT, 2 * R>(p, rows, acc);
    const int lane = threadIdx.x % WARP;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t)
            if (lane == t * R + r && t < p.n_tok && row0 + r < p.rows) {
                const float g = acc[r][t], u = acc[R + r][t];
                p.out[(long long)t * p.out_stride + row0 + r] = g / (1.0f + expf(-g)) * u;
            }
}

// grid: ceil(rows / (GEMVQ8_WARPS * R)) with R the output rows per warp (the SwiGLU entries
// read 2 R weight rows), block: 32 * GEMVQ8_WARPS.
#define GEMVQ8_ENTRY(kname, impl, NT, R, F) \
    extern "C" __global__ void __launch_bounds__(WARP * GEMVQ8_WARPS) kname(const GemvQ8Params p) { impl<F, NT, R>(p); }
#define GEMVQ8_ENTRIES(name, F)                                                 \
    GEMVQ8_ENTRY(gemvq8_##name##_n1, gemv_q8_impl, 1, 4, F)                     \
    GEMVQ8_ENTRY(gemvq8_##name##_n2, gemv_q8_impl, 2, 2, F)                     \
    GEMVQ8_ENTRY(gemvq8_##name##_n4, gemv_q8_impl, 4, 2, F)                     \
    GEMVQ8_ENTRY(gemvq8_##name##_n8, gemv_q8_impl, 8, 2, F)                     \
    GEMVQ8_ENTRY(gemvq8_swiglu_##name##_n1, gemv_swiglu_q8_impl, 1, 2, F)       \
    GEMVQ8_ENTRY(gemvq8_swiglu_##name##_n2, gemv_swiglu_q8_impl, 2, 1, F)       \
    GEMVQ8_ENTRY(gemvq8_swiglu_##name##_n4, gemv_swiglu_q8_impl, 4, 1, F)       \
    GEMVQ8_ENTRY(gemvq8_swiglu_##name##_n8, gemv_swiglu_q8_impl, 8, 1, F)       \
    GEMVQ8_ENTRY(gemvq8_##name##_n1r2, gemv_q8_impl, 1, 2, F)                   \
    GEMVQ8_ENTRY(gemvq8_swiglu_##name##_n1r2, gemv_swiglu_q8_impl, 1, 1, F)

FOR_EACH_QFORMAT(GEMVQ8_ENTRIES)
