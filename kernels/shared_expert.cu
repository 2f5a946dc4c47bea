// The shared expert of Qwen3.5-MoE and Qwen3-Next sparse layers: every token runs it beside
// its routed experts, scaled by a per-token gate. Its SwiGLU and down projection go through
// the ordinary matmul dispatcher; this file holds the gate (CPU twin: the end of
// src/backend/cpu/moe.rs `shared_expert`):
//   shexp_gate_add_f32   x[t] += sigmoid(gate . h[t]) * y[t]
#include "common.cuh"

struct ShexpGateParams {
    const float* h;     // [n_tok, dim]: the FFN's normed input
    const float* gate;  // [dim]: the gate row (f32)
    const float* y;     // [n_tok, dim]: the shared expert's output
    float* x;           // [n_tok, dim]: the residual (routed experts already added)
    int n_tok;
    int dim;
};

// grid: n_tok, block 256: the gate logit as a block sum, then the scaled add of the row.
extern "C" __global__ void shexp_gate_add_f32(const ShexpGateParams p) {
    __shared__ float scratch[32];
    const long long t = blockIdx.x;
    if (t >= p.n_tok) return;
    const float* hr = p.h + t * p.dim;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x) acc = fmaf(p.gate[i], hr[i], acc);
    const float logit = block_sum(acc, scratch);
    const float scale = 1.0f / (1.0f + expf(-logit));
    const float* yr = p.y + t * p.dim;
    float* xr = p.x + t * p.dim;
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x) xr[i] += scale * yr[i];
}
