// Mixture-of-experts FFN (Qwen3-MoE) on the device. The expert ids of a step live in device
// memory (written by moe_route_f32), and every kernel below reads them there, so a captured
// CUDA graph stays valid whatever the tokens choose. CPU twin: src/backend/cpu/moe.rs.
//
// Expert weights: one slab per matrix kind (gate, up, down), expert e's rows at e * rows of a
// [n_experts * rows, cols] matrix in the GPU layout of its format (quant.cuh; F16: plain
// halves), so a weight row is slab + (e * rows + r) * row bytes, computed on the device.
//
// Two ways to walk the (token, rank) pairs of a step (n pairs = tokens x k):
//   pair mode (few tokens, decode): grid.y = pair p, its expert ids[p]; rows p of act / y;
//   grouped mode (batches, prefill): grid.y = expert e, the positions offsets[e]..offsets[e+1]
//     of the grouping (moe_group), each weight row decoded once per 8 tokens of the group;
//     rows q (grouped position) of act / y.
// Both then sum y into the residual with moe_combine_f32, rank 0 first: a fixed order, no
// float atomics, the same result however the step was batched.
//
// Dot products: a row group of `lpr` lanes (a power of two up to 32, chosen for the row
// length) shares each row; lane s decodes units s, s + lpr, ... and the group reduces with
// shfl_xor in a fixed pattern (deterministic).
#include "common.cuh"
#include "quant.cuh"

// F16 rows as a "format": a unit is 8 halves (one 16-byte load).
struct FF16 {
    enum { UE = 8 };
};

struct MoeMatParams {
    const u8_t* qs;      // slab [n_experts * rows] rows: qs part (F16: the halves)
    const u8_t* aux;     // slab aux part (unused for F16)
    const u8_t* qs2;     // gate/up: the up slab (same format and shape); else null
    const u8_t* aux2;
    const float* x;      // input rows [*, x_stride] f32
    float* out;          // output rows [*, out_stride] f32
    const int* ids;      // [n_pairs] expert of each pair (pair mode)
    const int* offsets;  // [n_experts + 1] grouped positions per expert (grouped mode)
    const int* entries;  // [n_pairs] pair at each grouped position (grouped mode)
    int rows;            // output rows per expert (gate/up: expert width; down: model width)
    int cols;            // row length
    int n_pairs;
    int k;               // experts per token
    int x_stride;
    int out_stride;
    int qs_row;          // bytes of one row in qs (F16: 2 cols)
    int aux_row;         // bytes of one row in aux (F16: 0)
    int lpr;             // lanes per row group: 1, 2, 4, ..., 32
    int x_by_token;      // 1: the input row of pair p is its token p / k (gate/up reads h); 0: row p (down reads act)
    // Pair mode with a shared expert (Qwen3.5-MoE / Qwen3-Next one-stream steps): block rows
    // n_pairs + t of the grid are token t's shared expert, whose gate / up rows (the routed
    // experts' width and format) start at these (null otherwise); its output is row n_pairs + t.
    const u8_t* sh_qs;
    const u8_t* sh_aux;
    const u8_t* sh_qs2;
    const u8_t* sh_aux2;
};

// acc[r][t] += row r . x[t] over the units of this lane (u = sub, sub + lpr, ...).
template <class F, int NT, int NR>
struct RowDot {
    static __device__ __forceinline__ void run(const QRow* rows, int units, int sub, int lpr, const float* const* xs,
                                               int nt, float (&acc)[NR][NT]) {
        for (int u = sub; u < units; u += lpr) {
            typename F::Raw raw[NR];
#pragma unroll
            for (int r = 0; r < NR; ++r) raw[r] = F::load(rows[r], u);
#pragma unroll
            for (int run = 0; run < F::RUNS; ++run) {
                // w = a * q + b per run of 16: acc += a * sum(q x) + b * sum(x).
                unsigned q[NR][4];
                float ca[NR], cb[NR];
#pragma unroll
                for (int r = 0; r < NR; ++r) F::codes(raw[r], u, run, q[r], ca[r], cb[r]);
                const int st = F::start(u, run);
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    if (t < nt) {
                        const float4* xv = reinterpret_cast<const float4*>(xs[t] + st);
                        float4 v[4];
#pragma unroll
                        for (int i = 0; i < 4; ++i) v[i] = __ldg(xv + i);
                        run_dot_f32<NR, NT>(v, q, ca, cb, acc, t);
                    }
                }
            }
        }
    }
};

template <int NT, int NR>
struct RowDot<FF16, NT, NR> {
    static __device__ __forceinline__ void run(const QRow* rows, int units, int sub, int lpr, const float* const* xs,
                                               int nt, float (&acc)[NR][NT]) {
        for (int u = sub; u < units; u += lpr) {
            uint4 w[NR];
#pragma unroll
            for (int r = 0; r < NR; ++r) w[r] = ld16(rows[r].qs + 16 * u);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (t < nt) {
                    const float4* xv = reinterpret_cast<const float4*>(xs[t] + 8 * u);
                    const float4 a = __ldg(xv), b = __ldg(xv + 1);
                    const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                    for (int r = 0; r < NR; ++r) acc[r][t] += dot8(w[r], x);
                }
            }
        }
    }
};

// Sum over the lpr lanes of a row group (xor pattern: every lane of the group gets it).
__device__ __forceinline__ float group_sum(float v, int lpr) {
    for (int o = lpr >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// The items (grouped positions or one pair) a block works on, and their expert.
struct Items {
    int expert, first, count;
};

// Pair mode: expert -1 is the shared expert (block rows from n_pairs on).
__device__ __forceinline__ Items block_items(const MoeMatParams& p, int grouped) {
    if (grouped) {
        const int e = blockIdx.y;
        return {e, p.offsets[e], p.offsets[e + 1] - p.offsets[e]};
    }
    if ((int)blockIdx.y >= p.n_pairs) return {-1, (int)blockIdx.y, 1};
    return {p.ids[blockIdx.y], (int)blockIdx.y, 1};
}

// The input row of item q (a grouped position, or a pair in pair mode; from n_pairs on the
// shared expert's of token q - n_pairs).
__device__ __forceinline__ const float* item_input(const MoeMatParams& p, int grouped, int q) {
    const int pair = grouped ? p.entries[q] : q;
    const int tok = !grouped && pair >= p.n_pairs ? pair - p.n_pairs : pair / p.k;
    const int row = p.x_by_token ? tok : q;
    return p.x + (long long)row * p.x_stride;
}

// Output rows RG at a time of one expert for the items `it`, NT items per pass, the rows of row
// tile `tile` (blockDim.x / 32 * 32 / lpr * RG rows). GATE_UP: weight rows r of the gate slab
// and r of the up slab, out = silu(gate) * up; else plain. Both walks run this one body.
template <class F, int NT, int RG, bool GATE_UP>
__device__ __forceinline__ void moe_mat_rows(const MoeMatParams& p, int grouped, const Items it, int tile) {
    constexpr int NR = GATE_UP ? 2 * RG : RG;
    if (it.count == 0) return;
    const int lane = threadIdx.x % WARP;
    const int sub = lane % p.lpr;
    const int groups_per_block = (blockDim.x / WARP) * (WARP / p.lpr);
    const int group = (threadIdx.x / WARP) * (WARP / p.lpr) + lane / p.lpr;
    const int row0 = (tile * groups_per_block + group) * RG;
    // Whole warps stay to the end (shuffles); rows past the end are computed, not written.
    if ((tile * groups_per_block + (threadIdx.x / WARP) * (WARP / p.lpr)) * RG >= p.rows) return;
    const bool sh = !grouped && it.expert < 0;
    const long long base = sh ? 0 : (long long)it.expert * p.rows;
    const u8_t* qs = sh ? p.sh_qs : p.qs;
    const u8_t* aux = sh ? p.sh_aux : p.aux;
    QRow rows[NR];
#pragma unroll
    for (int r = 0; r < RG; ++r) {
        const long long row = base + min(row0 + r, p.rows - 1);
        rows[r] = q_row(qs, aux, row, p.qs_row, p.aux_row);
        if (GATE_UP) rows[RG + r] = q_row(sh ? p.sh_qs2 : p.qs2, sh ? p.sh_aux2 : p.aux2, row, p.qs_row, p.aux_row);
    }
    const int units = p.cols / F::UE;
    for (int c = 0; c < it.count; c += NT) {
        const int nt = min(NT, it.count - c);
        const float* xs[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) xs[t] = item_input(p, grouped, it.first + c + min(t, nt - 1));
        float acc[NR][NT];
#pragma unroll
        for (int r = 0; r < NR; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
        RowDot<F, NT, NR>::run(rows, units, sub, p.lpr, xs, nt, acc);
#pragma unroll
        for (int r = 0; r < NR; ++r)
#pragma unroll
            for (int t = 0; t < NT; ++t) acc[r][t] = group_sum(acc[r][t], p.lpr);
        if (sub == 0) {
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (t >= nt) break;
                float* o = p.out + (long long)(it.first + c + t) * p.out_stride;
#pragma unroll
                for (int r = 0; r < RG; ++r) {
                    if (row0 + r >= p.rows) break;
                    if (GATE_UP) {
                        const float g = acc[r][t], u = acc[RG + r][t];
                        o[row0 + r] = silu(g) * u;
                    } else {
                        o[row0 + r] = acc[r][t];
                    }
                }
            }
        }
    }
}

template <class F, int NT, int RG, bool GATE_UP>
__device__ __forceinline__ void moe_mat_impl(const MoeMatParams& p, int grouped) {
    moe_mat_rows<F, NT, RG, GATE_UP>(p, grouped, block_items(p, grouped), blockIdx.x);
}

// Entry points per format: gate/up and down, pair mode (_p: one item, 2 output rows per
// group for gate/up, 4 for down) and grouped mode (_g: 8 items a pass, 1 and 2 rows).
// grid: (ceil(rows / rows per block), pairs or experts), block 128.
#define MOE_ENTRIES(name, F)                                                                                    \
    extern "C" __global__ void __launch_bounds__(128) moe_gate_up_##name##_p(const MoeMatParams p) { moe_mat_impl<F, 1, 2, true>(p, 0); } \
    extern "C" __global__ void __launch_bounds__(128) moe_gate_up_##name##_g(const MoeMatParams p) { moe_mat_impl<F, 8, 1, true>(p, 1); } \
    extern "C" __global__ void __launch_bounds__(128) moe_down_##name##_p(const MoeMatParams p) { moe_mat_impl<F, 1, 4, false>(p, 0); } \
    extern "C" __global__ void __launch_bounds__(128) moe_down_##name##_g(const MoeMatParams p) { moe_mat_impl<F, 8, 2, false>(p, 1); }

FOR_EACH_QFORMAT(MOE_ENTRIES)
MOE_ENTRIES(f16, FF16)

// ---- Router, in two launches so that reading the router (n_experts x dim f32, 1 MB for
// Qwen3-30B-A3B) is spread over the GPU instead of one block per token:
// moe_router_logits_f32: logits = W x (a block per (expert, token));
// moe_route_f32: per token, softmax over all experts, the k largest (ties: the lower expert
// index, as src/backend/cpu/moe.rs `route`), weights renormalised over the chosen when
// norm != 0 (else divided by the softmax total).
struct RouteParams {
    const float* x;   // [n_tok, dim] normed hidden states
    const float* w;   // [n_experts, dim] router, f32
    float* logits;    // [n_tok, n_experts]
    int* ids;         // [n_tok, k] chosen experts, best first
    float* wts;       // [n_tok, k] their weights
    int n_tok;
    int dim;          // multiple of 4
    int n_experts;
    int k;
    int norm;
};

// Router logit (expert blockIdx.x, token blockIdx.y) by a block of 128 threads: thread i takes
// float4 i, i + 128, ... (the 4 loads of a 2048-wide row all in flight: the 1 MB router of
// Qwen3-30B-A3B is read by n_experts blocks, not 16), then a fixed-order block sum.
__device__ __forceinline__ float router_dot(const float* xr, const float* wr, int dim, float* scratch) {
    const float4* x = reinterpret_cast<const float4*>(xr);
    const float4* w = reinterpret_cast<const float4*>(wr);
    float acc = 0.0f;
#pragma unroll 4
    for (int c = threadIdx.x; c < dim / 4; c += blockDim.x) {
        const float4 a = __ldg(w + c), b = __ldg(x + c);
        acc = fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, acc))));
    }
    return block_sum(acc, scratch);
}

// Few tokens (<= 8): grid (n_experts, n_tok), block 128.
extern "C" __global__ void __launch_bounds__(128) moe_router_logits_blk_f32(const RouteParams p) {
    __shared__ float scratch[32];
    const int t = blockIdx.y, e = blockIdx.x;
    const float v = router_dot(p.x + (long long)t * p.dim, p.w + (long long)e * p.dim, p.dim, scratch);
    if (threadIdx.x == 0) p.logits[(long long)t * p.n_experts + e] = v;
}

// More tokens: a warp per (expert, token), 8 experts a block, so that a token's input is read
// from the L2 once per 8 experts (prefill: n_tok x n_experts blocks of the kernel above would
// read it once per expert). grid (ceil(n_experts / 8), n_tok), block 256.
extern "C" __global__ void __launch_bounds__(256) moe_router_logits_f32(const RouteParams p) {
    const int t = blockIdx.y;
    const int lane = threadIdx.x % WARP;
    const int e = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (e >= p.n_experts) return;
    const float4* x = reinterpret_cast<const float4*>(p.x + (long long)t * p.dim);
    const float4* w = reinterpret_cast<const float4*>(p.w + (long long)e * p.dim);
    float acc = 0.0f;
#pragma unroll 4
    for (int c = lane; c < p.dim / 4; c += WARP) {
        const float4 a = __ldg(w + c), b = __ldg(x + c);
        acc = fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, acc))));
    }
    acc = warp_sum(acc);
    if (lane == 0) p.logits[(long long)t * p.n_experts + e] = acc;
}

// Prefill and batches: a block per 32 tokens x 32 experts, the router rows and inputs staged
// through shared memory 32 columns at a time, so the router (1 MB for Qwen3-30B-A3B) is read
// from the L2 once per 32 tokens, not once per token (768 tokens: 25 MB, not 805 MB). Thread
// (tt, te) of 16 x 16 sums tokens tt, tt + 16 against experts te, te + 16, column by column
// in order (fixed order: the same logits whatever the grid). Rows padded to 33 floats: the 16
// experts a half-warp reads sit in distinct banks, its tokens are broadcasts.
// grid (ceil(n_experts / 32), ceil(n_tok / 32)), block 256.
#define RT_TILE 32
#define RT_LD (RT_TILE + 1)
extern "C" __global__ void __launch_bounds__(256) moe_router_logits_tile_f32(const RouteParams p) {
    __shared__ float xs[RT_TILE * RT_LD];  // [32 tokens, 32 columns]
    __shared__ float ws[RT_TILE * RT_LD];  // [32 experts, 32 columns]
    const int te = threadIdx.x % 16, tt = threadIdx.x / 16;
    const int e0 = blockIdx.x * RT_TILE, t0 = blockIdx.y * RT_TILE;
    // Staging: thread i loads float4 i % 8 of row i / 8 of both tiles (zeros past the ends).
    const int lr = threadIdx.x / 8, lc = (threadIdx.x % 8) * 4;
    const bool x_ok = t0 + lr < p.n_tok, w_ok = e0 + lr < p.n_experts;
    const float* xrow = p.x + (long long)(t0 + lr) * p.dim;
    const float* wrow = p.w + (long long)(e0 + lr) * p.dim;
    float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    for (int c0 = 0; c0 < p.dim; c0 += RT_TILE) {
        const bool c_ok = c0 + lc < p.dim;  // dim % 4 == 0: a float4 is whole or past the end
        const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float4 xv = x_ok && c_ok ? __ldg(reinterpret_cast<const float4*>(xrow + c0 + lc)) : zero;
        const float4 wv = w_ok && c_ok ? __ldg(reinterpret_cast<const float4*>(wrow + c0 + lc)) : zero;
        __syncthreads();  // the previous columns are summed
        float* xd = xs + lr * RT_LD + lc;
        float* wd = ws + lr * RT_LD + lc;
        xd[0] = xv.x, xd[1] = xv.y, xd[2] = xv.z, xd[3] = xv.w;
        wd[0] = wv.x, wd[1] = wv.y, wd[2] = wv.z, wd[3] = wv.w;
        __syncthreads();
#pragma unroll 8
        for (int c = 0; c < RT_TILE; ++c) {
            const float a0 = xs[tt * RT_LD + c], a1 = xs[(tt + 16) * RT_LD + c];
            const float b0 = ws[te * RT_LD + c], b1 = ws[(te + 16) * RT_LD + c];
            acc[0][0] = fmaf(a0, b0, acc[0][0]);
            acc[0][1] = fmaf(a0, b1, acc[0][1]);
            acc[1][0] = fmaf(a1, b0, acc[1][0]);
            acc[1][1] = fmaf(a1, b1, acc[1][1]);
        }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int t = t0 + tt + 16 * i, e = e0 + te + 16 * j;
            if (t < p.n_tok && e < p.n_experts) p.logits[(long long)t * p.n_experts + e] = acc[i][j];
        }
}

// ---- Top-k of one token, by the whole block and without a serial loop over the k ranks:
// expert e's rank is the number of experts that beat it (a larger logit, or an equal
// one at a lower index: the CPU's `route` tie rule), so the k experts of rank < k are the CPU's
// choice in the CPU's order. Ranks compare order keys (the float's bits made monotone as
// unsigned, -0 as +0, NaN below every number), a strict total order: every rank 0..n-1 is taken
// exactly once, so all k ranks are written. Weights: exp(l - max) over the softmax total, or
// over the chosen ones' sum in rank order when norm (the CPU's order).
struct TopKShared {
    float* logit;    // [n] the token's logits
    unsigned* key;   // [n] their order keys
    int* slot_id;    // [k]
    float* rank_w;   // [k]
    float* red;      // [32] reduction scratch
};

__device__ __forceinline__ unsigned order_key(float v) {
    if (v != v) return 0u;
    if (v == 0.0f) v = 0.0f;
    const unsigned b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / WARP) ? scratch[lane] : NEG_INF;
    return warp_max(v);
}

// Every thread of the block calls it, with sh.logit filled (and a barrier after the fill).
// Writes ids[0..k) and wts[0..k); returns after a barrier (sh may be refilled).
__device__ __forceinline__ void block_top_k(const TopKShared& sh, int n, int k, int norm, int* ids, float* wts) {
    float mx = NEG_INF;
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        mx = fmaxf(mx, sh.logit[e]);
        sh.key[e] = order_key(sh.logit[e]);
    }
    mx = block_max(mx, sh.red);
    float total = 0.0f;
    for (int e = threadIdx.x; e < n; e += blockDim.x) total += expf(sh.logit[e] - mx);
    total = block_sum(total, sh.red);  // its barriers also publish sh.key
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        const unsigned ke = sh.key[e];
        int rank = 0;
        for (int f = 0; f < n; ++f) {
            const unsigned kf = sh.key[f];
            rank += (kf > ke) | ((kf == ke) & (f < e));
        }
        if (rank < k) {
            sh.slot_id[rank] = e;
            sh.rank_w[rank] = expf(sh.logit[e] - mx);
        }
    }
    __syncthreads();
    if (threadIdx.x < k) {
        float denom = total;
        if (norm) {
            denom = 0.0f;
            for (int j = 0; j < k; ++j) denom += sh.rank_w[j];  // rank order, as the CPU sums them
        }
        ids[threadIdx.x] = sh.slot_id[threadIdx.x];
        wts[threadIdx.x] = sh.rank_w[threadIdx.x] / denom;
    }
    __syncthreads();
}

// Dynamic shared memory of block_top_k for n experts, k ranks: bytes 8 n + 8 k + 128.
__device__ __forceinline__ TopKShared top_k_shared(unsigned char* base, int n, int k) {
    TopKShared sh;
    sh.logit = reinterpret_cast<float*>(base);
    sh.key = reinterpret_cast<unsigned*>(base + 4 * n);
    sh.slot_id = reinterpret_cast<int*>(base + 8 * n);
    sh.rank_w = reinterpret_cast<float*>(base + 8 * n + 4 * k);
    sh.red = reinterpret_cast<float*>(base + 8 * n + 8 * k);
    return sh;
}

// grid n_tok, block 128; dynamic shared memory: 8 n_experts + 8 k + 128 bytes.
extern "C" __global__ void __launch_bounds__(128) moe_route_f32(const RouteParams p) {
    extern __shared__ __align__(16) unsigned char route_sh[];
    const TopKShared sh = top_k_shared(route_sh, p.n_experts, p.k);
    const int t = blockIdx.x;
    for (int e = threadIdx.x; e < p.n_experts; e += blockDim.x) sh.logit[e] = p.logits[(long long)t * p.n_experts + e];
    __syncthreads();
    block_top_k(sh, p.n_experts, p.k, p.norm, p.ids + t * p.k, p.wts + t * p.k);
}

// ---- Grouping by expert (a stable counting sort, as `group` in cpu/moe.rs): offsets[e] =
// pairs choosing experts below e; entries[offsets[e] + i] = the i-th pair (ascending) that
// chose e; position[pair] = its index in entries. One block of nw warps; warp w owns the
// contiguous chunk w of the pairs: (1) per-warp counts per expert (shared atomics: counts do
// not depend on their order), (2) each expert's start per warp (warps in order) and the
// prefix sum over experts, (3) each warp walks its chunk 32 pairs at a time in order, a pair's
// rank among the earlier lanes with the same expert from __match_any_sync (sm_70): so the order
// within an expert is the pair order, as on the CPU.
struct GroupParams {
    const int* ids;  // [n_pairs]
    int* offsets;    // [n_experts + 1]
    int* entries;    // [n_pairs]
    int* position;   // [n_pairs]
    int n_pairs;
    int n_experts;
};

// grid 1, block 32 * nw (nw <= 32); dynamic shared memory: (nw + 1) * n_experts ints.
extern "C" __global__ void __launch_bounds__(1024) moe_group(const GroupParams p) {
    extern __shared__ int sh[];
    const int n = p.n_experts, nw = blockDim.x / WARP, w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int* hist = sh;          // [nw, n]: pairs of warp w's chunk per expert, then their start
    int* base = sh + nw * n; // [n]: pairs of experts below e
    for (int i = threadIdx.x; i < nw * n; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    const int chunk = (p.n_pairs + nw - 1) / nw;
    const int c0 = min(p.n_pairs, w * chunk), c1 = min(p.n_pairs, c0 + chunk);
    for (int i = c0 + lane; i < c1; i += WARP) atomicAdd(&hist[w * n + p.ids[i]], 1);
    __syncthreads();
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        int run = 0;
        for (int v = 0; v < nw; ++v) {
            const int c = hist[v * n + e];
            hist[v * n + e] = run;
            run += c;
        }
        base[e] = run;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int e = 0; e < n; ++e) {
            p.offsets[e] = run;
            const int c = base[e];
            base[e] = run;
            run += c;
        }
        p.offsets[n] = run;
    }
    __syncthreads();
    for (int b0 = c0; b0 < c1; b0 += WARP) {
        const int i = b0 + lane;
        const bool live = i < c1;
        const int e = live ? p.ids[i] : -1 - lane;  // dead lanes match nobody
        const unsigned same = __match_any_sync(FULL_MASK, e);
        const int rank = __popc(same & ((1u << lane) - 1u));
        if (live) {
            const int pos = base[e] + hist[w * n + e] + rank;
            p.entries[pos] = i;
            p.position[i] = pos;
        }
        __syncwarp();
        if (live && rank == 0) hist[w * n + e] += __popc(same);
        __syncwarp();
    }
}

// ---- Weighted sum into the residual: x[t, c] += sum_j wts[t, j] * y[row(t, j), c], rank 0
// first (the CPU's order); row = position[t k + j] (grouped) or t k + j (pair mode).
struct CombineParams {
    const float* y;        // [n_pairs, dim] expert outputs
    const float* wts;      // [n_tok, k]
    const int* position;   // [n_pairs] or null (pair mode)
    float* x;              // [n_tok, dim] residual
    int n_tok;
    int dim;
    int k;
};

// grid (ceil(dim / 256), n_tok), block 256.
extern "C" __global__ void __launch_bounds__(256) moe_combine_f32(const CombineParams p) {
    const int t = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= p.dim) return;
    float acc = 0.0f;
    for (int j = 0; j < p.k; ++j) {
        const int pair = t * p.k + j;
        const int row = p.position ? p.position[pair] : pair;
        acc += p.wts[pair] * p.y[(long long)row * p.dim + c];
    }
    p.x[(long long)t * p.dim + c] += acc;
}

// ---- One stream (pair mode), three launches a layer instead of five:
// moe_route_fused_f32: router logits, then the last block of each token (an atomic count per
//   token; the count is reset by that block, so the next launch and graph replays start at 0)
//   runs the softmax / top-k / renormalisation of moe_route_f32 on the finished logits;
// gate/up: moe_gate_up_<fmt>_p as before;
// moe_down_sum_<fmt>: down and the weighted sum in one launch: block (row tile, token t), warp j
//   computes rank j's expert rows . act[t k + j], then x[t, r] += sum_j wts[t, j] acc[j][r] in
//   rank order (the weighted sum of moe_combine_f32, the same order): each output row is written
//   once, by one thread.
// The fields of RouteParams first, in its order (the launcher embeds that struct), then:
struct RouteFusedParams {
    const float* x;      // [n_tok, dim] normed hidden states
    const float* w;      // [n_experts, dim] router, f32
    float* logits;       // [n_tok, n_experts]
    int* ids;            // [n_tok, k]
    float* wts;          // [n_tok, k]
    int n_tok;
    int dim;             // multiple of 4
    int n_experts;
    int k;
    int norm;
    unsigned* count;     // [n_tok] blocks done per token (0 between launches)
    // With a shared expert (pair mode): its gate row [dim] f32; block n_experts of each token
    // writes sigmoid(gate . x[t]) to wts[n_tok k + t], the weight of its rank k (else null).
    const float* sh_gate;
};

// grid (n_experts (+ 1 with sh_gate), n_tok), block 128 (a block per expert, as
// moe_router_logits_f32); dynamic shared memory: 8 n_experts + 8 k + 128 bytes (block_top_k).
extern "C" __global__ void __launch_bounds__(128) moe_route_fused_f32(const RouteFusedParams p) {
    extern __shared__ __align__(16) unsigned char route_sh[];
    __shared__ float scratch[32];
    __shared__ int last;
    const int t = blockIdx.y, e = blockIdx.x;
    if (e >= p.n_experts) {
        // The shared expert's gate (shexp_gate_add_f32's sigmoid); not counted below.
        const float g = router_dot(p.x + (long long)t * p.dim, p.sh_gate, p.dim, scratch);
        if (threadIdx.x == 0) p.wts[p.n_tok * p.k + t] = sigmoid(g);
        return;
    }
    const float v = router_dot(p.x + (long long)t * p.dim, p.w + (long long)e * p.dim, p.dim, scratch);
    if (threadIdx.x == 0) p.logits[(long long)t * p.n_experts + e] = v;
    __threadfence();  // this block's logits are visible before its count
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(p.count + t, 1u) == (unsigned)p.n_experts - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();  // the other blocks' logits, counted before ours
    const TopKShared sh = top_k_shared(route_sh, p.n_experts, p.k);
    for (int i = threadIdx.x; i < p.n_experts; i += blockDim.x) sh.logit[i] = __ldcg(p.logits + (long long)t * p.n_experts + i);
    __syncthreads();
    block_top_k(sh, p.n_experts, p.k, p.norm, p.ids + t * p.k, p.wts + t * p.k);
    if (threadIdx.x == 0) p.count[t] = 0;
}

struct DownSumParams {
    const u8_t* qs;     // down slab [n_experts * rows] rows: qs part (F16: the halves)
    const u8_t* aux;
    const float* act;   // [n_tok * k, cols] f32 SwiGLU activations by pair
    const int* ids;     // [n_tok * k]
    const float* wts;   // [n_tok * k]
    float* x;           // [n_tok, rows] residual, += the weighted sum
    int rows;           // model width
    int cols;           // expert width
    int k;              // <= 8 (one warp per rank)
    int qs_row;
    int aux_row;
    int lpr;            // lanes per row group
    // With a shared expert (its down rows: the routed experts' shape and format; else null):
    // warp k computes it for token t from act row n_tok k + t, weight wts[n_tok k + t].
    const u8_t* sh_qs;
    const u8_t* sh_aux;
};

#define DS_RG 4  // rows per row group

// Warp j < k: rows row0 .. row0 + (32 / lpr) * DS_RG of rank j's expert for token t, row tile
// `tile`; warp k the shared expert's where there is one; further warps only join the barrier.
// The rank of pair index pair_of(j) (the shared expert's after all n_tok k routed pairs).
template <class F>
__device__ __forceinline__ void moe_down_sum_rows(const DownSumParams& p, int t, int tile) {
    __shared__ float part[9][32 * DS_RG];  // [rank, row of the block]
    const int j = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int sub = lane % p.lpr, group = lane / p.lpr;
    const int per_block = (WARP / p.lpr) * DS_RG;
    const int row0 = tile * per_block;
    const int ranks = p.k + (p.sh_qs != nullptr);
    const int shared_pair = (int)gridDim.y * p.k + t;
    if (j < ranks) {
        const bool sh = j == p.k;
        const int pair = sh ? shared_pair : t * p.k + j;
        const long long base = sh ? 0 : (long long)p.ids[pair] * p.rows;
        QRow rows[DS_RG];
#pragma unroll
        for (int r = 0; r < DS_RG; ++r) {
            const long long row = base + min(row0 + group * DS_RG + r, p.rows - 1);
            rows[r] = q_row(sh ? p.sh_qs : p.qs, sh ? p.sh_aux : p.aux, row, p.qs_row, p.aux_row);
        }
        const float* xs[1] = {p.act + (long long)pair * p.cols};
        float acc[DS_RG][1];
#pragma unroll
        for (int r = 0; r < DS_RG; ++r) acc[r][0] = 0.0f;
        RowDot<F, 1, DS_RG>::run(rows, p.cols / F::UE, sub, p.lpr, xs, 1, acc);
#pragma unroll
        for (int r = 0; r < DS_RG; ++r) acc[r][0] = group_sum(acc[r][0], p.lpr);
        if (sub == 0) {
#pragma unroll
            for (int r = 0; r < DS_RG; ++r) part[j][group * DS_RG + r] = acc[r][0];
        }
    }
    __syncthreads();
    for (int r = threadIdx.x; r < per_block && row0 + r < p.rows; r += blockDim.x) {
        float s = 0.0f;
        for (int i = 0; i < p.k; ++i) s += *(p.wts + t * p.k + i) * part[i][r];
        if (ranks > p.k) s += p.wts[shared_pair] * part[p.k][r];
        p.x[(long long)t * p.rows + row0 + r] += s;
    }
}

template <class F>
__device__ __forceinline__ void moe_down_sum_impl(const DownSumParams& p) {
    moe_down_sum_rows<F>(p, blockIdx.y, blockIdx.x);
}

// grid (ceil(rows / ((32 / lpr) * DS_RG)), n_tok), block 32 * k (32 * (k + 1) with a shared expert).
#define DOWN_SUM_ENTRY(name, F) \
    extern "C" __global__ void __launch_bounds__(288) moe_down_sum_##name(const DownSumParams p) { moe_down_sum_impl<F>(p); }
FOR_EACH_QFORMAT(DOWN_SUM_ENTRY)
DOWN_SUM_ENTRY(f16, FF16)
