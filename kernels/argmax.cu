// Greedy choice on the device: the arg-max of each logits row, so a greedy decode step downloads
// one id per sequence instead of the whole [m, vocab] logits (64 x 151,936 f32 = 39 MB a step).
// Same rule as the host's sampler::argmax: the largest value, the lowest index among equals,
// NaN never chosen (a row of NaN only: 0).
#include "common.cuh"

struct ArgmaxParams {
    const float* x;  // [rows, n] f32
    int* out;        // [rows]
    int rows;
    int n;
};

// (v, i) beats (bv, bi): larger value, or equal value and lower index; NaN never beats.
__device__ __forceinline__ bool am_better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// The best (value, index) of the warp, in every lane.
__device__ __forceinline__ void am_warp(float& bv, int& bi) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(FULL_MASK, bv, o);
        const int i = __shfl_xor_sync(FULL_MASK, bi, o);
        if (am_better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
}

// grid: rows, block: 1024 (a multiple of 32).
extern "C" __global__ void argmax_rows_f32(const ArgmaxParams p) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const float* x = p.x + (long long)blockIdx.x * p.n;
    float bv = NEG_INF;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < p.n; i += blockDim.x) {
        const float v = x[i];
        if (am_better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    am_warp(bv, bi);
    const int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP, nw = blockDim.x / WARP;
    if (lane == 0) {
        sv[wid] = bv;
        si[wid] = bi;
    }
    __syncthreads();
    if (wid == 0) {
        bv = lane < nw ? sv[lane] : NEG_INF;
        bi = lane < nw ? si[lane] : 0x7fffffff;
        am_warp(bv, bi);
        if (lane == 0) p.out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
    }
}
