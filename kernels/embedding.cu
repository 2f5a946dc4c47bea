// Embedding lookup: out[t, :] = f32(table[ids[t], :]). Token ids are checked on the host.
#include "common.cuh"

struct EmbeddingParams {
    const half_t* table;  // [vocab, dim] f16
    const unsigned int* ids;  // [n_tok]
    float* out;           // [n_tok, dim] f32
    int n_tok;
    int dim;
};

// grid: n_tok, block: 256.
extern "C" __global__ void embedding_f16(const EmbeddingParams p) {
    const int t = blockIdx.x;
    const half_t* row = p.table + (long long)p.ids[t] * p.dim;
    float* o = p.out + (long long)t * p.dim;
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x) o[i] = h2f(row[i]);
}

// Random weights made on the GPU (synthetic models): out[i] = f16(uniform(-scale, scale)) from
// a counter-based hash of (seed, i), so the values do not depend on the launch shape.
struct FillParams {
    half_t* out;   // [n] f16
    long long n;
    unsigned long long seed;
    float scale;
};

// grid-stride; any grid.
extern "C" __global__ void fill_uniform_f16(const FillParams p) {
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += step) {
        const unsigned long long r = hash_index(p.seed, i);
        const float u = (float)(r >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
        p.out[i] = f2h((2.0f * u - 1.0f) * p.scale);
    }
}
