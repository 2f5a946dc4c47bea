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

// Greedy choice under a grammar: the arg-max of each row over the tokens its packed allow-mask
// permits (bit t % 32 of word t / 32 set: token t allowed), so a constrained greedy step uploads
// the mask bits (vocab / 32 words a row) instead of downloading the logits. Same rule as the
// host's sampler::masked_argmax: the largest allowed value (-inf included), the lowest id among
// equals, NaN never chosen; no allowed token with a value: the lowest allowed id (0 if none).
// A row whose mask index is 0xffffffff has no mask (an unconstrained sequence of a mixed step): the
// plain arg-max, as argmax_rows_f32.
struct MaskedArgmaxParams {
    const float* x;           // [rows, n] f32
    const unsigned* mask_of;  // [rows]: the row's mask in `bits`, or 0xffffffff (none)
    const unsigned* bits;     // [masks, words]
    int* out;                 // [rows]
    int rows;
    int n;
    int words;                // per mask; tokens past words * 32 are not allowed
};

// grid: rows, block: 1024 (a multiple of 32). Thread i reads token i of each stride: the 32
// lanes of a warp share one mask word (one broadcast load), and a zero word (32 masked tokens)
// skips their logits altogether; a grammar usually allows a small part of the vocabulary.
extern "C" __global__ void argmax_masked_rows_f32(const MaskedArgmaxParams p) {
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ int sf[32];
    const float* x = p.x + (long long)blockIdx.x * p.n;
    const unsigned mask = p.mask_of[blockIdx.x];
    const unsigned* m = mask == 0xffffffffu ? nullptr : p.bits + (long long)mask * p.words;
    const int limit = m == nullptr ? p.n : min(p.n, p.words * 32);
    float bv = NEG_INF;
    int bi = 0x7fffffff;
    int first = 0x7fffffff;  // lowest allowed id, whatever its value
    for (int i = threadIdx.x; i < limit; i += blockDim.x) {
        const unsigned w = m == nullptr ? FULL_MASK : m[i >> 5];
        if ((w >> (i & 31)) & 1u) {
            first = min(first, i);
            const float v = x[i];
            if (am_better(v, i, bv, bi)) {
                bv = v;
                bi = i;
            }
        }
    }
    am_warp(bv, bi);
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(FULL_MASK, first, o));
    const int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP, nw = blockDim.x / WARP;
    if (lane == 0) {
        sv[wid] = bv;
        si[wid] = bi;
        sf[wid] = first;
    }
    __syncthreads();
    if (wid == 0) {
        bv = lane < nw ? sv[lane] : NEG_INF;
        bi = lane < nw ? si[lane] : 0x7fffffff;
        first = lane < nw ? sf[lane] : 0x7fffffff;
        am_warp(bv, bi);
#pragma unroll
        for (int o = WARP / 2; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(FULL_MASK, first, o));
        if (lane == 0) p.out[blockIdx.x] = bi != 0x7fffffff ? bi : (first != 0x7fffffff ? first : 0);
    }
}
