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
