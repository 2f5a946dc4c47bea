// Writes the K and V of this step's tokens into the paged cache of one layer.
// Cache layout: [n_blocks, block_size, n_kv_heads, head_dim] f16 (or int8 with F16 scales per
// 32 values: the 8-bit cache of common.cuh), so cache row = block * block_size + offset and
// element (row, i) lives at row * kv_dim + i.
#include "common.cuh"

struct KvStoreParams {
    const float* qkv;   // [n_tok, stride] f32; K at column k_off, V at column v_off
    half_t* k_cache;    // [cache_rows, kv_dim] f16
    half_t* v_cache;    // [cache_rows, kv_dim] f16
    const int* kv_rows; // [n_tok] destination cache row of each token
    half_t* k_scale;    // 8-bit cache: [cache_rows, kv_dim / 32] f16; null: F16 cache
    half_t* v_scale;    // same
    int n_tok;
    int kv_dim;
    int stride;
    int k_off;
    int v_off;
};

// grid: ceil(n_tok * kv_dim / 256), block 256 (the 8-bit cache: kv_dim a multiple of 32, so a
// warp holds one group of one token). Saturates at +-65504 rather than storing inf.
extern "C" __global__ void kv_store_f16(const KvStoreParams p) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)p.n_tok * p.kv_dim) return;
    const long long t = idx / p.kv_dim, i = idx % p.kv_dim;
    const long long dst = (long long)p.kv_rows[t] * p.kv_dim + i;
    const float* row = p.qkv + t * p.stride;
    kv_store(p.k_cache, p.k_scale, dst, row[p.k_off + i]);
    kv_store(p.v_cache, p.v_scale, dst, row[p.v_off + i]);
}

// The fused step between the QKV matmul and attention, one block per (head, token) over the
// q, k and v heads of the fused qkv row (q heads, then k heads, then v heads, each head_dim
// wide, so head h starts at column h * head_dim):
//   q, k heads: optional per-head RMSNorm (Qwen3), then RoPE, written back in place (f32);
//   k heads are also stored to the K cache (f16 or 8-bit), v heads to the V cache.
// Same arithmetic, in the same order, as rmsnorm_f32 + rope_f32 + kv_store_f16 launched with the
// same block size (block = clamp(round_up(head_dim, 32), 32, 256), as the launcher picks).
struct QkvPostParams {
    float* qkv;             // [n_tok, stride] f32
    RopeStorePtrs rs;       // tables [max_pos, head_dim / 2]
    int n_tok;
    int n_heads;
    int n_kv;
    int head_dim;
    int stride;
    int style;              // 0: adjacent pairs; 1: halves
    float eps;
};

// grid: (n_heads + 2 * n_kv, n_tok); dynamic shared memory: head_dim floats.
extern "C" __global__ void qkv_post_f32(const QkvPostParams p) {
    extern __shared__ float hs[];
    __shared__ float scratch[32];
    const int h = blockIdx.x, t = blockIdx.y;
    const int hd = p.head_dim, half = hd / 2;
    const long long kv_dim = (long long)p.n_kv * hd;
    float* x = p.qkv + (long long)t * p.stride + (long long)h * hd;
    const long long kv_row = p.rs.kv_rows[t];
    if (h >= p.n_heads + p.n_kv) {  // v head: store only
        const long long e0 = kv_row * kv_dim + (long long)(h - p.n_heads - p.n_kv) * hd;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) kv_store(p.rs.v_cache, p.rs.v_scale, e0 + i, x[i]);
        return;
    }
    const bool is_k = h >= p.n_heads;
    head_norm_to_shared(x, is_k ? p.rs.k_norm : p.rs.q_norm, hd, p.eps, hs, scratch);
    const long long tb = (long long)p.rs.pos[t] * half;
    half_t* kdst = cache_head(p.rs.k_cache, kv_row, kv_dim, h - p.n_heads, hd);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const int a = p.style == 0 ? 2 * i : i;
        const int b = p.style == 0 ? 2 * i + 1 : i + half;
        const float c = p.rs.cos_t[tb + i], s = p.rs.sin_t[tb + i];
        const float x0 = hs[a], x1 = hs[b];
        const float r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
        x[a] = r0;
        x[b] = r1;
        if (is_k && !p.rs.k_scale) {
            kdst[a] = f2h_sat(r0);
            kdst[b] = f2h_sat(r1);
        }
    }
    if (is_k && p.rs.k_scale) {  // the 8-bit cache: a warp stores a group of the rotated row
        __syncthreads();         // the pair loop's writes to x are visible to the whole block
        const long long e0 = kv_row * kv_dim + (long long)(h - p.n_heads) * hd;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) kv_store(p.rs.k_cache, p.rs.k_scale, e0 + i, x[i]);
    }
}
