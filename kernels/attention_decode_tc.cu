// Decode attention on the tensor cores: the same splits and partials as attention_decode.cu
// (merged by attn_merge_f32), with the query heads of one KV head as the rows of a wmma tile.
//
// Why: with grouped-query attention every K/V row meets `group` query heads. The CUDA-core
// kernels spend ~4 FMAs per byte of K/V on it (group 8, F32), which is more issue time than the
// H200 needs to stream the cache, and more than a V100 has. Here one warp computes, per tile of
// 16 positions, S [16 rows = the group's heads (zero rows past the group), 16 positions] =
// Q K^T and O [16, HD] += P V as wmma m16n16k16 (F16 inputs, F32 accumulation; inline PTX,
// valid on compute_70): 32 MMAs per 8 KB of K/V at head size 128. Q and P are F32 values
// split into two F16 parts (hi = f16(x), lo = f16(x - hi)) and each product runs twice, so the
// roundings left are those of the cache itself and ~2^-22 relative of the split (one F16
// rounding of Q and P, as attention_prefill makes, moved the token-by-token logits of the
// route-flip test past its 0.05 bound). The tensor cores have the time to spare.
//
// grid (n_kv, n_tok, n_splits), block W warps: block (g, t, s) covers split s of token t for KV
// head g; warp w takes the 16-position tiles start + 16 (w + i W). Each warp stages its tile in
// its own shared memory (no block barrier in the loop) and has the next tile's K/V loads in
// flight in registers while it computes the current one. Online softmax in log2 units (Q carries
// scale * log2(e); exponentials are 2^x on the SFU). At the end the warps' (m, l, O) are merged
// in warp order (deterministic) into the partial of (t, head, s). The 8-bit cache is dequantized
// into the same F16 tile: in the `_q8` entries when a tile is staged (adt_fetch).
// Shared memory (bytes): Q hi, Q lo [16, LDQ] f16, then per warp: K, V [16, LDK] f16, m/alpha
// [16] f32, l [16] f32. Once a tile's QK^T product is done its K area holds S [16, LDS] f32 (then
// P lo [16, LDP] f16 over it) and P hi [16, LDP] f16; at the end the warp's K/V area holds its
// O [16, HD] f32 for the merge.
// Limits (checked by the launcher): HD 64 or 128, group <= 16.
#include "common.cuh"
#include "attention.cuh"

#define ADT_KT 16

template <int HD>
struct Adt {
    static constexpr int NK = HD / 16;              // 16-wide slices of the head dimension
    static constexpr int PARTS = HD / 8;            // 16-byte parts of a K/V row
    static constexpr int PL = ADT_KT * PARTS / WARP;  // (K, V) part pairs a lane fetches: 4 or 8
    // Rows 8 halves past the head size (4 banks apart): fewer conflicts on fragment loads.
    static constexpr int LDK = HD + 8, LDQ = HD + 8, LDS = ADT_KT + 4, LDP = ADT_KT + 8;
    static constexpr int Q_BYTES = 2 * 16 * LDQ * 2;  // hi and lo
    static constexpr int KV_BYTES = ADT_KT * LDK * 2;
    static constexpr int S_BYTES = 16 * LDS * 4, P_BYTES = 16 * LDP * 2;
    static constexpr int WARP_BYTES = 2 * KV_BYTES + 2 * 16 * 4;
    static_assert(Q_BYTES % 32 == 0 && KV_BYTES % 32 == 0 && S_BYTES % 32 == 0 && P_BYTES % 32 == 0 &&
                      WARP_BYTES % 32 == 0,
                  "wmma needs 32-byte alignment");
    static_assert(S_BYTES + P_BYTES <= KV_BYTES && P_BYTES <= S_BYTES, "S and P must fit the K area");
    static_assert(16 * HD * 4 <= 2 * KV_BYTES, "the merge's O must fit the warp's K/V area");
};

// The K/V tile at kp into registers: lane pair j holds part (e % PARTS) of row e / PARTS, e =
// lane + 32 j, K in kv[2 j] and V in kv[2 j + 1]; zeros at or past `end` (no load: the block
// table may not reach there). RAW (the 8-bit cache's entries): raw bytes (kv_part), converted
// by kv_halves when staged, so the loads stay in flight through the current tile's products.
template <int HD, bool RAW>
__device__ __forceinline__ void adt_fetch(const AttnParams& p, const int* bt, long long kv_dim, int g, int kp,
                                          int end, uint4 (&kv)[2 * Adt<HD>::PL]) {
    using A = Adt<HD>;
    const int lane = threadIdx.x % WARP;
#pragma unroll
    for (int j = 0; j < A::PL; ++j) {
        const int e = lane + WARP * j, ps = kp + e / A::PARTS;
        kv[2 * j] = make_uint4(0, 0, 0, 0);
        kv[2 * j + 1] = make_uint4(0, 0, 0, 0);
        if (ps < end) {
            const long long row = ((long long)bt[ps >> p.block_shift] << p.block_shift) + (ps & (p.block_size - 1));
            const long long off = row * kv_dim + (long long)g * HD + (e % A::PARTS) * 8;
            kv[2 * j] = kv_part<RAW>(p.k_cache, p.k_scale, off);
            kv[2 * j + 1] = kv_part<RAW>(p.v_cache, p.v_scale, off);
        }
    }
}

template <int HD, bool RAW>
__device__ __forceinline__ void attn_decode_tc(const AttnParams& p) {
    using A = Adt<HD>;
    constexpr int NK = A::NK;
    extern __shared__ __align__(32) unsigned char smem[];
    const int group = p.n_heads / p.n_kv;
    const int g = blockIdx.x, t = blockIdx.y, s = blockIdx.z, h0 = g * group;
    int start, end;
    if (!split_range(p, t, h0, group, s, start, end)) return;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nwarps = blockDim.x / WARP;
    half_t* qs = reinterpret_cast<half_t*>(smem);  // [16, LDQ] hi
    half_t* ql = qs + 16 * A::LDQ;                 // [16, LDQ] lo
    unsigned char* wb = smem + A::Q_BYTES + warp * A::WARP_BYTES;
    half_t* ks = reinterpret_cast<half_t*>(wb);                       // [KT, LDK]
    half_t* vs = ks + ADT_KT * A::LDK;                                // [KT, LDK]
    float* ss = reinterpret_cast<float*>(ks);                         // [16, LDS] in the K area
    half_t* ps = reinterpret_cast<half_t*>(wb + A::S_BYTES);          // [16, LDP] hi, K area
    // P lo over S: written after the row-maximum shuffle, which every lane reaches only once its
    // S values are in registers.
    half_t* pl = reinterpret_cast<half_t*>(wb);  // [16, LDP] lo
    float* alpha_s = reinterpret_cast<float*>(wb + 2 * A::KV_BYTES);  // [16]; m at the end
    float* l_s = alpha_s + 16;                                        // [16]

    // Q rows: the group's heads of token t (contiguous in q), scaled, as hi + lo F16 parts;
    // zero rows past the group.
    const float qscale = p.scale * LOG2E_F;
    const float* qt = p.q + (long long)t * p.q_stride + (long long)h0 * HD;
    for (int i = threadIdx.x; i < 16 * HD; i += blockDim.x) {
        const int r = i / HD, d = i % HD;
        const float x = r < group ? qt[i] * qscale : 0.0f;
        const half_t hi = f2h_sat(x);
        qs[r * A::LDQ + d] = hi;
        ql[r * A::LDQ + d] = f2h(x - h2f(hi));
    }
    // The accumulator element -> (row, column) map, read back through the warp's S area (the
    // fragment layout is the architecture's).
    for (int i = lane; i < 256; i += WARP) ss[(i / 16) * A::LDS + i % 16] = (float)i;
    __syncwarp();
    int frow[8];
    {
        float d[8];
        wmma_load_c(d, ss, A::LDS);
#pragma unroll
        for (int i = 0; i < 8; ++i) frow[i] = (int)d[i] / 16;
    }
    __syncthreads();  // Q staged

    const int* bt = p.block_tables + (long long)p.tok_seq[t] * p.bt_stride;
    const long long kv_dim = (long long)p.n_kv * HD;
    const int row = lane / 2, hf = lane % 2;  // lane pairs own a row of S, 8 columns each
    float m_row = NEG_INF, l_row = 0.0f;
    float o[NK][8];
    wmma_zero(o);

    const int stride = nwarps * ADT_KT;
    uint4 pf[2 * A::PL];
    int kp = start + warp * ADT_KT;
    if (kp < end) adt_fetch<HD, RAW>(p, bt, kv_dim, g, kp, end, pf);
    for (; kp < end; kp += stride) {
#pragma unroll
        for (int j = 0; j < A::PL; ++j) {
            const int e = lane + WARP * j, at = (e / A::PARTS) * A::LDK + (e % A::PARTS) * 8;
            *reinterpret_cast<uint4*>(ks + at) = kv_halves<RAW>(pf[2 * j], p.k_scale);
            *reinterpret_cast<uint4*>(vs + at) = kv_halves<RAW>(pf[2 * j + 1], p.v_scale);
        }
        __syncwarp();
        // The next tile's rows, in flight during this tile's products.
        if (kp + stride < end) adt_fetch<HD, RAW>(p, bt, kv_dim, g, kp + stride, end, pf);

        // S = Q K^T [16 heads, 16 positions].
        float sc[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) sc[i] = 0.0f;
#pragma unroll
        for (int k = 0; k < NK; ++k) {
            unsigned a[8], b[8];
            wmma_load_b_col(b, ks + k * 16, A::LDK);
            wmma_load_a(a, qs + k * 16, A::LDQ);
            wmma_mma_rc(sc, a, b);
            wmma_load_a(a, ql + k * 16, A::LDQ);
            wmma_mma_rc(sc, a, b);
        }
        __syncwarp();  // every lane's K fragments are read: S and P may overwrite the K area
        wmma_store_c(ss, sc, A::LDS);
        __syncwarp();

        // Online softmax over this lane's 8 columns of its row (positions past `end` excluded).
        const int c0 = kp + hf * 8;
        const float* srow = ss + row * A::LDS + hf * 8;
        half_t* prow = ps + row * A::LDP + hf * 8;
        half_t* plow = pl + row * A::LDP + hf * 8;
        float sv[8], tmax = NEG_INF;
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            sv[c] = c0 + c < end ? srow[c] : NEG_INF;
            tmax = fmaxf(tmax, sv[c]);
        }
        tmax = fmaxf(tmax, __shfl_xor_sync(FULL_MASK, tmax, 1));
        const float m_new = fmaxf(m_row, tmax);  // finite: the tile holds position kp < end
        float sum = 0.0f;
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            const float e = ex2_sfu(sv[c] - m_new);  // 2^-inf = 0
            const half_t eh = f2h(e);
            prow[c] = eh;
            plow[c] = f2h(e - h2f(eh));
            sum += e;
        }
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        const float alpha = ex2_sfu(m_row - m_new);  // 0 on the warp's first tile
        l_row = l_row * alpha + sum;
        m_row = m_new;
        if (hf == 0) alpha_s[row] = alpha;
        __syncwarp();

        // O = alpha O + P V (no rescale while no row's maximum moved).
        if (__any_sync(FULL_MASK, alpha != 1.0f)) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float a = alpha_s[frow[i]];
#pragma unroll
                for (int j = 0; j < NK; ++j) o[j][i] *= a;
            }
        }
        unsigned a[8], al[8];
        wmma_load_a(a, ps, A::LDP);
        wmma_load_a(al, pl, A::LDP);
#pragma unroll
        for (int j = 0; j < NK; ++j) {
            unsigned b[8];
            wmma_load_b_row(b, vs + j * 16, A::LDK);
            wmma_mma_rr(o[j], a, b);
            wmma_mma_rr(o[j], al, b);
        }
        __syncwarp();  // P, alpha and the tile are read before the next tile overwrites them
    }

    // The warps' states through their own areas: m (log2 units) and l per row, O [16, HD] f32.
    if (hf == 0) {
        alpha_s[row] = m_row;
        l_s[row] = l_row;
    }
    float* os = reinterpret_cast<float*>(ks);
#pragma unroll
    for (int j = 0; j < NK; ++j) wmma_store_c(os + j * 16, o[j], HD);
    __syncthreads();
    // Merge in warp order: thread e takes (head j, dimension d).
    for (int e = threadIdx.x; e < group * HD; e += blockDim.x) {
        const int j = e / HD, d = e % HD;
        // Warp w's area: O at its start, then m [16] and l [16] past its K/V tiles.
        auto area = [&](int w) { return smem + A::Q_BYTES + w * A::WARP_BYTES; };
        float mm = NEG_INF;
        for (int w = 0; w < nwarps; ++w) mm = fmaxf(mm, reinterpret_cast<const float*>(area(w) + 2 * A::KV_BYTES)[j]);
        float lsum = 0.0f, v = 0.0f;
        for (int w = 0; w < nwarps; ++w) {
            const unsigned char* b = area(w);
            const float* mw = reinterpret_cast<const float*>(b + 2 * A::KV_BYTES);
            const float f = mw[j] == NEG_INF ? 0.0f : ex2_sfu(mw[j] - mm);  // a warp without a tile adds nothing
            lsum += mw[16 + j] * f;
            v += reinterpret_cast<const float*>(b)[j * HD + d] * f;
        }
        const long long prow = ((long long)t * p.n_heads + h0 + j) * p.n_splits + s;
        p.part_o[prow * HD + d] = v;
        if (d == 0) {
            p.part_ml[prow * 2] = mm * LN2_F;  // natural units, as the merge reads them
            p.part_ml[prow * 2 + 1] = lsum;
        }
    }
}

extern "C" __global__ void __launch_bounds__(4 * WARP) attn_decode_tc_hd64(const AttnParams p) { attn_decode_tc<64, false>(p); }
extern "C" __global__ void __launch_bounds__(4 * WARP) attn_decode_tc_hd128(const AttnParams p) { attn_decode_tc<128, false>(p); }
// The 8-bit cache's entries (they also run an F16 cache, as the F16 entries run an 8-bit one).
extern "C" __global__ void __launch_bounds__(4 * WARP) attn_decode_tc_q8_hd64(const AttnParams p) { attn_decode_tc<64, true>(p); }
extern "C" __global__ void __launch_bounds__(4 * WARP) attn_decode_tc_q8_hd128(const AttnParams p) { attn_decode_tc<128, true>(p); }
