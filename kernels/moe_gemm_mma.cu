// The grouped MoE GEMM's register-fragment tiles (r8, r16: 8 or 16 tokens of one expert; CPU
// twin, layout and requirements as kernels/moe_gemm.cu): the weights are dequantized straight
// into the A fragments of mma.sync.m8n8k4 (documented fragment layout, native HMMA.884 on a
// V100) and never staged in shared memory.
//
// Why: the wmma tiles stage each chunk's weights as F16 in shared memory and load them back as
// fragments (16 KB written and 32 KB read a 64 x 128 chunk); Nsight Compute found the L1 unit's
// LSU wavefronts at ~87% in every wmma MoE tile, those stores and loads the most of them. An
// m8n8k4 A fragment is 4 consecutive K values of one row in one thread, exactly one word of a
// run's codes (quant.cuh F::codes: byte b of word i is element 4i + b), so each thread converts
// its own unit's packed bytes (pack16, the values Stage16 would stage) and multiplies.
//
// Block (128 threads, 4 warps): 64 weight rows (gate/up: 32 gate rows, then the same rows of
// up) x 8 N8 tokens. Warp w owns tile rows 16 w .. 16 w + 15 as two row groups of 8; in a
// warp, the 4 m8n8k4 products (quad pairs q = lane / 4 % 4: lanes 4q..4q+3 and 4q+16..4q+19)
// each take one unit of a chunk (unit q % UPC), its quad pair's 8 lanes holding 8 rows (row j =
// lane % 4 + 4 (lane >= 16), the A layout). Per chunk a thread loads S = UPC / 2 units (16-byte
// loads; a warp's load covers 8 rows x the chunk's contiguous units), row group g = (q + 4 s) /
// UPC of slot s, and the next chunk's are fetched while this one multiplies. Each quad pair
// accumulates its units' K; the quad pairs of one row group are summed by shuffles at the end.
// The input chunk is staged once in shared memory as 8-byte B fragments (4 K values of one
// token), xs_slot's swizzle keeping a half-warp's 16 fragment loads on distinct banks.
#include "common.cuh"
#include "quant.cuh"
#include "moe_gemm.cuh"

// d (8 f32, the m8n8k4 C layout) += A (row-major 8 x 4: a0, a1) x B (column-major 4 x 8: b0, b1).
__device__ __forceinline__ void mma884(float (&d)[8], unsigned a0, unsigned a1, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9}, {%10,%11}, "
        "{%0,%1,%2,%3,%4,%5,%6,%7};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a0), "r"(a1), "r"(b0), "r"(b1));
}

// The 8-byte slot of token n (0..7 of group jn) and K group kg (4 columns, 0..31 of a chunk):
// slots [N8][32][8] XORed with h(kg) << 2 (h reads kg's bits 2..4, so the XOR, which may
// move a slot to the other K group of its pair, is a bijection). The 4 quad pairs' K groups at
// one instruction (kg = 8q + 4r + i for the 32-element units; 16 (q / 2) + 4 (q % 2) + 8r + i for
// Q5_K; 4 (q % 2) + 8r + i for Q6_K) then take distinct bank pairs (8 (kg & 1) + n) ^ (h << 2)
// in each half-warp (checked for each layout by enumeration).
__device__ __forceinline__ int xs_slot(int jn, int kg, int n) {
    const int h = (((kg >> 2) ^ (kg >> 3)) & 1) | ((kg >> 3) & 2);
    return ((jn * 32 + kg) * 8 + n) ^ (h << 2);
}

template <class F, int N8, bool GATE_UP>
__device__ __forceinline__ void moe_gemm_mma_impl(const MoeGemmParams& p) {
    constexpr int UPC = MG_BK / F::UE, S = UPC / 2, BM = 64, BN = 8 * N8, LDO = BN + 4;
    static_assert(UPC == 2 || UPC == 4, "units of 32 or 64 columns");
    constexpr int SX = N8 * 32 * 8 * 8, SO = BM * LDO * 4;
    // The staged input during the loop, then (after a barrier) the outputs [BM, LDO] f32.
    __shared__ __align__(128) unsigned char smem[SX > SO ? SX : SO];
    uint2* sx = reinterpret_cast<uint2*>(smem);
    int expert, first, count;
    if (!mg_tile(p, BN, expert, first, count)) return;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, q = (lane >> 2) & 3;
    const int j = (lane & 3) | ((lane >> 4) << 2);  // A row / B token of this lane
    const int unit = q % UPC;
    const int r0 = blockIdx.x * (GATE_UP ? BM / 2 : BM);
    const long long base = (long long)expert * p.rows + r0;
    QRow rows[S];
#pragma unroll
    for (int s = 0; s < S; ++s) mg_row<GATE_UP, BM>(p, base, 16 * warp + 8 * ((q + 4 * s) / UPC) + j, rows[s]);
    float acc[S][N8][8];
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
        for (int jn = 0; jn < N8; ++jn)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[s][jn][i] = 0.0f;
    // Token groups of 8 that hold tokens (block-uniform; the rest repeat the last token).
    const int groups = p.all_frags ? N8 : (count + 7) / 8;
    const int chunks = p.cols / MG_BK;
    typename F::Raw rw[S];
    uint4 rx[N8];  // 16-byte piece threadIdx.x + 128 i: token (.. / 16), columns 8 (.. % 16)
    auto fetch = [&](int c) {
#pragma unroll
        for (int s = 0; s < S; ++s) rw[s] = F::load(rows[s], c * UPC + unit);
#pragma unroll
        for (int i = 0; i < N8; ++i) {
            const int e = threadIdx.x + MG_THREADS * i, tok = min(e / 16, count - 1);
            rx[i] = __ldg(reinterpret_cast<const uint4*>(p.x + (long long)(first + tok) * p.cols + c * MG_BK + 8 * (e % 16)));
        }
    };
    fetch(0);
    for (int c = 0; c < chunks; ++c) {
        __syncthreads();  // the previous chunk's input fragments are loaded
#pragma unroll
        for (int i = 0; i < N8; ++i) {
            const int e = threadIdx.x + MG_THREADS * i, tok = e / 16, kg = 2 * (e % 16);
            sx[xs_slot(tok / 8, kg, tok % 8)] = make_uint2(rx[i].x, rx[i].y);
            sx[xs_slot(tok / 8, kg + 1, tok % 8)] = make_uint2(rx[i].z, rx[i].w);
        }
        typename F::Raw cur[S];
#pragma unroll
        for (int s = 0; s < S; ++s) cur[s] = rw[s];
        __syncthreads();
        if (c + 1 < chunks) fetch(c + 1);
        const int u = c * UPC + unit;
#pragma unroll
        for (int r = 0; r < F::RUNS; ++r) {
            unsigned pk[S][8];
#pragma unroll
            for (int s = 0; s < S; ++s) pack16<F>(cur[s], u, r, pk[s]);
            const int kg0 = (F::start(u, r) - c * MG_BK) / 4;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
#pragma unroll
                for (int jn = 0; jn < N8; ++jn) {
                    if (jn >= groups) break;
                    const uint2 b = sx[xs_slot(jn, kg0 + i, j)];
#pragma unroll
                    for (int s = 0; s < S; ++s) mma884(acc[s][jn], pk[s][2 * i], pk[s][2 * i + 1], b.x, b.y);
                }
            }
        }
    }
    // The quad pairs of one row group (UPC of them: lanes ^ 4, ^ 8) hold partial sums over K.
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
        for (int jn = 0; jn < N8; ++jn)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                float v = acc[s][jn][i];
                v += __shfl_xor_sync(FULL_MASK, v, 4);
                if (UPC == 4) v += __shfl_xor_sync(FULL_MASK, v, 8);
                acc[s][jn][i] = v;
            }
    __syncthreads();  // the staging area becomes the output tile
    float* o = reinterpret_cast<float*>(smem);  // [BM tile rows, LDO]: (row, token)
    if (unit == 0) {
#pragma unroll
        for (int s = 0; s < S; ++s) {
            const int g = (q + 4 * s) / UPC;
#pragma unroll
            for (int jn = 0; jn < N8; ++jn)
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    // The f32 C layout of m8n8k4.
                    const int row = (lane & 1) + (i & 2) + 4 * (lane >> 4), col = (i & 4) + (lane & 2) + (i & 1);
                    o[(16 * warp + 8 * g + row) * LDO + 8 * jn + col] = acc[s][jn][i];
                }
        }
    }
    __syncthreads();
    mg_write<GATE_UP, BM>(p, r0, first, count, [&](int r, int n) { return o[r * LDO + n]; });
}

// grid: as moe_gemm.cu's entries (tiles of 8 or 16 tokens), block 128.
#define MOE_GEMM_MMA_ENTRY(name, F, kind, tile, N8, GATE_UP)                                   \
    extern "C" __global__ void __launch_bounds__(MG_THREADS) moe_gemm_##kind##_##name##_##tile( \
        const MoeGemmParams p) {                                                                \
        moe_gemm_mma_impl<F, N8, GATE_UP>(p);                                                   \
    }
#define MOE_GEMM_MMA_ENTRIES(name, F)                  \
    MOE_GEMM_MMA_ENTRY(name, F, gate_up, r8, 1, true)  \
    MOE_GEMM_MMA_ENTRY(name, F, down, r8, 1, false)    \
    MOE_GEMM_MMA_ENTRY(name, F, gate_up, r16, 2, true) \
    MOE_GEMM_MMA_ENTRY(name, F, down, r16, 2, false)

MOE_GEMM_MMA_ENTRIES(q4_0, FQ4_0)
MOE_GEMM_MMA_ENTRIES(q8_0, FQ8_0)
MOE_GEMM_MMA_ENTRIES(q4_k, FQ4K)
MOE_GEMM_MMA_ENTRIES(q5_k, FQ5K)
MOE_GEMM_MMA_ENTRIES(q6_k, FQ6K)
