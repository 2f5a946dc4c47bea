// Routed experts on int8 activations: the packed expert rows dotted with dp4a against the
// two-plane int8 form of the input (kernels/quant.cuh, "int8 activations"), instead of the f32
// decode + FMA of moe.cu's GEMV kernels. CPU twin: src/backend/cuda/q8x.rs `matmul_q8x` per
// (token, slot) pair (the product on the dequantized input).
//
// Each block quantizes the input rows it needs into shared memory itself (the arithmetic of
// gemv_q8.cu's quantize_x_q8, bit for bit), so no int8 buffer crosses launches:
//   moe_gate_up_q8_<fmt>[_g]: act[q, r] = silu(gate_e[r] . h[t]) * (up_e[r] . h[t]), block 256;
//     pair mode (few tokens): grid (row tiles, pairs), item q = pair p, e = ids[p], t = p / k;
//     grouped (_g, batches): grid (row tiles, experts), items q = offsets[e] .. offsets[e + 1]
//     (grouped positions of moe_group), t = entries[q] / k, NT items per pass, the weight
//     registers shared by them; experts nobody chose exit at once;
//   moe_down_q8_<fmt>_g: y[q, r] = down_e[r] . act[q] over the same grouping (then
//     moe_combine_f32 sums each token's rows, slot 0 first);
//   moe_down_sum_q8_<fmt>: pair mode, grid (row tiles, tokens), block 32 k: warp j quantizes
//     act[t k + j] (its own shared memory, no block barrier) and dots the rows of expert
//     ids[t k + j]'s down slab; then x[t, r] += sum_j wts[t k + j] * part[j][r], slot 0 first
//     (moe_combine_f32's order).
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
    const int* ids;      // [n_pairs] expert of each pair (pair mode)
    const int* offsets;  // [n_experts + 1] grouped positions per expert (grouped mode), else null
    const int* entries;  // [n_pairs] pair at each grouped position (grouped gate/up)
    const float* wts;    // [n_pairs] weights (down + sum)
    float* out;          // act [n_pairs, rows]; grouped down: y [n_pairs, rows]; down + sum: x [n_tok, rows] (+=)
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

// Rows xr[0 .. nr) of `cols` values quantized as quantize_x_q8 does (bit for bit), row t into
// sm + t rb: 8 lanes per block of 32 values, one float4 each, so a warp takes 4 blocks (a chunk
// of 128 values) at a time; warp `first` of `step` warps takes chunks first, first + step, ...
// of all rows, QN chunks' loads in flight at once (few: the registers bound the blocks an SM
// holds). Writes the hi / lo codes and the (d, d sum(q) + dl sum(l)) of each run of 16.
template <int NT, int QN>
__device__ __forceinline__ void quantize_rows_q8(const float* const (&xr)[NT], int nr, int cols, u8_t* sm, int rb,
                                                 int first, int step) {
    const int lane = threadIdx.x % WARP, bi = lane / 8, c4 = lane % 8;
    const int nb = cols / 32, nch = (nb + 3) / 4, total = nr * nch;
    for (int g0 = first; g0 < total; g0 += QN * step) {
        float4 v[QN];
#pragma unroll
        for (int i = 0; i < QN; ++i) {
            const int g = g0 + i * step, t = g / nch, b = 4 * (g - t * nch) + bi;
            // Row t's pointer by unrolled selects (a dynamic index would put xr in local memory).
            const float* x = xr[0];
#pragma unroll
            for (int j = 1; j < NT; ++j) x = t == j ? xr[j] : x;
            v[i] = g < total && b < nb ? __ldg(reinterpret_cast<const float4*>(x + 32 * b + 4 * c4))
                                       : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int i = 0; i < QN; ++i) {
            const int g = g0 + i * step;
            if (g >= total) break;  // warp-uniform
            const int t = g / nch, b = 4 * (g - t * nch) + bi;
            u8_t* qh = sm + t * rb;
            u8_t* ql = qh + cols;
            float2* xs = reinterpret_cast<float2*>(qh + 2 * cols);
            float amax = fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)), fmaxf(fabsf(v[i].z), fabsf(v[i].w)));
#pragma unroll
            for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
            const float d = amax / 127.0f;
            const float id = d > 0.0f ? 1.0f / d : 0.0f;
            const float dl = __fmul_rn(d, Q8X_LO);
            const float idl = dl > 0.0f ? 1.0f / dl : 0.0f;
            const float vv[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
            int q[4], l[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                q[e] = __float2int_rn(__fmul_rn(vv[e], id));
                const float r = __fmaf_rn(-d, (float)q[e], vv[e]);
                l[e] = max(-127, min(127, __float2int_rn(__fmul_rn(r, idl))));
            }
            // Sums over each run of 16 (4 lanes): integers, exact in any order.
            int s = q[0] + q[1] + q[2] + q[3], sl = l[0] + l[1] + l[2] + l[3];
            s += __shfl_xor_sync(FULL_MASK, s, 1);
            s += __shfl_xor_sync(FULL_MASK, s, 2);
            sl += __shfl_xor_sync(FULL_MASK, sl, 1);
            sl += __shfl_xor_sync(FULL_MASK, sl, 2);
            if (b < nb) {
                const unsigned wh = (q[0] & 0xff) | (q[1] & 0xff) << 8 | (q[2] & 0xff) << 16 | (unsigned)(q[3] & 0xff) << 24;
                const unsigned wl = (l[0] & 0xff) | (l[1] & 0xff) << 8 | (l[2] & 0xff) << 16 | (unsigned)(l[3] & 0xff) << 24;
                reinterpret_cast<unsigned*>(qh + 32 * b)[c4] = wh;
                reinterpret_cast<unsigned*>(ql + 32 * b)[c4] = wl;
                if ((c4 & 3) == 0) xs[2 * b + c4 / 4] = make_float2(d, __fmaf_rn(dl, (float)sl, __fmul_rn(d, (float)s)));
            }
        }
    }
}

// acc[r][t] += unit u of rows r dotted with quantized row t (< nt) in shared memory (sm + t rb).
template <class F, int NR, int NT>
__device__ __forceinline__ void unit_dot_sm(const typename F::Raw (&raw)[NR], int u, const u8_t* sm, int rb, int cols,
                                            int nt, float (&acc)[NR][NT]) {
#pragma unroll
    for (int run = 0; run < F::RUNS; ++run) {
        const int st = F::start(u, run);
        unsigned c[NR][4];
        float a[NR], b[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) codes_q8<F>(raw[r], u, run, c[r], a[r], b[r]);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t < nt) {
                const u8_t* x = sm + t * rb;
                const uint4 qh = *reinterpret_cast<const uint4*>(x + st);
                const uint4 ql = *reinterpret_cast<const uint4*>(x + cols + st);
                const float2 x2 = reinterpret_cast<const float2*>(x + 2 * cols)[st / 16];
                const float dx = x2.x * Q8X_LO;
#pragma unroll
                for (int r = 0; r < NR; ++r) {
                    const int si = dot16_q8<F>(c[r], qh) * 254 + dot16_q8<F>(c[r], ql);
                    acc[r][t] = fmaf(a[r], dx * (float)si, fmaf(b[r], x2.y, acc[r][t]));
                }
            }
        }
    }
}

// The partial dot products of NR weight rows with nt quantized inputs over this lane's units
// (sub, sub + lpr, ...), UN units' loads in flight at once; `ready` is called once by every
// thread, after the first loads are issued and before the inputs are read (the caller
// quantizes them there).
template <class F, int NR, int NT, int UN, class Ready>
__device__ __forceinline__ void rows_dot_sm(const QRow (&rows)[NR], int units, int sub, int lpr, const u8_t* sm,
                                            int rb, int cols, int nt, float (&acc)[NR][NT], Ready ready) {
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
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
            if (u0 + lpr * i < units) unit_dot_sm<F, NR, NT>(raw[i], u0 + lpr * i, sm, rb, cols, nt, acc);
    }
}

// Sum over the lpr lanes of a row group (xor pattern: every lane of the group gets it).
__device__ __forceinline__ float lane_group_sum(float v, int lpr) {
    for (int o = lpr >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

#define MAT_R 2        // output rows per row group of the gate/up and grouped down products
#define MAT_THREADS 256
#define MAT_NT 4       // grouped items per pass

// Gate/up (GATE_UP: 2 MAT_R weight rows a group, gate then up) or the grouped down product,
// pair mode (p.offsets null, one item) or grouped (NT items a pass). See the file comment.
template <class F, int NT, int UN, int QN, bool GATE_UP>
__device__ __forceinline__ void moe_mat_q8_impl(const MoeQ8Params& p) {
    constexpr int NR = GATE_UP ? 2 * MAT_R : MAT_R;
    extern __shared__ uint4 smem_v[];
    u8_t* sm = reinterpret_cast<u8_t*>(smem_v);
    int e, first, count;
    if (p.offsets) {
        e = blockIdx.y;
        first = p.offsets[e];
        count = p.offsets[e + 1] - first;
        if (count == 0) return;  // the whole block: nobody chose expert e
    } else {
        first = blockIdx.y;
        count = 1;
        e = p.ids[first];
    }
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int sub = lane % p.lpr;
    const int groups = (MAT_THREADS / WARP) * (WARP / p.lpr);
    const int group = warp * (WARP / p.lpr) + lane / p.lpr;
    const int row0 = (blockIdx.x * groups + group) * MAT_R;
    const long long base = (long long)e * p.rows;
    QRow rows[NR];
#pragma unroll
    for (int r = 0; r < MAT_R; ++r) {
        const long long row = base + min(row0 + r, p.rows - 1);
        rows[r] = q_row(p.qs, p.aux, row, p.qs_row, p.aux_row);
        if (GATE_UP) rows[MAT_R + r] = q_row(p.qs2, p.aux2, row, p.qs_row, p.aux_row);
    }
    const int rb = q8_row_bytes(p.cols);
    for (int c = 0; c < count; c += NT) {
        const int nt = min(NT, count - c);
        const float* xr[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int q = first + c + min(t, nt - 1);
            // gate/up reads the pair's token (pair / k); down reads the item's own row.
            const int row = GATE_UP ? (p.offsets ? p.entries[q] : q) / p.k : q;
            xr[t] = p.x + (long long)row * p.cols;
        }
        if (c > 0) __syncthreads();  // the previous pass's reads of the shared inputs are done
        float acc[NR][NT];
        rows_dot_sm<F, NR, NT, UN>(rows, p.cols / F::UE, sub, p.lpr, sm, rb, p.cols, nt, acc, [&] {
            quantize_rows_q8<NT, QN>(xr, nt, p.cols, sm, rb, warp, MAT_THREADS / WARP);
            __syncthreads();
        });
#pragma unroll
        for (int r = 0; r < NR; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) acc[r][t] = lane_group_sum(acc[r][t], p.lpr);
        if (sub == 0) {
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (t >= nt) break;
                float* o = p.out + (long long)(first + c + t) * p.rows;
#pragma unroll
                for (int r = 0; r < MAT_R; ++r) {
                    if (row0 + r >= p.rows) break;
                    if (GATE_UP) {
                        const float g = acc[r][t], u = acc[MAT_R + r][t];
                        o[row0 + r] = g / (1.0f + expf(-g)) * u;
                    } else {
                        o[row0 + r] = acc[r][t];
                    }
                }
            }
        }
    }
}

#define DS_R 4   // output rows per row group of the down + sum product

// Units in flight per lane in pair mode: 2 for formats whose unit loads fit 32 bytes, else 1
// (Q5_K / Q6_K / Q8_0 units with 2 in flight spilled registers under the 128-register bound).
template <class F> struct PairUnits { enum { V = sizeof(typename F::Raw) <= 32 ? 2 : 1 }; };

template <class F>
__device__ __forceinline__ void moe_down_sum_q8_impl(const MoeQ8Params& p) {
    extern __shared__ uint4 smem_v[];
    __shared__ float part[8][32 * DS_R];  // [slot, row of the block]
    const int t = blockIdx.y, j = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int sub = lane % p.lpr, group = lane / p.lpr;
    const int per_block = (WARP / p.lpr) * DS_R;
    const int row0 = blockIdx.x * per_block;
    const int pair = t * p.k + j;
    const int rb = q8_row_bytes(p.cols);
    u8_t* sm = reinterpret_cast<u8_t*>(smem_v) + j * rb;
    const long long base = (long long)p.ids[pair] * p.rows;
    QRow rows[DS_R];
#pragma unroll
    for (int r = 0; r < DS_R; ++r) {
        const long long row = base + min(row0 + group * DS_R + r, p.rows - 1);
        rows[r] = q_row(p.qs, p.aux, row, p.qs_row, p.aux_row);
    }
    const float* xr[1] = {p.x + (long long)pair * p.cols};
    float acc[DS_R][1];
    rows_dot_sm<F, DS_R, 1, PairUnits<F>::V>(rows, p.cols / F::UE, sub, p.lpr, sm, rb, p.cols, 1, acc, [&] {
        quantize_rows_q8<1, 4>(xr, 1, p.cols, sm, rb, 0, 1);
        __syncwarp();
    });
#pragma unroll
    for (int r = 0; r < DS_R; ++r) acc[r][0] = lane_group_sum(acc[r][0], p.lpr);
    if (sub == 0) {
#pragma unroll
        for (int r = 0; r < DS_R; ++r) part[j][group * DS_R + r] = acc[r][0];
    }
    __syncthreads();
    for (int r = threadIdx.x; r < per_block && row0 + r < p.rows; r += blockDim.x) {
        float s = 0.0f;
        for (int i = 0; i < p.k; ++i) s += p.wts[t * p.k + i] * part[i][r];
        p.out[(long long)t * p.rows + row0 + r] += s;
    }
}

// gate/up (pair mode and _g) and grouped down: grid (ceil(rows / (8 (32 / lpr) MAT_R)), pairs
// or experts), block MAT_THREADS, dynamic shared memory (items a pass) q8_row_bytes(cols);
// down + sum: grid (ceil(rows / ((32 / lpr) DS_R)), n_tok), block 32 k (k <= 8), dynamic shared
// memory k q8_row_bytes(cols). At least 2 blocks an SM (<= 128 registers a thread): with 1 (H200,
// round 1 of this session: 148-248 registers) the one-stream launches ran in 2-3 waves.
// Pair mode: PairUnits units a lane in flight, the input in 2 chunk loads a warp; grouped: 1
// unit, 4.
#define MOE_Q8_ENTRIES(name, F)                                                                                 \
    extern "C" __global__ void __launch_bounds__(MAT_THREADS, 2) moe_gate_up_q8_##name(const MoeQ8Params p) {    \
        moe_mat_q8_impl<F, 1, PairUnits<F>::V, 2, true>(p);                                                                   \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(256, 2) moe_down_sum_q8_##name(const MoeQ8Params p) {          \
        moe_down_sum_q8_impl<F>(p);                                                                             \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(MAT_THREADS, 2) moe_gate_up_q8_##name##_g(const MoeQ8Params p) { \
        moe_mat_q8_impl<F, MAT_NT, 1, 4, true>(p);                                                              \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(MAT_THREADS, 2) moe_down_q8_##name##_g(const MoeQ8Params p) {   \
        moe_mat_q8_impl<F, MAT_NT, 1, 4, false>(p);                                                             \
    }

FOR_EACH_QFORMAT(MOE_Q8_ENTRIES)
