// Decode GEMV on quantized weights with int8 activations (the default for 1..8 tokens):
// - quantize_x_q8: the step input x [n_tok, x_stride] f32 -> qx, ql [n_tok, cols] int8 (hi
//   and lo planes) and xs [n_tok, cols / 16] float2 (layout and rounding: quant.cuh, "int8
//   activations"), once per matrix input (the parts of a mixed QKV, gate/up share it);
// - gemvq8_<fmt>_n{1,2,4,8} / gemvq8_swiglu_<fmt>_n*: out[t, r] (+)= sum_c W[r, c] x[t, c]
//   with W packed (quant.cuh), f32 accumulation.
// A block of 4 warps is 2 groups of 64 threads; a group owns R = 4 weight rows (2 with the _n1r2
// entries; H200, round 1: 4 rows read the Qwen3-8B head at 82% / 89% of the copy bandwidth
// (Q4_K / Q6_K), 2 rows at 68% / 79%) and its 64 threads stride over the rows' units, so
// that a block covers few rows (small matrices still fill the GPU) and each thread's activation
// loads serve R rows. Per run of 16 weights and token: 4 dp4a on the hi codes, the sum scaled
// by 254 (exact in int32), 4 dp4a on the lo codes on top, one int-to-float conversion; formats
// whose two runs share a scale (the 32-element blocks) convert once per unit. Reduction: each
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

// Four consecutive values v of a block of 32 (thread j % 8 of 8 consecutive lanes holds values
// 4 (j % 8) ..): their hi and lo codes packed as 4 bytes each, and in lanes j % 4 == 0 the
// xs entry of their run of 16. Every lane of the warp must call it (shuffles).
__device__ __forceinline__ void quantize_quad(const float4 v, unsigned& wh, unsigned& wl, float2& xs) {
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
    wh = (q[0] & 0xff) | (q[1] & 0xff) << 8 | (q[2] & 0xff) << 16 | (unsigned)(q[3] & 0xff) << 24;
    wl = (l[0] & 0xff) | (l[1] & 0xff) << 8 | (l[2] & 0xff) << 16 | (unsigned)(l[3] & 0xff) << 24;
    xs = make_float2(d, __fmaf_rn(dl, (float)sl, __fmul_rn(d, (float)s)));
}

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
    unsigned wh, wl;
    float2 xs;
    quantize_quad(v, wh, wl, xs);
    if (!live) return;
    reinterpret_cast<unsigned*>(p.qx + (long long)t * p.cols)[c4] = wh;
    reinterpret_cast<unsigned*>(p.ql + (long long)t * p.cols)[c4] = wl;
    if ((c4 & 3) == 0) p.xs[(long long)t * (p.cols / 16) + c4 / 4] = xs;
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
    const float* x;    // the gemvq8x_* entries: the f32 input [n_tok, x_stride] they quantize
    int x_stride;
    float eps;         // gemvq8xn_*: the norm's epsilon
    const float* nw;   // gemvq8xn_*: the norm weight [cols] f32
};

// Where the dot products read the int8 activations: the planes in global memory (written by
// quantize_x_q8 or a fused norm), or in shared memory (SM: the gemvq8x_* entries quantized
// their f32 input there).
struct XQ {
    const u8_t* qx;    // [n_tok, cols]
    const u8_t* ql;    // [n_tok, cols]
    const float2* xs;  // [n_tok, cols / 16]
};
template <bool SM> __device__ __forceinline__ uint4 ldx16(const u8_t* p) {
    return SM ? *reinterpret_cast<const uint4*>(p) : ld16(p);
}
template <bool SM> __device__ __forceinline__ float2 ldxs(const float2* p) { return SM ? *p : __ldg(p); }
template <bool SM> __device__ __forceinline__ float4 ldxs4(const float2* p) {
    return SM ? *reinterpret_cast<const float4*>(p) : __ldg(reinterpret_cast<const float4*>(p));
}

#define GEMVQ8_WARPS 4
#define GEMVQ8_GROUP 64  // threads sharing one group of rows
#define GEMVQ8_UNROLL 2

// Whether both runs of a unit share one weight scale (a, b) and one activation block of 32:
// the 32-element block formats (start(u, 1) = start(u, 0) + 16).
template <class F> struct SameScale { enum { V = F::UE == 32 && F::RUNS == 2 && F::QB <= 32 }; };

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
template <class F, int NT, int NR, bool SM, bool SAME = SameScale<F>::V>
struct UnitDot {
    static __device__ __forceinline__ void add(const GemvQ8Params& p, const XQ& x, const typename F::Raw (&raw)[NR],
                                               int u, float (&acc)[NR][NT]) {
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
                    const uint4 qh = ldx16<SM>(x.qx + (long long)t * p.cols + st);
                    const uint4 ql = ldx16<SM>(x.ql + (long long)t * p.cols + st);
                    const float2 xs = ldxs<SM>(x.xs + (long long)t * xs_row + st / 16);
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
template <class F, int NT, int NR, bool SM>
struct UnitDot<F, NT, NR, SM, true> {
    static __device__ __forceinline__ void add(const GemvQ8Params& p, const XQ& x, const typename F::Raw (&raw)[NR],
                                               int u, float (&acc)[NR][NT]) {
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
                const u8_t* hx = x.qx + (long long)t * p.cols + st;
                const u8_t* lx = x.ql + (long long)t * p.cols + st;
                const uint4 h0 = ldx16<SM>(hx), h1 = ldx16<SM>(hx + 16), l0 = ldx16<SM>(lx), l1 = ldx16<SM>(lx + 16);
                const float4 xs = ldxs4<SM>(x.xs + (long long)t * xs_row + st / 16);
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
// row j % NR, token j / NR (others: garbage). All threads of the block (G groups) must call it.
template <class F, int NT, int NR, int G, bool SM>
__device__ __forceinline__ float group_sums_q8(const GemvQ8Params& p, const XQ& x, const QRow* rows) {
    const int gt = threadIdx.x % GEMVQ8_GROUP;
    const int units = p.cols / F::UE;
    float acc[NR][NT];
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
    for (int u0 = gt; u0 < units; u0 += GEMVQ8_GROUP * GEMVQ8_UNROLL) {
        typename F::Raw raw[GEMVQ8_UNROLL][NR];
#pragma unroll
        for (int k = 0; k < GEMVQ8_UNROLL; ++k)
#pragma unroll
            for (int r = 0; r < NR; ++r)
                if (u0 + GEMVQ8_GROUP * k < units) raw[k][r] = F::load(rows[r], u0 + GEMVQ8_GROUP * k);
#pragma unroll
        for (int k = 0; k < GEMVQ8_UNROLL; ++k) {
            if (u0 + GEMVQ8_GROUP * k >= units) break;
            UnitDot<F, NT, NR, SM>::add(p, x, raw[k], u0 + GEMVQ8_GROUP * k, acc);
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
    __shared__ float red[2 * G][V];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (lane % (WARP / V) == 0) red[warp][warp_sum_index<V>()] = v[0];
    __syncthreads();
    const int gw = warp & ~1;  // the group's first warp
    return gt < V ? red[gw][gt] + red[gw + 1][gt] : 0.0f;
}

// The input planes in global memory (quantize_x_q8 or a fused norm wrote them).
__device__ __forceinline__ XQ xq_global(const GemvQ8Params& p) { return {p.qx, p.ql, p.xs}; }

// The R weight rows of group g of block b: output rows (G b + g) R .. + R (clamped: the last
// block's spare rows read the last row and write nothing).
template <int R, int G>
__device__ __forceinline__ void plain_rows(const GemvQ8Params& p, QRow (&rows)[R]) {
    const int row0 = (blockIdx.x * G + threadIdx.x / GEMVQ8_GROUP) * R;
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = q_row(p.qs, p.aux, min(row0 + r, p.rows - 1), p.qs_row, p.aux_row);
}

// The SwiGLU form: R gate rows, then the R up rows of the same outputs (p.rows further on).
template <int R, int G>
__device__ __forceinline__ void swiglu_rows(const GemvQ8Params& p, QRow (&rows)[2 * R]) {
    const int row0 = (blockIdx.x * G + threadIdx.x / GEMVQ8_GROUP) * R;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = min(row0 + r, p.rows - 1);
        rows[r] = q_row(p.qs, p.aux, row, p.qs_row, p.aux_row);
        rows[R + r] = q_row(p.qs, p.aux, (long long)p.rows + row, p.qs_row, p.aux_row);
    }
}

// Group g of block b computes output rows (G b + g) R .. + R from `rows` (plain_rows).
template <class F, int NT, int R, int G, bool SM>
__device__ __forceinline__ void gemv_q8_rows(const GemvQ8Params& p, const XQ& x, const QRow (&rows)[R]) {
    const int row0 = (blockIdx.x * G + threadIdx.x / GEMVQ8_GROUP) * R;
    const float v = group_sums_q8<F, NT, R, G, SM>(p, x, rows);
    const int j = threadIdx.x % GEMVQ8_GROUP, r = j % R, t = j / R;
    if (j < R * NT && t < p.n_tok && row0 + r < p.rows) {
        const int row = row0 + r;
        float* o = p.out + (long long)t * p.out_stride + row;
        const float y = v + (p.bias ? p.bias[row] : 0.0f);
        *o = p.accumulate ? *o + y : y;
    }
}

// Output rows (G b + g) R .. + R from their gate and up rows (swiglu_rows).
template <class F, int NT, int R, int G, bool SM>
__device__ __forceinline__ void gemv_swiglu_q8_rows(const GemvQ8Params& p, const XQ& x, const QRow (&rows)[2 * R]) {
    const int row0 = (blockIdx.x * G + threadIdx.x / GEMVQ8_GROUP) * R;
    // Thread j < 2 R NT holds weight row j % 2R (gate rows first), token j / 2R: the up value
    // of the same output is R threads further on (the same warp: 2 R NT <= 32).
    const float v = group_sums_q8<F, NT, 2 * R, G, SM>(p, x, rows);
    const int j = threadIdx.x % GEMVQ8_GROUP;
    const float up = __shfl_down_sync(FULL_MASK, v, R);
    const int r = j % (2 * R), t = j / (2 * R);
    if (j < 2 * R * NT && r < R && t < p.n_tok && row0 + r < p.rows) {
        p.out[(long long)t * p.out_stride + row0 + r] = v / (1.0f + expf(-v)) * up;
    }
}

template <class F, int NT, int R>
__device__ __forceinline__ void gemv_q8_impl(const GemvQ8Params& p) {
    QRow rows[R];
    plain_rows<R, 2>(p, rows);
    gemv_q8_rows<F, NT, R, 2, false>(p, xq_global(p), rows);
}

template <class F, int NT, int R>
__device__ __forceinline__ void gemv_swiglu_q8_impl(const GemvQ8Params& p) {
    QRow rows[2 * R];
    swiglu_rows<R, 2>(p, rows);
    gemv_swiglu_q8_rows<F, NT, R, 2, false>(p, xq_global(p), rows);
}

// The prologue of the gemvq8x_* entries (a block of G groups, 64 G threads): the block
// quantizes the f32 input x [n_tok, cols] (with NORM: rmsnorm(x) * nw first, 1 token) into
// dynamic shared memory (qx [n_tok, cols], ql [n_tok, cols], xs [n_tok, cols / 16] float2:
// 2.5 n_tok cols bytes), the codes quantize_x_q8 (or rmsnorm_q8_f32) writes, from the same
// device function (quantize_quad) and, for the norm, the same sums in the same order
// (row_scale over 256 threads: rmsnorm_q8_f32's block for dim >= 256; below, the extra
// threads add zeros). So no separate quantize or norm launch (and graph node) before the
// matrix. While it quantizes, the first 128-byte lines of the group's weight rows are already
// on their way to L2 (prefetch): the weights' DRAM latency overlaps the prologue. Each block
// re-reads x (from L2): worth it where the block's weights outweigh x (qlaunch.rs chooses).
template <int NR, int G, bool NORM>
__device__ __forceinline__ XQ quantize_prologue(const GemvQ8Params& p, const QRow (&rows)[NR]) {
    extern __shared__ __align__(16) u8_t q8x_smem[];
    __shared__ float scratch[32];
    const int plane = p.n_tok * p.cols;
    u8_t* sq = q8x_smem;
    u8_t* sl = q8x_smem + plane;
    float2* sxs = reinterpret_cast<float2*>(q8x_smem + 2 * plane);
    const int gt = threadIdx.x % GEMVQ8_GROUP;
    if (128 * gt < p.qs_row) {
#pragma unroll
        for (int r = 0; r < NR; ++r) asm volatile("prefetch.global.L2 [%0];" ::"l"(rows[r].qs + 128 * gt));
    }
    // NORM: one token (the entries' NT), its 1 / rms.
    const float scale = NORM ? row_scale(p.x, p.cols, p.eps, scratch) : 1.0f;
    const int per_tok = p.cols / 4, total = p.n_tok * per_tok;
    // total is a multiple of 8 (cols of whole 32-blocks) and so is the block: every group of 8
    // lanes is whole in every round, and every lane of a warp runs the same rounds (shuffles).
    for (int i0 = 0; i0 < total; i0 += GEMVQ8_GROUP * G) {
        const int i = i0 + threadIdx.x;
        const bool live = i < total;
        const int j = live ? i : 0;
        const int t = j / per_tok, c4 = j % per_tok;
        float4 v = __ldg(reinterpret_cast<const float4*>(p.x + (long long)t * p.x_stride + 4 * c4));
        if (NORM) {
            const float4 w = __ldg(reinterpret_cast<const float4*>(p.nw + 4 * c4));
            v = make_float4(v.x * scale * w.x, v.y * scale * w.y, v.z * scale * w.z, v.w * scale * w.w);
        }
        unsigned wh, wl;
        float2 xs;
        quantize_quad(v, wh, wl, xs);
        if (live) {
            reinterpret_cast<unsigned*>(sq + t * p.cols)[c4] = wh;
            reinterpret_cast<unsigned*>(sl + t * p.cols)[c4] = wl;
            if ((c4 & 3) == 0) sxs[t * (p.cols / 16) + c4 / 4] = xs;
        }
    }
    __syncthreads();
    return XQ{sq, sl, sxs};
}

template <class F, int NT, int R, int G, bool NORM>
__device__ __forceinline__ void gemv_q8x_impl(const GemvQ8Params& p) {
    QRow rows[R];
    plain_rows<R, G>(p, rows);
    const XQ x = quantize_prologue<R, G, NORM>(p, rows);
    gemv_q8_rows<F, NT, R, G, true>(p, x, rows);
}

template <class F, int NT, int R, int G, bool NORM>
__device__ __forceinline__ void gemv_swiglu_q8x_impl(const GemvQ8Params& p) {
    QRow rows[2 * R];
    swiglu_rows<R, G>(p, rows);
    const XQ x = quantize_prologue<2 * R, G, NORM>(p, rows);
    gemv_swiglu_q8_rows<F, NT, R, G, true>(p, x, rows);
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

// The entries that quantize their own input (quantize_prologue): grid ceil(rows / (G R)),
// block 64 G threads, dynamic shared memory 2.5 n_tok cols bytes. gemvq8x_*: _n1 2 groups of 4
// rows; _n1g4 and the 2- and 4-token ones 4 groups (the prologue shared by 16 rows).
// gemvq8xn_* (1 token): rmsnorm, then the quantization, then the GEMV (4 groups, 256 threads:
// rmsnorm_q8_f32's block); the SwiGLU one with 2 output rows a group.
#define GEMVQ8X_ENTRY(kname, impl, NT, R, G, NORM, F)                                             \
    extern "C" __global__ void __launch_bounds__(GEMVQ8_GROUP * G) kname(const GemvQ8Params p) { \
        impl<F, NT, R, G, NORM>(p);                                                               \
    }
#define GEMVQ8X_ENTRIES(name, F)                                                \
    GEMVQ8X_ENTRY(gemvq8x_##name##_n1, gemv_q8x_impl, 1, 4, 2, false, F)        \
    GEMVQ8X_ENTRY(gemvq8x_##name##_n1g4, gemv_q8x_impl, 1, 4, 4, false, F)      \
    GEMVQ8X_ENTRY(gemvq8x_##name##_n2, gemv_q8x_impl, 2, 4, 4, false, F)        \
    GEMVQ8X_ENTRY(gemvq8x_##name##_n4, gemv_q8x_impl, 4, 4, 4, false, F)        \
    GEMVQ8X_ENTRY(gemvq8xn_##name##_n1, gemv_q8x_impl, 1, 4, 4, true, F)        \
    GEMVQ8X_ENTRY(gemvq8xn_swiglu_##name##_n1, gemv_swiglu_q8x_impl, 1, 2, 4, true, F)

FOR_EACH_QFORMAT(GEMVQ8X_ENTRIES)
