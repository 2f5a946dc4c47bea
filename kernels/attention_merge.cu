// The exact merge of split attention partials (attn_split_* / attn_onepass_* of
// attention_decode.cu, attn_prefill_* of attention_prefill.cu in split mode): per (token, head),
// out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s over the partials with m_s > -inf, in
// partial order (deterministic). CPU twin: cpu::ops::attend_batch (the parity tests compare the
// split kernels followed by this merge with it).
#include "common.cuh"

struct MergeParams {
    const float* part_o;   // [n_tok, n_heads, n_parts, head_dim] f32
    const float* part_ml;  // [n_tok, n_heads, n_parts, 2] f32 (max, sum of exp; max -inf: empty)
    float* out;            // [n_tok, out_stride] f32
    int n_heads;
    int head_dim;
    int n_parts;
    int out_stride;
};

#define MERGE_CHUNK 1024

// grid: (n_heads, n_tok), block: 128 threads (thread i owns dimensions i and i + 128). Every
// token has one non-empty partial. The weights e^(m_s - M) are computed once per partial (into
// shared memory, MERGE_CHUNK partials at a time), and partials past the last non-empty one (the
// empty tail of a graph's split bucket) are not read.
extern "C" __global__ void attn_merge_f32(const MergeParams p) {
    __shared__ float w_s[MERGE_CHUNK];
    __shared__ float scratch[32];
    const int h = blockIdx.x, t = blockIdx.y, hd = p.head_dim;
    const long long base = ((long long)t * p.n_heads + h) * p.n_parts;
    const float* ml = p.part_ml + base * 2;
    float m = NEG_INF, last = 0.0f;
    for (int s = threadIdx.x; s < p.n_parts; s += blockDim.x) {
        const float v = ml[2 * s];
        m = fmaxf(m, v);
        if (v != NEG_INF) last = (float)(s + 1);
    }
    // Block max of m and of last (partial counts are exact in f32 far beyond any grid).
    m = warp_max(m);
    last = warp_max(last);
    __syncthreads();
    if (threadIdx.x % WARP == 0) {
        scratch[threadIdx.x / WARP] = m;
        scratch[16 + threadIdx.x / WARP] = last;
    }
    __syncthreads();
    const int nw = blockDim.x / WARP, lane = threadIdx.x % WARP;
    m = warp_max(lane < nw ? scratch[lane] : NEG_INF);
    const int used = (int)warp_max(lane < nw ? scratch[16 + lane] : 0.0f);
    const int d0 = threadIdx.x, d1 = threadIdx.x + blockDim.x;
    float acc0 = 0.0f, acc1 = 0.0f, lsum = 0.0f;
    for (int c0 = 0; c0 < used; c0 += MERGE_CHUNK) {
        const int n = min(MERGE_CHUNK, used - c0);
        __syncthreads();  // the previous chunk's weights are read
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float v = ml[2 * (c0 + i)];
            const float w = v == NEG_INF ? 0.0f : expf(v - m);
            w_s[i] = w;
            lsum = fmaf(w, ml[2 * (c0 + i) + 1], lsum);
        }
        __syncthreads();
        const float* o = p.part_o + (base + c0) * hd;
        for (int i = 0; i < n; ++i) {
            const float w = w_s[i];
            if (w != 0.0f) {  // block-uniform; an empty partial's O is never read
                if (d0 < hd) acc0 = fmaf(w, o[(long long)i * hd + d0], acc0);
                if (d1 < hd) acc1 = fmaf(w, o[(long long)i * hd + d1], acc1);
            }
        }
    }
    const float inv = 1.0f / block_sum(lsum, scratch);
    float* out = p.out + (long long)t * p.out_stride + (long long)h * hd;
    if (d0 < hd) out[d0] = acc0 * inv;
    if (d1 < hd) out[d1] = acc1 * inv;
}
