// Gated DeltaNet, the linear-attention layer of Qwen3.5 (three of every four layers), in four
// kernels run in this order per layer (CPU twins: src/backend/cpu/deltanet.rs):
//   dn_conv_silu_f32   causal depthwise conv1d (kernel K <= 8) + SiLU over the q|k|v channels,
//                      the conv window state of each sequence updated in place;
//   dn_prep_f32        q/k L2 norm (q also times 1/sqrt(d_k)), beta = sigmoid(b),
//                      g = -exp(A_log) * softplus(a + dt_bias);
//   dn_recur_f32       the delta rule per (sequence, value head) over the chunk's tokens in
//                      order, the f32 state matrix [d_k, d_v] held in registers;
//   dn_gated_norm_f32  RMSNorm of each head's output times the weight times SiLU(z).
//
// The step's tokens are grouped by sequence (chunks of consecutive tokens); `chunks` holds
// n_chunks, then per chunk (first token, tokens, state slot). Kernels are launched for up to
// max_chunks chunks and the extra blocks exit, so a captured graph serves any split of its
// token count into chunks. State pool: [n_slots, slot_stride] f32; linear layer j of a slot
// starts at layer_off = j * (conv (K - 1) * C + matrices n_v * d_k * d_v): conv state
// [K - 1, C] (oldest input first), then the matrices [n_v, d_k, d_v].
#include "common.cuh"

#define DN_MAX_K 8
// Lanes that share one column of a state matrix (each holds d_k / DN_LANES rows of it).
#define DN_LANES 4
// Rows of a state column one thread holds: d_k <= DN_LANES * DN_MAX_ROWS = 128.
#define DN_MAX_ROWS 32
// Threads of a dn_recur_f32 block (d_v <= 128): the bound keeps a thread within the 128
// registers that 512 threads may use on an SM (65,536), the 32 state values among them.
#define DN_RECUR_MAX_THREADS 512

__device__ __forceinline__ float dn_silu(float x) { return x / (1.0f + expf(-x)); }

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
    const int first = p.chunks[1 + 3 * c], count = p.chunks[2 + 3 * c];
    const long long slot = p.chunks[3 + 3 * c];
    const int C = p.channels, K = p.kernel;
    float* st = p.state + slot * p.slot_stride + p.layer_off;  // [K - 1, C]
    // The history right-aligned in win[0 .. H): win[H - 1] is the newest input; slots before
    // H - (K - 1) hold zeros with zero weights. Only compile-time indices (unrolled loops), so
    // the window stays in registers.
    constexpr int H = DN_MAX_K - 1;
    float win[H];
    float wk[H];
#pragma unroll
    for (int jj = 0; jj < H; ++jj) {
        const int j = jj - (H - (K - 1));  // index in the state / weight row, < 0: unused
        win[jj] = j >= 0 ? st[(long long)j * C + ch] : 0.0f;
        wk[jj] = j >= 0 ? p.w[(long long)ch * K + j] : 0.0f;
    }
    const float w_last = p.w[(long long)ch * K + K - 1];
    for (int i = 0; i < count; ++i) {
        const long long t = first + i;
        const float xin = p.x[t * p.x_stride + ch];
        // Summed oldest tap first, the order of the CPU twin, so both round alike; the padding
        // taps (j < 0) are zero and add nothing.
        float acc = 0.0f;
#pragma unroll
        for (int jj = 0; jj < H; ++jj) acc += wk[jj] * win[jj];
        acc += w_last * xin;
        p.out[t * C + ch] = dn_silu(acc);
#pragma unroll
        for (int jj = 0; jj < H - 1; ++jj) win[jj] = win[jj + 1];
        win[H - 1] = xin;
    }
#pragma unroll
    for (int jj = 0; jj < H; ++jj) {
        const int j = jj - (H - (K - 1));
        if (j >= 0) st[(long long)j * C + ch] = win[jj];
    }
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
    for (int hh = lane; hh < p.n_v; hh += WARP) {
        const float b = row[p.b_off + hh];
        row[p.b_off + hh] = 1.0f / (1.0f + expf(-b));
        // softplus with torch's threshold: x above 20.
        const float a = row[p.a_off + hh] + p.dt_bias[hh];
        const float sp = a > 20.0f ? a : log1pf(expf(a));
        row[p.a_off + hh] = p.neg_a[hh] * sp;
    }
}

struct DnRecurParams {
    const float* mixed;  // [n_tok, C] after dn_prep
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

// The delta rule over one chunk's tokens for one value head, per token:
//   S <- exp(g) S;  u = beta (v - S^T k);  S <- S + k u^T;  o = S^T q.
// grid: (n_v, max_chunks); block d_v * DN_LANES <= 512 threads: thread (j, r) holds rows
// r, r + 4, r + 8, ... of column j of S in registers (d_k / 4 <= 32 of them; a 128 x 128
// matrix is 64 KB, so registers, not shared memory, hold it). The column sums S^T k and S^T q
// are reduced over the 4 lanes of a column. Dynamic shared memory: 2 * d_k floats (q, k).
extern "C" __global__ void __launch_bounds__(DN_RECUR_MAX_THREADS) dn_recur_f32(const DnRecurParams p) {
    extern __shared__ float qk[];  // [2, d_k]
    const int h = blockIdx.x, c = blockIdx.y;
    if (c >= p.chunks[0]) return;
    const int first = p.chunks[1 + 3 * c], count = p.chunks[2 + 3 * c];
    const long long slot = p.chunks[3 + 3 * c];
    const int j = threadIdx.x / DN_LANES, r = threadIdx.x % DN_LANES;
    const int dk = p.d_k, dv = p.d_v, nr = dk / DN_LANES;
    const int kh = p.tiled ? h % p.n_k : h / (p.n_v / p.n_k);
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
        if (r == 0) p.out[t * vd + (long long)h * dv + j] = qs;
        __syncthreads();  // q and k of the next token overwrite the shared copies
    }
#pragma unroll
    for (int m = 0; m < DN_MAX_ROWS; ++m) {
        if (m < nr) S[(long long)(r + DN_LANES * m) * dv + j] = s[m];
    }
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
    for (int i = lane; i < p.d_v; i += WARP) x[i] = x[i] * inv * p.w[i] * dn_silu(z[i]);
}
