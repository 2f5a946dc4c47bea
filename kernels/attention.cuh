// What the decode attention kernels share (attention_decode.cu: CUDA cores; attention_decode_tc.cu:
// tensor cores): their one parameter struct (mirrored by cuda/ops/attention.rs) and the split
// range of a block. Inlined by the kernel loader like common.cuh.
#define ATT_MAX_GROUP 16
#define ATT_MAX_HD 256

struct AttnParams {
    const float* q;          // [n_tok, q_stride] f32; head h at q + t * q_stride + h * head_dim
    const half_t* k_cache;   // [n_blocks, block_size, n_kv, head_dim] f16
    const half_t* v_cache;   // same layout
    const half_t* k_scale;   // 8-bit cache: [n_blocks * block_size, n_kv * head_dim / 32] f16; null: F16
    const half_t* v_scale;   // same
    const int* block_tables; // [n_seqs, bt_stride] physical block ids
    const int* tok_seq;      // [n_tok] row of block_tables of each token
    const int* pos;          // [n_tok] absolute position of each token
    const int* kv_begin;     // [n_tok] first position of each token's own range, or 0 (all from 0)
    float* part_o;           // [n_tok, n_heads, n_splits, head_dim] f32
    float* part_ml;          // [n_tok, n_heads, n_splits, 2] f32 (max, sum of exp)
    float* out;              // [n_tok, out_stride] f32
    int n_tok;
    int n_heads;
    int n_kv;
    int head_dim;
    int block_size;
    int bt_stride;
    int q_stride;
    int out_stride;
    int n_splits;            // partials per (token, head): the grid's splits, then prefix partials
    int split_len;           // positions per split
    float scale;             // 1 / sqrt(head_dim)
    int block_shift;         // log2(block_size) (block sizes are powers of two)
    int fast_exp;            // 1: the one-pass kernel's exponentials as 2^(x log2 e) on the SFU
};

// The range of split s of token t: [start, end); empty splits (and, for a token outside any
// shared-prefix group, the prefix partials past the grid) get m = -inf, l = 0 for the block's
// query heads hf..hf + hc.
__device__ __forceinline__ bool split_range(const AttnParams& p, int t, int hf, int hc, int s, int& start, int& end) {
    const int begin = p.kv_begin ? p.kv_begin[t] : 0;
    start = max(s * p.split_len, begin);
    end = min(p.pos[t] + 1, s * p.split_len + p.split_len);
    const bool empty = start >= end, prefix = s == 0 && begin == 0 && (int)gridDim.z < p.n_splits;
    if (empty || prefix) {
        for (int j = threadIdx.x; j < hc; j += blockDim.x) {
            float* ml = p.part_ml + ((long long)t * p.n_heads + hf + j) * p.n_splits * 2;
            if (empty) {
                ml[2 * s] = NEG_INF;
                ml[2 * s + 1] = 0.0f;
            }
            if (prefix)
                for (int z = gridDim.z; z < p.n_splits; ++z) {
                    ml[2 * z] = NEG_INF;
                    ml[2 * z + 1] = 0.0f;
                }
        }
    }
    return !empty;
}

