//! Launcher of the decode attention (kernels/attention_decode.cu): split attention over the
//! paged F16 cache for one-token chunks, and the combine pass. Same conventions as `launch`.

use cudarc::driver::{CudaStream, DeviceRepr};

use super::kernels::Kernels;
use super::launch::{check, extent, i32_of, launch, need, Dev};
use super::tuning::tuning;
use super::CudaError;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct AttnParams {
    q: u64,
    k_cache: u64,
    v_cache: u64,
    block_tables: u64,
    tok_seq: u64,
    pos: u64,
    part_o: u64,
    part_ml: u64,
    out: u64,
    n_tok: i32,
    n_heads: i32,
    n_kv: i32,
    head_dim: i32,
    block_size: i32,
    bt_stride: i32,
    q_stride: i32,
    out_stride: i32,
    n_splits: i32,
    split_len: i32,
    scale: f32,
    block_shift: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for AttnParams {}

/// Positions per split of the attention pass (a split is one block's share of a sequence):
/// short for decode steps (few query tokens, so the splits are what fills the GPU), long for
/// prefill (many query tokens already fill it; fewer partials to store and merge).
/// Blocks per split column are n_tok x n_kv; from 32 query tokens on, longer splits still
/// give thousands of blocks at long contexts, with fewer partials to write and merge.
pub fn attn_split_len(n_tok: usize) -> usize {
    if let Some(v) = tuning().attn_split {
        return v; // for comparisons
    }
    match n_tok {
        0..=16 => 64,
        17..=32 => 128,
        _ => 256,
    }
}
const ATTN_MAX_GROUP: usize = 16;
const ATTN_MAX_HD: usize = 256;
const ATTN_VCHUNK: usize = 4;
const ATTN_THREADS: usize = 128;

/// Most query heads per KV head of the one-pass decode kernel (kernels/attention_decode.cu).
const ATTN_ONEPASS_MAX_GROUP: usize = 4;

/// Splits needed for sequences of at most `max_len` positions, `n_tok` query tokens.
pub fn attn_splits(max_len: usize, n_tok: usize) -> usize {
    max_len.div_ceil(attn_split_len(n_tok)).max(1)
}

/// The inputs every paged attention kernel reads: queries `q` `[n_tok, q_stride]` (heads first),
/// the paged F16 cache (`[n_slots, n_kv * head_dim]`, slot = block * block_size + offset, blocks
/// from row `tok_seq[t]` of `block_tables` `[n_seqs, bt_stride]`), each token's position `pos`,
/// and the output `[n_tok, out_stride]`. Each token attends positions `0..=pos[t]` of its
/// sequence. The host guarantees block ids `< n_slots / block_size` and `tok_seq < n_seqs`.
#[derive(Clone, Copy, Debug)]
pub struct PagedAttn {
    pub q: Dev<f32>,
    pub k_cache: Dev<u16>,
    pub v_cache: Dev<u16>,
    pub block_tables: Dev<i32>,
    pub tok_seq: Dev<i32>,
    pub pos: Dev<i32>,
    pub out: Dev<f32>,
    pub n_slots: usize,
    pub n_seqs: usize,
    pub n_tok: usize,
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub bt_stride: usize,
    pub q_stride: usize,
    pub out_stride: usize,
}

impl PagedAttn {
    /// The shape checks both kernels need: strides, a power-of-two block size, and every buffer
    /// long enough.
    pub(super) fn check(&self, kernel: &'static str) -> Result<(), CudaError> {
        let (hd, nh) = (self.head_dim, self.n_heads);
        check(kernel, nh * hd <= self.q_stride && nh * hd <= self.out_stride, || {
            "heads overlap the row stride".into()
        })?;
        check(kernel, self.block_size.is_power_of_two(), || {
            format!("block size {} (a power of two)", self.block_size)
        })?;
        need(kernel, "q", self.q, extent(self.n_tok, self.q_stride, nh * hd))?;
        need(kernel, "K cache", self.k_cache, self.n_slots * self.n_kv * hd)?;
        need(kernel, "V cache", self.v_cache, self.n_slots * self.n_kv * hd)?;
        need(kernel, "block tables", self.block_tables, self.n_seqs * self.bt_stride)?;
        need(kernel, "token sequences", self.tok_seq, self.n_tok)?;
        need(kernel, "positions", self.pos, self.n_tok)?;
        need(kernel, "output", self.out, extent(self.n_tok, self.out_stride, nh * hd))
    }
}

/// Split attention of every token of `paged` (one-token chunks: decode). Scratch `part_o`
/// `[n_tok, n_heads, splits, head_dim]`, `part_ml` `[n_tok, n_heads, splits, 2]` with
/// `n_splits >= attn_splits(max_len, n_tok)` (more is allowed: the extra blocks exit at once,
/// so a captured graph can serve growing lengths). The host guarantees `pos[t] < max_len`.
pub struct Attention {
    pub paged: PagedAttn,
    pub part_o: Dev<f32>,
    pub part_ml: Dev<f32>,
    pub max_len: usize,
    pub n_splits: usize,
}

impl Attention {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "attn_split_f16";
        let a = &self.paged;
        let (hd, nh) = (a.head_dim, a.n_heads);
        check(K, a.n_kv > 0 && nh.is_multiple_of(a.n_kv), || format!("{nh} heads over {} KV heads", a.n_kv))?;
        let group = nh / a.n_kv;
        check(K, group <= ATTN_MAX_GROUP, || format!("{group} query heads per KV head (at most {ATTN_MAX_GROUP})"))?;
        check(K, hd.is_multiple_of(2) && hd <= ATTN_MAX_HD, || {
            format!("head size {hd} (even, at most {ATTN_MAX_HD})")
        })?;
        check(K, a.n_tok <= 65_535, || format!("{} query tokens in one launch (at most 65535)", a.n_tok))?;
        let splits = self.n_splits;
        let split_len = attn_split_len(a.n_tok);
        check(K, splits * split_len >= self.max_len, || {
            format!("{splits} splits of {split_len} positions do not cover {}", self.max_len)
        })?;
        a.check(K)?;
        check(K, a.bt_stride * a.block_size >= self.max_len, || {
            "block tables shorter than the longest sequence".into()
        })?;
        need(K, "partial outputs", self.part_o, a.n_tok * nh * splits * hd)?;
        need(K, "partial statistics", self.part_ml, a.n_tok * nh * splits * 2)?;
        if a.n_tok == 0 {
            return Ok(());
        }
        let p = AttnParams {
            q: a.q.ptr,
            k_cache: a.k_cache.ptr,
            v_cache: a.v_cache.ptr,
            block_tables: a.block_tables.ptr,
            tok_seq: a.tok_seq.ptr,
            pos: a.pos.ptr,
            part_o: self.part_o.ptr,
            part_ml: self.part_ml.ptr,
            out: a.out.ptr,
            n_tok: a.n_tok as i32,
            n_heads: i32_of(K, nh)?,
            n_kv: i32_of(K, a.n_kv)?,
            head_dim: i32_of(K, hd)?,
            block_size: i32_of(K, a.block_size)?,
            bt_stride: i32_of(K, a.bt_stride)?,
            q_stride: i32_of(K, a.q_stride)?,
            out_stride: i32_of(K, a.out_stride)?,
            n_splits: i32_of(K, splits)?,
            split_len: split_len as i32,
            scale: 1.0 / (hd as f32).sqrt(),
            block_shift: a.block_size.trailing_zeros() as i32,
        };
        let mut smem = ((group * hd + group * split_len + (ATTN_THREADS / 32) * ATTN_VCHUNK * hd) * 4) as u32;
        let grid = (a.n_kv as u32, a.n_tok as u32, i32_of(K, splits)? as u32);
        // Head sizes 64 and 128: the one-pass kernel for up to 4 query heads per KV head, else
        // the reshaped two-pass one (same outputs). `DUSTOFF_ATTN_ONEPASS=0` turns the first off.
        // Below 16 tokens the two-pass kernel was faster (8 sequences: 31 against 38 us a layer).
        let onepass = group <= ATTN_ONEPASS_MAX_GROUP && a.n_tok >= 16 && tuning().attn_onepass;
        let entry = match (hd, onepass) {
            (64, true) => "attn_onepass_f16_hd64",
            (128, true) => "attn_onepass_f16_hd128",
            (64, false) => "attn_split_f16_hd64",
            (128, false) => "attn_split_f16_hd128",
            _ => K,
        };
        let mut threads = ATTN_THREADS;
        if onepass && matches!(hd, 64 | 128) {
            // `DUSTOFF_ATTN_WARPS` (1..=16) sets the warps of a block (for comparisons).
            threads = tuning().attn_warps.map_or(ATTN_THREADS, |w| w * 32);
            // q [group, 8, hd / 8 + 4] + per warp [group, hd + 2] floats.
            smem = ((group * 8 * (hd / 8 + 4) + (threads / 32) * group * (hd + 2)) * 4) as u32;
        }
        launch(k, s, entry, grid, threads as u32, smem, &p)?;
        launch(k, s, "attn_combine_f32", (nh as u32, a.n_tok as u32, 1), 128, 0, &p)
    }
}
