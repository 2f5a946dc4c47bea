// Causal attention over the paged KV cache (F16, or 8-bit read back as F16 by the kv_load*
// helpers of common.cuh), split along the sequence (flash-decoding).
// Each query token t (decode, or any token of a prefill chunk) attends positions 0..=pos[t] of
// its sequence. Grouped-query attention: one block serves the `group = n_heads / n_kv` query
// heads of one KV head, so each K/V row is read once per group.
//
// Pass 1 (attn_split_f16): grid (n_kv, n_tok, n_splits); block b covers positions
//   [s * split_len, min(len, (s + 1) * split_len)) and writes, per query head, the running max m,
//   the sum of exponentials l and the unnormalized output o. Scores: one warp per position (two per pass); V sum:
//   warps take positions in turn, lanes own head dimensions, partial sums added in shared memory.
//   A token may start at kv_begin[t] (a shared-prefix group's members: attention_prefill.cu
//   covers positions below it once for the group, into the partials past this grid's
//   splits). Blocks whose split holds no position of the token write m = -inf, l = 0 and exit
//   (a graph may launch extra splits); a token outside any group marks those extra partials empty.
// Pass 2 (attn_merge_f32, attention_merge.cu): merges every partial of the token, exactly.
// Limits (checked by the launcher): group <= ATT_MAX_GROUP, head_dim <= ATT_MAX_HD and even.
#include "common.cuh"
#include "attention.cuh"

#define ATT_VCHUNK 4

// Row `ps` of the sequence (K or V, KV head g) widened to f32: lane holds half pairs lane,
// lane + 32, ... in f[2 i], f[2 i + 1]; zeros past head_dim.
__device__ __forceinline__ void load_row(const AttnParams& p, const int* bt, int ps, long long kv_dim, int g,
                                         const half_t* cache, const half_t* scale, float (&f)[ATT_MAX_HD / WARP]) {
    const int lane = threadIdx.x % WARP, half = p.head_dim / 2;
    const long long kv_row = ((long long)bt[ps >> p.block_shift] << p.block_shift) + (ps & (p.block_size - 1));
    const long long e0 = kv_row * kv_dim + (long long)g * p.head_dim;
#pragma unroll
    for (int i = 0; i < ATT_MAX_HD / 64; ++i) {
        const int d2 = lane + WARP * i;
        if (d2 < half) {
            h2x2f(kv_load2(cache, scale, e0 + 2 * d2), f[2 * i], f[2 * i + 1]);
        } else {
            f[2 * i] = 0.0f;
            f[2 * i + 1] = 0.0f;
        }
    }
}

// Softmax statistics of one split, one warp per query head: the scores sc [group, split_len]
// (n valid) become e^(s - m), and part_ml gets (m, sum).
__device__ __forceinline__ void split_softmax(const AttnParams& p, float* sc, int group, int n, int t, int g, int s) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nwarps = blockDim.x / WARP;
    for (int j = warp; j < group; j += nwarps) {
        float* sj = sc + j * p.split_len;
        float m = NEG_INF;
        for (int i = lane; i < n; i += WARP) m = fmaxf(m, sj[i]);
        m = warp_max(m);
        float l = 0.0f;
        for (int i = lane; i < n; i += WARP) {
            const float e = expf(sj[i] - m);
            sj[i] = e;
            l += e;
        }
        l = warp_sum(l);
        if (lane == 0) {
            float* ml = p.part_ml + (((long long)t * p.n_heads + g * group + j) * p.n_splits + s) * 2;
            ml[0] = m;
            ml[1] = l;
        }
    }
}

// A lane's part of the scores of two positions: acc[u] = q . k_u over the lane's DL dimensions
// (q: DL / 4 float4 in shared memory; kf: the two rows widened to f32), products in dimension
// order.
// The warps' partial V sums red [nwarps, ATT_VCHUNK, hd] added in warp order (a fixed order)
// into the partial outputs of query heads j0 .. j0 + ATT_VCHUNK of KV head g, token t, split s.
// Called by the whole block after the barrier that follows the writes to red.
__device__ __forceinline__ void att_store_vsum(const AttnParams& p, const float* red, int hd, int nwarps, int group,
                                               int j0, int t, int g, int s) {
    for (int e = threadIdx.x; e < ATT_VCHUNK * hd; e += blockDim.x) {
        const int j = e / hd, d = e % hd;
        if (j0 + j < group) {
            float v = 0.0f;
            for (int w = 0; w < nwarps; ++w) v += red[((long long)w * ATT_VCHUNK + j) * hd + d];
            p.part_o[(((long long)t * p.n_heads + g * group + j0 + j) * p.n_splits + s) * hd + d] = v;
        }
    }
}

template <int DL>
__device__ __forceinline__ void att_dot2(const float4* qv, const float (&kf)[2][DL], float (&acc)[2]) {
    acc[0] = 0.0f;
    acc[1] = 0.0f;
#pragma unroll
    for (int i = 0; i < DL / 4; ++i) {
        const float4 q4 = qv[i];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            acc[u] = fmaf(q4.x, kf[u][4 * i + 0], acc[u]);
            acc[u] = fmaf(q4.y, kf[u][4 * i + 1], acc[u]);
            acc[u] = fmaf(q4.z, kf[u][4 * i + 2], acc[u]);
            acc[u] = fmaf(q4.w, kf[u][4 * i + 3], acc[u]);
        }
    }
}

// Dynamic shared memory: (group * head_dim + group * split_len + nwarps * ATT_VCHUNK * head_dim) floats.
extern "C" __global__ void attn_split_f16(const AttnParams p) {
    extern __shared__ float smem[];
    const int g = blockIdx.x, t = blockIdx.y, s = blockIdx.z;
    const int group = p.n_heads / p.n_kv;
    const int hd = p.head_dim, half = hd / 2;
    int start, end;
    if (!split_range(p, t, g * group, group, s, start, end)) return;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nwarps = blockDim.x / WARP;
    float* q_s = smem;                      // [group, head_dim], pre-scaled
    float* sc = q_s + group * hd;           // [group, split_len] scores, then probabilities
    float* red = sc + group * p.split_len;  // [nwarps, ATT_VCHUNK, head_dim] partial V sums

    const float* qt = p.q + (long long)t * p.q_stride + (long long)g * group * hd;
    for (int i = threadIdx.x; i < group * hd; i += blockDim.x) q_s[i] = qt[i] * p.scale;
    __syncthreads();

    const int* bt = p.block_tables + (long long)p.tok_seq[t] * p.bt_stride;
    const long long kv_dim = (long long)p.n_kv * hd;

    // Scores: one warp per position, two positions per pass (both K rows loaded before the dot
    // products, so two loads are in flight per warp); lane owns the half pairs lane, lane + 32, ...
    for (int ps = start + warp; ps < end; ps += 2 * nwarps) {
        const int ps2 = ps + nwarps;
        const bool two = ps2 < end;  // warp-uniform
        float kf[ATT_MAX_HD / WARP], kf2[ATT_MAX_HD / WARP] = {};
        load_row(p, bt, ps, kv_dim, g, p.k_cache, p.k_scale, kf);
        if (two) load_row(p, bt, ps2, kv_dim, g, p.k_cache, p.k_scale, kf2);
        for (int j = 0; j < group; ++j) {
            const float* qj = q_s + j * hd;
            float acc = 0.0f, acc2 = 0.0f;
#pragma unroll
            for (int i = 0; i < ATT_MAX_HD / 64; ++i) {
                const int d2 = lane + WARP * i;
                if (d2 < half) {
                    const float q0 = qj[2 * d2], q1 = qj[2 * d2 + 1];
                    acc = fmaf(q0, kf[2 * i], acc);
                    acc = fmaf(q1, kf[2 * i + 1], acc);
                    acc2 = fmaf(q0, kf2[2 * i], acc2);
                    acc2 = fmaf(q1, kf2[2 * i + 1], acc2);
                }
            }
            acc = warp_sum(acc);
            if (two) acc2 = warp_sum(acc2);
            if (lane == 0) {
                sc[j * p.split_len + (ps - start)] = acc;
                if (two) sc[j * p.split_len + (ps2 - start)] = acc2;
            }
        }
    }
    __syncthreads();

    split_softmax(p, sc, group, end - start, t, g, s);
    __syncthreads();

    // Weighted sum of V, ATT_VCHUNK query heads at a time: warps take positions in turn (each V
    // row read as one coalesced 2 * head_dim-byte line), lanes own half pairs; then the warps'
    // partial sums are added through shared memory.
    for (int j0 = 0; j0 < group; j0 += ATT_VCHUNK) {
        float acc[ATT_VCHUNK][ATT_MAX_HD / WARP];
#pragma unroll
        for (int j = 0; j < ATT_VCHUNK; ++j)
#pragma unroll
            for (int i = 0; i < ATT_MAX_HD / WARP; ++i) acc[j][i] = 0.0f;
        // Two positions per pass, as for the scores (two V rows in flight per warp).
        for (int ps = start + warp; ps < end; ps += 2 * nwarps) {
            const int ps2 = ps + nwarps;
            const bool two = ps2 < end;  // warp-uniform
            float vf[ATT_MAX_HD / WARP], vf2[ATT_MAX_HD / WARP];
            load_row(p, bt, ps, kv_dim, g, p.v_cache, p.v_scale, vf);
            if (two) load_row(p, bt, ps2, kv_dim, g, p.v_cache, p.v_scale, vf2);
#pragma unroll
            for (int j = 0; j < ATT_VCHUNK; ++j) {
                if (j0 + j < group) {
                    const float pj = sc[(j0 + j) * p.split_len + (ps - start)];
#pragma unroll
                    for (int i = 0; i < ATT_MAX_HD / WARP; ++i) acc[j][i] = fmaf(pj, vf[i], acc[j][i]);
                    if (two) {
                        const float pj2 = sc[(j0 + j) * p.split_len + (ps2 - start)];
#pragma unroll
                        for (int i = 0; i < ATT_MAX_HD / WARP; ++i) acc[j][i] = fmaf(pj2, vf2[i], acc[j][i]);
                    }
                }
            }
        }
#pragma unroll
        for (int j = 0; j < ATT_VCHUNK; ++j)
#pragma unroll
            for (int i = 0; i < ATT_MAX_HD / 64; ++i) {
                const int d2 = lane + WARP * i;
                if (d2 < half) {
                    float* r = red + ((long long)warp * ATT_VCHUNK + j) * hd + 2 * d2;
                    r[0] = acc[j][2 * i];
                    r[1] = acc[j][2 * i + 1];
                }
            }
        __syncthreads();
        att_store_vsum(p, red, hd, nwarps, group, j0, t, g, s);
        __syncthreads();
    }
}

// The same pass for head sizes 64 and 128 (every model dustoff ships shapes for), with the score
// loop reshaped: 8 lanes per position (each lane DL = HD / 8 dimensions, 16-byte loads), four
// positions per warp and two such groups in flight, so a dot product ends in 3 shuffles instead
// of 5 per position and head; q is read from shared memory as float4. The V pass keeps one
// position per warp, lanes owning HD / 32 dimensions. Same outputs as attn_split_f16 (one
// block per (KV head, token, split)); shared memory (group * head_dim + group * split_len +
// nwarps * ATT_VCHUNK * head_dim) floats.
template <int HD>
__device__ __forceinline__ void attn_split_fast(const AttnParams& p) {
    constexpr int DL = HD / 8, VL = HD / WARP;
    extern __shared__ float smem[];
    const int g = blockIdx.x, t = blockIdx.y, s = blockIdx.z;
    const int group = p.n_heads / p.n_kv;
    int start, end;
    if (!split_range(p, t, g * group, group, s, start, end)) return;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nwarps = blockDim.x / WARP;
    float* q_s = smem;                      // [group, HD], pre-scaled
    float* sc = q_s + group * HD;           // [group, split_len]
    float* red = sc + group * p.split_len;  // [nwarps, ATT_VCHUNK, HD]

    const float* qt = p.q + (long long)t * p.q_stride + (long long)g * group * HD;
    for (int i = threadIdx.x; i < group * HD; i += blockDim.x) q_s[i] = qt[i] * p.scale;
    __syncthreads();
    const int* bt = p.block_tables + (long long)p.tok_seq[t] * p.bt_stride;
    const long long kv_dim = (long long)p.n_kv * HD;
    const int sub = lane % 8, pq = lane / 8;

    // Scores: a warp takes 8 positions per pass (two groups of four, lanes 8 per position).
    for (int base = start + warp * 8; base < end; base += nwarps * 8) {
        float kf[2][DL];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int ps = base + u * 4 + pq;
            if (ps < end) {
                const long long kv_row = ((long long)bt[ps >> p.block_shift] << p.block_shift) + (ps & (p.block_size - 1));
                const long long e0 = kv_row * kv_dim + (long long)g * HD + sub * DL;
#pragma unroll
                for (int i = 0; i < DL / 8; ++i) {
                    const uint4 w = kv_load8(p.k_cache, p.k_scale, e0 + 8 * i);
                    h2x2f(w.x, kf[u][8 * i + 0], kf[u][8 * i + 1]);
                    h2x2f(w.y, kf[u][8 * i + 2], kf[u][8 * i + 3]);
                    h2x2f(w.z, kf[u][8 * i + 4], kf[u][8 * i + 5]);
                    h2x2f(w.w, kf[u][8 * i + 6], kf[u][8 * i + 7]);
                }
            } else {
#pragma unroll
                for (int i = 0; i < DL; ++i) kf[u][i] = 0.0f;
            }
        }
        for (int j = 0; j < group; ++j) {
            const float4* qv = reinterpret_cast<const float4*>(q_s + j * HD + sub * DL);
            float acc[2];
            att_dot2<DL>(qv, kf, acc);
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                float a = acc[u];
                a += __shfl_xor_sync(FULL_MASK, a, 1);
                a += __shfl_xor_sync(FULL_MASK, a, 2);
                a += __shfl_xor_sync(FULL_MASK, a, 4);
                const int ps = base + u * 4 + pq;
                if (sub == 0 && ps < end) sc[j * p.split_len + (ps - start)] = a;
            }
        }
    }
    __syncthreads();

    split_softmax(p, sc, group, end - start, t, g, s);
    __syncthreads();

    // V: warps take positions in turn (two in flight), lanes own VL consecutive dimensions.
    for (int j0 = 0; j0 < group; j0 += ATT_VCHUNK) {
        float acc[ATT_VCHUNK][VL];
#pragma unroll
        for (int j = 0; j < ATT_VCHUNK; ++j)
#pragma unroll
            for (int i = 0; i < VL; ++i) acc[j][i] = 0.0f;
        for (int ps = start + warp; ps < end; ps += 2 * nwarps) {
            const int ps2 = ps + nwarps;
            const bool two = ps2 < end;  // warp-uniform
            float vf[2][VL];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int q = u ? ps2 : ps;
                if (u == 0 || two) {
                    const long long kv_row = ((long long)bt[q >> p.block_shift] << p.block_shift) + (q & (p.block_size - 1));
                    const long long e = kv_row * kv_dim + (long long)g * HD + lane * VL;
                    if (VL == 4) {
                        const uint2 w = kv_load4(p.v_cache, p.v_scale, e);
                        h2x2f(w.x, vf[u][0], vf[u][1]);
                        h2x2f(w.y, vf[u][2], vf[u][3]);
                    } else {
                        const unsigned w = kv_load2(p.v_cache, p.v_scale, e);
                        h2x2f(w, vf[u][0], vf[u][1]);
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < VL; ++i) vf[u][i] = 0.0f;
                }
            }
#pragma unroll
            for (int j = 0; j < ATT_VCHUNK; ++j) {
                if (j0 + j < group) {
                    const float p1 = sc[(j0 + j) * p.split_len + (ps - start)];
                    const float p2 = two ? sc[(j0 + j) * p.split_len + (ps2 - start)] : 0.0f;
#pragma unroll
                    for (int i = 0; i < VL; ++i) acc[j][i] = fmaf(p2, vf[1][i], fmaf(p1, vf[0][i], acc[j][i]));
                }
            }
        }
#pragma unroll
        for (int j = 0; j < ATT_VCHUNK; ++j)
#pragma unroll
            for (int i = 0; i < VL; ++i) red[((long long)warp * ATT_VCHUNK + j) * HD + lane * VL + i] = acc[j][i];
        __syncthreads();
        att_store_vsum(p, red, HD, nwarps, group, j0, t, g, s);
        __syncthreads();
    }
}

extern "C" __global__ void attn_split_f16_hd64(const AttnParams p) { attn_split_fast<64>(p); }
extern "C" __global__ void attn_split_f16_hd128(const AttnParams p) { attn_split_fast<128>(p); }

// One-pass variant (flash-decoding inside the split) for head sizes 64, 128 and 256 and any
// group: a block serves up to ATF_MAX_HEADS query heads of one KV head (a group of 8 or 16 takes
// 2 or 4 blocks per (KV head, token, split); they read the same K/V rows, the second mostly from
// L2). Lanes form position groups of LPP = HD / DL lanes, each lane owning DL dimensions (DL 8
// for HD 64, else 16, so the head loop holds at most 4 x 16 accumulators); a warp step takes
// PG = 32 / LPP positions per row buffer and two buffers (8 positions for HD 64/128, 4 for 256).
// The next step's K and V rows are loaded into registers before this step's products (the
// loads of a step and the arithmetic of the last one overlap: without it a warp waited out a
// full memory latency per step), scores end in log2(LPP) shuffles, and an online softmax
// (running max m, sum l, output o per query head) runs per position group. The position groups,
// then the warps, are merged at the end. Same outputs as attn_split_f16; grid (n_kv * chunks,
// n_tok, n_splits) with chunks = ceil(group / ATF_MAX_HEADS); shared memory:
// q [heads, LPP, DL + 4] (padded: the lanes of a float4 read hit distinct banks) + per warp
// [heads, HD + 2] floats.
#define ATF_MAX_HEADS 4
template <int HD>
struct Atf {
    static constexpr int DL = HD >= 128 ? 16 : 8;  // dimensions per lane
    static constexpr int LPP = HD / DL;            // lanes per position: 8, 8, 16
    static constexpr int PG = WARP / LPP;          // positions per row buffer: 4, 4, 2
    static constexpr int PW = 2 * PG;              // positions per warp step
    static constexpr int QP = DL + 4, RW = HD + 2;
};

// K and V rows of the two row buffers of the warp step at `base` (position base + u * PG + pg
// for lane group pg), packed halves; zeros past `end` (no load).
template <int HD>
__device__ __forceinline__ void atf_fetch(const AttnParams& p, const int* bt, long long kv_dim, int g, int base,
                                          int end, uint4 (&kr)[2][Atf<HD>::DL / 8],
                                          uint4 (&vr)[2][Atf<HD>::DL / 8]) {
    using A = Atf<HD>;
    const int lane = threadIdx.x % WARP, sub = lane % A::LPP, pg = lane / A::LPP;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        const int ps = base + u * A::PG + pg;
        const bool ok = ps < end;
        const long long kv_row = ok ? ((long long)bt[ps >> p.block_shift] << p.block_shift) + (ps & (p.block_size - 1)) : 0;
        const long long off = kv_row * kv_dim + (long long)g * HD + sub * A::DL;
#pragma unroll
        for (int i = 0; i < A::DL / 8; ++i) {
            kr[u][i] = ok ? kv_load8(p.k_cache, p.k_scale, off + 8 * i) : make_uint4(0, 0, 0, 0);
            vr[u][i] = ok ? kv_load8(p.v_cache, p.v_scale, off + 8 * i) : make_uint4(0, 0, 0, 0);
        }
    }
}

__device__ __forceinline__ void atf_unpack(const uint4& w, float* f) {
    h2x2f(w.x, f[0], f[1]);
    h2x2f(w.y, f[2], f[3]);
    h2x2f(w.z, f[4], f[5]);
    h2x2f(w.w, f[6], f[7]);
}

// e^x for the one-pass loop: expf (a dozen instructions with its range handling), or with
// p.fast_exp one multiply and the SFU's 2^x (relative error ~2^-21 for the scores' range: far
// below the F16 rounding of K and V); -inf gives 0 either way.
__device__ __forceinline__ float atf_exp(const AttnParams& p, float x) {
    if (p.fast_exp) return ex2_sfu(x * LOG2E_F);
    return expf(x);
}

template <int HD>
__device__ __forceinline__ void attn_split_onepass(const AttnParams& p) {
    using A = Atf<HD>;
    constexpr int DL = A::DL, LPP = A::LPP, PG = A::PG, PW = A::PW, QP = A::QP, RW = A::RW;
    extern __shared__ float smem[];
    const int group = p.n_heads / p.n_kv;
    const int chunks = (group + ATF_MAX_HEADS - 1) / ATF_MAX_HEADS, heads = (group + chunks - 1) / chunks;
    const int g = blockIdx.x / chunks, t = blockIdx.y, s = blockIdx.z;
    const int h0 = g * group + (blockIdx.x % chunks) * heads;            // first query head of the block
    const int nh = min(heads, g * group + group - h0);                    // its heads (the last chunk may have fewer)
    int start, end;
    if (!split_range(p, t, h0, nh, s, start, end)) return;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, nwarps = blockDim.x / WARP;
    const int sub = lane % LPP, pg = lane / LPP;
    float* q_s = smem;                 // [heads, LPP, QP]
    float* red = q_s + heads * LPP * QP;  // [nwarps, heads, RW]: m, l, o[HD]

    const float* qt = p.q + (long long)t * p.q_stride + (long long)h0 * HD;
    for (int i = threadIdx.x; i < nh * HD; i += blockDim.x) {
        const int j = i / HD, d = i % HD;
        q_s[(j * LPP + d / DL) * QP + d % DL] = qt[i] * p.scale;
    }
    __syncthreads();
    const int* bt = p.block_tables + (long long)p.tok_seq[t] * p.bt_stride;
    const long long kv_dim = (long long)p.n_kv * HD;

    float m[ATF_MAX_HEADS], l[ATF_MAX_HEADS], o[ATF_MAX_HEADS][DL];
#pragma unroll
    for (int j = 0; j < ATF_MAX_HEADS; ++j) {
        m[j] = NEG_INF;
        l[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < DL; ++i) o[j][i] = 0.0f;
    }
    uint4 kr[2][DL / 8], vr[2][DL / 8];
    int base = start + warp * PW;
    atf_fetch<HD>(p, bt, kv_dim, g, base, end, kr, vr);
    for (; base < end; base += nwarps * PW) {
        float kf[2][DL], vf[2][DL];
        bool ok[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            ok[u] = base + u * PG + pg < end;
#pragma unroll
            for (int i = 0; i < DL / 8; ++i) {
                atf_unpack(kr[u][i], kf[u] + 8 * i);
                atf_unpack(vr[u][i], vf[u] + 8 * i);
            }
        }
        // The next step's rows, in flight during this step's arithmetic.
        atf_fetch<HD>(p, bt, kv_dim, g, base + nwarps * PW, end, kr, vr);
#pragma unroll
        for (int j = 0; j < ATF_MAX_HEADS; ++j) {
            if (j < nh) {
                const float4* qv = reinterpret_cast<const float4*>(q_s + (j * LPP + sub) * QP);
                float sc[2];
                att_dot2<DL>(qv, kf, sc);
#pragma unroll
                for (int u = 0; u < 2; ++u)
#pragma unroll
                    for (int x = 1; x < LPP; x <<= 1) sc[u] += __shfl_xor_sync(FULL_MASK, sc[u], x);
                const float s0 = ok[0] ? sc[0] : NEG_INF, s1 = ok[1] ? sc[1] : NEG_INF;
                const float m_new = fmaxf(m[j], fmaxf(s0, s1));
                if (m_new != NEG_INF) {  // else: no position of this lane group yet
                    const float corr = atf_exp(p, m[j] - m_new);
                    const float p0 = ok[0] ? atf_exp(p, s0 - m_new) : 0.0f, p1 = ok[1] ? atf_exp(p, s1 - m_new) : 0.0f;
                    l[j] = l[j] * corr + p0 + p1;
#pragma unroll
                    for (int i = 0; i < DL; ++i) o[j][i] = fmaf(p1, vf[1][i], fmaf(p0, vf[0][i], o[j][i] * corr));
                    m[j] = m_new;
                }
            }
        }
    }

    // Merge the position groups (lanes sub, sub + LPP, ... hold the same dimensions).
#pragma unroll
    for (int j = 0; j < ATF_MAX_HEADS; ++j) {
        if (j < nh) {
            float mm = m[j];
#pragma unroll
            for (int x = LPP; x < WARP; x <<= 1) mm = fmaxf(mm, __shfl_xor_sync(FULL_MASK, mm, x));
            const float f = mm == NEG_INF ? 0.0f : expf(m[j] - mm);
            float lj = l[j] * f;
#pragma unroll
            for (int x = LPP; x < WARP; x <<= 1) lj += __shfl_xor_sync(FULL_MASK, lj, x);
            float* r = red + (warp * heads + j) * RW;
#pragma unroll
            for (int i = 0; i < DL; ++i) {
                float v = o[j][i] * f;
#pragma unroll
                for (int x = LPP; x < WARP; x <<= 1) v += __shfl_xor_sync(FULL_MASK, v, x);
                if (pg == 0) r[2 + sub * DL + i] = v;
            }
            if (lane == 0) {
                r[0] = mm;
                r[1] = lj;
            }
        }
    }
    __syncthreads();
    // Merge the warps: thread e takes (head j, dimension d); warps in order (deterministic).
    for (int e = threadIdx.x; e < nh * HD; e += blockDim.x) {
        const int j = e / HD, d = e % HD;
        float mm = NEG_INF;
        for (int w = 0; w < nwarps; ++w) mm = fmaxf(mm, red[(w * heads + j) * RW]);
        float lsum = 0.0f, v = 0.0f;
        for (int w = 0; w < nwarps; ++w) {
            const float* r = red + (w * heads + j) * RW;
            const float f = r[0] == NEG_INF ? 0.0f : expf(r[0] - mm);
            lsum += r[1] * f;
            v += r[2 + d] * f;
        }
        const long long row = ((long long)t * p.n_heads + h0 + j) * p.n_splits + s;
        p.part_o[row * HD + d] = v;
        if (d == 0) {
            p.part_ml[row * 2] = mm;
            p.part_ml[row * 2 + 1] = lsum;
        }
    }
}

extern "C" __global__ void attn_onepass_f16_hd64(const AttnParams p) { attn_split_onepass<64>(p); }
extern "C" __global__ void attn_onepass_f16_hd128(const AttnParams p) { attn_split_onepass<128>(p); }
extern "C" __global__ void attn_onepass_f16_hd256(const AttnParams p) { attn_split_onepass<256>(p); }
