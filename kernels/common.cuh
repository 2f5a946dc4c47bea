// Shared helpers for every kernel file; the loader pastes this file in place of the include line
// of each kernel source. NVRTC 12.9 ships no cuda_fp16.h, so the half-precision helpers are
// written with inline PTX (cvt.f32.f16, cvt.rn.f16.f32), valid on compute_70 and newer.
//
// Conventions: half values travel as their raw 16 bits (`unsigned short`, `half_t`); pairs as
// 32 bits (`unsigned int`); 8 halves as one 16-byte `uint4` load. Every kernel takes one
// `#[repr(C)]`-mirrored params struct by value: pointers first, then 32-bit scalars.
#pragma once

typedef unsigned short half_t;

#define WARP 32
#define FULL_MASK 0xffffffffu
#define NEG_INF (__int_as_float(0xff800000))

__device__ __forceinline__ float h2f(half_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Round to nearest even. Values beyond +-65504 become +-inf (PTX cvt.rn semantics); use
// f2h_sat where the input may be out of range.
__device__ __forceinline__ half_t f2h(float f) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// Saturating conversion: clamps to +-65504 instead of producing inf (NaN stays NaN).
__device__ __forceinline__ half_t f2h_sat(float f) {
    return f2h(fminf(fmaxf(f, -65504.0f), 65504.0f));
}

// Two halves packed in 32 bits (low half first in memory) -> two floats.
__device__ __forceinline__ void h2x2f(unsigned int v, float& lo, float& hi) {
    half_t a, b;
    asm("mov.b32 {%0, %1}, %2;" : "=h"(a), "=h"(b) : "r"(v));
    lo = h2f(a);
    hi = h2f(b);
}

// Dot product of 8 halves (one uint4) with 8 floats.
__device__ __forceinline__ float dot8(uint4 w, const float* x) {
    float a, b, acc = 0.0f;
    h2x2f(w.x, a, b); acc = fmaf(a, x[0], acc); acc = fmaf(b, x[1], acc);
    h2x2f(w.y, a, b); acc = fmaf(a, x[2], acc); acc = fmaf(b, x[3], acc);
    h2x2f(w.z, a, b); acc = fmaf(a, x[4], acc); acc = fmaf(b, x[5], acc);
    h2x2f(w.w, a, b); acc = fmaf(a, x[6], acc); acc = fmaf(b, x[7], acc);
    return acc;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
// `scratch` holds at least 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP;
    const int nw = blockDim.x / WARP;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.0f;
    return warp_sum(v);
}
