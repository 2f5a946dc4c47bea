// The shared expert of Qwen3.5-MoE and Qwen3-Next sparse layers: every token runs it beside
// its routed experts, scaled by a per-token gate. Its SwiGLU and down projection go through
// the ordinary matmul dispatcher; this file holds the gate (CPU twin: the end of
// src/backend/cpu/moe.rs `shared_expert`):
//   shexp_gate_add_f32   x[t] += sigmoid(gate . h[t]) * y[t]
//   shexp_gate_q8_f32    sigmoid(gate . h[t]) * act[t] as the down GEMV's int8 input (below)
#include "common.cuh"
#include "quant.cuh"

// sigmoid(gate . h) for one token's row h [dim], every thread of the block (256) getting it;
// scratch: block_sum's.
__device__ __forceinline__ float shexp_gate(const float* h, const float* gate, int dim, float* scratch) {
    float acc = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) acc = fmaf(gate[i], h[i], acc);
    return sigmoid(block_sum(acc, scratch));
}

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
    const float scale = shexp_gate(p.h + t * p.dim, p.gate, p.dim, scratch);
    const float* yr = p.y + t * p.dim;
    float* xr = p.x + t * p.dim;
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x) xr[i] += scale * yr[i];
}

// shexp_gate_q8_f32: the gate folded into the down product's input. Since down is linear,
// sigmoid(g) (W act) = W (sigmoid(g) act): the kernel scales the SwiGLU output by the token's
// gate and writes it as the int8 planes the packed GEMV reads (kernels/quant.cuh, "int8
// activations"; the rounding of quantize_x_q8, so the codes are those of the scaled row), and
// the down GEMV adds its rows straight into the residual: one launch (this one) instead of the
// input quantization and shexp_gate_add_f32. CPU twin: the gate of cpu/moe.rs `shared_expert`,
// then q8x::quantize of the scaled row.
struct ShexpQ8Params {
    const float* h;     // [n_tok, dim]: the FFN's normed input
    const float* gate;  // [dim]
    const float* act;   // [n_tok, f]: silu(gate) * up of the shared expert
    u8_t* qx;           // [n_tok, f] int8 hi codes
    u8_t* ql;           // [n_tok, f] int8 lo codes
    float2* xs;         // [n_tok, f / 16]: (d, d * sum(q) + dl * sum(l)) per run of 16
    int n_tok;
    int dim;
    int f;              // a multiple of 32
};

// grid: n_tok, block 256. 8 threads per 32-value block (a float4 each); every thread of a warp
// takes part in the shuffles (the loop bound is block-uniform, the groups of 8 whole).
extern "C" __global__ void __launch_bounds__(256) shexp_gate_q8_f32(const ShexpQ8Params p) {
    __shared__ float scratch[32];
    const long long t = blockIdx.x;
    if (t >= p.n_tok) return;
    const float scale = shexp_gate(p.h + t * p.dim, p.gate, p.dim, scratch);
    const int per_tok = p.f / 4;
    for (int base = 0; base < per_tok; base += blockDim.x) {
        const int c4 = base + threadIdx.x;
        const bool live = c4 < per_tok;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (live) v = *reinterpret_cast<const float4*>(p.act + t * p.f + 4 * c4);
        const Q8Quad o = q8_quad(make_float4(scale * v.x, scale * v.y, scale * v.z, scale * v.w));
        if (!live) continue;
        reinterpret_cast<unsigned*>(p.qx + t * p.f)[c4] = o.wh;
        reinterpret_cast<unsigned*>(p.ql + t * p.f)[c4] = o.wl;
        if ((c4 & 3) == 0) p.xs[t * (p.f / 16) + c4 / 4] = o.xs;
    }
}
