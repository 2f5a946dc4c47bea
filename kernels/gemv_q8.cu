// Decode GEMV on quantized weights with int8 activations (the default for 1..8 tokens):
// - quantize_x_q8: the step input x [n_tok, x_stride] f32 -> qx, ql [n_tok, cols] int8 (hi
//   and lo planes) and xs [n_tok, cols / 16] float2 (layout and rounding: quant.cuh, "int8
//   activations"), once per matrix input (the parts of a mixed QKV, gate/up share it);
// - gemvq8_<fmt>_n{1,2,4,8} / gemvq8_swiglu_<fmt>_n*: out[t, r] (+)= sum_c W[r, c] x[t, c]
//   with W packed (quant.cuh), f32 accumulation.
// A block of 4 warps is 2 groups of 64 threads; a group owns R = 4 weight rows (2 with the _n1r2
// entries; on an H200 4 rows read the Qwen3-8B head at 82% / 89% of the copy bandwidth
// (Q4_K / Q6_K), 2 rows at 68% / 79%) and its 64 threads stride over the rows' units, so
// that a block covers few rows (small matrices still fill the GPU) and each thread's activation
// loads serve R rows. Per run of 16 weights and token: 4 dp4a on the hi codes, the sum scaled
// by 254 (exact in int32), 4 dp4a on the lo codes on top, one int-to-float conversion; formats
// whose two runs share a scale (the 32-element blocks, Q4_K) convert once per unit. Reduction: each
// warp sums its lanes (butterfly, fixed order), the group's two warps are added through shared
// memory in warp order: deterministic. SwiGLU: gate rows then up rows (stacked [2 rows, cols]).
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
    const Q8Quad r = q8_quad(v);
    if (!live) return;
    reinterpret_cast<unsigned*>(p.qx + (long long)t * p.cols)[c4] = r.wh;
    reinterpret_cast<unsigned*>(p.ql + (long long)t * p.cols)[c4] = r.wl;
    if ((c4 & 3) == 0) p.xs[(long long)t * (p.cols / 16) + c4 / 4] = r.xs;
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
#define GEMVQ8_GROUP 64  // threads sharing one group of rows
#define GEMVQ8_UNROLL 2

// Whether both runs of a unit share one weight scale (a, b) and one activation block of 32:
// the 32-element block formats and Q4_K in the loader's sub-block order (start(u, 1) =
// start(u, 0) + 16).
template <class F> struct SameScale { enum { V = F::UE == 32 && F::RUNS == 2 && F::QB <= 32 }; };
template <> struct SameScale<FQ4K> { enum { V = 1 }; };

// 4 dp4a of a run's codes with 16 int8 values, added to s.
template <class F>
__device__ __forceinline__ int dot16_acc(const unsigned (&c)[4], const uint4& q, int s) {
    if (SignedCodes<F>::V) {
        s = dp4a_ss(c[0], q.x, s);
        s = dp4a_ss(c[1], q.y, s);
        s = dp4a_ss(c[2], q.z, s);
        return dp4a_ss(c[3], q.w, s);
    }
    s = dp4a_us(c[0], q.x, s);
    s = dp4a_us(c[1], q.y, s);
    s = dp4a_us(c[2], q.z, s);
    return dp4a_us(c[3], q.w, s);
}

// Unit u of NR rows (raw) dotted with NT tokens, added to acc. Per run: sum_j c_j (254 q_j +
// l_j) in int32 (|sum| < 2^28 for every format), times a * d / 254, plus b * xs.y. The
// primary template: each run on its own (the K formats: a scale and an activation block per run).
template <class F, int NT, int NR, bool SAME = SameScale<F>::V>
struct UnitDot {
    static __device__ __forceinline__ void add(const GemvQ8Params& p, const typename F::Raw (&raw)[NR], int u,
                                               float (&acc)[NR][NT]) {
        const int xs_row = p.cols / 16;
#pragma unroll
        for (int run = 0; run < F::RUNS; ++run) {
            unsigned c[NR][4];
            float a[NR], b[NR];
#pragma unroll
            for (int r = 0; r < NR; ++r) codes_q8<F>(raw[r], u, run, c[r], a[r], b[r]);
            const int st = F::start(u, run);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (t < p.n_tok) {
                    const uint4 qh = ld16(p.qx + (long long)t * p.cols + st);
                    const uint4 ql = ld16(p.ql + (long long)t * p.cols + st);
                    const float2 xs = __ldg(p.xs + (long long)t * xs_row + st / 16);
                    const float dx = xs.x * Q8X_LO;
#pragma unroll
                    for (int r = 0; r < NR; ++r) {
                        const int si = dot16_acc<F>(c[r], ql, dot16_acc<F>(c[r], qh, 0) * 254);
                        acc[r][t] = fmaf(a[r], dx * (float)si, fmaf(b[r], xs.y, acc[r][t]));
                    }
                }
            }
        }
    }
};

// The 32-element blocks: both runs share (a, b) and the activation block, so one integer sum
// and one conversion per unit and token (32 hi and lo codes: 4 x 16-byte loads, the two runs'
// xs as one float4).
template <class F, int NT, int NR>
struct UnitDot<F, NT, NR, true> {
    static __device__ __forceinline__ void add(const GemvQ8Params& p, const typename F::Raw (&raw)[NR], int u,
                                               float (&acc)[NR][NT]) {
        const int xs_row = p.cols / 16;
        unsigned c[NR][2][4];
        float a[NR], b[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            codes_q8<F>(raw[r], u, 0, c[r][0], a[r], b[r]);
            codes_q8<F>(raw[r], u, 1, c[r][1], a[r], b[r]);
        }
        const int st = F::start(u, 0);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t < p.n_tok) {
                const u8_t* hx = p.qx + (long long)t * p.cols + st;
                const u8_t* lx = p.ql + (long long)t * p.cols + st;
                const uint4 h0 = ld16(hx), h1 = ld16(hx + 16), l0 = ld16(lx), l1 = ld16(lx + 16);
                const float4 xs = __ldg(reinterpret_cast<const float4*>(p.xs + (long long)t * xs_row + st / 16));
                const float dx = xs.x * Q8X_LO, ys = xs.y + xs.w;
#pragma unroll
                for (int r = 0; r < NR; ++r) {
                    int si = dot16_acc<F>(c[r][1], h1, dot16_acc<F>(c[r][0], h0, 0)) * 254;
                    si = dot16_acc<F>(c[r][1], l1, dot16_acc<F>(c[r][0], l0, si));
                    acc[r][t] = fmaf(a[r], dx * (float)si, fmaf(b[r], ys, acc[r][t]));
                }
            }
        }
    }
};

// Sums of V values over a warp, all at once (V a power of two, <= 32): each butterfly step
// sends half of the values a lane holds and keeps the other half, so V values take V - 1 +
// (5 - log2 V) shuffles instead of 5 V. Afterwards lane l holds the total of value
// (l / (32 / V)) in v[0] (with V = 1: every lane). Fixed order: deterministic.
template <int V>
__device__ __forceinline__ void warp_sum_many(float (&v)[V]) {
    const int lane = threadIdx.x % WARP;
    int n = V;
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) {
        if (n > 1) {
            const bool upper = (lane & o) != 0;
#pragma unroll
            for (int i = 0; i < V / 2; ++i) {
                if (i < n / 2) {
                    const float send = upper ? v[i] : v[i + n / 2];
                    const float keep = upper ? v[i + n / 2] : v[i];
                    v[i] = keep + __shfl_xor_sync(FULL_MASK, send, o);
                }
            }
            n /= 2;
        } else {
            v[0] += __shfl_xor_sync(FULL_MASK, v[0], o);
        }
    }
}

// This thread's lane of the warp sums of NR x NT partial sums: the value index it holds
// (warp_sum_many's order: after the step with offset o the lanes with bit o set keep the upper
// half, so value i ends at the lanes whose bits 16, 8, ... spell i).
template <int V>
__device__ __forceinline__ int warp_sum_index() {
    const int lane = threadIdx.x % WARP;
    int idx = 0, n = V;
#pragma unroll
    for (int o = WARP / 2; o > 0 && n > 1; o >>= 1) {
        if (lane & o) idx += n / 2;
        n /= 2;
    }
    return idx;
}

// The partial sums of NR weight rows with NT tokens over this thread's units (stride: the
// group), reduced over the group: returns, for thread j < NR * NT of the group, the total of
// row j % NR, token j / NR (others: garbage). All threads of the block must call it.
template <class F, int NT, int NR>
__device__ __forceinline__ float group_sums_q8(const GemvQ8Params& p, const QRow* rows) {
    const int gt = threadIdx.x % GEMVQ8_GROUP;
    const int units = p.cols / F::UE;
    float acc[NR][NT];
    zero_acc<NR, NT>(acc);
    for (int u0 = gt; u0 < units; u0 += GEMVQ8_GROUP * GEMVQ8_UNROLL) {
        typename F::Raw raw[GEMVQ8_UNROLL][NR];
        load_round<F, NR, GEMVQ8_UNROLL, GEMVQ8_GROUP>(raw, rows, u0, units);
#pragma unroll
        for (int k = 0; k < GEMVQ8_UNROLL; ++k) {
            if (u0 + GEMVQ8_GROUP * k >= units) break;
            UnitDot<F, NT, NR>::add(p, raw[k], u0 + GEMVQ8_GROUP * k, acc);
        }
    }
    constexpr int V = NR * NT;
    float v[V];
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int r = 0; r < NR; ++r) v[t * NR + r] = acc[r][t];
    warp_sum_many<V>(v);
    // Lane l holds value warp_sum_index (each value at 32 / V lanes: the first one writes).
    __shared__ float red[GEMVQ8_WARPS][V];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (lane % (WARP / V) == 0) red[warp][warp_sum_index<V>()] = v[0];
    __syncthreads();
    const int gw = warp & ~1;  // the group's first warp
    return gt < V ? red[gw][gt] + red[gw + 1][gt] : 0.0f;
}

// Group g of block b computes output rows (2 b + g) R .. + R.
template <class F, int NT, int R>
__device__ __forceinline__ void gemv_q8_impl(const GemvQ8Params& p) {
    const int row0 = (blockIdx.x * 2 + threadIdx.x / GEMVQ8_GROUP) * R;
    QRow rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = q_row(p.qs, p.aux, min(row0 + r, p.rows - 1), p.qs_row, p.aux_row);
    const float v = group_sums_q8<F, NT, R>(p, rows);
    const int j = threadIdx.x % GEMVQ8_GROUP, r = j % R, t = j / R;
    if (j < R * NT && t < p.n_tok && row0 + r < p.rows) {
        gemv_store(p.out, p.out_stride, p.bias, p.accumulate, t, row0 + r, v);
    }
}

// Group g of block b computes output rows (2 b + g) R .. + R from their R gate rows and R up
// rows (2 R weight rows).
template <class F, int NT, int R>
__device__ __forceinline__ void gemv_swiglu_q8_impl(const GemvQ8Params& p) {
    const int row0 = (blockIdx.x * 2 + threadIdx.x / GEMVQ8_GROUP) * R;
    QRow rows[2 * R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = min(row0 + r, p.rows - 1);
        rows[r] = q_row(p.qs, p.aux, row, p.qs_row, p.aux_row);
        rows[R + r] = q_row(p.qs, p.aux, (long long)p.rows + row, p.qs_row, p.aux_row);
    }
    // Thread j < 2 R NT holds weight row j % 2R (gate rows first), token j / 2R: the up value
    // of the same output is R threads further on (the same warp: 2 R NT <= 32).
    const float v = group_sums_q8<F, NT, 2 * R>(p, rows);
    const int j = threadIdx.x % GEMVQ8_GROUP;
    const float up = __shfl_down_sync(FULL_MASK, v, R);
    const int r = j % (2 * R), t = j / (2 * R);
    if (j < 2 * R * NT && r < R && t < p.n_tok && row0 + r < p.rows) {
        p.out[(long long)t * p.out_stride + row0 + r] = silu(v) * up;
    }
}

// grid: ceil(rows / (2 R)) with R the output rows per group (the SwiGLU entries read 2 R
// weight rows), block: 32 * GEMVQ8_WARPS.
#define GEMVQ8_ENTRY(kname, impl, NT, R, F) \
    extern "C" __global__ void __launch_bounds__(WARP * GEMVQ8_WARPS) kname(const GemvQ8Params p) { impl<F, NT, R>(p); }
#define GEMVQ8_ENTRIES(name, F)                                                 \
    GEMVQ8_ENTRY(gemvq8_##name##_n1, gemv_q8_impl, 1, 4, F)                     \
    GEMVQ8_ENTRY(gemvq8_##name##_n2, gemv_q8_impl, 2, 4, F)                     \
    GEMVQ8_ENTRY(gemvq8_##name##_n4, gemv_q8_impl, 4, 4, F)                     \
    GEMVQ8_ENTRY(gemvq8_##name##_n8, gemv_q8_impl, 8, 4, F)                     \
    GEMVQ8_ENTRY(gemvq8_swiglu_##name##_n1, gemv_swiglu_q8_impl, 1, 2, F)       \
    GEMVQ8_ENTRY(gemvq8_swiglu_##name##_n2, gemv_swiglu_q8_impl, 2, 2, F)       \
    GEMVQ8_ENTRY(gemvq8_swiglu_##name##_n4, gemv_swiglu_q8_impl, 4, 2, F)       \
    GEMVQ8_ENTRY(gemvq8_swiglu_##name##_n8, gemv_swiglu_q8_impl, 8, 2, F)       \
    GEMVQ8_ENTRY(gemvq8_##name##_n1r2, gemv_q8_impl, 1, 2, F)                   \
    GEMVQ8_ENTRY(gemvq8_swiglu_##name##_n1r2, gemv_swiglu_q8_impl, 1, 1, F)

FOR_EACH_QFORMAT(GEMVQ8_ENTRIES)
