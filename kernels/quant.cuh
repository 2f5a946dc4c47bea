// GGML block formats as the GPU reads them: the decoders of one "unit" of a packed row, shared
// by the quantized GEMV (gemv_quant.cu), the dequantization to F16 and the embedding gather
// (dequant.cu). The loader pastes this file in place of its include line (after common.cuh).
//
// Device layout (src/backend/cuda/qformat.rs repacks at load: a byte permutation of the file's
// blocks, the K scales a bit permutation; never a re-quantization): a matrix [rows, cols] of
// nblk blocks per row is two arrays,
//   qs  [rows, nblk, QB] bytes: the quantized values of each block (16-byte aligned rows),
//   aux [rows, nblk, AB] bytes: the block's scales, mins and high bits.
// | format | block | QB  | AB | aux bytes                         |
// | Q4_0   | 32    | 16  | 2  | d                                 |
// | Q4_1   | 32    | 16  | 4  | d, m                              |
// | Q5_0   | 32    | 16  | 8  | qh (u32), d, pad                  |
// | Q5_1   | 32    | 16  | 8  | qh (u32), d, m                    |
// | Q8_0   | 32    | 32  | 2  | d                                 |
// | Q4_K   | 256   | 128 | 16 | d, dmin, scales[12] per chunk (k_chunk_bits); qs per sub-block |
// | Q5_K   | 256   | 128 | 48 | d, dmin, scales[12] as Q4_K, qh[32] |
// | Q6_K   | 256   | 192 | 20 | scales[16] (i8) in unit order, d, pad; qs = ql[128], qh[64] |
//
// A unit is what one thread decodes from one or a few 16-byte loads: RUNS runs of 16
// consecutive elements of the row, run r starting at column start(u, r). Values are computed as the
// CPU decoders in src/model/quant/{legacy,kquants}.rs compute them (f32 from f16 scales).
#pragma once

typedef unsigned char u8_t;

struct QRow {
    const u8_t* qs;   // this row's qs bytes
    const u8_t* aux;  // this row's aux bytes
};

__device__ __forceinline__ unsigned byte_of(const uint4& v, int j) {
    const unsigned w = j < 4 ? v.x : j < 8 ? v.y : j < 12 ? v.z : v.w;
    return (w >> (8 * (j & 3))) & 0xffu;
}

// v - off as a float for 0 <= v < 2^23 without a conversion instruction (I2F runs at a
// quarter of the FMA rate or less): the bits of 2^23 + v, minus 2^23 + off, exact.
__device__ __forceinline__ float small_u2f(unsigned v, float off) {
    return __int_as_float(0x4B000000u | v) - (8388608.0f + off);
}

// Word i (0..3) of a 16-byte load.
__device__ __forceinline__ unsigned word_of(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// Fifth bits: bits 0..3 of h at bit 4 of bytes 0..3 (the four products land on distinct bits).
__device__ __forceinline__ unsigned bits_to_bytes4(unsigned h) { return ((h & 15u) * 0x00204081u & 0x01010101u) << 4; }

// Code j (byte j of w, 0..255) as a float: one byte permute and one subtraction.
__device__ __forceinline__ float code_f(unsigned w, int j) {
    return __int_as_float(__byte_perm(w, 0x4B000000u, 0x7440 + j)) - 8388608.0f;
}

__device__ __forceinline__ uint4 ld16(const u8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ float ldh(const u8_t* p) { return h2f(__ldg(reinterpret_cast<const half_t*>(p))); }
__device__ __forceinline__ unsigned ld32(const u8_t* p) { return __ldg(reinterpret_cast<const unsigned*>(p)); }

// Each format: Raw (the loaded bytes of one unit), load(row, u), run(raw, u, r, w) (the 16
// values of run r), start(u, r) (its first column). decode_unit() below gives all runs.

// ---- 32-element blocks: one unit = one block, run 0 = elements 32b.. (low nibbles), run 1 =
// elements 32b + 16.. (high nibbles).
struct FQ4_0 {
    enum { QB = 16, AB = 2, UE = 32, RUNS = 2 };
    struct Raw { uint4 q; float d; };
    static __device__ __forceinline__ Raw load(const QRow& r, int u) { return {ld16(r.qs + 16 * u), ldh(r.aux + 2 * u)}; }
    static __device__ __forceinline__ int start(int u, int r) { return 32 * u + 16 * r; }
    static __device__ __forceinline__ void run(const Raw& a, int, int r, float (&w)[16]) {
#pragma unroll
        for (int j = 0; j < 16; ++j) w[j] = small_u2f((byte_of(a.q, j) >> (4 * r)) & 15u, 8.0f) * a.d;
    }
    // Run r as codes q (byte j of q[i] is element 4i + j) with w = a * q + b.
    static __device__ __forceinline__ void codes(const Raw& x, int, int r, unsigned (&q)[4], float& a, float& b) {
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = (word_of(x.q, i) >> (4 * r)) & 0x0F0F0F0Fu;
        a = x.d;
        b = -8.0f * x.d;
    }
};

struct FQ4_1 {
    enum { QB = 16, AB = 4, UE = 32, RUNS = 2 };
    struct Raw { uint4 q; unsigned dm; };
    static __device__ __forceinline__ Raw load(const QRow& r, int u) { return {ld16(r.qs + 16 * u), ld32(r.aux + 4 * u)}; }
    static __device__ __forceinline__ int start(int u, int r) { return 32 * u + 16 * r; }
    static __device__ __forceinline__ void run(const Raw& a, int, int r, float (&w)[16]) {
        float d, m;
        h2x2f(a.dm, d, m);
#pragma unroll
        for (int j = 0; j < 16; ++j) w[j] = small_u2f((byte_of(a.q, j) >> (4 * r)) & 15u, 0.0f) * d + m;
    }
    static __device__ __forceinline__ void codes(const Raw& x, int, int r, unsigned (&q)[4], float& a, float& b) {
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = (word_of(x.q, i) >> (4 * r)) & 0x0F0F0F0Fu;
        h2x2f(x.dm, a, b);
    }
};

// Q5_0 (MIN false: w = d (q - 16)) and Q5_1 (MIN true: w = d q + m): 4 low bits of an element
// as in Q4, the fifth from the block's 32-bit qh (element e's bit e); aux (qh, then d and
// pad or m as two halves) loads as one uint2.
template <bool MIN>
struct FQ5 {
    enum { QB = 16, AB = 8, UE = 32, RUNS = 2 };
    struct Raw { uint4 q; uint2 a; };
    static __device__ __forceinline__ Raw load(const QRow& r, int u) {
        return {ld16(r.qs + 16 * u), __ldg(reinterpret_cast<const uint2*>(r.aux + 8 * u))};
    }
    static __device__ __forceinline__ int start(int u, int r) { return 32 * u + 16 * r; }
    static __device__ __forceinline__ void run(const Raw& a, int, int r, float (&w)[16]) {
        const unsigned qh = a.a.x >> (16 * r);
        float d, m;
        h2x2f(a.a.y, d, m);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const unsigned q = ((byte_of(a.q, j) >> (4 * r)) & 15u) | ((qh >> j) & 1u) << 4;
            w[j] = MIN ? small_u2f(q, 0.0f) * d + m : small_u2f(q, 16.0f) * d;
        }
    }
    static __device__ __forceinline__ void codes(const Raw& x, int, int r, unsigned (&q)[4], float& a, float& b) {
        const unsigned qh = x.a.x >> (16 * r);
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = ((word_of(x.q, i) >> (4 * r)) & 0x0F0F0F0Fu) | bits_to_bytes4(qh >> (4 * i));
        h2x2f(x.a.y, a, b);
        if (!MIN) b = -16.0f * a;
    }
};
using FQ5_0 = FQ5<false>;
using FQ5_1 = FQ5<true>;

struct FQ8_0 {
    enum { QB = 32, AB = 2, UE = 32, RUNS = 2 };
    struct Raw { uint4 q0, q1; float d; };
    static __device__ __forceinline__ Raw load(const QRow& r, int u) {
        return {ld16(r.qs + 32 * u), ld16(r.qs + 32 * u + 16), ldh(r.aux + 2 * u)};
    }
    static __device__ __forceinline__ int start(int u, int r) { return 32 * u + 16 * r; }
    static __device__ __forceinline__ void run(const Raw& a, int, int r, float (&w)[16]) {
        const uint4 q = r == 0 ? a.q0 : a.q1;
#pragma unroll
        for (int j = 0; j < 16; ++j) w[j] = small_u2f(byte_of(q, j) ^ 0x80u, 128.0f) * a.d;
    }
    // Signed codes offset by 128 (x ^ 0x80 per byte), so b = -128 d.
    static __device__ __forceinline__ void codes(const Raw& x, int, int r, unsigned (&q)[4], float& a, float& b) {
        const uint4 v = r == 0 ? x.q0 : x.q1;
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = word_of(v, i) ^ 0x80808080u;
        a = x.d;
        b = -128.0f * x.d;
    }
};

// ---- 256-element super-blocks.
// The 12 scale bytes of a Q4_K / Q5_K super-block as the loader rewrites them (qformat.rs
// pack_k_scales, a bijection of the file's bits): chunk c (sub-blocks 2c, 2c + 1) is the 24
// bits from bit 24c of aux bytes 4..16, sc[2c] | mn[2c] << 6 | sc[2c+1] << 12 | mn[2c+1] << 18.
// h: the super-block's 16 aux bytes (d, dmin, then those 12). One funnel shift, no byte select.
__device__ __forceinline__ unsigned k_chunk_bits(const uint4& h, int c) {
    const unsigned lo = c < 2 ? h.y : (c == 2 ? h.z : h.w);
    const unsigned hi = c < 2 ? h.z : h.w;
    unsigned r;
    asm("shf.r.wrap.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(lo), "r"(hi), "r"((24 * c) & 31));
    return r;
}

// Scale and min of run r (sub-block 2c + r) from k_chunk_bits, as floats (exact small ints).
__device__ __forceinline__ void k_scale_min(unsigned bits, int r, float& sc, float& mn) {
    sc = small_u2f((bits >> (12 * r)) & 63u, 0.0f);
    mn = small_u2f((bits >> (12 * r + 6)) & 63u, 0.0f);
}

// Q4_K: unit u = sub-block u (32 elements: super-block u / 8, sub-block j = u % 8). The loader
// reorders the nibbles of a super-block (qformat.rs `q4k_subblock_nibbles`, a bijection) so that
// the 16 bytes qs[16 j ..] hold elements 32u + i (low nibbles: run 0) and 32u + 16 + i (high
// nibbles: run 1), i = 0..15: one unit is one activation block of 32 with one scale and min
// (chunk j / 2, half j % 2 of k_chunk_bits), as the 32-element block formats, so the int8 GEMV
// takes one integer sum and one conversion per 32 weights (gemv_q8.cu SameScale).
struct FQ4K {
    enum { QB = 128, AB = 16, UE = 32, RUNS = 2 };
    struct Raw { uint4 q, h; };
    static __device__ __forceinline__ Raw load(const QRow& r, int u) {
        return {ld16(r.qs + 16 * u), ld16(r.aux + 16 * (u >> 3))};
    }
    static __device__ __forceinline__ int start(int u, int r) { return 32 * u + 16 * r; }
    static __device__ __forceinline__ void scale_min(const Raw& a, int u, float& d1, float& o1) {
        float d, dmin, sc, mn;
        h2x2f(a.h.x, d, dmin);
        k_scale_min(k_chunk_bits(a.h, (u & 7) >> 1), u & 1, sc, mn);
        d1 = d * sc;
        o1 = dmin * mn;
    }
    static __device__ __forceinline__ void run(const Raw& a, int u, int r, float (&w)[16]) {
        float d1, o1;
        scale_min(a, u, d1, o1);
#pragma unroll
        for (int j = 0; j < 16; ++j) w[j] = d1 * small_u2f((byte_of(a.q, j) >> (4 * r)) & 15u, 0.0f) - o1;
    }
    static __device__ __forceinline__ void codes(const Raw& x, int u, int r, unsigned (&q)[4], float& a, float& b) {
        float d1, o1;
        scale_min(x, u, d1, o1);
#pragma unroll
        for (int i = 0; i < 4; ++i) q[i] = (word_of(x.q, i) >> (4 * r)) & 0x0F0F0F0Fu;
        a = d1;
        b = -o1;
    }
};

// Q5_K: the file's Q4_K nibble order plus a fifth bit, bit 2c + r of qh[16h + i] (aux bytes 16..48).
struct FQ5K {
    enum { QB = 128, AB = 48, UE = 32, RUNS = 2 };
    struct Raw { uint4 q, h, qh; };
    static __device__ __forceinline__ Raw load(const QRow& r, int u) {
        const int sb = u >> 3, c = (u & 7) >> 1, h = u & 1;
        return {ld16(r.qs + 128 * sb + 32 * c + 16 * h), ld16(r.aux + 48 * sb), ld16(r.aux + 48 * sb + 16 + 16 * h)};
    }
    // Unit u = super-block u / 8, chunk c = (u % 8) / 2, half h = u % 2 (the file's nibble
    // order): qs[32c + 16h ..] holds elements 64c + 16h + i (low nibbles, sub-block 2c: run 0)
    // and 64c + 32 + 16h + i (high nibbles, sub-block 2c + 1: run 1).
    static __device__ __forceinline__ int start(int u, int r) {
        return 256 * (u >> 3) + 64 * ((u & 7) >> 1) + 16 * (u & 1) + 32 * r;
    }
    static __device__ __forceinline__ void run(const Raw& a, int u, int r, float (&w)[16]) {
        const int c = (u & 7) >> 1;
        float d, dmin, sc, mn;
        h2x2f(a.h.x, d, dmin);
        k_scale_min(k_chunk_bits(a.h, c), r, sc, mn);
        const float d1 = d * sc, o1 = dmin * mn;
        const int hb = 2 * c + r;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const unsigned q = ((byte_of(a.q, j) >> (4 * r)) & 15u) | ((byte_of(a.qh, j) >> hb) & 1u) << 4;
            w[j] = d1 * small_u2f(q, 0.0f) - o1;
        }
    }
    static __device__ __forceinline__ void codes(const Raw& x, int u, int r, unsigned (&q)[4], float& a, float& b) {
        const int c = (u & 7) >> 1;
        float d, dmin, sc, mn;
        h2x2f(x.h.x, d, dmin);
        k_scale_min(k_chunk_bits(x.h, c), r, sc, mn);
#pragma unroll
        for (int i = 0; i < 4; ++i)
            q[i] = ((word_of(x.q, i) >> (4 * r)) & 0x0F0F0F0Fu) | ((word_of(x.qh, i) >> (2 * c + r)) & 0x01010101u) << 4;
        a = d * sc;
        b = -(dmin * mn);
    }
};

// Q6_K: unit u = super-block u / 4, half hh = (u % 4) / 2 (128 elements), l0 = 16 (u % 2):
// for l = l0 + i, run k (0..3) is element 128hh + l + 32k: the low nibble of ql[64hh + l]
// (k = 0), low of ql[64hh + 32 + l] (1), high of ql[64hh + l] (2), high of ql[64hh + 32 + l]
// (3), with bits 2k..2k+1 of qh[32hh + l] on top; its scale sc[8hh + l0 / 16 + 2k] is byte k
// of aux word u % 4 (the loader's order, qformat.rs Q6K_AUX), d at aux byte 16.
struct FQ6K {
    enum { QB = 192, AB = 20, UE = 64, RUNS = 4 };
    struct Raw { uint4 a, b, c; unsigned s; float d; };
    static __device__ __forceinline__ Raw load(const QRow& r, int u) {
        const int sb = u >> 2, hh = (u & 3) >> 1, g = u & 1;
        const u8_t* q = r.qs + 192 * sb;
        const u8_t* x = r.aux + 20 * sb;
        return {ld16(q + 64 * hh + 16 * g), ld16(q + 64 * hh + 32 + 16 * g), ld16(q + 128 + 32 * hh + 16 * g),
                ld32(x + 4 * (u & 3)), ldh(x + 16)};
    }
    static __device__ __forceinline__ int start(int u, int r) {
        return 256 * (u >> 2) + 128 * ((u & 3) >> 1) + 16 * (u & 1) + 32 * r;
    }
    // The signed scale of run r times d (byte r of s, offset by 128 through the float trick).
    static __device__ __forceinline__ float scale(const Raw& a, int r) {
        return a.d * (code_f(a.s ^ 0x80808080u, r) - 128.0f);
    }
    static __device__ __forceinline__ void run(const Raw& a, int, int r, float (&w)[16]) {
        const float sc = scale(a, r);
        const uint4 lq = (r & 1) ? a.b : a.a;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const unsigned lo = (byte_of(lq, j) >> (4 * (r >> 1))) & 15u;
            const unsigned q = lo | ((byte_of(a.c, j) >> (2 * r)) & 3u) << 4;
            w[j] = sc * small_u2f(q, 32.0f);
        }
    }
    static __device__ __forceinline__ void codes(const Raw& x, int, int r, unsigned (&q)[4], float& a, float& b) {
        a = scale(x, r);
        b = -32.0f * a;
        const uint4 lq = (r & 1) ? x.b : x.a;
#pragma unroll
        for (int i = 0; i < 4; ++i)
            q[i] = ((word_of(lq, i) >> (4 * (r >> 1))) & 0x0F0F0F0Fu) | ((word_of(x.c, i) >> (2 * r)) & 0x03030303u) << 4;
    }
};

// acc[r][t] = 0 for NR rows x NT tokens.
template <int NR, int NT>
__device__ __forceinline__ void zero_acc(float (*acc)[NT]) {
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
}

// One round of a GEMV's unit loop: units u0 + STRIDE k (k < UNROLL) of NR rows, those below
// `units`, all loads issued before any is used (UNROLL x NR loads in flight a thread).
template <class F, int NR, int UNROLL, int STRIDE>
__device__ __forceinline__ void load_round(typename F::Raw (&raw)[UNROLL][NR], const QRow* rows, int u0, int units) {
#pragma unroll
    for (int k = 0; k < UNROLL; ++k)
#pragma unroll
        for (int r = 0; r < NR; ++r)
            if (u0 + STRIDE * k < units) raw[k][r] = F::load(rows[r], u0 + STRIDE * k);
}

// One run of 16 f32 inputs (v: its four float4 loads) against the codes of NR rows (q[r]: four
// words of byte codes, weight = ca[r] * code + cb[r]): acc[r][t] += ca[r] * sum(code x) +
// cb[r] * sum(x), sum(x) shared by the rows. The inner step of the f32-input GEMVs
// (gemv_quant.cu, moe.cu), in one fixed order of operations.
template <int NR, int NT>
__device__ __forceinline__ void run_dot_f32(const float4 (&v)[4], const unsigned (&q)[NR][4], const float (&ca)[NR],
                                            const float (&cb)[NR], float (*acc)[NT], int t) {
    float x[16];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        x[4 * i] = v[i].x;
        x[4 * i + 1] = v[i].y;
        x[4 * i + 2] = v[i].z;
        x[4 * i + 3] = v[i].w;
    }
    float sx = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) sx += x[j];
#pragma unroll
    for (int r = 0; r < NR; ++r) {
        float sq = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) sq = fmaf(code_f(q[r][i], j), x[4 * i + j], sq);
        acc[r][t] = fmaf(ca[r], sq, fmaf(cb[r], sx, acc[r][t]));
    }
}

// All runs of unit u: w[r] holds the 16 values from column st[r] on.
template <class F>
__device__ __forceinline__ void decode_unit(const typename F::Raw& a, int u, float (&w)[F::RUNS][16], int (&st)[F::RUNS]) {
#pragma unroll
    for (int r = 0; r < F::RUNS; ++r) {
        F::run(a, u, r, w[r]);
        st[r] = F::start(u, r);
    }
}

// Row r of a matrix with the given per-row byte counts of qs and aux.
__device__ __forceinline__ QRow q_row(const u8_t* qs, const u8_t* aux, long long r, int qs_row, int aux_row) {
    return {qs + r * qs_row, aux + r * aux_row};
}

// The packed units of column chunk c of a tile's weight rows, as the dense prefill GEMMs
// (gemm_quant.cu) fetch them: thread q = threadIdx.x + THREADS i loads unit q % UPC (of the UPC
// units a row has in a chunk) of its row rows[i]. (The 128-row tiles map slots by bank group:
// tile_slot.)
template <class F, int THREADS, int UPC, int N>
__device__ __forceinline__ void fetch_tile_units(const QRow* rows, int c, typename F::Raw (&rw)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const int q = threadIdx.x + THREADS * i;
        rw[i] = F::load(rows[i], c * UPC + q % UPC);
    }
}

// Staging slot q (of the BM x UPC unit slots of a tile's 128-column chunk; the GEMMs of
// moe_gemm.cu and gemm_quant.cu's 128-row tile) -> tile row and unit of the chunk.
// Each quarter-warp's 16-byte stores of a staged run (8 threads) must fall in 8 different 16-byte
// bank groups: a row is 128 + 8 halves = 17 groups (row r starts at group r mod 8), and a row's
// units 0 and 1 start `gap` groups apart (the format's layout: 4 for Q4_0 / Q8_0 / Q4_K, 2 for
// Q5_K / Q6_K). Two units of 4 rows do it: rows {0, 1, 2, 3} for gap 4, rows {0, 1, 4, 5} for
// gap 2 (units 2 and 3 come from the next quarter); the pair of threads reading one row's two
// units still reads 32 contiguous bytes. With q / UPC, q % UPC the quarter's two rows of four
// units stored two-way conflicted (Nsight Compute: half the store wavefronts excess).
template <class F, int UPC>
__device__ __forceinline__ void tile_slot(int q, int& tr, int& unit) {
    const int gap = (F::start(1, 0) - F::start(0, 0)) / 8;  // 16-byte groups
    if (UPC < 2 || (gap != 2 && gap != 4)) {
        tr = q / UPC;
        unit = q % UPC;
        return;
    }
    const int l = q & 7, b0 = (l >> 1) & 1, b1 = (l >> 2) & 1;
    int hq = q >> 3;
    unit = l & 1;
    if (UPC > 2) {
        unit |= (hq % (UPC / 2)) << 1;
        hq /= UPC / 2;
    }
    tr = gap == 4 ? b0 | b1 << 1 | hq << 2 : b0 | (hq & 1) << 1 | b1 << 2 | (hq >> 1) << 3;
}

// ---- Staging one run of 16 weights as F16 (16 halves from dst on, two 16-byte stores).
//
// The generic form decodes through F::run (f32) and rounds with the saturating conversion: per
// weight two shifts/masks, an OR, FADD, FFMA, two FMNMX and a conversion (quarter rate; on
// sm_70 no packed F2FP), which bounds the packed GEMMs by instruction issue, not bytes. Q4_K,
// Q6_K and Q8_0 have an F16 form: two codes c0, c1 (< 1024) byte-permuted under the exponent
// byte 0x64 are the halves 1024 + c0, 1024 + c1 (PRMT); one add.f16x2 of -(1024 + offset)
// gives the signed codes exactly; one fma/mul.f16x2 applies the run's scale and min, rounded
// to F16 once. Per weight: half a PRMT, half a HADD2, half an HFMA2 and a share of one mask.
// The run's scale and min enter as F16 (rounded from the f32 the generic form uses): Q4_K
// values are round16(q * round16(d sc) - round16(dmin m)), Q6_K round16(round16(d sc) * (q -
// 32)), Q8_0 round16(d q) (the generic form's value: d is F16, the product exact in f32). The
// CPU twin: src/model/quant/staged.rs. Where a run's bound says a value could pass 65,000 the
// generic (saturating) form runs. (h2_codes, hadd2, hmul2, hfma2: common.cuh.)

// f in both halves (rounded to F16 once).
__device__ __forceinline__ unsigned h2_splat(float f) { return (unsigned)f2h(f) * 0x10001u; }

// A run's 16 values as 8 F16 pairs, handed to `out` (a sink: out(pk), pk[j] holding elements 2j
// (low half) and 2j + 1). Each form calls its sink where it ends, so a sink that stores to
// shared memory (Stage16) compiles to the stores inside each branch.
template <class F, class K>
__device__ __forceinline__ void pack16_generic(const typename F::Raw& a, int u, int r, const K& out) {
    float w[16];
    F::run(a, u, r, w);
    unsigned pk[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) pk[j] = f2h_sat(w[2 * j]) | (unsigned)f2h_sat(w[2 * j + 1]) << 16;
    out(pk);
}

// The F16 form of a run whose codes are the bytes of q[0..4] (element 4i + b = byte b of q[i]),
// each value (code - OFF) * s + m on F16 halves (m: FMA adds it; else a plain product).
template <unsigned OFF, bool FMA, class K>
__device__ __forceinline__ void pack16_h2(const unsigned (&q)[4], unsigned s, unsigned m, const K& out) {
    constexpr unsigned BIAS = h2_minus_1024_plus(OFF);
    unsigned pk[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned v0 = hadd2(h2_codes<0x4140>(q[i]), BIAS), v1 = hadd2(h2_codes<0x4342>(q[i]), BIAS);
        pk[2 * i] = FMA ? hfma2(v0, s, m) : hmul2(v0, s);
        pk[2 * i + 1] = FMA ? hfma2(v1, s, m) : hmul2(v1, s);
    }
    out(pk);
}

// Pack16<F>::emit: run r of unit u as F16 pairs into a sink (the generic form, or the format's
// F16 form).
template <class F> struct Pack16 {
    template <class K>
    static __device__ __forceinline__ void emit(const typename F::Raw& a, int u, int r, const K& out) {
        pack16_generic<F>(a, u, r, out);
    }
};

__device__ __forceinline__ unsigned lop_and_or(unsigned a, unsigned m, unsigned c) {
    unsigned r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(m), "r"(c));  // (a & m) | c
    return r;
}

// Q4_K: run r's codes and value a * q + b from FQ4K::codes (a = d sc, b = -dmin m).
template <> struct Pack16<FQ4K> {
    template <class K> static __device__ __forceinline__ void emit(const FQ4K::Raw& raw, int u, int r, const K& out) {
        unsigned q[4];
        float a, b;
        FQ4K::codes(raw, u, r, q, a, b);
        if (!(fabsf(b) + 15.0f * fabsf(a) <= 65000.0f)) {
            pack16_generic<FQ4K>(raw, u, r, out);
            return;
        }
        pack16_h2<0, true>(q, h2_splat(a), h2_splat(b), out);
    }
};

// Q6_K: element 4i + b of run r is the low (r < 2) or high nibble of byte b of word i of a (runs
// 0, 2) or b (runs 1, 3), with bits 2r, 2r + 1 of byte b of c as bits 4, 5; value sc * (q - 32).
template <> struct Pack16<FQ6K> {
    template <class K> static __device__ __forceinline__ void emit(const FQ6K::Raw& a, int u, int r, const K& out) {
        const float sc = FQ6K::scale(a, r);
        if (!(32.0f * fabsf(sc) <= 65000.0f)) {
            pack16_generic<FQ6K>(a, u, r, out);
            return;
        }
        const uint4 lq = (r & 1) ? a.b : a.a;
        unsigned q[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const unsigned c = word_of(a.c, i), hi = (r < 2 ? c << (4 - 2 * r) : c >> (2 * r - 4)) & 0x30303030u;
            q[i] = lop_and_or(word_of(lq, i) >> (4 * (r >> 1)), 0x0F0F0F0Fu, hi);
        }
        pack16_h2<32, false>(q, h2_splat(sc), 0, out);
    }
};

// Q8_0: run r's codes from FQ8_0::codes (the signed bytes offset by 128), value d (q - 128).
template <> struct Pack16<FQ8_0> {
    template <class K> static __device__ __forceinline__ void emit(const FQ8_0::Raw& raw, int, int r, const K& out) {
        unsigned q[4];
        float d, b;
        FQ8_0::codes(raw, 0, r, q, d, b);
        if (!(128.0f * fabsf(d) <= 65000.0f)) {
            pack16_generic<FQ8_0>(raw, 0, r, out);
            return;
        }
        pack16_h2<128, false>(q, h2_splat(d), 0, out);
    }
};

// The sinks: into shared memory (16 halves from dst on, two 16-byte stores) or registers.
struct Pack16Store {
    uint4* dst;
    __device__ __forceinline__ void operator()(const unsigned (&pk)[8]) const {
        dst[0] = make_uint4(pk[0], pk[1], pk[2], pk[3]);
        dst[1] = make_uint4(pk[4], pk[5], pk[6], pk[7]);
    }
};
struct Pack16Regs {
    unsigned* v;
    __device__ __forceinline__ void operator()(const unsigned (&pk)[8]) const {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = pk[j];
    }
};

// Stage16<F>::run: run r of unit u as F16 into shared memory at dst.
template <class F> struct Stage16 {
    static __device__ __forceinline__ void run(const typename F::Raw& a, int u, int r, uint4* dst) {
        Pack16<F>::emit(a, u, r, Pack16Store{dst});
    }
};

// pack16<F>: run r of unit u as F16 pairs in registers (the register-fragment tiles' A values).
template <class F>
__device__ __forceinline__ void pack16(const typename F::Raw& a, int u, int r, unsigned (&pk)[8]) {
    Pack16<F>::emit(a, u, r, Pack16Regs{pk});
}

// Stages chunk c's fetched units as F16: slot q = threadIdx.x + THREADS i (rw[i]; tile_slot)
// into its tile row of sw [tile rows, 128 + 8 halves] (the 128-column chunks of the grouped MoE
// GEMM and of gemm_quant.cu's 128-row tile).
template <class F, int THREADS, int UPC, int N>
__device__ __forceinline__ void stage_tile_chunk(half_t* sw, const typename F::Raw (&rw)[N], int c) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
        int tr, unit;
        tile_slot<F, UPC>(threadIdx.x + THREADS * i, tr, unit);
        const int u = c * UPC + unit;
#pragma unroll
        for (int k = 0; k < F::RUNS; ++k)
            Stage16<F>::run(rw[i], u, k, reinterpret_cast<uint4*>(sw + tr * (128 + 8) + (F::start(u, k) - c * 128)));
    }
}

// Instantiates MACRO(name, F) for every format (entry point names use the lower-case name).
#define FOR_EACH_QFORMAT(MACRO) \
    MACRO(q4_0, FQ4_0)          \
    MACRO(q4_1, FQ4_1)          \
    MACRO(q5_0, FQ5_0)          \
    MACRO(q5_1, FQ5_1)          \
    MACRO(q8_0, FQ8_0)          \
    MACRO(q4_k, FQ4K)           \
    MACRO(q5_k, FQ5K)           \
    MACRO(q6_k, FQ6K)

// ---- int8 activations (kernels/gemv_q8.cu; CPU twin: src/backend/cuda/ops/q8x.rs).
// A step input x [n_tok, cols] f32 quantized in blocks of 32 as two int8 planes: hi codes
// q = rint(x / d) with d = amax / 127, and the residual r = x - d q (|r| <= d / 2) as lo codes
// l = rint(r / dl) with dl = d * Q8X_LO (1 / 254), so x ~ d q + dl l to about amax / 65,000
// (one plane alone, llama.cpp's design, is off by up to amax / 254 per value: ~0.16 logits on
// the sample model, above the GPU tolerance of its greedy reference cases). Stored as
// qx [n_tok, cols] (hi), ql [n_tok, cols] (lo), and per run of 16 xs [n_tok, cols / 16]
// float2 = (d, d * sum(q) + dl * sum(l)). A run of packed weights w = a * c + b (codes c from
// F::codes) then dots the run of x as a d sum(c q) + a dl sum(c l) + b xs.y: eight dp4a.
#define Q8X_LO (1.0f / 254.0f)

// The two planes of 4 consecutive values v of one block of 32 held by 8 consecutive lanes (a
// lane group aligned to 8; every lane of the warp must call it, so the shuffles see whole
// groups): wh, wl = the hi and lo codes of v as bytes 0..3, xs = (d, d * sum(q) + dl * sum(l))
// of the run of 16 that v is in (the same on the run's 4 lanes). The one quantizer of the int8
// activations (quantize_x_q8, rmsnorm_q8_f32, the MoE kernels); CPU twin: q8x.rs `quantize`.
struct Q8Quad {
    unsigned wh, wl;
    float2 xs;
};
__device__ __forceinline__ Q8Quad q8_quad(const float4 v) {
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    const float dl = __fmul_rn(d, Q8X_LO);
    const float idl = dl > 0.0f ? 1.0f / dl : 0.0f;
    const float vv[4] = {v.x, v.y, v.z, v.w};
    int q[4], l[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        q[k] = __float2int_rn(__fmul_rn(vv[k], id));
        const float r = __fmaf_rn(-d, (float)q[k], vv[k]);
        l[k] = max(-127, min(127, __float2int_rn(__fmul_rn(r, idl))));
    }
    // Sums over the run of 16 (4 lanes): integers, exact in any order.
    int s = q[0] + q[1] + q[2] + q[3], sl = l[0] + l[1] + l[2] + l[3];
    s += __shfl_xor_sync(FULL_MASK, s, 1);
    s += __shfl_xor_sync(FULL_MASK, s, 2);
    sl += __shfl_xor_sync(FULL_MASK, sl, 1);
    sl += __shfl_xor_sync(FULL_MASK, sl, 2);
    Q8Quad out;
    out.wh = (q[0] & 0xff) | (q[1] & 0xff) << 8 | (q[2] & 0xff) << 16 | (unsigned)(q[3] & 0xff) << 24;
    out.wl = (l[0] & 0xff) | (l[1] & 0xff) << 8 | (l[2] & 0xff) << 16 | (unsigned)(l[3] & 0xff) << 24;
    out.xs = make_float2(d, __fmaf_rn(dl, (float)sl, __fmul_rn(d, (float)s)));
    return out;
}

// sum of the 4 byte products of a (unsigned bytes) and b (signed bytes), plus c.
__device__ __forceinline__ int dp4a_us(unsigned a, unsigned b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
// Both operands signed bytes.
__device__ __forceinline__ int dp4a_ss(unsigned a, unsigned b, int c) {
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// Whether a format's codes are read as signed bytes with b = 0 (Q8_0: its stored bytes are the
// signed values; the unsigned form, offset by 128, would add a large b * sum(q) that cancels).
template <class F> struct SignedCodes { enum { V = 0 }; };
template <> struct SignedCodes<FQ8_0> { enum { V = 1 }; };

// Codes of run r of unit u for dot_codes_q8 (F::codes; Q8_0 back to its signed bytes, b = 0).
template <class F>
__device__ __forceinline__ void codes_q8(const typename F::Raw& raw, int u, int r, unsigned (&c)[4], float& a, float& b) {
    F::codes(raw, u, r, c, a, b);
    if (SignedCodes<F>::V) {
#pragma unroll
        for (int i = 0; i < 4; ++i) c[i] ^= 0x80808080u;
        b = 0.0f;
    }
}

// sum of the 16 products of a run's codes with 16 int8 values (as a uint4).
template <class F>
__device__ __forceinline__ int dot16_q8(const unsigned (&c)[4], const uint4& q) {
    if (SignedCodes<F>::V) {
        int s = dp4a_ss(c[0], q.x, 0);
        s = dp4a_ss(c[1], q.y, s);
        s = dp4a_ss(c[2], q.z, s);
        return dp4a_ss(c[3], q.w, s);
    }
    int s = dp4a_us(c[0], q.x, 0);
    s = dp4a_us(c[1], q.y, s);
    s = dp4a_us(c[2], q.z, s);
    return dp4a_us(c[3], q.w, s);
}

// A run's codes (codes_q8) dotted with one token's run of x (qh, ql: its 16 hi and lo codes,
// xs: (d, d * sum(q) + dl * sum(l))): sum over the run of w_j * (d q_j + dl l_j).
template <class F>
__device__ __forceinline__ float dot_codes_q8(const unsigned (&c)[4], float a, float b, const uint4& qh,
                                              const uint4& ql, float2 xs) {
    const float ad = a * xs.x;
    return fmaf(ad, (float)dot16_q8<F>(c, qh), fmaf(ad * Q8X_LO, (float)dot16_q8<F>(c, ql), b * xs.y));
}

// Run r of unit u of packed weights dotted with one token's run of x (for callers with one
// token, e.g. an expert's GEMV): codes_q8 then dot_codes_q8.
template <class F>
__device__ __forceinline__ float dot_run_q8(const typename F::Raw& raw, int u, int r, const uint4& qh, const uint4& ql,
                                            float2 xs) {
    unsigned c[4];
    float a, b;
    codes_q8<F>(raw, u, r, c, a, b);
    return dot_codes_q8<F>(c, a, b, qh, ql, xs);
}
