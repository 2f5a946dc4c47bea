//! The shape of one flattened step (`Flat`: tokens, logit rows, the attention's splits and
//! tiles), computed by `inputs` and read by the step, its attention and the masked step.

/// The shape of one step (its inputs are in `CudaBackend::host_meta`).
///
/// Tokens are laid out with the one-token chunks (decode) first: the split attention kernel
/// takes tokens `0..n_single`, the tensor-core prefill attention the tiles of the longer
/// chunks after them. Logit rows stay in plan order.
pub(in crate::backend::cuda) struct Flat {
    pub n_tok: usize,
    pub n_seqs: usize,
    /// Chunks that want logits.
    pub m: usize,
    /// Tokens for the split attention kernel (the first ones).
    pub n_single: usize,
    /// Longest sequence among those tokens.
    pub max_len: usize,
    /// Attention splits launched for them, and positions per split.
    pub splits: usize,
    pub split_len: usize,
    /// Prefill attention tiles (16 tokens at most each) over the other tokens.
    pub n_tiles: usize,
    /// Their splits (1: no partials) and positions per split.
    pub pf_splits: usize,
    pub pf_split_len: usize,
    /// Shared-prefix pass over the decode tokens: tiles, rows, splits, positions per split
    /// (no tiles: none).
    pub casc_tiles: usize,
    pub casc_rows: usize,
    pub casc_splits: usize,
    pub casc_split_len: usize,
}

impl Flat {
    /// Partials per (token, head) of the decode tokens (splits, then shared-prefix partials).
    pub(in crate::backend::cuda) fn dec_parts(&self) -> usize {
        self.splits + self.casc_splits
    }

    /// Partial rows (token x head x partial) of the step: decode, then prefill.
    pub(in crate::backend::cuda) fn part_rows(&self, n_heads: usize) -> usize {
        let pf = if self.pf_splits > 1 { (self.n_tok - self.n_single) * self.pf_splits } else { 0 };
        (self.n_single * self.dec_parts() + pf) * n_heads
    }
}
