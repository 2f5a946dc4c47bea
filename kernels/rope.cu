// Rotary position embedding, in place, on the q and k heads of the fused qkv buffer.
// cos/sin come from tables computed on the host in f64 ([max_pos, head_dim / 2] each), so the
// angles match the CPU reference exactly at any position.
#include "common.cuh"

struct RopeParams {
    float* x;            // [n_tok, stride] f32; heads at x + t * stride + h * head_dim
    const int* pos;      // [n_tok] absolute positions
    const float* cos_t;  // [max_pos, head_dim / 2]
    const float* sin_t;  // [max_pos, head_dim / 2]
    int n_tok;
    int n_heads;         // q heads + k heads (adjacent in the buffer)
    int head_dim;
    int stride;
    int style;           // 0: adjacent pairs (2i, 2i+1); 1: halves (i, i + head_dim / 2)
};

// One thread per (token, head, pair). grid: ceil(n_tok * n_heads * half / 256), block 256.
extern "C" __global__ void rope_f32(const RopeParams p) {
    const int half = p.head_dim / 2;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long total = (long long)p.n_tok * p.n_heads * half;
    if (idx >= total) return;
    const int i = (int)(idx % half);
    const int h = (int)((idx / half) % p.n_heads);
    const int t = (int)(idx / ((long long)half * p.n_heads));
    float* head = p.x + (long long)t * p.stride + (long long)h * p.head_dim;
    const int a = p.style == 0 ? 2 * i : i;
    const int b = p.style == 0 ? 2 * i + 1 : i + half;
    const long long ti = (long long)p.pos[t] * half + i;
    const float c = p.cos_t[ti], s = p.sin_t[ti];
    const float x0 = head[a], x1 = head[b];
    head[a] = x0 * c - x1 * s;
    head[b] = x0 * s + x1 * c;
}
