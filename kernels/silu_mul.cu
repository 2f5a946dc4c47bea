// SwiGLU: out[t, i] = silu(gu[t, i]) * gu[t, ffn + i], reading the fused gate/up output.
#include "common.cuh"

struct SiluMulParams {
    const float* gu;  // [n_tok, 2 * ffn] f32: gate then up
    float* out;       // [n_tok, ffn] f32
    int n_tok;
    int ffn;
};

// grid: ceil(n_tok * ffn / 256), block 256.
extern "C" __global__ void silu_mul_f32(const SiluMulParams p) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)p.n_tok * p.ffn) return;
    const long long t = idx / p.ffn, i = idx % p.ffn;
    const float g = p.gu[t * 2 * p.ffn + i];
    const float u = p.gu[t * 2 * p.ffn + p.ffn + i];
    p.out[idx] = silu(g) * u;
}
