// Quantized weights widened on the device (layout: quant.cuh):
// - dequant_<fmt>_f16: rows row0 .. row0 + n_rows of a matrix into an F16 scratch [n_rows, cols]
//   that the tensor-core GEMM / cuBLAS read (steps of more than 8 tokens; no full F16 copy of
//   the model: one scratch, reused matrix after matrix);
// - embedding_<fmt>: out[t, :] = f32(row ids[t]) of a quantized embedding table;
// - fill_random_u32 / tile_aux: random synthetic quantized weights made on the GPU (random qs
//   bytes; aux blocks copied from host-quantized templates, so scales are realistic).
#include "common.cuh"
#include "quant.cuh"

struct DequantParams {
    const u8_t* qs;
    const u8_t* aux;
    half_t* out;    // [n_rows, cols] f16
    long long row0; // first row of the matrix to widen
    int n_rows;
    int cols;
    int qs_row;
    int aux_row;
};

// Widening is a copy (7 G weights of a Qwen3-8B prefill: 4.3 GB read, 14 GB written), built
// for coalesced 16-byte stores and bytes in flight: a unit's RUNS runs of 16 values are stored
// by 2 RUNS lanes, 8 values (one 16-byte store) each, so the lanes of a warp write 512
// consecutive bytes per store (units of every format tile their columns this way); a block of
// DQ_THREADS lanes takes DQ_PASSES rounds of units of one row (4,096 columns), all loads issued
// before the first decode. The lanes of a unit load the same bytes (one request per warp).
#define DQ_THREADS 256
#define DQ_PASSES 2

// 8 decoded values as one 16-byte F16 store at o (16-byte aligned).
__device__ __forceinline__ void store8_f16(half_t* o, const float (&w)[16], int half) {
    unsigned pk[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float lo = half ? w[8 + 2 * j] : w[2 * j], hi = half ? w[9 + 2 * j] : w[2 * j + 1];
        pk[j] = (unsigned)f2h_sat(lo) | (unsigned)f2h_sat(hi) << 16;
    }
    // One vector store (the compiler splits the plain uint4 store here into four 4-byte ones).
    asm volatile("st.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(o), "r"(pk[0]), "r"(pk[1]), "r"(pk[2]), "r"(pk[3]) : "memory");
}

template <class F>
__device__ __forceinline__ void dequant_impl(const DequantParams& p) {
    constexpr int G = 2 * F::RUNS;  // lanes per unit
    constexpr int PER_PASS = DQ_THREADS / G;
    const int units = p.cols / F::UE;
    const int per_block = PER_PASS * DQ_PASSES;
    const int blocks_per_row = (units + per_block - 1) / per_block;
    const int r = blockIdx.x / blocks_per_row;
    if (r >= p.n_rows) return;
    const int u0 = (blockIdx.x - r * blocks_per_row) * per_block + threadIdx.x / G;
    const int run = (threadIdx.x % G) >> 1, half = threadIdx.x & 1;
    const QRow row = q_row(p.qs, p.aux, p.row0 + r, p.qs_row, p.aux_row);
    half_t* o = p.out + (long long)r * p.cols;
    typename F::Raw raw[DQ_PASSES];
#pragma unroll
    for (int k = 0; k < DQ_PASSES; ++k) {
        const int u = u0 + k * PER_PASS;
        if (u < units) raw[k] = F::load(row, u);
    }
#pragma unroll
    for (int k = 0; k < DQ_PASSES; ++k) {
        const int u = u0 + k * PER_PASS;
        if (u >= units) continue;
        float w[16];
        F::run(raw[k], u, run, w);
        store8_f16(o + F::start(u, run) + 8 * half, w, half);
    }
}

// Q6_K apart (its generic unit is 4 runs of 64 columns: the 8 lanes of a unit each issued the
// unit's five loads, 54 bytes, for 8 values, ~40% of the copy rate): a lane takes the 8 columns
// l..l+8 of runs k and k + 2 (k = 0, 1) of half hh of a super-block, which share their ql bytes
// (low and high nibbles) and qh bytes (bits 2k and 2k + 4), so 22 bytes in four loads give 16
// values, each computed once and stored. 16 lanes a super-block (hh, k, l / 8), 16 super-blocks
// a block of DQ_THREADS (4,096 columns, the launcher's grid); a warp's store writes four whole
// 128-byte lines (columns 0..64 and 128..192 of two super-blocks, then 64..128 and 192..256).
__device__ __forceinline__ void dequant_q6k_impl(const DequantParams& p) {
    constexpr int SB_PER_BLOCK = DQ_THREADS / 16;
    const int nsb = p.cols / 256;
    const int blocks_per_row = (nsb + SB_PER_BLOCK - 1) / SB_PER_BLOCK;
    const int r = blockIdx.x / blocks_per_row;
    if (r >= p.n_rows) return;
    const int sb = (blockIdx.x - r * blocks_per_row) * SB_PER_BLOCK + threadIdx.x / 16;
    if (sb >= nsb) return;
    const int i = threadIdx.x & 15, hh = i >> 3, k = (i >> 2) & 1, l = 8 * (i & 3);
    const QRow row = q_row(p.qs, p.aux, p.row0 + r, p.qs_row, p.aux_row);
    const u8_t* q = row.qs + 192 * sb;
    const u8_t* x = row.aux + 20 * sb;
    // ql[64 hh + 32 k + l ..], qh[32 hh + l ..]: 8 bytes each; the scales of runs 0..3 of unit
    // 2 hh + l / 16 (FQ6K), d.
    const uint2 ql = __ldg(reinterpret_cast<const uint2*>(q + 64 * hh + 32 * k + l));
    const uint2 qh = __ldg(reinterpret_cast<const uint2*>(q + 128 + 32 * hh + l));
    const unsigned s = ld32(x + 4 * (2 * hh + (l >> 4)));
    FQ6K::Raw sd;  // only the scale word and d (FQ6K::scale)
    sd.s = s;
    sd.d = ldh(x + 16);
    half_t* o = p.out + (long long)r * p.cols + 256 * sb + 128 * hh + 32 * k + l;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
        const int run = k + 2 * n;
        const float sc = FQ6K::scale(sd, run);
        unsigned pk[4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            // Byte b of c is the 6-bit code of column l + 4h + b (bytes of the two words at once).
            const unsigned lw = h ? ql.y : ql.x, hw = h ? qh.y : qh.x;
            const unsigned c = ((lw >> (4 * n)) & 0x0F0F0F0Fu) | ((hw >> (2 * run)) & 0x03030303u) << 4;
            float w[4];
#pragma unroll
            for (int b = 0; b < 4; ++b)  // code - 32 exact (small_u2f on a byte of c), then the product
                w[b] = sc * (__int_as_float(__byte_perm(c, 0x4B000000u, 0x7440 + b)) - (8388608.0f + 32.0f));
            pk[2 * h] = (unsigned)f2h_sat(w[0]) | (unsigned)f2h_sat(w[1]) << 16;
            pk[2 * h + 1] = (unsigned)f2h_sat(w[2]) | (unsigned)f2h_sat(w[3]) << 16;
        }
        half_t* on = o + 64 * n;
        asm volatile("st.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(on), "r"(pk[0]), "r"(pk[1]), "r"(pk[2]), "r"(pk[3]) : "memory");
    }
}

// Q4_K apart as well (its generic unit: 4 lanes each loading the unit's 32 bytes and decoding
// both runs for one half of one): a lane takes 8 bytes of a unit's qs, the low nibbles (run 0,
// columns 32u + 8b ..) and the high ones (run 1, 32u + 16 + 8b ..), b = lane % 2: 24 bytes in
// two loads give 16 values. 2 lanes a unit, 128 units a block (4,096 columns); each warp store
// writes whole 32-byte sectors (the two runs of a unit are its two sectors).
__device__ __forceinline__ void dequant_q4k_impl(const DequantParams& p) {
    constexpr int U_PER_BLOCK = DQ_THREADS / 2;
    const int units = p.cols / FQ4K::UE;
    const int blocks_per_row = (units + U_PER_BLOCK - 1) / U_PER_BLOCK;
    const int r = blockIdx.x / blocks_per_row;
    if (r >= p.n_rows) return;
    const int u = (blockIdx.x - r * blocks_per_row) * U_PER_BLOCK + threadIdx.x / 2, b = threadIdx.x & 1;
    if (u >= units) return;
    const QRow row = q_row(p.qs, p.aux, p.row0 + r, p.qs_row, p.aux_row);
    FQ4K::Raw a;  // only the scale block (FQ4K::scale_min); the codes: 8 bytes of the unit
    a.h = ld16(row.aux + 16 * (u >> 3));
    const uint2 q = __ldg(reinterpret_cast<const uint2*>(row.qs + 16 * u + 8 * b));
    float d1, o1;
    FQ4K::scale_min(a, u, d1, o1);
    half_t* o = p.out + (long long)r * p.cols + 32 * u + 8 * b;
#pragma unroll
    for (int run = 0; run < 2; ++run) {
        unsigned pk[4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const unsigned c = ((h ? q.y : q.x) >> (4 * run)) & 0x0F0F0F0Fu;  // byte j: code of column 4h + j
            float w[4];
#pragma unroll
            for (int j = 0; j < 4; ++j)  // as FQ4K::run (small_u2f of the code: exact), same contraction
                w[j] = d1 * (__int_as_float(__byte_perm(c, 0x4B000000u, 0x7440 + j)) - 8388608.0f) - o1;
            pk[2 * h] = (unsigned)f2h_sat(w[0]) | (unsigned)f2h_sat(w[1]) << 16;
            pk[2 * h + 1] = (unsigned)f2h_sat(w[2]) | (unsigned)f2h_sat(w[3]) << 16;
        }
        half_t* on = o + 16 * run;
        asm volatile("st.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(on), "r"(pk[0]), "r"(pk[1]), "r"(pk[2]), "r"(pk[3]) : "memory");
    }
}

struct EmbeddingQParams {
    const u8_t* qs;
    const u8_t* aux;
    const unsigned int* ids;  // [n_tok]
    float* out;               // [n_tok, cols] f32
    int n_tok;
    int cols;
    int qs_row;
    int aux_row;
};

template <class F>
__device__ __forceinline__ void embedding_q_impl(const EmbeddingQParams& p) {
    const int t = blockIdx.x;
    const QRow row = q_row(p.qs, p.aux, p.ids[t], p.qs_row, p.aux_row);
    float* o = p.out + (long long)t * p.cols;
    for (int u = threadIdx.x; u < p.cols / F::UE; u += blockDim.x) {
        float w[F::RUNS][16];
        int st[F::RUNS];
        decode_unit<F>(F::load(row, u), u, w, st);
#pragma unroll
        for (int k = 0; k < F::RUNS; ++k)
#pragma unroll
            for (int j = 0; j < 16; ++j) o[st[k] + j] = w[k][j];
    }
}

// dequant: grid n_rows x ceil(cols / 4,096), block DQ_THREADS.
// embedding: grid n_tok, block 128.
template <class F>
__device__ __forceinline__ void dequant_any(const DequantParams& p) { dequant_impl<F>(p); }
template <>
__device__ __forceinline__ void dequant_any<FQ6K>(const DequantParams& p) { dequant_q6k_impl(p); }
template <>
__device__ __forceinline__ void dequant_any<FQ4K>(const DequantParams& p) { dequant_q4k_impl(p); }

#define DEQUANT_ENTRIES(name, F)                                                                       \
    extern "C" __global__ void dequant_##name##_f16(const DequantParams p) { dequant_any<F>(p); }    \
    extern "C" __global__ void embedding_##name(const EmbeddingQParams p) { embedding_q_impl<F>(p); }

FOR_EACH_QFORMAT(DEQUANT_ENTRIES)

struct FillBytesParams {
    unsigned int* out;  // [n] u32
    long long n;
    unsigned long long seed;
};

// grid-stride; out[i] = 32 random bits from a hash of (seed, i).
extern "C" __global__ void fill_random_u32(const FillBytesParams p) {
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += step)
        p.out[i] = (unsigned)(hash_index(p.seed, i) >> 16);
}

struct TileAuxParams {
    u8_t* out;           // [n_blocks, ab] bytes
    const u8_t* tmpl;    // [n_tmpl, ab] bytes
    long long n_blocks;
    unsigned long long seed;
    int ab;
    int n_tmpl;
};

// grid-stride over bytes: block i takes template hash(seed, i) % n_tmpl.
extern "C" __global__ void tile_aux(const TileAuxParams p) {
    const long long n = p.n_blocks * p.ab;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const long long b = i / p.ab;
        const int k = (int)(hash_index(p.seed, b) % (unsigned long long)p.n_tmpl);
        p.out[i] = p.tmpl[(long long)k * p.ab + (i - b * p.ab)];
    }
}
