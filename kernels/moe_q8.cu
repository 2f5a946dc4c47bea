// One-stream (pair mode) routed experts on int8 activations: the packed expert rows dotted
// with dp4a against the two-plane int8 form of the input (kernels/quant.cuh, "int8
// activations"), instead of the f32 decode + FMA of moe.cu's pair kernels. CPU twin:
// src/backend/cuda/ops/q8x.rs `matmul_q8x` per pair (the product on the dequantized input).
//
// Each block quantizes the input rows it needs into shared memory itself (the arithmetic of
// gemv_q8.cu's quantize_x_q8, bit for bit), so the layer keeps three launches (fused router,
// gate/up, down + weighted sum) and no int8 buffer crosses launches:
//   moe_gate_up_q8_<fmt>: grid (ceil(ffn / rows per block), pairs), block 256; the block's
//     pair p reads token p / k's input h [dim] (quantized once per block, 2.5 bytes a column
//     of shared memory) and writes act[p, r] = silu(gate_e[r] . h) * (up_e[r] . h), e = ids[p];
//   moe_down_sum_q8_<fmt>: grid (ceil(dim / rows per block), tokens), block 32 k: warp j
//     quantizes act[t k + j] (its own shared memory, no block barrier) and dots the rows of
//     expert ids[t k + j]'s down slab; then x[t, r] += sum_j wts[t k + j] * part[j][r], slot 0
//     first (moe_combine_f32's order).
// Weight rows: lpr lanes (a power of two) share a row group of R rows; lane s takes units s,
// s + lpr, ...; the weight loads of UN units are issued before the activations are needed (the
// first ones before the block quantizes its input), the group reduces with shfl_xor in a
// fixed pattern: deterministic.
#include "common.cuh"
#include "quant.cuh"

struct MoeQ8Params {
    const u8_t* qs;    // slab [n_experts * rows] rows: qs part (gate for gate/up, down)
    const u8_t* aux;
    const u8_t* qs2;   // gate/up: the up slab (same format and shape); down: null
    const u8_t* aux2;
    const float* x;    // gate/up: h [n_tok, cols]; down: act [n_pairs, cols] (f32)
    const int* ids;    // [n_pairs] expert of each pair
    const float* wts;  // [n_pairs] weights (down)
    float* out;        // gate/up: act [n_pairs, rows]; down: the residual [n_tok, rows] (+=)
    int rows;          // output rows per expert
    int cols;          // row length (a multiple of 32)
    int k;             // experts per token
    int qs_row;
    int aux_row;
    int lpr;           // lanes per row group
};

// Shared-memory bytes of one quantized input row of `cols` values: hi codes, lo codes, then
// (d, d sum(q) + dl sum(l)) per run of 16.
__device__ __forceinline__ int q8_row_bytes(int cols) { return 2 * cols + cols / 2; }

// x [cols] quantized as quantize_x_q8 does (bit for bit): 8 lanes per block of 32 values, one
// float4 each, so a warp takes 4 blocks (a chunk of 128 values) at a time; warp `first` of
// `step` warps takes chunks first, first + step, ..., QN chunks' loads in flight at once. Writes
// hi / lo codes and the (d, d sum(q) + dl sum(l)) of each run of 16 into `sm`.
#define QN 4
__device__ __forceinline__ void quantize_rows_q8(const float* x, int cols, u8_t* sm, int first, int step) {
    const int lane = threadIdx.x % WARP, bi = lane / 8, c4 = lane % 8;
    const int nb = cols / 32;
    u8_t* qh = sm;
    u8_t* ql = sm + cols;
    float2* xs = reinterpret_cast<float2*>(sm + 2 * cols);
    for (int g0 = first; 4 * g0 < nb; g0 += QN * step) {
        float4 v[QN];
#pragma unroll
        for (int i = 0; i < QN; ++i) {
            const int b = 4 * (g0 + i * step) + bi;
            v[i] = b < nb ? __ldg(reinterpret_cast<const float4*>(x + 32 * b + 4 * c4)) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int i = 0; i < QN; ++i) {
            if (4 * (g0 + i * step) >= nb) break;  // warp-uniform
            const int b = 4 * (g0 + i * step) + bi;
            const Q8Quad r = q8_quad(v[i]);
            if (b < nb) {
                reinterpret_cast<unsigned*>(qh + 32 * b)[c4] = r.wh;
                reinterpret_cast<unsigned*>(ql + 32 * b)[c4] = r.wl;
                if ((c4 & 3) == 0) xs[2 * b + c4 / 4] = r.xs;
            }
        }
    }
}

// acc[r] += unit u of rows r dotted with the quantized row in shared memory `sm` (cols values).
template <class F, int NR>
__device__ __forceinline__ void unit_dot_sm(const typename F::Raw (&raw)[NR], int u, const u8_t* sm, int cols,
                                            float (&acc)[NR]) {
    const float2* xs = reinterpret_cast<const float2*>(sm + 2 * cols);
#pragma unroll
    for (int run = 0; run < F::RUNS; ++run) {
        const int st = F::start(u, run);
        const uint4 qh = *reinterpret_cast<const uint4*>(sm + st);
        const uint4 ql = *reinterpret_cast<const uint4*>(sm + cols + st);
        const float2 x2 = xs[st / 16];
        const float dx = x2.x * Q8X_LO;
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            unsigned c[4];
            float a, b;
            codes_q8<F>(raw[r], u, run, c, a, b);
            const int si = dot16_q8<F>(c, qh) * 254 + dot16_q8<F>(c, ql);
            acc[r] = fmaf(a, dx * (float)si, fmaf(b, x2.y, acc[r]));
        }
    }
}

// The partial dot products of NR weight rows with the quantized input over this lane's units
// (sub, sub + lpr, ...), UN units' loads in flight at once; `ready` is called once by every
// thread, after the first loads are issued and before the input is read (the caller quantizes
// the input there).
template <class F, int NR, int UN, class Ready>
__device__ __forceinline__ void rows_dot_sm(const QRow (&rows)[NR], int units, int sub, int lpr, const u8_t* sm,
                                            int cols, float (&acc)[NR], Ready ready) {
#pragma unroll
    for (int r = 0; r < NR; ++r) acc[r] = 0.0f;
    typename F::Raw raw[UN][NR];
    auto load = [&](int u0) {
#pragma unroll
        for (int i = 0; i < UN; ++i)
            if (u0 + lpr * i < units)
#pragma unroll
                for (int r = 0; r < NR; ++r) raw[i][r] = F::load(rows[r], u0 + lpr * i);
    };
    load(sub);
    ready();
    for (int u0 = sub; u0 < units; u0 += lpr * UN) {
        if (u0 != sub) load(u0);
#pragma unroll
        for (int i = 0; i < UN; ++i)
            if (u0 + lpr * i < units) unit_dot_sm<F, NR>(raw[i], u0 + lpr * i, sm, cols, acc);
    }
}

// Sum over the lpr lanes of a row group (xor pattern: every lane of the group gets it).
__device__ __forceinline__ float lane_group_sum(float v, int lpr) {
    for (int o = lpr >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// Units in flight per lane: 2 for formats whose unit loads fit 32 bytes, else 1 (Q5_K / Q6_K /
// Q8_0 units with 2 in flight spilled registers under the 128-register bound of the entries).
template <class F> struct PairUnits { enum { V = sizeof(typename F::Raw) <= 32 ? 2 : 1 }; };

#define GU_R 2       // output rows per row group (gate/up: 2 gate + 2 up weight rows)
#define GU_THREADS 256

template <class F>
__device__ __forceinline__ void moe_gate_up_q8_impl(const MoeQ8Params& p) {
    extern __shared__ uint4 smem_v[];
    u8_t* sm = reinterpret_cast<u8_t*>(smem_v);
    const int pair = blockIdx.y, lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int sub = lane % p.lpr;
    const int groups = (GU_THREADS / WARP) * (WARP / p.lpr);
    const int group = warp * (WARP / p.lpr) + lane / p.lpr;
    const int row0 = (blockIdx.x * groups + group) * GU_R;
    const long long base = (long long)p.ids[pair] * p.rows;
    QRow rows[2 * GU_R];
#pragma unroll
    for (int r = 0; r < GU_R; ++r) {
        const long long row = base + min(row0 + r, p.rows - 1);
        rows[r] = q_row(p.qs, p.aux, row, p.qs_row, p.aux_row);
        rows[GU_R + r] = q_row(p.qs2, p.aux2, row, p.qs_row, p.aux_row);
    }
    const float* x = p.x + (long long)(pair / p.k) * p.cols;
    float acc[2 * GU_R];
    rows_dot_sm<F, 2 * GU_R, PairUnits<F>::V>(rows, p.cols / F::UE, sub, p.lpr, sm, p.cols, acc, [&] {
        quantize_rows_q8(x, p.cols, sm, warp, GU_THREADS / WARP);
        __syncthreads();
    });
#pragma unroll
    for (int r = 0; r < 2 * GU_R; ++r) acc[r] = lane_group_sum(acc[r], p.lpr);
    if (sub == 0) {
        float* o = p.out + (long long)pair * p.rows;
#pragma unroll
        for (int r = 0; r < GU_R; ++r) {
            if (row0 + r < p.rows) {
                const float g = acc[r], u = acc[GU_R + r];
                o[row0 + r] = silu(g) * u;
            }
        }
    }
}

#define DS_R 4   // output rows per row group of the down product

template <class F>
__device__ __forceinline__ void moe_down_sum_q8_impl(const MoeQ8Params& p) {
    extern __shared__ uint4 smem_v[];
    __shared__ float part[8][32 * DS_R];  // [slot, row of the block]
    const int t = blockIdx.y, j = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int sub = lane % p.lpr, group = lane / p.lpr;
    const int per_block = (WARP / p.lpr) * DS_R;
    const int row0 = blockIdx.x * per_block;
    const int pair = t * p.k + j;
    u8_t* sm = reinterpret_cast<u8_t*>(smem_v) + j * q8_row_bytes(p.cols);
    const long long base = (long long)p.ids[pair] * p.rows;
    QRow rows[DS_R];
#pragma unroll
    for (int r = 0; r < DS_R; ++r) {
        const long long row = base + min(row0 + group * DS_R + r, p.rows - 1);
        rows[r] = q_row(p.qs, p.aux, row, p.qs_row, p.aux_row);
    }
    const float* x = p.x + (long long)pair * p.cols;
    float acc[DS_R];
    rows_dot_sm<F, DS_R, PairUnits<F>::V>(rows, p.cols / F::UE, sub, p.lpr, sm, p.cols, acc, [&] {
        quantize_rows_q8(x, p.cols, sm, 0, 1);
        __syncwarp();
    });
#pragma unroll
    for (int r = 0; r < DS_R; ++r) acc[r] = lane_group_sum(acc[r], p.lpr);
    if (sub == 0) {
#pragma unroll
        for (int r = 0; r < DS_R; ++r) part[j][group * DS_R + r] = acc[r];
    }
    __syncthreads();
    for (int r = threadIdx.x; r < per_block && row0 + r < p.rows; r += blockDim.x) {
        float s = 0.0f;
        for (int i = 0; i < p.k; ++i) s += p.wts[t * p.k + i] * part[i][r];
        p.out[(long long)t * p.rows + row0 + r] += s;
    }
}

// gate/up: grid (ceil(rows / (8 (32 / lpr) GU_R)), n_pairs), block GU_THREADS, dynamic shared
// memory q8_row_bytes(cols); down + sum: grid (ceil(rows / ((32 / lpr) DS_R)), n_tok), block
// 32 k (k <= 8), dynamic shared memory k q8_row_bytes(cols). At least 2 blocks an SM (<= 128
// registers a thread): without the bound they take 148-248 registers (ptxas, sm_90), 1 block an
// SM, and run in 2-3 waves.
#define MOE_Q8_ENTRIES(name, F)                                                                             \
    extern "C" __global__ void __launch_bounds__(GU_THREADS, 2) moe_gate_up_q8_##name(const MoeQ8Params p) { \
        moe_gate_up_q8_impl<F>(p);                                                                          \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(256, 2) moe_down_sum_q8_##name(const MoeQ8Params p) {      \
        moe_down_sum_q8_impl<F>(p);                                                                         \
    }

FOR_EACH_QFORMAT(MOE_Q8_ENTRIES)
