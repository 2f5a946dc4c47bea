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

// SiLU and the logistic function in the one form every kernel and the CPU twins use.
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Output (t, row) of a GEMV into out [n_tok, out_stride]: (+)= v + bias[row] (bias optional;
// accumulate 1: add to what is there, the residual add of a down or out projection).
__device__ __forceinline__ void gemv_store(float* out, int out_stride, const float* bias, int accumulate, int t,
                                           int row, float v) {
    float* o = out + (long long)t * out_stride + row;
    const float x = v + (bias ? bias[row] : 0.0f);
    *o = accumulate ? *o + x : x;
}

// The split-K reduction of the tensor-core and packed-weight GEMMs (gemm_tc.cu, gemm_quant.cu):
// out[n, r] (+)= sum_k part[k, n, r] (k ascending: deterministic) + bias[r] (bias optional), by
// thread e of a 1-D grid for element e of [n_tok, rows]. P: a params struct with part
// [nk, n_tok, rows], out [n_tok, out_stride], bias, rows, n_tok, out_stride, accumulate, nk.
template <class P>
__device__ __forceinline__ void splitk_reduce(const P& p) {
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)p.n_tok * p.rows) return;
    const int n = (int)(e / p.rows), r = (int)(e % p.rows);
    float v = 0.0f;
    for (int k = 0; k < p.nk; ++k) v += p.part[((long long)k * p.n_tok + n) * p.rows + r];
    if (p.bias) v += p.bias[r];
    float* dst = p.out + (long long)n * p.out_stride + r;
    *dst = p.accumulate ? *dst + v : v;
}

// The F16 GEMV blocks' weight rows (gemv_f16.cu, fused_norm.cu): 16-byte pointers to rows row0 ..
// row0 + NR of w [rows, cols] (null past rows) and, with UP (SwiGLU), to the up rows rows +
// row0 .. in wrow[NR ..] (the gate rows first in a [2 rows, cols] matrix).
template <int NR, bool UP>
__device__ __forceinline__ void f16_row_ptrs(const half_t* w, int rows, int cols, int row0,
                                             const uint4* (&wrow)[UP ? 2 * NR : NR]) {
#pragma unroll
    for (int r = 0; r < NR; ++r) {
        const bool in = row0 + r < rows;
        wrow[r] = in ? reinterpret_cast<const uint4*>(w + (long long)(row0 + r) * cols) : nullptr;
        if (UP) wrow[UP ? NR + r : r] = in ? reinterpret_cast<const uint4*>(w + (long long)(rows + row0 + r) * cols) : nullptr;
    }
}

// Thread (r, t) = (threadIdx.x / NT, threadIdx.x % NT) of an F16 GEMV block of NR rows owns
// output (t, row0 + r): f(rr, tt) runs for it (t < n_tok, row0 + r < rows) with compile-time
// indices rr == r, tt == t, so the per-(row, token) totals it reads stay in registers.
template <int NR, int NT, class F>
__device__ __forceinline__ void gemv_own_output(int row0, int rows, int n_tok, F&& f) {
    const int r = threadIdx.x / NT, t = threadIdx.x % NT;
#pragma unroll
    for (int rr = 0; rr < NR; ++rr)
#pragma unroll
        for (int tt = 0; tt < NT; ++tt)
            if (rr == r && tt == t && t < n_tok && row0 + r < rows) f(rr, tt);
}

// 64 well-mixed bits of (seed, i) (splitmix64's finalizer of seed ^ i * an odd constant): the
// random fills' element hash, so a fill is a pure function of (seed, index) for any grid.
__device__ __forceinline__ unsigned long long hash_index(unsigned long long seed, unsigned long long i) {
    unsigned long long z = seed ^ (i * 0xd1b54a32d192ed03ull);
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
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

// One attention head's hd values x (f32) into shared memory hs, RMS-normalized by the head-norm
// weights nw [hd] (Qwen3's q/k norms) or copied as they are (nw null), then a block barrier.
// The sums of rmsnorm_f32 over a row of hd with the same block size, so the same values.
// Called by the whole block; scratch as block_sum's.
__device__ __forceinline__ void head_norm_to_shared(const float* x, const float* nw, int hd, float eps, float* hs,
                                                    float* scratch) {
    if (nw) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) {
            const float v = x[i];
            ss = fmaf(v, v, ss);
        }
        ss = block_sum(ss, scratch);
        const float scale = rsqrtf(ss / (float)hd + eps);
        for (int i = threadIdx.x; i < hd; i += blockDim.x) hs[i] = x[i] * scale * nw[i];
    } else {
        for (int i = threadIdx.x; i < hd; i += blockDim.x) hs[i] = x[i];
    }
    __syncthreads();
}

// The inputs both QK-norm + RoPE + cache-store kernels take (qkv_post_f32 in kv_cache.cu,
// hyb_qkv_post_f32 in hybrid_attn.cu), one member of their params structs (Rust mirror:
// kv_cache::RopeStorePtrs).
struct RopeStorePtrs {
    const float* q_norm;    // optional [head_dim] f32, or null
    const float* k_norm;    // optional [head_dim] f32, or null
    const int* pos;         // [n_tok]
    const float* cos_t;     // [max_pos, rotated dims / 2]
    const float* sin_t;     // same
    half_t* k_cache;        // [cache_rows, n_kv * head_dim] f16, or int8 with k_scale
    half_t* v_cache;        // same
    const int* kv_rows;     // [n_tok] cache row of each token
    half_t* k_scale;        // 8-bit cache: [cache_rows, n_kv * head_dim / 32] f16; null: F16 cache
    half_t* v_scale;        // same
};

// KV head kh of cache row kv_row in a paged F16 cache [cache_rows, kv_dim] (kv_dim = n_kv * hd).
__device__ __forceinline__ half_t* cache_head(half_t* cache, long long kv_row, long long kv_dim, int kh, int hd) {
    return cache + kv_row * kv_dim + (long long)kh * hd;
}

// ---- The 8-bit KV cache (`--kv-cache q8`; CPU twin: backend::kv_type::q8_round_trip). A cache
// of kv_dim values per row keeps them as int8 ([cache_rows, kv_dim] bytes, where the F16 cache
// keeps halves: element e of either layout is at the same index) and one F16 scale per group of
// KV_Q8_GROUP values ([cache_rows, kv_dim / 32], group e / 32). Written: d = f16_sat(amax / 127),
// q = clamp(rint(x / d), -127, 127), 0 where d is 0; read: f16_sat(q * d), so every attention
// kernel works on F16 values as with an F16 cache: the loads below replace its F16 loads
// (scale pointer null: the F16 cache, loaded as before). Division and product in IEEE rounding
// (explicit PTX: --fmad=true would otherwise fuse them), as the CPU twin computes them.
#define KV_Q8_GROUP 32

__device__ __forceinline__ float kv_div_rn(float a, float b) {
    float r;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float kv_mul_rn(float a, float b) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// Stores x, dimension i of a head vector whose first element is element e0 of the cache row
// space (e0 + i = element e), to an F16 cache (scale null) or the 8-bit one. For the 8-bit
// cache the lanes of a warp must hold the 32 dimensions of one group, in order and all active
// (i = threadIdx.x + k * blockDim.x with blockDim.x and the head size multiples of 32).
__device__ __forceinline__ void kv_store(half_t* cache, half_t* scale, long long e, float x) {
    if (!scale) {
        cache[e] = f2h_sat(x);
        return;
    }
    const float d = h2f(f2h_sat(kv_div_rn(warp_max(fabsf(x)), 127.0f)));
    int q = 0;
    if (d != 0.0f) {
        asm("cvt.rni.s32.f32 %0, %1;" : "=r"(q) : "f"(kv_div_rn(x, d)));
        q = max(-127, min(127, q));
    }
    reinterpret_cast<signed char*>(cache)[e] = (signed char)q;
    if (threadIdx.x % WARP == 0) scale[e / KV_Q8_GROUP] = f2h_sat(d);
}

// ---- F16 pairs from byte codes (quant.cuh's F16 forms and the 8-bit KV cache): PRMT puts a byte
// under the exponent of 1024 and one add.f16x2 of -(1024 + offset) gives the code exactly.
// Halves 1024 + byte b0, 1024 + byte b1 of w (bytes < 4 of w select the pair: SEL 0x4140 for
// bytes 0, 1, 0x4342 for bytes 2, 3).
template <int SEL> __device__ __forceinline__ unsigned h2_codes(unsigned w) { return __byte_perm(w, 0x64u, SEL); }

__device__ __forceinline__ unsigned hadd2(unsigned a, unsigned b) {
    unsigned r;
    asm("add.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

__device__ __forceinline__ unsigned hmul2(unsigned a, unsigned b) {
    unsigned r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

__device__ __forceinline__ unsigned hfma2(unsigned a, unsigned b, unsigned c) {
    unsigned r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// -(1024 + off) in both halves, for off < 1024 (exact).
__host__ __device__ constexpr unsigned h2_minus_1024_plus(unsigned off) { return (0xE400u | off) * 0x10001u; }

// Byte b (0..3) of w as a signed value times d, read back as F16.
__device__ __forceinline__ unsigned short kv_q8_h(unsigned w, int b, float d) {
    const int q = (int)(signed char)((w >> (8 * b)) & 0xffu);
    return f2h_sat(kv_mul_rn((float)q, d));
}
__device__ __forceinline__ unsigned kv_q8_h2(unsigned w, int b, float d) {
    return (unsigned)kv_q8_h(w, b, d) | ((unsigned)kv_q8_h(w, b + 1, d) << 16);
}
// The same pair on F16 halves, for a scale whose bits are sb (d2: sb in both halves): the code
// (byte ^ 0x80 is code + 128) comes out exact and one mul.f16x2 rounds code * d to F16 once, as
// kv_q8_h does, valid while no product can pass F16's range (kv_q8_h2_exact). SEL as h2_codes.
__device__ __forceinline__ bool kv_q8_h2_exact(half_t sb) { return (sb & 0x7fffu) <= 0x6000u; }  // |d| <= 512
template <int SEL> __device__ __forceinline__ unsigned kv_q8_h2(unsigned w, unsigned d2) {
    return hmul2(hadd2(h2_codes<SEL>(w ^ 0x80808080u), h2_minus_1024_plus(128)), d2);
}

// The 16 raw bytes behind 8 cache values from element e (a multiple of 8), loaded and not yet
// converted: F16: the 8 halves; 8-bit: the 8 codes in .x, .y and the group's scale bits in .z.
// A prefetch keeps its loads in flight until kv_cvt8 reads them (converting at the load made
// every 8-bit tile wait for its loads: 2.4x the F16 cache's decode attention time).
__device__ __forceinline__ uint4 kv_fetch8(const half_t* cache, const half_t* scale, long long e) {
    if (!scale) return __ldg(reinterpret_cast<const uint4*>(cache + e));
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(reinterpret_cast<const signed char*>(cache) + e));
    return make_uint4(w.x, w.y, __ldg(scale + e / KV_Q8_GROUP), 0u);
}
// kv_fetch8's bytes as 8 packed halves (all zero bytes give zeros in either form).
__device__ __forceinline__ uint4 kv_cvt8(const uint4& r, const half_t* scale) {
    if (!scale) return r;
    const half_t sb = (half_t)r.z;
    if (kv_q8_h2_exact(sb)) {
        const unsigned d2 = sb * 0x10001u;
        return make_uint4(kv_q8_h2<0x4140>(r.x, d2), kv_q8_h2<0x4342>(r.x, d2), kv_q8_h2<0x4140>(r.y, d2),
                          kv_q8_h2<0x4342>(r.y, d2));
    }
    const float d = h2f(sb);
    return make_uint4(kv_q8_h2(r.x, 0, d), kv_q8_h2(r.x, 2, d), kv_q8_h2(r.y, 0, d), kv_q8_h2(r.y, 2, d));
}
// 8 values from element e (a multiple of 8) as 8 packed halves (one uint4, as an F16 load gives),
// the 8-bit values converted through f32.
__device__ __forceinline__ uint4 kv_load8(const half_t* cache, const half_t* scale, long long e) {
    if (!scale) return __ldg(reinterpret_cast<const uint4*>(cache + e));
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(reinterpret_cast<const signed char*>(cache) + e));
    const float d = h2f(__ldg(scale + e / KV_Q8_GROUP));
    return make_uint4(kv_q8_h2(w.x, 0, d), kv_q8_h2(w.x, 2, d), kv_q8_h2(w.y, 0, d), kv_q8_h2(w.y, 2, d));
}
// A prefetched part of a K/V tile for the kernels' two entry kinds: RAW (the 8-bit cache's
// entries) loads kv_fetch8's raw bytes and kv_halves converts them when the tile is staged; else
// the part is loaded as halves (kv_load8) and staged as is (the F16 entries, unchanged by RAW).
template <bool RAW> __device__ __forceinline__ uint4 kv_part(const half_t* cache, const half_t* scale, long long e) {
    return RAW ? kv_fetch8(cache, scale, e) : kv_load8(cache, scale, e);
}
template <bool RAW> __device__ __forceinline__ uint4 kv_halves(const uint4& r, const half_t* scale) {
    return RAW ? kv_cvt8(r, scale) : r;
}
// 4 values from element e (a multiple of 4) as 4 packed halves.
__device__ __forceinline__ uint2 kv_load4(const half_t* cache, const half_t* scale, long long e) {
    if (!scale) return __ldg(reinterpret_cast<const uint2*>(cache + e));
    const unsigned w = __ldg(reinterpret_cast<const unsigned*>(reinterpret_cast<const signed char*>(cache) + e));
    const float d = h2f(__ldg(scale + e / KV_Q8_GROUP));
    return make_uint2(kv_q8_h2(w, 0, d), kv_q8_h2(w, 2, d));
}
// 2 values from element e (even) as 2 packed halves.
__device__ __forceinline__ unsigned kv_load2(const half_t* cache, const half_t* scale, long long e) {
    if (!scale) return __ldg(reinterpret_cast<const unsigned*>(cache + e));
    const unsigned short w =
        __ldg(reinterpret_cast<const unsigned short*>(reinterpret_cast<const signed char*>(cache) + e));
    const float d = h2f(__ldg(scale + e / KV_Q8_GROUP));
    return kv_q8_h2((unsigned)w, 0, d);
}

// ---- Tensor cores: wmma m16n16k16, F16 inputs, F32 accumulators, as inline PTX (no toolkit
// headers; valid from compute_70). Fragments are 8 registers; addresses 32-byte aligned, leading
// dimensions (ldm, in elements) multiples of 8 (F16) or 4 (F32). The element order inside a
// fragment is the architecture's: code that needs it reads it back through wmma_load_c.

// Every fragment load and store below names shared memory (`.shared`, the pointer converted
// by smem_addr): with generic addresses ptxas emits generic loads (LD.E) that take the generic
// path; Nsight Compute on the grouped MoE GEMM counted ~47M of them per launch. Every caller
// stages its tiles in shared memory.
__device__ __forceinline__ unsigned long long smem_addr(const void* p) {
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return a;
}

// A (16 x 16, row-major): row r's 16 values at p + r * ldm.
__device__ __forceinline__ void wmma_load_a(unsigned (&a)[8], const half_t* p, int ldm) {
    asm volatile("wmma.load.a.sync.aligned.row.m16n16k16.shared.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, [%8], %9;"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]), "=r"(a[4]), "=r"(a[5]), "=r"(a[6]), "=r"(a[7])
                 : "l"(smem_addr(p)), "r"(ldm)
                 : "memory");
}

// B (k x n) column-major: column n's 16 values at p + n * ldm (K rows: k = head dim, n = position).
__device__ __forceinline__ void wmma_load_b_col(unsigned (&b)[8], const half_t* p, int ldm) {
    asm volatile("wmma.load.b.sync.aligned.col.m16n16k16.shared.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, [%8], %9;"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]), "=r"(b[4]), "=r"(b[5]), "=r"(b[6]), "=r"(b[7])
                 : "l"(smem_addr(p)), "r"(ldm)
                 : "memory");
}

// B (k x n) row-major: row k's 16 values at p + k * ldm (V rows: k = position, n = head dim).
__device__ __forceinline__ void wmma_load_b_row(unsigned (&b)[8], const half_t* p, int ldm) {
    asm volatile("wmma.load.b.sync.aligned.row.m16n16k16.shared.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, [%8], %9;"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]), "=r"(b[4]), "=r"(b[5]), "=r"(b[6]), "=r"(b[7])
                 : "l"(smem_addr(p)), "r"(ldm)
                 : "memory");
}

// d += a b, B column-major.
__device__ __forceinline__ void wmma_mma_rc(float (&d)[8], const unsigned (&a)[8], const unsigned (&b)[8]) {
    asm volatile(
        "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, "
        "{%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19,%20,%21,%22,%23}, {%0,%1,%2,%3,%4,%5,%6,%7};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(a[4]), "r"(a[5]), "r"(a[6]), "r"(a[7]),
          "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(b[4]), "r"(b[5]), "r"(b[6]), "r"(b[7]));
}

// d += a b, B row-major.
__device__ __forceinline__ void wmma_mma_rr(float (&d)[8], const unsigned (&a)[8], const unsigned (&b)[8]) {
    asm volatile(
        "wmma.mma.sync.aligned.row.row.m16n16k16.f32.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, "
        "{%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19,%20,%21,%22,%23}, {%0,%1,%2,%3,%4,%5,%6,%7};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(a[4]), "r"(a[5]), "r"(a[6]), "r"(a[7]),
          "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(b[4]), "r"(b[5]), "r"(b[6]), "r"(b[7]));
}

// The m32n8k16 shape (32 weight rows x 8 tokens, k 16; the same 8-register fragments): A
// (32 x 16, row-major) at p + r * ldm, B (16 x 8) column-major (token n's 16 values at
// p + n * ldm), C (32 x 8 f32, row-major). For tiles of at most 8 tokens: a B fragment holds
// 8 tokens instead of 16, so a 16-token tile's repeated rows are neither staged nor loaded.
__device__ __forceinline__ void wmma_load_a_m32(unsigned (&a)[8], const half_t* p, int ldm) {
    asm volatile("wmma.load.a.sync.aligned.row.m32n8k16.shared.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, [%8], %9;"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]), "=r"(a[4]), "=r"(a[5]), "=r"(a[6]), "=r"(a[7])
                 : "l"(smem_addr(p)), "r"(ldm)
                 : "memory");
}

__device__ __forceinline__ void wmma_load_b_col_n8(unsigned (&b)[8], const half_t* p, int ldm) {
    asm volatile("wmma.load.b.sync.aligned.col.m32n8k16.shared.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, [%8], %9;"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]), "=r"(b[4]), "=r"(b[5]), "=r"(b[6]), "=r"(b[7])
                 : "l"(smem_addr(p)), "r"(ldm)
                 : "memory");
}

// d += a b (m32n8k16), B column-major.
__device__ __forceinline__ void wmma_mma_rc_m32n8(float (&d)[8], const unsigned (&a)[8], const unsigned (&b)[8]) {
    asm volatile(
        "wmma.mma.sync.aligned.row.col.m32n8k16.f32.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, "
        "{%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19,%20,%21,%22,%23}, {%0,%1,%2,%3,%4,%5,%6,%7};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(a[4]), "r"(a[5]), "r"(a[6]), "r"(a[7]),
          "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(b[4]), "r"(b[5]), "r"(b[6]), "r"(b[7]));
}

// Accumulator (32 x 8 f32) to p, row-major in shared memory.
__device__ __forceinline__ void wmma_store_c_m32n8(float* p, const float (&d)[8], int ldm) {
    asm volatile("wmma.store.d.sync.aligned.row.m32n8k16.shared.f32 [%0], {%1,%2,%3,%4,%5,%6,%7,%8}, %9;"
                 :
                 : "l"(smem_addr(p)), "f"(d[0]), "f"(d[1]), "f"(d[2]), "f"(d[3]), "f"(d[4]), "f"(d[5]), "f"(d[6]), "f"(d[7]),
                   "r"(ldm)
                 : "memory");
}

// 2^x on the special-function unit (one instruction; relative error ~2^-22; 2^-inf = 0). The
// attention kernels keep scores in log2 units (Q scaled by scale * LOG2E_F) and give partial
// maxima back in natural units (times LN2_F).
#define LOG2E_F 1.4426950408889634f
#define LN2_F 0.6931471805599453f
__device__ __forceinline__ float ex2_sfu(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// N accumulator fragments set to zero.
template <int N>
__device__ __forceinline__ void wmma_zero(float (&d)[N][8]) {
#pragma unroll
    for (int j = 0; j < N; ++j)
#pragma unroll
        for (int i = 0; i < 8; ++i) d[j][i] = 0.0f;
}

// Accumulator (16 x 16 f32, row-major) from p.
__device__ __forceinline__ void wmma_load_c(float (&d)[8], const float* p, int ldm) {
    asm volatile("wmma.load.c.sync.aligned.row.m16n16k16.shared.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, [%8], %9;"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7])
                 : "l"(smem_addr(p)), "r"(ldm)
                 : "memory");
}

// Accumulator to p (row-major, shared memory).
__device__ __forceinline__ void wmma_store_c(float* p, const float (&d)[8], int ldm) {
    asm volatile("wmma.store.d.sync.aligned.row.m16n16k16.shared.f32 [%0], {%1,%2,%3,%4,%5,%6,%7,%8}, %9;"
                 :
                 : "l"(smem_addr(p)), "f"(d[0]), "f"(d[1]), "f"(d[2]), "f"(d[3]), "f"(d[4]), "f"(d[5]), "f"(d[6]), "f"(d[7]),
                   "r"(ldm)
                 : "memory");
}

// One K tile of a warp's tensor-core product, both operands F16 in shared memory: for k-steps
// u < BK / 16, acc[j] += A[16 rows at a + 16 u] x B[token tile j at b + j 16 ld + 16 u]
// (A row-major [16, ld], B column-major: token tile j's 16 tokens as rows of ld).
template <int NT16, int BK>
__device__ __forceinline__ void wmma_k_tile(float (*acc)[8], const half_t* a_tile, const half_t* b_tiles, int ld) {
#pragma unroll
    for (int u = 0; u < BK / 16; ++u) {
        unsigned a[8];
        wmma_load_a(a, a_tile + u * 16, ld);
#pragma unroll
        for (int j = 0; j < NT16; ++j) {
            unsigned b[8];
            wmma_load_b_col(b, b_tiles + j * 16 * ld + u * 16, ld);
            wmma_mma_rc(acc[j], a, b);
        }
    }
}

// A fetched input tile into shared memory (the GEMMs of gemm_quant.cu, moe_gemm.cu): 16-byte
// piece q = threadIdx.x + THREADS i (rx[i]) is part q % 16 of row q / 16 of sx [rows, ld] halves.
template <int THREADS, int N>
__device__ __forceinline__ void stage_x_tile(half_t* sx, int ld, const uint4 (&rx)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const int q = threadIdx.x + THREADS * i;
        *reinterpret_cast<uint4*>(sx + (q / 16) * ld + (q % 16) * 8) = rx[i];
    }
}

// One output v of a tensor-core GEMM block for weight row `row` and token n: with one K split
// (nk == 1) to out [n_tok, out_stride] (+ bias, added to what is there with accumulate), else to
// split kb's partial part [nk, n_tok, rows]. P: as wmma_store_rows.
template <class P>
__device__ __forceinline__ void gemm_store_one(const P& p, int row, int n, float v, int nk, int kb) {
    if (nk == 1) {
        const float r = p.bias ? v + p.bias[row] : v;
        float* dst = p.out + (long long)n * p.out_stride + row;
        *dst = p.accumulate ? *dst + r : r;
    } else {
        p.part[((long long)kb * p.n_tok + n) * p.rows + row] = v;
    }
}

// The end of a tensor-core GEMM block (gemm_tc.cu, gemm_quant.cu): after a block barrier (the
// staging area smem becomes the output buffer), each warp's NT16 accumulator tiles (weight rows
// row0 .. + 16, tokens t0 .. + 16 NT16) go through its [16, ldo] floats of smem to the output
// [n_tok, out_stride] (one K split, nk == 1: + bias, accumulate) or to split kb's partial
// part [nk, n_tok, rows]. Element (m = e % 16, n = e / 16): 16 consecutive rows of one token per
// half-warp. P: a params struct with out, part, bias, out_stride, rows, n_tok, accumulate.
template <int NT16, class P>
__device__ __forceinline__ void wmma_store_rows(const P& p, unsigned char* smem, int ldo, const float (&acc)[NT16][8],
                                                int row0, int t0, int nk, int kb) {
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    __syncthreads();
    float* o = reinterpret_cast<float*>(smem) + warp * 16 * ldo;  // [16, ldo]
#pragma unroll
    for (int j = 0; j < NT16; ++j) wmma_store_c(o + j * 16, acc[j], ldo);
    __syncwarp();
    for (int e = lane; e < 16 * 16 * NT16; e += WARP) {
        const int m = e % 16, n = t0 + e / 16;
        if (n < p.n_tok) gemm_store_one(p, row0 + m, n, o[m * ldo + e / 16], nk, kb);
    }
}
