//! The paged f32 KV cache as the CPU attention reads it: the portable ops (`ops`) and the AVX2
//! kernels (`attn`) both walk it through these.

/// A paged KV cache of one layer: `[n_blocks, block_size, n_kv_heads, head_dim]`, f32.
pub struct PagedKv<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl PagedKv<'_> {
    /// Offset of (position, kv head) in the cache arrays, through the sequence's block table.
    #[inline]
    pub fn offset(&self, block_table: &[u32], pos: usize, kv_head: usize) -> usize {
        let block = block_table[pos / self.block_size] as usize;
        ((block * self.block_size + pos % self.block_size) * self.n_kv_heads + kv_head) * self.head_dim
    }
}

/// Runs `$body` with `$p` (position) and `$o` (offset of KV head `$kvh` of that position in
/// the cache arrays) for positions `0..=pos`, walking the block table block by block (no
/// division per position). A macro, not a closure, so the body is compiled inside the
/// caller's `target_feature` context.
macro_rules! for_positions {
    ($kv:expr, $table:expr, $pos:expr, $kvh:expr, |$p:ident, $o:ident| $body:block) => {{
        let stride = $kv.n_kv_heads * $kv.head_dim;
        let mut first = 0;
        for &blk in $table {
            if first > $pos {
                break;
            }
            let n = $kv.block_size.min($pos + 1 - first);
            let base = blk as usize * $kv.block_size * stride + $kvh * $kv.head_dim;
            for i in 0..n {
                let ($p, $o) = (first + i, base + i * stride);
                $body
            }
            first += n;
        }
    }};
}
pub(super) use for_positions;
