//! What the decode (attention.rs, kernels/attention_decode.cu) and the prefill (prefill.rs,
//! kernels/attention_prefill.cu) attention launchers share: the description of queries over the
//! paged KV cache, and the exact merge of split partials that follows either kernel's splits
//! (entry `attn_merge_f32`, defined in attention_decode.cu: the one entry of that file launched
//! from outside attention.rs. It cannot move there: attention.rs uses prefill.rs for a
//! shared-prefix group's pass, and prefill.rs needs the merge, so the two would import each
//! other, a circle that tests/module_graph.rs refuses).

use cudarc::driver::{CudaStream, DeviceRepr};

use super::kernels::Kernels;
use super::launch::{check, extent, i32_of, launch, need, Dev};
use super::CudaError;

/// The inputs every paged attention kernel reads: queries `q` `[n_tok, q_stride]` (heads first),
/// the paged F16 cache (`[cache_rows, n_kv * head_dim]`, cache row = block * block_size + offset, blocks
/// from row `tok_seq[t]` of `block_tables` `[n_seqs, bt_stride]`), each token's position `pos`,
/// and the output `[n_tok, out_stride]`. Each token attends positions `0..=pos[t]` of its
/// sequence. The host guarantees block ids `< cache_rows / block_size` and `tok_seq < n_seqs`.
#[derive(Clone, Copy, Debug)]
pub struct PagedAttn {
    pub q: Dev<f32>,
    pub k_cache: Dev<u16>,
    pub v_cache: Dev<u16>,
    pub block_tables: Dev<i32>,
    pub tok_seq: Dev<i32>,
    pub pos: Dev<i32>,
    pub out: Dev<f32>,
    pub cache_rows: usize,
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
    pub fn check(&self, kernel: &'static str) -> Result<(), CudaError> {
        let (hd, nh) = (self.head_dim, self.n_heads);
        check(kernel, nh * hd <= self.q_stride && nh * hd <= self.out_stride, || {
            "heads overlap the row stride".into()
        })?;
        check(kernel, self.block_size.is_power_of_two(), || {
            format!("block size {} (a power of two)", self.block_size)
        })?;
        need(kernel, "q", self.q, extent(self.n_tok, self.q_stride, nh * hd))?;
        need(kernel, "K cache", self.k_cache, self.cache_rows * self.n_kv * hd)?;
        need(kernel, "V cache", self.v_cache, self.cache_rows * self.n_kv * hd)?;
        need(kernel, "block tables", self.block_tables, self.n_seqs * self.bt_stride)?;
        need(kernel, "token sequences", self.tok_seq, self.n_tok)?;
        need(kernel, "positions", self.pos, self.n_tok)?;
        need(kernel, "output", self.out, extent(self.n_tok, self.out_stride, nh * hd))
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct MergeParams {
    part_o: u64,
    part_ml: u64,
    out: u64,
    n_heads: i32,
    head_dim: i32,
    n_parts: i32,
    out_stride: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for MergeParams {}

/// `out[t, h] = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s` over the non-empty partials of
/// `part_o` `[n_tok, n_heads, n_parts, head_dim]` / `part_ml` `[n_tok, n_heads, n_parts, 2]`,
/// in partial order. The host guarantees that every partial was written and each token has a
/// non-empty one.
pub struct Merge {
    pub part_o: Dev<f32>,
    pub part_ml: Dev<f32>,
    pub out: Dev<f32>,
    pub n_tok: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    pub n_parts: usize,
    pub out_stride: usize,
}

impl Merge {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "attn_merge_f32";
        let (nh, hd) = (self.n_heads, self.head_dim);
        check(K, hd <= 256, || format!("head size {hd} (at most 256: two dimensions per thread)"))?;
        check(K, nh * hd <= self.out_stride, || "heads overlap the row stride".into())?;
        check(K, self.n_tok <= 65_535, || format!("{} tokens in one launch (at most 65535)", self.n_tok))?;
        need(K, "partial outputs", self.part_o, self.n_tok * nh * self.n_parts * hd)?;
        need(K, "partial statistics", self.part_ml, self.n_tok * nh * self.n_parts * 2)?;
        need(K, "output", self.out, extent(self.n_tok, self.out_stride, nh * hd))?;
        if self.n_tok == 0 {
            return Ok(());
        }
        let p = MergeParams {
            part_o: self.part_o.ptr,
            part_ml: self.part_ml.ptr,
            out: self.out.ptr,
            n_heads: i32_of(K, nh)?,
            head_dim: i32_of(K, hd)?,
            n_parts: i32_of(K, self.n_parts)?,
            out_stride: i32_of(K, self.out_stride)?,
        };
        launch(k, s, K, (nh as u32, self.n_tok as u32, 1), 128, 0, &p)
    }
}
