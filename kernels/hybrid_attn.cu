// The gated full-attention layer of Qwen3.5 around the shared paged attention kernels
// (CPU twin: HybridCpu::attention in src/backend/cpu/hybrid.rs):
//   hyb_qkv_post_f32  from the fused projection row (per q head [query | gate] when gated,
//                     then k heads, then v heads; head_dim each): per-head RMSNorm of q and k,
//                     RoPE on the first `rot` dims of each head (pairs (i, i + rot / 2)), queries
//                     written compactly to q [n_tok, n_heads * head_dim], K and V stored to the
//                     F16 (or 8-bit) cache at row kv_rows[t];
//   hyb_gate_mul_f32  attention output times sigmoid(gate).
#include "common.cuh"

struct HybQkvParams {
    const float* proj;      // [n_tok, stride]
    float* q;               // [n_tok, n_heads * head_dim]
    RopeStorePtrs rs;       // tables [max_pos, rot / 2]
    int n_tok;
    int n_heads;
    int n_kv;
    int head_dim;
    int rot;                // rotated dims per head (even, <= head_dim)
    int stride;
    int gated;              // 1: each q head is followed by its gate in the projection
    float eps;
};

// grid: (n_heads + 2 * n_kv, n_tok); block clamp(round_up(head_dim, 32), 32, 256); dynamic
// shared memory: head_dim floats.
extern "C" __global__ void hyb_qkv_post_f32(const HybQkvParams p) {
    extern __shared__ float hs[];
    __shared__ float scratch[32];
    const int h = blockIdx.x, t = blockIdx.y;
    const int hd = p.head_dim, half = p.rot / 2;
    const long long kv_dim = (long long)p.n_kv * hd;
    const long long q_rows = (long long)p.n_heads * hd * (p.gated ? 2 : 1);
    const float* row = p.proj + (long long)t * p.stride;
    const long long kv_row = p.rs.kv_rows[t];
    if (h >= p.n_heads + p.n_kv) {  // v head: store only
        const int vh = h - p.n_heads - p.n_kv;
        const float* x = row + q_rows + kv_dim + (long long)vh * hd;
        const long long e0 = kv_row * kv_dim + (long long)vh * hd;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) kv_store(p.rs.v_cache, p.rs.v_scale, e0 + i, x[i]);
        return;
    }
    const bool is_k = h >= p.n_heads;
    const float* x = is_k ? row + q_rows + (long long)(h - p.n_heads) * hd
                          : row + (long long)h * hd * (p.gated ? 2 : 1);
    head_norm_to_shared(x, is_k ? p.rs.k_norm : p.rs.q_norm, hd, p.eps, hs, scratch);
    float* dst = p.q + ((long long)t * p.n_heads + h) * hd;  // q heads only
    const long long k0 = kv_row * kv_dim + (long long)(h - p.n_heads) * hd;
    const long long tb = (long long)p.rs.pos[t] * half;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float r;
        if (i < half) {
            r = hs[i] * p.rs.cos_t[tb + i] - hs[i + half] * p.rs.sin_t[tb + i];
        } else if (i < p.rot) {
            const int k = i - half;
            r = hs[k] * p.rs.sin_t[tb + k] + hs[i] * p.rs.cos_t[tb + k];
        } else {
            r = hs[i];
        }
        if (is_k) {  // the 8-bit cache: thread i holds dimension i, so a warp holds a group
            kv_store(p.rs.k_cache, p.rs.k_scale, k0 + i, r);
        } else {
            dst[i] = r;
        }
    }
}

struct GateMulParams {
    float* att;         // [n_tok, n_heads * head_dim]
    const float* proj;  // [n_tok, stride]: gate of head h at column (2 h + 1) * head_dim
    int n_tok;
    int n_heads;
    int head_dim;
    int stride;
};

// grid: ceil(n_tok * n_heads * head_dim / 256), block 256.
extern "C" __global__ void hyb_gate_mul_f32(const GateMulParams p) {
    const long long qd = (long long)p.n_heads * p.head_dim;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)p.n_tok * qd) return;
    const long long t = idx / qd, e = idx % qd;
    const long long h = e / p.head_dim, d = e % p.head_dim;
    const float g = p.proj[t * p.stride + (2 * h + 1) * p.head_dim + d];
    p.att[idx] *= sigmoid(g);
}
