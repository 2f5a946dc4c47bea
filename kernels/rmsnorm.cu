// RMSNorm over rows of an f32 matrix, f32 statistics, output f32 (in place allowed).
// Rows are addressed as (outer, inner): row start = outer * in_stride + inner * dim, so the same
// kernel normalizes a plain [n, dim] matrix (n_inner = 1) and the per-head q/k norm of Qwen3
// inside the fused qkv buffer (n_inner = heads, dim = head_dim, in_stride = qkv width).
#include "common.cuh"

struct RmsNormParams {
    const float* x;    // [n_outer, in_stride] f32
    const float* w;    // [dim] f32
    float* out;        // [n_outer, out_stride] f32; may equal x
    const int* rows;   // optional [n_outer] source row of each output row (gather), or null
    int n_outer;
    int n_inner;
    int dim;
    int in_stride;
    int out_stride;
    float eps;
};

// grid: (n_outer * n_inner), block: multiple of 32 (launcher picks).
extern "C" __global__ void rmsnorm_f32(const RmsNormParams p) {
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    const int outer = r / p.n_inner, inner = r % p.n_inner;
    const int src_outer = p.rows ? p.rows[outer] : outer;
    const float* x = p.x + (long long)src_outer * p.in_stride + (long long)inner * p.dim;
    float* o = p.out + (long long)outer * p.out_stride + (long long)inner * p.dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x) {
        const float v = x[i];
        ss = fmaf(v, v, ss);
    }
    ss = block_sum(ss, scratch);
    const float scale = rsqrtf(ss / (float)p.dim + p.eps);
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x) o[i] = x[i] * scale * p.w[i];
}
