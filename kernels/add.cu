// Element-wise helpers: bias add over rows, f32 -> f16 casts for cuBLAS inputs.
#include "common.cuh"

struct BiasAddParams {
    float* x;         // [n_tok, stride] f32, in place on columns [0, n)
    const float* b;   // [n] f32
    int n_tok;
    int n;
    int stride;
};

// grid: ceil(n_tok * n / 256), block 256.
extern "C" __global__ void bias_add_f32(const BiasAddParams p) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)p.n_tok * p.n) return;
    const long long t = idx / p.n, i = idx % p.n;
    p.x[t * p.stride + i] += p.b[i];
}

struct CastParams {
    const float* x;   // [n] f32
    half_t* out;      // [n] f16, saturated to +-65504
    long long n;
};

// grid: ceil(n / 256), block 256.
extern "C" __global__ void cast_f32_f16(const CastParams p) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) p.out[i] = f2h_sat(p.x[i]);
}
