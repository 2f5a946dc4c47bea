// Causal attention for prefill chunks (and shared-prefix groups) on the tensor cores, flash-
// attention style, one pass over a K/V range. The decode kernel (attention_decode.cu) reads the
// context once per query token; here a block takes a tile of up to 16 query rows (tokens) that
// share one block table and `heads` query heads of one KV head, so each K/V row is read once
// per tile and every product runs as wmma m16n16k16 (F16 inputs, F32 accumulation; inline PTX,
// valid on compute_70).
//
// grid (n_tiles, n_kv * head_chunks, n_splits), block: `heads` warps (warp w = query head
// g * group + chunk * heads + w), 16 rows each (row r = token rows[first + r]). Block z covers
// positions [z * split_len, min((z + 1) * split_len, kv_end)) of its tile, so one long prompt
// spreads over n_tiles x n_kv x n_splits blocks instead of walking its context serially per
// tile. Per K/V tile of ATP_KT positions (staged in shared memory, positions past the range
// zero-filled):
//   S [16, KT] = (Q * scale) K^T     Q as F16 A fragments (registers; shared memory for HD 256)
//   online softmax per row (lane pairs own a row): m, l, P = exp(S - m) as F16, alpha = e^(m_old - m)
//   (in log2 units: Q carries scale * log2(e), the exponentials are 2^x on the SFU)
//   O [16, HD] = alpha O + P V       O held in registers as F32 accumulators
// Output: with part_o == 0 (one split), O / l straight to `out`; else the unnormalized O and
// (m, l) go to partial part0 + z of each (token, head), merged by attn_merge_f32
// (attention_decode.cu). A split with no position for a row writes m = -inf, l = 0, O = 0.
// Row r attends the positions c of the block's range with c <= pos[token]; the tile's range end
// `kv_end` is the last row's position + 1 for a prefill chunk, the shared length for a
// shared-prefix group (kernels/attention_decode.cu adds each member's own suffix).
// The accumulator element -> (row, column) map is read once from a wmma load of an index
// matrix, so the rescale and the final store do not depend on an architecture's fragment layout.
// Limits (checked by the launcher): HD 64, 128 or 256; heads <= ATP_MAX_HEADS (4 for HD 256 and
// the _qs entries);
// split_len a multiple of ATP_KT; kv_end <= the block table's reach.
#include "common.cuh"

#define ATP_KT 32
#define ATP_MAX_HEADS 8
#define ATP_PF 8  // 16-byte loads in flight per thread

struct PrefillParams {
    const float* q;           // [n_tok, q_stride] f32; head h at q + t * q_stride + h * head_dim
    const half_t* k_cache;    // [cache_rows, n_kv, head_dim] f16
    const half_t* v_cache;    // same layout
    const half_t* k_scale;    // 8-bit cache (common.cuh): [cache_rows, n_kv * head_dim / 32] f16; null: F16
    const half_t* v_scale;    // same
    const int* block_tables;  // [n_seqs, bt_stride]
    const int* pos;           // [n_tok] absolute position of each token
    const int* tiles;         // [n_tiles, 4]: first row, row count (1..=16), kv_end, block-table row
    const int* rows;          // [n_rows] flat token of each tile row
    float* out;               // [n_tok, out_stride] f32 (one split)
    float* part_o;            // [n_part_tok, n_heads, n_parts, HD] f32, or 0
    float* part_ml;           // [n_part_tok, n_heads, n_parts, 2] f32 (max, sum of exp)
    int n_heads;
    int n_kv;
    int block_size;
    int bt_stride;
    int q_stride;
    int out_stride;
    float scale;              // 1 / sqrt(head_dim)
    int block_shift;          // log2(block_size) (block sizes are powers of two)
    int heads;                // query heads per block (divides n_heads / n_kv)
    int split_len;            // positions per split (a multiple of ATP_KT)
    int n_parts;              // partials per (token, head)
    int part0;                // partial of split 0
    int part_tok0;            // token of partial row 0
};

// Shared memory layout (bytes), for head size HD and W warps:
//   map  [16, 16] f32                     element index r * 16 + c (the fragment map)
//   K, V [ATP_KT, HD + 16] f16 each        the current K/V tile (rows padded: fewer bank conflicts)
//   per warp: S [16, ATP_KT + 4] f32, P [16, ATP_KT + 16] f16, alpha [16] f32, l [16] f32
//   HD 256 only, per warp: Q [16, HD + 8] f16 (too many registers to hold as fragments)
template <int HD, bool QS>
struct AtpLayout {
    // K/V and P rows 8 banks apart mod 32 (HD + 16 halves, 48 halves): the 16 rows of a wmma
    // fragment load then hit each bank once per 4 rows (+8 halves overlapped rows 4 banks apart).
    static constexpr int LDK = HD + 16, LDS = ATP_KT + 4, LDP = ATP_KT + 16, LDQ = HD + 8;
    static constexpr bool Q_SMEM = QS || HD > 128;
    static constexpr int MAP = 16 * 16 * 4;
    static constexpr int KV = ATP_KT * LDK * 2;
    static constexpr int WARP_BYTES = 16 * LDS * 4 + 16 * LDP * 2 + 2 * 16 * 4 + (Q_SMEM ? 16 * LDQ * 2 : 0);
};

// The regions of the layout above in the block's dynamic shared memory, those of warp `warp`
// for the per-warp ones (its alpha and l lie between ps and qs).
struct AtpSmem {
    float* map;  // [16, 16]
    half_t* ks;  // [ATP_KT, LDK]
    half_t* vs;  // [ATP_KT, LDK]
    float* ss;   // [16, LDS]
    half_t* ps;  // [16, LDP]
    half_t* qs;  // [16, LDQ] (Q_SMEM)
};
template <class L>
__device__ __forceinline__ AtpSmem atp_smem(unsigned char* smem, int warp) {
    unsigned char* wbase = smem + L::MAP + 2 * L::KV + warp * L::WARP_BYTES;
    float* ss = reinterpret_cast<float*>(wbase);
    half_t* ps = reinterpret_cast<half_t*>(ss + 16 * L::LDS);
    return {reinterpret_cast<float*>(smem), reinterpret_cast<half_t*>(smem + L::MAP),
            reinterpret_cast<half_t*>(smem + L::MAP + L::KV), ss, ps,
            reinterpret_cast<half_t*>(ps + 16 * L::LDP + 2 * 16 * 2)};
}

// Pair e of a K/V tile (e < ATP_KT * HD / 8): row e / PARTS, 8-half part e % PARTS of K (into
// v[2 j]) and of V (v[2 j + 1]), one block-table lookup for both. Positions at or past `end` are
// zero (their block-table entries may not exist). RAW (the 8-bit cache's entries): raw bytes
// (kv_part), converted by atp_stage, so a prefetch stays in flight until the tile is staged
// (converting at the load made each tile wait for its own loads).
template <int HD, bool RAW>
__device__ __forceinline__ void atp_fetch(const PrefillParams& p, const int* bt, long long kv_dim, int g, int kp,
                                          int end, int base, uint4 (&v)[ATP_PF]) {
    constexpr int PARTS = HD / 8, PAIRS = ATP_KT * PARTS;
#pragma unroll
    for (int j = 0; j < ATP_PF / 2; ++j) {
        const int e = base + j * blockDim.x + threadIdx.x;
        const int ps = kp + e / PARTS, part = e % PARTS;
        v[2 * j] = make_uint4(0, 0, 0, 0);
        v[2 * j + 1] = make_uint4(0, 0, 0, 0);
        if (e < PAIRS && ps < end) {
            const long long kv_row = ((long long)bt[ps >> p.block_shift] << p.block_shift) + (ps & (p.block_size - 1));
            const long long off = kv_row * kv_dim + (long long)g * HD + part * 8;
            v[2 * j] = kv_part<RAW>(p.k_cache, p.k_scale, off);
            v[2 * j + 1] = kv_part<RAW>(p.v_cache, p.v_scale, off);
        }
    }
}

template <int HD, bool RAW>
__device__ __forceinline__ void atp_stage(const PrefillParams& p, half_t* ks, half_t* vs, int base,
                                          const uint4 (&v)[ATP_PF]) {
    constexpr int PARTS = HD / 8, PAIRS = ATP_KT * PARTS, LDK = AtpLayout<HD, false>::LDK;
#pragma unroll
    for (int j = 0; j < ATP_PF / 2; ++j) {
        const int e = base + j * blockDim.x + threadIdx.x;
        if (e < PAIRS) {
            const int at = (e / PARTS) * LDK + (e % PARTS) * 8;
            *reinterpret_cast<uint4*>(ks + at) = kv_halves<RAW>(v[2 * j], p.k_scale);
            *reinterpret_cast<uint4*>(vs + at) = kv_halves<RAW>(v[2 * j + 1], p.v_scale);
        }
    }
}

// Partial of (token t, head h, split z).
__device__ __forceinline__ long long atp_part(const PrefillParams& p, int t, int h, int z) {
    return ((long long)(t - p.part_tok0) * p.n_heads + h) * p.n_parts + p.part0 + z;
}

// (max, sum of exp) of partial (token t, head h, split z); m in natural units (-inf: none).
__device__ __forceinline__ void atp_store_ml(const PrefillParams& p, int t, int h, int z, float m, float l) {
    float* ml = p.part_ml + atp_part(p, t, h, z) * 2;
    ml[0] = m;
    ml[1] = l;
}

// What a block works on (both kernel families): tile blockIdx.x of the tile table, query head
// h of the warp (KV head g), split z's K/V range [start, end) of the tile.
struct AtpTile {
    int z, g, h, nt, start, end;
    const int* bt;    // the tile's block-table row
    const int* rows;  // [nt] flat tokens of the tile's rows
};
__device__ __forceinline__ AtpTile atp_tile(const PrefillParams& p, int warp) {
    AtpTile a;
    const int tile = blockIdx.x;
    a.z = blockIdx.z;
    const int group = p.n_heads / p.n_kv, chunks = group / p.heads;
    a.g = blockIdx.y / chunks;
    a.h = a.g * group + (blockIdx.y % chunks) * p.heads + warp;
    const int r0 = p.tiles[4 * tile], kv_end = p.tiles[4 * tile + 2];
    a.nt = p.tiles[4 * tile + 1];
    a.bt = p.block_tables + (long long)p.tiles[4 * tile + 3] * p.bt_stride;
    a.rows = p.rows + r0;
    a.start = a.z * p.split_len;
    a.end = min(kv_end, a.start + p.split_len);
    return a;
}

// The K/V tile at kp into shared memory (ks, vs), from the batch already fetched into pf and
// the rest of the tile (batch pairs a fetch); then the first batch of the next tile into pf, in
// flight during this tile's products. Called by the whole block.
template <int HD, bool RAW>
__device__ __forceinline__ void atp_next_kv(const PrefillParams& p, const AtpTile& a, long long kv_dim, int kp,
                                            int batch, half_t* ks, half_t* vs, uint4 (&pf)[ATP_PF]) {
    constexpr int PAIRS = ATP_KT * (HD / 8);  // (K, V) uint4 pairs per tile
    __syncthreads();  // every warp is done with the previous K/V tile
    atp_stage<HD, RAW>(p, ks, vs, 0, pf);
    for (int base = batch; base < PAIRS; base += batch) {
        uint4 more[ATP_PF];
        atp_fetch<HD, RAW>(p, a.bt, kv_dim, a.g, kp, a.end, base, more);
        atp_stage<HD, RAW>(p, ks, vs, base, more);
    }
    __syncthreads();
    if (kp + ATP_KT < a.end) atp_fetch<HD, RAW>(p, a.bt, kv_dim, a.g, kp + ATP_KT, a.end, 0, pf);
}

// O += P V over the tile: P the warp's [16, ATP_KT] F16 rows at ps (leading dimension ldp), V
// the tile's rows at vs [ATP_KT, LDK].
template <int HD>
__device__ __forceinline__ void atp_pv(float (&o)[HD / 16][8], const half_t* ps, int ldp, const half_t* vs) {
    constexpr int LDK = AtpLayout<HD, false>::LDK;
#pragma unroll
    for (int k2 = 0; k2 < ATP_KT / 16; ++k2) {
        unsigned a[8];
        wmma_load_a(a, ps + k2 * 16, ldp);
#pragma unroll
        for (int j = 0; j < HD / 16; ++j) {
            unsigned b[8];
            wmma_load_b_row(b, vs + k2 * 16 * LDK + j * 16, LDK);
            wmma_mma_rr(o[j], a, b);
        }
    }
}

// Q of the warp's head for its tile rows (scaled, F16): A fragments staged through `ss` (the
// warp's scratch, used as [16, 72] halves) 64 columns at a time, or (Q_SMEM) the warp's Q area
// `qs` [16, LDQ], read again for every K tile. Each 64-column slab is read as 32 independent
// loads a lane, all issued before the first store (a loop of load-then-store waited out a memory
// latency per element: ~30 us a block, the whole cost of a short prefill chunk's or a
// shared-prefix group's block); lanes r < 16 hold row r's token.
template <int HD, bool QS, int NQ>
__device__ __forceinline__ void atp_load_q(const PrefillParams& p, const int* rows, int nt, int h, float qscale,
                                           float* ss, half_t* qs, unsigned (&qa)[NQ][8]) {
    using L = AtpLayout<HD, QS>;
    const int lane = threadIdx.x % WARP;
    const int lane_tok = rows[min(lane % 16, nt - 1)];
    half_t* stage = reinterpret_cast<half_t*>(ss);  // [16, 72] halves = 2,304 bytes
#pragma unroll
    for (int c0 = 0; c0 < HD; c0 += 64) {
        constexpr int PER_LANE = 16 * 64 / WARP;  // row i / 2, column lane + 32 (i % 2)
        float v[PER_LANE];
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) {
            const int r = i / 2, c = c0 + lane + WARP * (i % 2);
            const int t = __shfl_sync(FULL_MASK, lane_tok, r);
            v[i] = r < nt ? __ldg(p.q + (long long)t * p.q_stride + (long long)h * HD + c) * qscale : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) {
            const int r = i / 2, c = lane + WARP * (i % 2);
            if (L::Q_SMEM) {
                qs[r * L::LDQ + c0 + c] = f2h_sat(v[i]);
            } else {
                stage[r * 72 + c] = f2h_sat(v[i]);
            }
        }
        __syncwarp();
        if (!L::Q_SMEM) {
#pragma unroll
            for (int k = 0; k < 4; ++k) wmma_load_a(qa[L::Q_SMEM ? 0 : c0 / 16 + k], stage + k * 16, 72);
            __syncwarp();
        }
    }
}

template <int HD, bool QS, bool RAW>
__device__ __forceinline__ void attn_prefill_impl(const PrefillParams& p) {
    using L = AtpLayout<HD, QS>;
    constexpr int NK = HD / 16;                   // 16-wide slices of the head dimension
    constexpr int NQ = L::Q_SMEM ? 1 : NK;        // Q fragments held in registers
    extern __shared__ __align__(32) unsigned char smem[];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, nthreads = blockDim.x;
    const auto [map, ks, vs, ss, ps, qs] = atp_smem<L>(smem, warp);
    float* alpha_s = reinterpret_cast<float*>(ps + 16 * L::LDP);  // [16]
    float* l_s = alpha_s + 16;                                    // [16]

    const AtpTile tl = atp_tile(p, warp);
    const int z = tl.z, g = tl.g, h = tl.h, nt = tl.nt, start = tl.start, end = tl.end;
    const int* rows = tl.rows;
    const long long kv_dim = (long long)p.n_kv * HD;
    const int row = lane / 2, half = lane % 2;
    const int row_tok = rows[min(row, nt - 1)];
    if (start >= end) {  // a split past this tile's range (partial mode only): empty partials
        if (half == 0 && row < nt) {
            atp_store_ml(p, row_tok, h, z, NEG_INF, 0.0f);
        }
        return;
    }

    for (int i = threadIdx.x; i < 256; i += nthreads) map[i] = (float)i;
    __syncthreads();
    int frow[8], fcol[8];
    {
        float d[8];
        wmma_load_c(d, map, 16);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int e = (int)d[i];
            frow[i] = e / 16;
            fcol[i] = e % 16;
        }
    }

    // Q (scaled, F16): A fragments staged through the warp's S area, or the warp's Q area.
    const float qscale = p.scale * LOG2E_F;
    unsigned qa[NQ][8];
    atp_load_q<HD, QS, NQ>(p, rows, nt, h, qscale, ss, qs, qa);

    // Row state: lane pairs (2r, 2r + 1) own row r; both lanes keep m and l.
    const int row_pos = p.pos[row_tok];
    float m_row = NEG_INF, l_row = 0.0f;
    float o[NK][8];
    wmma_zero(o);

    // K/V tiles are fetched ATP_PF 16-byte loads per thread at a time (all in flight together);
    // the first batch of the next tile is fetched before this tile's products and stored after.
    const int batch = ATP_PF / 2 * nthreads;       // (K, V) pairs per fetch
    uint4 pf[ATP_PF];
    atp_fetch<HD, RAW>(p, tl.bt, kv_dim, g, start, end, 0, pf);
    for (int kp = start; kp < end; kp += ATP_KT) {
        atp_next_kv<HD, RAW>(p, tl, kv_dim, kp, batch, ks, vs, pf);

        // S = Q K^T for the tile's ATP_KT positions (Q from shared memory: each A fragment
        // loaded once per tile, for both 16-column halves).
        if (L::Q_SMEM) {
            float s2[ATP_KT / 16][8];
#pragma unroll
            for (int n = 0; n < ATP_KT / 16; ++n)
#pragma unroll
                for (int i = 0; i < 8; ++i) s2[n][i] = 0.0f;
#pragma unroll
            for (int k = 0; k < NK; ++k) {
                unsigned a[8];
                wmma_load_a(a, qs + k * 16, L::LDQ);
#pragma unroll
                for (int n = 0; n < ATP_KT / 16; ++n) {
                    unsigned b[8];
                    wmma_load_b_col(b, ks + n * 16 * L::LDK + k * 16, L::LDK);
                    wmma_mma_rc(s2[n], a, b);
                }
            }
#pragma unroll
            for (int n = 0; n < ATP_KT / 16; ++n) wmma_store_c(ss + n * 16, s2[n], L::LDS);
        } else {
#pragma unroll
            for (int n = 0; n < ATP_KT / 16; ++n) {
                float s[8];
#pragma unroll
                for (int i = 0; i < 8; ++i) s[i] = 0.0f;
#pragma unroll
                for (int k = 0; k < NK; ++k) {
                    unsigned b[8];
                    wmma_load_b_col(b, ks + n * 16 * L::LDK + k * 16, L::LDK);
                    wmma_mma_rc(s, qa[L::Q_SMEM ? 0 : k], b);
                }
                wmma_store_c(ss + n * 16, s, L::LDS);
            }
        }
        __syncwarp();

        // Online softmax: this lane's half of its row (ATP_KT / 2 columns).
        constexpr int HC = ATP_KT / 2;
        const int c0 = kp + half * HC;
        const float* srow = ss + row * L::LDS + half * HC;
        half_t* prow = ps + row * L::LDP + half * HC;
        float tmax = NEG_INF, sum = 0.0f, m_new;
        // Tiles that every row of the warp sees whole (all but the diagonal ones of a long
        // context) skip the per-column causal and range tests: the same values, fewer
        // instructions (the softmax issues most of the instructions beside the products).
        if (__all_sync(FULL_MASK, kp + ATP_KT - 1 <= row_pos && kp + ATP_KT <= end)) {
#pragma unroll
            for (int c = 0; c < HC; ++c) tmax = fmaxf(tmax, srow[c]);
            tmax = fmaxf(tmax, __shfl_xor_sync(FULL_MASK, tmax, 1));
            m_new = fmaxf(m_row, tmax);
#pragma unroll
            for (int c = 0; c < HC; ++c) {
                const half_t eh = f2h(ex2_sfu(srow[c] - m_new));
                prow[c] = eh;
                sum += h2f(eh);
            }
        } else {
#pragma unroll
            for (int c = 0; c < HC; ++c)
                if (c0 + c <= row_pos && c0 + c < end) tmax = fmaxf(tmax, srow[c]);
            tmax = fmaxf(tmax, __shfl_xor_sync(FULL_MASK, tmax, 1));
            // -inf while no position of the split is in this row's range (a later split's row).
            m_new = fmaxf(m_row, tmax);
#pragma unroll
            for (int c = 0; c < HC; ++c) {
                const float e = c0 + c <= row_pos && c0 + c < end ? ex2_sfu(srow[c] - m_new) : 0.0f;
                const half_t eh = f2h(e);
                prow[c] = eh;
                sum += h2f(eh);  // the rounded weight, as the P V product uses it
            }
        }
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        const float alpha = m_new == NEG_INF ? 1.0f : ex2_sfu(m_row - m_new);
        l_row = l_row * alpha + sum;
        m_row = m_new;
        if (half == 0) alpha_s[row] = alpha;
        __syncwarp();

        // O = alpha O + P V (the rescale skipped while no row's maximum moved: alpha is then
        // exactly 1 for every row, most tiles of a long context).
        if (__any_sync(FULL_MASK, alpha != 1.0f)) {
            float a_of[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) a_of[i] = alpha_s[frow[i]];
#pragma unroll
            for (int j = 0; j < NK; ++j)
#pragma unroll
                for (int i = 0; i < 8; ++i) o[j][i] *= a_of[i];
        }
        atp_pv<HD>(o, ps, L::LDP, vs);
        __syncwarp();  // P and alpha are read before the next tile overwrites them
    }

    if (half == 0) l_s[row] = l_row;
    __syncwarp();
    if (p.part_o == nullptr) {
        // One split: every row has position 0 in range, so l > 0.
        float inv[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) inv[i] = 1.0f / l_s[frow[i]];
#pragma unroll
        for (int j = 0; j < NK; ++j)
#pragma unroll
            for (int i = 0; i < 8; ++i)
                if (frow[i] < nt)
                    p.out[(long long)rows[frow[i]] * p.out_stride + (long long)h * HD + j * 16 + fcol[i]] =
                        o[j][i] * inv[i];
        return;
    }
#pragma unroll
    for (int j = 0; j < NK; ++j)
#pragma unroll
        for (int i = 0; i < 8; ++i)
            if (frow[i] < nt) p.part_o[atp_part(p, rows[frow[i]], h, z) * HD + j * 16 + fcol[i]] = o[j][i];
    if (half == 0 && row < nt) {
        atp_store_ml(p, row_tok, h, z, m_row * LN2_F, l_row);  // -inf stays -inf
    }
}

// The entries of head sizes 64, 128 and 256 of one implementation (`sfx`: their name's end), of
// one launch shape. block: heads * 32 threads (256: at most 4 heads, the Q tile in shared
// memory); dynamic shared memory AtpLayout<HD, QS> (MAP + 2 KV + heads * WARP_BYTES). `raw`: the
// 8-bit cache's entries (`_q8` names), which keep a prefetch raw until staged; the F16 cache
// keeps the others (one raw form for both caches cost the F16 form 8-80 bytes of spills on sm_70).
#define ATP_ENTRIES(impl, sfx, raw) \
    extern "C" __global__ void __launch_bounds__(ATP_MAX_HEADS * WARP) attn_prefill_hd64##sfx(const PrefillParams p) { impl<64, false, raw>(p); } \
    extern "C" __global__ void __launch_bounds__(ATP_MAX_HEADS * WARP) attn_prefill_hd128##sfx(const PrefillParams p) { impl<128, false, raw>(p); } \
    extern "C" __global__ void __launch_bounds__(4 * WARP) attn_prefill_hd256##sfx(const PrefillParams p) { impl<256, true, raw>(p); }

ATP_ENTRIES(attn_prefill_impl, , false)
ATP_ENTRIES(attn_prefill_impl, _q8, true)

// The Q tile in shared memory for head sizes 64 / 128 too (64 fewer registers a thread: three
// 4-warp blocks an SM instead of two, where shared memory allows; at most 4 heads a block).
extern "C" __global__ void __launch_bounds__(4 * WARP, 3) attn_prefill_hd64_qs(const PrefillParams p) {
    attn_prefill_impl<64, true, false>(p);
}
extern "C" __global__ void __launch_bounds__(4 * WARP, 3) attn_prefill_hd128_qs(const PrefillParams p) {
    attn_prefill_impl<128, true, false>(p);
}
extern "C" __global__ void __launch_bounds__(4 * WARP, 3) attn_prefill_hd64_qs_q8(const PrefillParams p) {
    attn_prefill_impl<64, true, true>(p);
}
extern "C" __global__ void __launch_bounds__(4 * WARP, 3) attn_prefill_hd128_qs_q8(const PrefillParams p) {
    attn_prefill_impl<128, true, true>(p);
}

// ---- The softmax on the accumulators (architectures whose wmma accumulator is two m16n8
// tiles: compute capability 8.0 and newer, where the compute_70 PTX is JIT-compiled).
//
// The kernel above stores each S fragment to shared memory, reads it back by lane pairs for the
// softmax and writes P: four shared-memory passes and two warp barriers on the chain from the
// QK^T products to the PV products of every K/V tile. Here S stays in the accumulators: with
// the layout below a lane holds rows g = lane / 4 and g + 8 (four elements of each per
// 16-column fragment) and the four lanes of a quad hold a row's 16 columns, so the row maxima
// and sums are two xor shuffles, alpha is a register, and P goes to shared memory once (F16,
// as the A operand of the PV product, whose fragment layout stays the architecture's).
// Element i of a fragment (wmma m16n16k16 f32, sm_80 and newer): row g + 8 ((i >> 1) & 1),
// column 8 (i >> 2) + 2 (lane % 4) + (i & 1). The kernel checks this against the index
// matrix once and traps on another layout (the launcher takes it only from compute
// capability 8.0 on; sm_70 / sm_75 keep attn_prefill_impl).
__device__ __forceinline__ int atp_acc_row(int lane, int i) { return lane / 4 + 8 * ((i >> 1) & 1); }
__device__ __forceinline__ int atp_acc_col(int lane, int i) { return 8 * (i >> 2) + 2 * (lane % 4) + (i & 1); }

template <int HD, bool QS, bool RAW>
__device__ __forceinline__ void attn_prefill_acc_impl(const PrefillParams& p) {
    using L = AtpLayout<HD, QS>;
    constexpr int NK = HD / 16;             // 16-wide slices of the head dimension
    constexpr int NQ = L::Q_SMEM ? 1 : NK;  // Q fragments held in registers
    constexpr int NT = ATP_KT / 16;         // 16-position fragments of a K/V tile
    extern __shared__ __align__(32) unsigned char smem[];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, nthreads = blockDim.x;
    // ss: Q staging only ([16, 72] halves); alpha and l unused.
    const auto [map, ks, vs, ss, ps, qs] = atp_smem<L>(smem, warp);

    const AtpTile tl = atp_tile(p, warp);
    const int z = tl.z, g = tl.g, h = tl.h, nt = tl.nt, start = tl.start, end = tl.end;
    const int* rows = tl.rows;
    const long long kv_dim = (long long)p.n_kv * HD;
    // This lane's two rows (A: g, B: g + 8) and their tokens (rows past nt repeat the last).
    const int ra = lane / 4, rb = ra + 8;
    const int tok_a = rows[min(ra, nt - 1)], tok_b = rows[min(rb, nt - 1)];
    if (start >= end) {  // a split past this tile's range (partial mode only): empty partials
        if (lane % 4 == 0) {
            if (ra < nt) {
                atp_store_ml(p, tok_a, h, z, NEG_INF, 0.0f);
            }
            if (rb < nt) {
                atp_store_ml(p, tok_b, h, z, NEG_INF, 0.0f);
            }
        }
        return;
    }

    // The layout check: the index matrix through wmma_load_c must give row r * 16 + c where the
    // formulas above say (one load a block; a mismatch is a defect of the launcher's choice).
    for (int i = threadIdx.x; i < 256; i += nthreads) map[i] = (float)i;
    __syncthreads();
    {
        float d[8];
        wmma_load_c(d, map, 16);
        bool ok = true;
#pragma unroll
        for (int i = 0; i < 8; ++i) ok = ok && (int)d[i] == atp_acc_row(lane, i) * 16 + atp_acc_col(lane, i);
        if (!__all_sync(FULL_MASK, ok)) __trap();
    }

    // Q (scaled, F16): as in attn_prefill_impl.
    const float qscale = p.scale * LOG2E_F;
    unsigned qa[NQ][8];
    atp_load_q<HD, QS, NQ>(p, rows, nt, h, qscale, ss, qs, qa);

    // Row state of rows A and B, the same in the four lanes of the quad.
    const int pos_a = p.pos[tok_a], pos_b = p.pos[tok_b];
    float m_a = NEG_INF, m_b = NEG_INF, l_a = 0.0f, l_b = 0.0f;
    float o[NK][8];
    wmma_zero(o);

    const int batch = ATP_PF / 2 * nthreads;
    uint4 pf[ATP_PF];
    atp_fetch<HD, RAW>(p, tl.bt, kv_dim, g, start, end, 0, pf);
    for (int kp = start; kp < end; kp += ATP_KT) {
        atp_next_kv<HD, RAW>(p, tl, kv_dim, kp, batch, ks, vs, pf);

        // S = Q K^T: the NT accumulators of the tile live together (independent product chains).
        float s[NT][8];
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 8; ++i) s[n][i] = 0.0f;
#pragma unroll
        for (int k = 0; k < NK; ++k) {
            unsigned a[8];
            if (L::Q_SMEM) wmma_load_a(a, qs + k * 16, L::LDQ);
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                unsigned b[8];
                wmma_load_b_col(b, ks + n * 16 * L::LDK + k * 16, L::LDK);
                wmma_mma_rc(s[n], L::Q_SMEM ? a : qa[L::Q_SMEM ? 0 : k], b);
            }
        }

        // Masked positions (past the row's own position or the range end) become -inf; tiles
        // that every row of the warp sees whole skip the tests.
        const bool whole = __all_sync(FULL_MASK, kp + ATP_KT - 1 <= min(pos_a, pos_b) && kp + ATP_KT <= end);
        if (!whole) {
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const int c = kp + n * 16 + atp_acc_col(lane, i);
                    const int rp = (i & 2) ? pos_b : pos_a;
                    if (c > rp || c >= end) s[n][i] = NEG_INF;
                }
        }
        float t_a = NEG_INF, t_b = NEG_INF;
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                if (i & 2) {
                    t_b = fmaxf(t_b, s[n][i]);
                } else {
                    t_a = fmaxf(t_a, s[n][i]);
                }
            }
        t_a = fmaxf(t_a, __shfl_xor_sync(FULL_MASK, t_a, 1));
        t_b = fmaxf(t_b, __shfl_xor_sync(FULL_MASK, t_b, 1));
        t_a = fmaxf(t_a, __shfl_xor_sync(FULL_MASK, t_a, 2));
        t_b = fmaxf(t_b, __shfl_xor_sync(FULL_MASK, t_b, 2));
        // -inf while no position of the split is in the row's range (a later split's row).
        const float mn_a = fmaxf(m_a, t_a), mn_b = fmaxf(m_b, t_b);
        // P = 2^(S - m) rounded to F16 (the sum takes the rounded weights, as the PV product
        // does); masked elements are exactly 0 (also where m is still -inf).
        float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int i = 0; i < 8; i += 2) {
                const float m = (i & 2) ? mn_b : mn_a;
                const float e0 = s[n][i] == NEG_INF ? 0.0f : ex2_sfu(s[n][i] - m);
                const float e1 = s[n][i + 1] == NEG_INF ? 0.0f : ex2_sfu(s[n][i + 1] - m);
                const half_t h0 = f2h(e0), h1 = f2h(e1);
                if (i & 2) {
                    sum_b += h2f(h0) + h2f(h1);
                } else {
                    sum_a += h2f(h0) + h2f(h1);
                }
                const int at = atp_acc_row(lane, i) * L::LDP + n * 16 + atp_acc_col(lane, i);
                *reinterpret_cast<unsigned*>(ps + at) = (unsigned)h0 | ((unsigned)h1 << 16);
            }
        sum_a += __shfl_xor_sync(FULL_MASK, sum_a, 1);
        sum_b += __shfl_xor_sync(FULL_MASK, sum_b, 1);
        sum_a += __shfl_xor_sync(FULL_MASK, sum_a, 2);
        sum_b += __shfl_xor_sync(FULL_MASK, sum_b, 2);
        const float al_a = mn_a == NEG_INF ? 1.0f : ex2_sfu(m_a - mn_a);
        const float al_b = mn_b == NEG_INF ? 1.0f : ex2_sfu(m_b - mn_b);
        l_a = l_a * al_a + sum_a;
        l_b = l_b * al_b + sum_b;
        m_a = mn_a;
        m_b = mn_b;
        __syncwarp();  // P complete before its fragment loads

        // O = alpha O + P V (no rescale while no row's maximum moved).
        if (__any_sync(FULL_MASK, al_a != 1.0f || al_b != 1.0f)) {
#pragma unroll
            for (int j = 0; j < NK; ++j)
#pragma unroll
                for (int i = 0; i < 8; ++i) o[j][i] *= (i & 2) ? al_b : al_a;
        }
        atp_pv<HD>(o, ps, L::LDP, vs);
        __syncwarp();  // P is read before the next tile overwrites it
    }

    if (p.part_o == nullptr) {
        // One split: every row has position 0 in range, so l > 0.
        const float inv_a = 1.0f / l_a, inv_b = 1.0f / l_b;
        float* out_a = p.out + (long long)tok_a * p.out_stride + (long long)h * HD;
        float* out_b = p.out + (long long)tok_b * p.out_stride + (long long)h * HD;
#pragma unroll
        for (int j = 0; j < NK; ++j)
#pragma unroll
            for (int i = 0; i < 8; i += 2) {
                const int c = j * 16 + atp_acc_col(lane, i);
                if (i & 2) {
                    if (rb < nt) *reinterpret_cast<float2*>(out_b + c) = make_float2(o[j][i] * inv_b, o[j][i + 1] * inv_b);
                } else {
                    if (ra < nt) *reinterpret_cast<float2*>(out_a + c) = make_float2(o[j][i] * inv_a, o[j][i + 1] * inv_a);
                }
            }
        return;
    }
    float* po_a = p.part_o + atp_part(p, tok_a, h, z) * HD;
    float* po_b = p.part_o + atp_part(p, tok_b, h, z) * HD;
#pragma unroll
    for (int j = 0; j < NK; ++j)
#pragma unroll
        for (int i = 0; i < 8; i += 2) {
            const int c = j * 16 + atp_acc_col(lane, i);
            if (i & 2) {
                if (rb < nt) *reinterpret_cast<float2*>(po_b + c) = make_float2(o[j][i], o[j][i + 1]);
            } else {
                if (ra < nt) *reinterpret_cast<float2*>(po_a + c) = make_float2(o[j][i], o[j][i + 1]);
            }
        }
    if (lane % 4 == 0) {
        if (ra < nt) {
            atp_store_ml(p, tok_a, h, z, m_a * LN2_F, l_a);  // -inf stays -inf
        }
        if (rb < nt) {
            atp_store_ml(p, tok_b, h, z, m_b * LN2_F, l_b);
        }
    }
}

// Same launch shape and shared memory as the entries above.
ATP_ENTRIES(attn_prefill_acc_impl, _acc, false)
ATP_ENTRIES(attn_prefill_acc_impl, _acc_q8, true)
