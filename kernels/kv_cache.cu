// Writes the K and V of this step's tokens into the paged F16 cache of one layer.
// Cache layout: [n_blocks, block_size, n_kv_heads, head_dim] f16, so slot = block * block_size
// + offset and element (slot, i) lives at slot * kv_dim + i.
#include "common.cuh"

struct KvStoreParams {
    const float* qkv;   // [n_tok, stride] f32; K at column k_off, V at column v_off
    half_t* k_cache;    // [n_slots, kv_dim] f16
    half_t* v_cache;    // [n_slots, kv_dim] f16
    const int* slots;   // [n_tok] destination slot of each token
    int n_tok;
    int kv_dim;
    int stride;
    int k_off;
    int v_off;
};

// grid: ceil(n_tok * kv_dim / 256), block 256. Saturates at +-65504 rather than storing inf.
extern "C" __global__ void kv_store_f16(const KvStoreParams p) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)p.n_tok * p.kv_dim) return;
    const long long t = idx / p.kv_dim, i = idx % p.kv_dim;
    const long long dst = (long long)p.slots[t] * p.kv_dim + i;
    const float* row = p.qkv + t * p.stride;
    p.k_cache[dst] = f2h_sat(row[p.k_off + i]);
    p.v_cache[dst] = f2h_sat(row[p.v_off + i]);
}
