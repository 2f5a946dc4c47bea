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

// The fused step between the QKV matmul and attention, one warp per (token, head) over the
// q, k and v heads of the fused qkv row (q heads, then k heads, then v heads, each head_dim
// wide, so head h starts at column h * head_dim):
//   q, k heads: optional per-head RMSNorm (Qwen3), then RoPE, written back in place (f32);
//   k heads are also stored to the K cache (f16 or 8-bit), v heads to the V cache.
// A warp a head rather than a block: a prefill chunk of 2,048 tokens is 80k heads of 128 values,
// and a block a head spent most of its time in two block barriers. The head norm's sum is
// block_sum's over the block rmsnorm_f32 launches for a row of head_dim
// (`warp_sum_squares_as_block`),
// so the values are those of rmsnorm_f32 + rope_f32 + kv_store_f16.
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

// grid: ceil(n_tok * (n_heads + 2 n_kv) / 8), block 256 (8 warps); dynamic shared memory:
// 8 x head_dim floats.
extern "C" __global__ void qkv_post_f32(const QkvPostParams p) {
    extern __shared__ float hs_all[];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int heads = p.n_heads + 2 * p.n_kv;
    const long long job = (long long)blockIdx.x * (blockDim.x / WARP) + warp;
    if (job >= (long long)p.n_tok * heads) return;  // a whole warp: its shuffles stay whole
    const int t = (int)(job / heads), h = (int)(job % heads);
    const int hd = p.head_dim, half = hd / 2;
    float* hs = hs_all + warp * hd;
    const long long kv_dim = (long long)p.n_kv * hd;
    float* x = p.qkv + (long long)t * p.stride + (long long)h * hd;
    const long long kv_row = p.rs.kv_rows[t];
    if (h >= p.n_heads + p.n_kv) {  // v head: store only
        const long long e0 = kv_row * kv_dim + (long long)(h - p.n_heads - p.n_kv) * hd;
        for (int i = lane; i < hd; i += WARP) kv_store(p.rs.v_cache, p.rs.v_scale, e0 + i, x[i]);
        return;
    }
    const bool is_k = h >= p.n_heads;
    head_norm_warp(x, is_k ? p.rs.k_norm : p.rs.q_norm, hd, p.eps, hs);
    const long long tb = (long long)p.rs.pos[t] * half;
    half_t* kdst = cache_head(p.rs.k_cache, kv_row, kv_dim, h - p.n_heads, hd);
    for (int i = lane; i < half; i += WARP) {
        const int a = p.style == 0 ? 2 * i : i;
        const int b = p.style == 0 ? 2 * i + 1 : i + half;
        const float c = p.rs.cos_t[tb + i], s = p.rs.sin_t[tb + i];
        const float x0 = hs[a], x1 = hs[b];
        const float r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c;
        x[a] = r0;
        x[b] = r1;
        hs[a] = r0;  // each pair is this lane's alone
        hs[b] = r1;
        if (is_k && !p.rs.k_scale) {
            kdst[a] = f2h_sat(r0);
            kdst[b] = f2h_sat(r1);
        }
    }
    if (is_k && p.rs.k_scale) {  // the 8-bit cache: the warp stores each group of 32 of the rotated row
        __syncwarp();
        const long long e0 = kv_row * kv_dim + (long long)(h - p.n_heads) * hd;
        for (int i = lane; i < hd; i += WARP) kv_store(p.rs.k_cache, p.rs.k_scale, e0 + i, hs[i]);
    }
}
