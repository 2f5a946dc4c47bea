//! What the decode (attention.rs, kernels/attention_decode.cu) and the prefill (prefill.rs,
//! kernels/attention_prefill.cu) attention launchers share: the description of queries over the
//! paged KV cache (the merge of their split partials: attention_merge.rs).

use super::super::CudaError;
use super::launch::{check, extent, need, need_kv, Dev, KvScales};

/// The inputs every paged attention kernel reads: queries `q` `[n_tok, q_stride]` (heads first),
/// the paged F16 (or, with `kv_scales`, 8-bit) cache (`[cache_rows, n_kv * head_dim]`, cache row = block * block_size + offset, blocks
/// from row `tok_seq[t]` of `block_tables` `[n_seqs, bt_stride]`), each token's position `pos`,
/// and the output `[n_tok, out_stride]`. Each token attends positions `0..=pos[t]` of its
/// sequence. The host guarantees block ids `< cache_rows / block_size` and `tok_seq < n_seqs`.
#[derive(Clone, Copy, Debug)]
pub struct PagedAttn {
    pub q: Dev<f32>,
    pub k_cache: Dev<u16>,
    pub v_cache: Dev<u16>,
    /// The 8-bit cache's scales; `None`: an F16 cache.
    pub kv_scales: Option<KvScales>,
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
    /// long enough; gives the scale pointers of the params structs (0, 0 for an F16 cache).
    pub fn check(&self, kernel: &'static str) -> Result<(u64, u64), CudaError> {
        let (hd, nh) = (self.head_dim, self.n_heads);
        check(kernel, nh * hd <= self.q_stride && nh * hd <= self.out_stride, || {
            "heads overlap the row stride".into()
        })?;
        check(kernel, self.block_size.is_power_of_two(), || {
            format!("block size {} (a power of two)", self.block_size)
        })?;
        need(kernel, "q", self.q, extent(self.n_tok, self.q_stride, nh * hd))?;
        let group = crate::backend::kv_type::Q8_GROUP;
        check(kernel, self.kv_scales.is_none() || hd.is_multiple_of(group), || {
            format!("head size {hd} with an 8-bit cache (a multiple of {group})")
        })?;
        let scales = need_kv(kernel, (self.k_cache, self.v_cache), self.kv_scales, self.cache_rows * self.n_kv * hd)?;
        need(kernel, "block tables", self.block_tables, self.n_seqs * self.bt_stride)?;
        need(kernel, "token sequences", self.tok_seq, self.n_tok)?;
        need(kernel, "positions", self.pos, self.n_tok)?;
        need(kernel, "output", self.out, extent(self.n_tok, self.out_stride, nh * hd))?;
        Ok(scales)
    }
}
