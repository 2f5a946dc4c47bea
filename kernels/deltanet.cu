// Gated DeltaNet, the linear-attention layer of Qwen3.5 (three of every four layers), in four
// kernels run in this order per layer (CPU twins: src/backend/cpu/deltanet.rs):
//   dn_conv_silu_f32   causal depthwise conv1d (kernel K <= 8) + SiLU over the q|k|v channels,
//                      the conv window state of each sequence updated in place;
//   dn_prep_f32        q/k L2 norm (q also times 1/sqrt(d_k)), beta = sigmoid(b),
//                      g = -exp(A_log) * softplus(a + dt_bias);
//   dn_recur_f32       the delta rule per (sequence, value head) over the chunk's tokens in
//                      order, the f32 state matrix [d_k, d_v] held in registers;
//   dn_gated_norm_f32  RMSNorm of each head's output times the weight times SiLU(z);
//   dn_recur_norm_f32  dn_recur_f32 with the gated norm of each token's head output in the
//                      same block (a block holds a whole value head), one launch less a layer.
//
// The step's tokens are grouped by sequence (chunks of consecutive tokens); `chunks` holds
// n_chunks, then per chunk (first token, tokens, state slot). Kernels are launched for up to
// max_chunks chunks and the extra blocks exit, so a captured graph serves any split of its
// token count into chunks. State pool: [n_slots, slot_stride] f32; linear layer j of a slot
// starts at layer_off = j * (conv (K - 1) * C + matrices n_v * d_k * d_v): conv state
// [K - 1, C] (oldest input first), then the matrices [n_v, d_k, d_v].
#include "common.cuh"
#include "quant.cuh"

#define DN_MAX_K 8
// Lanes that share one column of a state matrix (each holds d_k / DN_LANES rows of it).
#define DN_LANES 4
// Rows of a state column one thread holds: d_k <= DN_LANES * DN_MAX_ROWS = 128.
#define DN_MAX_ROWS 32
// Threads of a dn_recur_f32 block (d_v <= 128): the bound keeps a thread within the 128
// registers that 512 threads may use on an SM (65,536), the 32 state values among them.
#define DN_RECUR_MAX_THREADS 512

// Chunk c of the chunk table: its first token, its tokens and its sequence's state slot.
struct DnChunk {
    int first, count;
    long long slot;
};
__device__ __forceinline__ DnChunk dn_chunk(const int* chunks, int c) {
    return {chunks[1 + 3 * c], chunks[2 + 3 * c], chunks[3 + 3 * c]};
}

// The causal conv window of one channel (dn_conv_silu_f32, dn_conv_prep_f32): the history
// right-aligned in win[0 .. H) (win[H - 1] the newest input; entries before H - (K - 1) hold
// zeros with zero weights). Only compile-time indices (unrolled loops), so it stays in registers.
struct DnWindow {
    static constexpr int H = DN_MAX_K - 1;
    float win[H];
    float wk[H];
    float w_last;
    // Channel ch's state column of st [K - 1, C] (oldest input first) and weight row of w
    // [C, K]; live false: zeros.
    __device__ __forceinline__ void load(const float* st, const float* w, int ch, int C, int K, bool live) {
#pragma unroll
        for (int jj = 0; jj < H; ++jj) {
            const int j = jj - (H - (K - 1));  // index in the state / weight row, < 0: unused
            win[jj] = (live && j >= 0) ? st[(long long)j * C + ch] : 0.0f;
            wk[jj] = (live && j >= 0) ? w[(long long)ch * K + j] : 0.0f;
        }
        w_last = live ? w[(long long)ch * K + K - 1] : 0.0f;
    }
    // The conv of the window and input xin, summed oldest tap first (the CPU twin's order, so
    // both round alike; the padding taps add nothing); then xin joins the window.
    __device__ __forceinline__ float step(float xin) {
        float acc = 0.0f;
#pragma unroll
        for (int jj = 0; jj < H; ++jj) acc += wk[jj] * win[jj];
        acc += w_last * xin;
#pragma unroll
        for (int jj = 0; jj < H - 1; ++jj) win[jj] = win[jj + 1];
        win[H - 1] = xin;
        return acc;
    }
    __device__ __forceinline__ void store(float* st, int ch, int C, int K) const {
#pragma unroll
        for (int jj = 0; jj < H; ++jj) {
            const int j = jj - (H - (K - 1));
            if (j >= 0) st[(long long)j * C + ch] = win[jj];
        }
    }
};

struct DnConvParams {
    const float* x;      // [n_tok, x_stride]: the q|k|v channels are columns 0..C
    float* out;          // [n_tok, C]
    const float* w;      // [C, K]
    float* state;        // pool [n_slots, slot_stride]
    const int* chunks;   // [1 + 3 * max_chunks]
    long long slot_stride;
    long long layer_off;
    int max_chunks;
    int channels;        // C
    int kernel;          // K
    int x_stride;
};

// One thread per (chunk, channel), sliding over the chunk's tokens with the window in
// registers. grid: (ceil(C / 128), max_chunks), block 128. Sums in the CPU's order (oldest
// input first).
extern "C" __global__ void dn_conv_silu_f32(const DnConvParams p) {
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    const int c = blockIdx.y;
    if (ch >= p.channels || c >= p.chunks[0]) return;
    const auto [first, count, slot] = dn_chunk(p.chunks, c);
    const int C = p.channels, K = p.kernel;
    float* st = p.state + slot * p.slot_stride + p.layer_off;  // [K - 1, C]
    DnWindow wnd;
    wnd.load(st, p.w, ch, C, K, true);
    for (int i = 0; i < count; ++i) {
        const long long t = first + i;
        p.out[t * C + ch] = silu(wnd.step(p.x[t * p.x_stride + ch]));
    }
    wnd.store(st, ch, C, K);
}

// Value head hh's gates in place in a projection row: beta = sigmoid(b) at b_off, g =
// -exp(A_log) softplus(a + dt_bias) at a_off (softplus with torch's threshold: x above 20).
__device__ __forceinline__ void dn_gates(float* row, int b_off, int a_off, int hh, const float* neg_a,
                                         const float* dt_bias) {
    row[b_off + hh] = sigmoid(row[b_off + hh]);
    const float a = row[a_off + hh] + dt_bias[hh];
    const float sp = a > 20.0f ? a : log1pf(expf(a));
    row[a_off + hh] = neg_a[hh] * sp;
}

struct DnPrepParams {
    float* mixed;          // [n_tok, C]: q heads, k heads (normalized in place), v heads
    float* proj;           // [n_tok, proj_stride]: b at b_off, a at a_off (become beta and g)
    const float* neg_a;    // [n_v]: -exp(A_log)
    const float* dt_bias;  // [n_v]
    int n_tok;
    int n_k;
    int d_k;
    int n_v;
    int channels;
    int proj_stride;
    int b_off;
    int a_off;
    float q_scale;         // 1 / sqrt(d_k)
    float eps;             // 1e-6 (transformers' l2norm)
};

// grid: (2 * n_k + 1, n_tok), block 32: one warp per q or k head; the last warp of a token
// computes the gates of its n_v value heads.
extern "C" __global__ void dn_prep_f32(const DnPrepParams p) {
    const int h = blockIdx.x, t = blockIdx.y, lane = threadIdx.x;
    if (h < 2 * p.n_k) {
        float* x = p.mixed + (long long)t * p.channels + (long long)h * p.d_k;
        float ss = 0.0f;
        for (int i = lane; i < p.d_k; i += WARP) ss += x[i] * x[i];
        ss = warp_sum(ss);
        const float inv = 1.0f / sqrtf(ss + p.eps);
        const bool is_q = h < p.n_k;
        for (int i = lane; i < p.d_k; i += WARP) {
            float v = x[i] * inv;
            if (is_q) v *= p.q_scale;
            x[i] = v;
        }
        return;
    }
    float* row = p.proj + (long long)t * p.proj_stride;
    for (int hh = lane; hh < p.n_v; hh += WARP) dn_gates(row, p.b_off, p.a_off, hh, p.neg_a, p.dt_bias);
}

// The delta rule's inputs that the recurrent and the chunked forms share (the base of both
// params structs; Rust mirror: deltanet.rs DnHeadsParams).
struct DnHeads {
    const float* mixed;  // [n_tok, C] after dn_prep: q heads, k heads, v heads
    const float* proj;   // [n_tok, proj_stride]: beta at b_off, g at a_off
    float* out;          // [n_tok, n_v * d_v]
    float* state;        // pool [n_slots, slot_stride]
    const int* chunks;   // [1 + 3 * max_chunks]
    long long slot_stride;
    long long mats_off;  // layer_off + (K - 1) * C
    int max_chunks;
    int n_k;
    int n_v;
    int d_k;
    int d_v;
    int channels;
    int proj_stride;
    int b_off;
    int a_off;
    int tiled;           // 1: value head h reads key head h % n_k; 0: h / (n_v / n_k)
};

// The key head that value head h reads.
__device__ __forceinline__ int dn_key_head(const DnHeads& p, int h) {
    return p.tiled ? h % p.n_k : h / (p.n_v / p.n_k);
}

struct DnRecurParams : DnHeads {
    // dn_recur_norm_f32 only: the gated RMSNorm of the output (dn_gated_norm_f32's inputs).
    const float* z;      // [n_tok, z_stride]: gate z of head h at column h * d_v
    const float* norm_w; // [d_v]
    int z_stride;
    float eps;
    // Optional (null: not written): the normalized output also as the int8 planes of the out
    // projection's GEMV (quant.cuh, "int8 activations"; [n_tok, n_v * d_v], d_v a multiple of
    // 32), so that GEMV needs no quantize launch before it.
    u8_t* qx;
    u8_t* ql;
    float2* xs;
};

// The delta rule over one chunk's tokens for one value head, per token:
//   S <- exp(g) S;  u = beta (v - S^T k);  S <- S + k u^T;  o = S^T q.
// grid: (n_v, max_chunks); block d_v * DN_LANES <= 512 threads: thread (j, r) holds rows
// r, r + 4, r + 8, ... of column j of S in registers (d_k / 4 <= 32 of them; a 128 x 128
// matrix is 64 KB, so registers, not shared memory, hold it). The column sums S^T k and S^T q
// are reduced over the 4 lanes of a column. Dynamic shared memory: 2 * d_k floats (q, k).
// The head's d_v values in `row` (shared) into the int8 planes at flat offset `at` of a
// [n_tok, vd] input (at a multiple of 32). Called by all 32 lanes of warp 0 (the shuffles are
// full-warp); lanes past d_v / 4 hold zeros and store nothing.
__device__ __forceinline__ void dn_quantize_row(const DnRecurParams& p, const float* row, long long at, int dv) {
    const int lane = threadIdx.x;
    const bool live = lane < dv / 4;
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = live ? row[4 * lane + e] : 0.0f;
    const Q8Quad q = q8_quad(make_float4(v[0], v[1], v[2], v[3]));
    if (!live) return;
    const long long c4 = at / 4 + lane;  // float4 index in the flat [n_tok, vd] input
    reinterpret_cast<unsigned*>(p.qx)[c4] = q.wh;
    reinterpret_cast<unsigned*>(p.ql)[c4] = q.wl;
    // Run of 16 (at + 4 lane) / 16 of the flat input: row t's runs start at t * vd / 16.
    if ((lane & 3) == 0) p.xs[(at + 4 * lane) / 16] = q.xs;
}

// NORM: each token's output row of the head is normalized in the block before it is stored:
// rmsnorm(o) * w * silu(z), the sum of squares over the d_v columns as a block sum (lane r == 0
// of each column contributes; the order is fixed, so the result is deterministic).
// With qx, warp 0 quantizes the head's normalized row from shared memory: 8 lanes per block
// of 32 values (a run of 4 each), the rounding of quantize_x_q8 (gemv_q8.cu), so the codes are
// those that launch would write.
template <bool NORM>
__device__ __forceinline__ void dn_recur_impl(const DnRecurParams& p) {
    extern __shared__ float qk[];  // [2, d_k]
    __shared__ float red[DN_RECUR_MAX_THREADS / WARP];
    __shared__ float orow[DN_RECUR_MAX_THREADS / DN_LANES];  // one token's d_v outputs
    const int h = blockIdx.x, c = blockIdx.y;
    if (c >= p.chunks[0]) return;
    const auto [first, count, slot] = dn_chunk(p.chunks, c);
    const int j = threadIdx.x / DN_LANES, r = threadIdx.x % DN_LANES;
    const int dk = p.d_k, dv = p.d_v, nr = dk / DN_LANES;
    const int kh = dn_key_head(p, h);
    float* S = p.state + slot * p.slot_stride + p.mats_off + (long long)h * dk * dv;
    float s[DN_MAX_ROWS];
#pragma unroll
    for (int m = 0; m < DN_MAX_ROWS; ++m) s[m] = (m < nr) ? S[(long long)(r + DN_LANES * m) * dv + j] : 0.0f;
    float* sq = qk;
    float* sk = qk + dk;
    const long long v_col = 2LL * p.n_k * dk + (long long)h * dv + j;
    const long long vd = (long long)p.n_v * dv;
    for (int i = 0; i < count; ++i) {
        const long long t = first + i;
        const float* row = p.mixed + t * p.channels;
        for (int e = threadIdx.x; e < dk; e += blockDim.x) {
            sq[e] = row[(long long)kh * dk + e];
            sk[e] = row[(long long)p.n_k * dk + (long long)kh * dk + e];
        }
        __syncthreads();
        const float* prow = p.proj + t * p.proj_stride;
        const float decay = expf(prow[p.a_off + h]);
        const float beta = prow[p.b_off + h];
        float ks = 0.0f;
#pragma unroll
        for (int m = 0; m < DN_MAX_ROWS; ++m) {
            if (m < nr) {
                s[m] *= decay;
                ks += sk[r + DN_LANES * m] * s[m];
            }
        }
        ks += __shfl_xor_sync(FULL_MASK, ks, 1);
        ks += __shfl_xor_sync(FULL_MASK, ks, 2);
        const float u = (row[v_col] - ks) * beta;
        float qs = 0.0f;
#pragma unroll
        for (int m = 0; m < DN_MAX_ROWS; ++m) {
            if (m < nr) {
                s[m] += sk[r + DN_LANES * m] * u;
                qs += sq[r + DN_LANES * m] * s[m];
            }
        }
        qs += __shfl_xor_sync(FULL_MASK, qs, 1);
        qs += __shfl_xor_sync(FULL_MASK, qs, 2);
        if (NORM) {
            const float ss = block_sum(r == 0 ? qs * qs : 0.0f, red);
            const float inv = 1.0f / sqrtf(ss / (float)dv + p.eps);
            const float zv = p.z[t * p.z_stride + (long long)h * dv + j];
            qs = qs * inv * p.norm_w[j] * silu(zv);
            if (p.qx != nullptr) {
                if (r == 0) orow[j] = qs;
                __syncthreads();
                if (threadIdx.x < WARP) dn_quantize_row(p, orow, t * vd + (long long)h * dv, dv);
            }
        }
        if (r == 0) p.out[t * vd + (long long)h * dv + j] = qs;
        __syncthreads();  // q and k of the next token overwrite the shared copies
    }
    // The state back through one pointer to column j's row r (row r + 4 m at col[m * step]),
    // its offset opaque to the compiler (the empty asm): under the token loop's register pressure
    // it otherwise rebuilt every row's address from the params (13 to 27 PTX instructions a row
    // instead of 6; dn_recur_norm_f32 1,802 -> 1,353 instructions, dn_recur_f32 1,235 -> 1,069).
    // Time on the H200 from compute_70 PTX: the same within run-to-run noise (the driver's
    // compiler seems to undo most of it); the token loop is unchanged either way.
    long long at = (S - p.state) + (long long)r * dv + j;
    asm volatile("" : "+l"(at));
    float* col = p.state + at;
    const long long step = (long long)DN_LANES * dv;
#pragma unroll
    for (int m = 0; m < DN_MAX_ROWS; ++m) {
        if (m < nr) col[m * step] = s[m];
    }
}

extern "C" __global__ void __launch_bounds__(DN_RECUR_MAX_THREADS) dn_recur_f32(const DnRecurParams p) {
    dn_recur_impl<false>(p);
}

extern "C" __global__ void __launch_bounds__(DN_RECUR_MAX_THREADS) dn_recur_norm_f32(const DnRecurParams p) {
    dn_recur_impl<true>(p);
}

struct DnNormParams {
    float* o;          // [n_tok, n_v * d_v], normalized in place
    const float* z;    // [n_tok, z_stride]: the gate z of head h at column h * d_v
    const float* w;    // [d_v]
    int n_tok;
    int n_v;
    int d_v;
    int z_stride;
    float eps;
};

// rmsnorm(o) * w * silu(z) per value head. grid: (n_v, n_tok), block 32 (one warp per head).
extern "C" __global__ void dn_gated_norm_f32(const DnNormParams p) {
    const int h = blockIdx.x, t = blockIdx.y, lane = threadIdx.x;
    float* x = p.o + ((long long)t * p.n_v + h) * p.d_v;
    const float* z = p.z + (long long)t * p.z_stride + (long long)h * p.d_v;
    float ss = 0.0f;
    for (int i = lane; i < p.d_v; i += WARP) ss += x[i] * x[i];
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)p.d_v + p.eps);
    for (int i = lane; i < p.d_v; i += WARP) x[i] = x[i] * inv * p.w[i] * silu(z[i]);
}

// ---------------------------------------------------------------------------------------------
// The chunked (WY) form of the delta rule for prompt chunks (CPU twin: delta_rule_chunked in
// src/backend/cpu/deltanet.rs). A sequence's chunk of tokens is cut into sub-chunks of
// DN_CH tokens. With G_i the cumulative log-decay within a sub-chunk (from its start),
// D_ij = exp(G_i - G_j) and S0 the state before it, the updates u_i solve the unit lower
// triangular system u_i + sum_{j<i} A_ij u_j = beta_i (v_i - exp(G_i) S0^T k_i),
// A_ij = beta_i D_ij (k_i . k_j); then o_i = exp(G_i) S0^T q_i + sum_{j<=i} B_ij u_j,
// B_ij = D_ij (q_i . k_j), and S = exp(G_last) S0 + sum_j D_last,j k_j u_j^T.
//   dn_chunk_prep_f32  A, B and G of every sub-chunk, all in parallel (no state needed);
//   dn_chunk_scan_f32  per (value head, group of DN_COLS state columns, sequence): the
//                      sub-chunks in order, the state columns in shared memory. Each column
//                      of S evolves on its own (u_j, o_j and S[:, j] read only column j), so
//                      the column groups are independent blocks: a 512-token prompt of 32
//                      value heads of 128 runs 32 x 8 blocks instead of 32.
#define DN_CH 32
#define DN_COLS 16
// Floats per (token, value head) in the sub-chunk table: the row of A, the row of B, G.
#define DN_AB_ROW (2 * DN_CH + 1)

struct DnChunkParams : DnHeads {
    float* ab;           // [n_tok, n_v, DN_AB_ROW]: A row, B row, G of each token
};

// grid: (n_v, max sub-chunks of a chunk, max_chunks), block 256. Dynamic shared memory:
// q and k rows of the sub-chunk, [2, DN_CH, d_k + 1] (padded against bank conflicts).
extern "C" __global__ void dn_chunk_prep_f32(const DnChunkParams p) {
    extern __shared__ float sm[];
    __shared__ float cum[DN_CH];
    const int h = blockIdx.x, sub = blockIdx.y, c = blockIdx.z;
    if (c >= p.chunks[0]) return;
    const auto [first, count, slot] = dn_chunk(p.chunks, c);
    const int t0 = sub * DN_CH;
    if (t0 >= count) return;
    const int n = min(DN_CH, count - t0);
    const int dk = p.d_k, ld = dk + 1, kh = dn_key_head(p, h);
    float* sq = sm;
    float* sk = sm + DN_CH * ld;
    for (int e = threadIdx.x; e < n * dk; e += blockDim.x) {
        const int i = e / dk, a = e % dk;
        const float* row = p.mixed + (long long)(first + t0 + i) * p.channels;
        sq[i * ld + a] = row[(long long)kh * dk + a];
        sk[i * ld + a] = row[(long long)p.n_k * dk + (long long)kh * dk + a];
    }
    if (threadIdx.x == 0) {
        // In token order, as the CPU sums it.
        float acc = 0.0f;
        for (int i = 0; i < n; ++i) {
            acc += p.proj[(long long)(first + t0 + i) * p.proj_stride + p.a_off + h];
            cum[i] = acc;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < DN_CH * DN_CH; e += blockDim.x) {
        const int i = e / DN_CH, j = e % DN_CH;
        if (i >= n) continue;
        float a = 0.0f, b = 0.0f;
        if (j <= i) {
            float kk = 0.0f, qk = 0.0f;
            for (int x = 0; x < dk; ++x) {
                kk += sk[i * ld + x] * sk[j * ld + x];
                qk += sq[i * ld + x] * sk[j * ld + x];
            }
            const float d = expf(cum[i] - cum[j]);
            const float beta = p.proj[(long long)(first + t0 + i) * p.proj_stride + p.b_off + h];
            a = j < i ? beta * d * kk : 0.0f;
            b = d * qk;
        }
        float* r = p.ab + ((long long)(first + t0 + i) * p.n_v + h) * DN_AB_ROW;
        r[j] = a;
        r[DN_CH + j] = b;
        if (j == 0) r[2 * DN_CH] = cum[i];
    }
}

// grid: (n_v, d_v / DN_COLS, max_chunks), block 256. Dynamic shared memory (floats):
// S columns [d_k, DN_COLS], one row block X [DN_CH, d_k + 1] (q, then k), A and B
// [DN_CH, DN_CH] each, G [DN_CH], P = exp(G) S0^T q, R (right-hand side) and U
// [DN_CH, DN_COLS] each, E = exp(G_last - G) [DN_CH].
extern "C" __global__ void dn_chunk_scan_f32(const DnChunkParams p) {
    extern __shared__ float sm[];
    const int h = blockIdx.x, cg = blockIdx.y, c = blockIdx.z;
    if (c >= p.chunks[0]) return;
    const auto [first, count, slot] = dn_chunk(p.chunks, c);
    const int dk = p.d_k, dv = p.d_v, ld = dk + 1, kh = dn_key_head(p, h);
    const int col0 = cg * DN_COLS;
    float* S = sm;                        // [dk, DN_COLS]
    float* X = S + dk * DN_COLS;          // [DN_CH, ld]
    float* A = X + DN_CH * ld;            // [DN_CH, DN_CH]
    float* B = A + DN_CH * DN_CH;         // [DN_CH, DN_CH]
    float* G = B + DN_CH * DN_CH;         // [DN_CH]
    float* P = G + DN_CH;                 // [DN_CH, DN_COLS]
    float* R = P + DN_CH * DN_COLS;       // [DN_CH, DN_COLS]
    float* U = R + DN_CH * DN_COLS;       // [DN_CH, DN_COLS]
    float* E = U + DN_CH * DN_COLS;       // [DN_CH]
    float* Sg = p.state + slot * p.slot_stride + p.mats_off + (long long)h * dk * dv;  // [dk, dv]
    for (int e = threadIdx.x; e < dk * DN_COLS; e += blockDim.x) {
        S[e] = Sg[(long long)(e / DN_COLS) * dv + col0 + e % DN_COLS];
    }
    const long long vd = (long long)p.n_v * dv;
    const long long v_col = 2LL * p.n_k * dk + (long long)h * dv + col0;
    for (int t0 = 0; t0 < count; t0 += DN_CH) {
        const int n = min(DN_CH, count - t0);
        const long long tb = first + t0;
        __syncthreads();  // the previous sub-chunk's readers of X, A, B, G, U are done
        for (int e = threadIdx.x; e < n * dk; e += blockDim.x) {
            const int i = e / dk, a = e % dk;
            X[i * ld + a] = p.mixed[(tb + i) * p.channels + (long long)kh * dk + a];
        }
        for (int e = threadIdx.x; e < n * DN_CH; e += blockDim.x) {
            const int i = e / DN_CH, j = e % DN_CH;
            const float* r = p.ab + ((tb + i) * p.n_v + h) * DN_AB_ROW;
            A[e] = r[j];
            B[e] = r[DN_CH + j];
            if (j == 0) G[i] = r[2 * DN_CH];
        }
        __syncthreads();
        // P = exp(G) (S0^T q_i) for the block's columns.
        for (int e = threadIdx.x; e < n * DN_COLS; e += blockDim.x) {
            const int i = e / DN_COLS, j = e % DN_COLS;
            float acc = 0.0f;
            for (int a = 0; a < dk; ++a) acc += X[i * ld + a] * S[a * DN_COLS + j];
            P[e] = expf(G[i]) * acc;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < n * dk; e += blockDim.x) {
            const int i = e / dk, a = e % dk;
            X[i * ld + a] = p.mixed[(tb + i) * p.channels + (long long)p.n_k * dk + (long long)kh * dk + a];
        }
        __syncthreads();
        // R = beta (v - exp(G) S0^T k_i).
        for (int e = threadIdx.x; e < n * DN_COLS; e += blockDim.x) {
            const int i = e / DN_COLS, j = e % DN_COLS;
            float acc = 0.0f;
            for (int a = 0; a < dk; ++a) acc += X[i * ld + a] * S[a * DN_COLS + j];
            const float beta = p.proj[(tb + i) * p.proj_stride + p.b_off + h];
            R[e] = beta * (p.mixed[(tb + i) * p.channels + v_col + j] - expf(G[i]) * acc);
        }
        __syncthreads();
        // Forward substitution, one thread per column: u_i = r_i - sum_{j<i} A_ij u_j.
        if (threadIdx.x < DN_COLS) {
            const int j = threadIdx.x;
            for (int i = 0; i < n; ++i) {
                float u = R[i * DN_COLS + j];
                for (int m = 0; m < i; ++m) u -= A[i * DN_CH + m] * U[m * DN_COLS + j];
                U[i * DN_COLS + j] = u;
            }
        }
        if (threadIdx.x < n) E[threadIdx.x] = expf(G[n - 1] - G[threadIdx.x]);
        __syncthreads();
        // o_i = P_i + sum_{m<=i} B_im u_m.
        for (int e = threadIdx.x; e < n * DN_COLS; e += blockDim.x) {
            const int i = e / DN_COLS, j = e % DN_COLS;
            float acc = P[e];
            for (int m = 0; m <= i; ++m) acc += B[i * DN_CH + m] * U[m * DN_COLS + j];
            p.out[(tb + i) * vd + (long long)h * dv + col0 + j] = acc;
        }
        // S = exp(G_last) S0 + sum_m exp(G_last - G_m) k_m u_m^T (X holds k; P is no longer
        // read by this update, and the outputs above read S0 only through P).
        const float gl = G[n - 1];
        for (int e = threadIdx.x; e < dk * DN_COLS; e += blockDim.x) {
            const int a = e / DN_COLS, j = e % DN_COLS;
            float acc = expf(gl) * S[e];
            for (int m = 0; m < n; ++m) acc += E[m] * X[m * ld + a] * U[m * DN_COLS + j];
            S[e] = acc;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < dk * DN_COLS; e += blockDim.x) {
        Sg[(long long)(e / DN_COLS) * dv + col0 + e % DN_COLS] = S[e];
    }
}

// ---------------------------------------------------------------------------------------------
// dn_conv_prep_f32: dn_conv_silu_f32 and dn_prep_f32 in one launch (CPU twins as theirs). A
// block holds the C channels of one q or k head (then the L2 norm of each token's head is a
// block sum), or 128 v channels (no norm), or, the last block of a chunk, the gates.
// grid: (2 n_k + ceil(n_v d_v / 128) + 1, max_chunks), block 128 (d_k <= 128).
struct DnConvPrepParams {
    const float* x;        // [n_tok, x_stride]: q|k|v channels at 0..C (the projection)
    float* out;            // [n_tok, C]: conv + SiLU, q and k heads L2-normed (q scaled)
    const float* w;        // [C, K]
    float* state;          // pool [n_slots, slot_stride]
    const int* chunks;     // [1 + 3 * max_chunks]
    float* proj;           // the projection again: b at b_off, a at a_off -> beta, g
    const float* neg_a;    // [n_v]
    const float* dt_bias;  // [n_v]
    long long slot_stride;
    long long layer_off;
    int max_chunks;
    int channels;
    int kernel;
    int x_stride;
    int n_k;
    int d_k;
    int n_v;
    int b_off;
    int a_off;
    float q_scale;
    float eps;
};

extern "C" __global__ void dn_conv_prep_f32(const DnConvPrepParams p) {
    __shared__ float scratch[32];
    const int c = blockIdx.y;
    if (c >= p.chunks[0]) return;
    const auto [first, count, slot] = dn_chunk(p.chunks, c);
    const int qk_blocks = 2 * p.n_k;
    const int v_blocks = (p.channels - qk_blocks * p.d_k + 127) / 128;
    const int b = blockIdx.x;
    if (b == qk_blocks + v_blocks) {
        // The gates of every token of the chunk: beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias).
        for (int e = threadIdx.x; e < count * p.n_v; e += blockDim.x) {
            const long long t = first + e / p.n_v;
            const int hh = e % p.n_v;
            dn_gates(p.proj + t * p.x_stride, p.b_off, p.a_off, hh, p.neg_a, p.dt_bias);
        }
        return;
    }
    const bool normed = b < qk_blocks;
    const int ch = normed ? b * p.d_k + threadIdx.x : qk_blocks * p.d_k + (b - qk_blocks) * 128 + threadIdx.x;
    const bool live = normed ? (int)threadIdx.x < p.d_k : ch < p.channels;
    const float scale = b < p.n_k ? p.q_scale : 1.0f;
    const int C = p.channels, K = p.kernel;
    float* st = p.state + slot * p.slot_stride + p.layer_off;  // [K - 1, C]
    DnWindow wnd;
    wnd.load(st, p.w, ch, C, K, live);
    for (int i = 0; i < count; ++i) {
        const long long t = first + i;
        const float acc = wnd.step(live ? p.x[t * p.x_stride + ch] : 0.0f);
        float y = live ? silu(acc) : 0.0f;
        if (normed) {
            // Every thread of the block takes part in the sum (the dead ones add 0).
            const float ss = block_sum(y * y, scratch);
            y = y * (1.0f / sqrtf(ss + p.eps)) * scale;
        }
        if (live) p.out[t * C + ch] = y;
    }
    if (live) wnd.store(st, ch, C, K);
}
