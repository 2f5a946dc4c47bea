//! What the last step read of the weights, for the step bound of `bench --batch`: a
//! mixture-of-experts step reads its router and shared expert, the experts its tokens chose
//! (at 64 sequences nearly all of a layer's 128) and every dense matrix; one token reads
//! `n_used` experts a layer (`decode_weight_bytes`). The experts are counted from the routing
//! output the step left on the device: the expert ids `[n_tok * n_used]` of the last sparse
//! layer (the step buffers are shared by the layers), whose count of distinct experts stands
//! for every sparse layer's.

use crate::backend::cuda::model::CudaBackend;

impl CudaBackend {
    /// Bytes of weights the last step of `n_tok` tokens read (every dense matrix, the head, the
    /// tokens' embedding rows, and per sparse layer its router, shared expert and the experts
    /// chosen); `None` for models without sparse layers (`decode_weight_bytes` then holds) or
    /// when the routing output cannot be read.
    pub(in crate::backend::cuda) fn touched_weight_bytes(&self, n_tok: usize) -> Option<u64> {
        let sparse: Vec<_> = self.layers.iter().filter_map(|l| l.ffn.experts()).collect();
        let first = sparse.first()?;
        let pairs = n_tok * first.n_used;
        let ids = self.work.experts.ids.as_ref().filter(|b| b.len() >= pairs && pairs > 0)?;
        let ids = self.dev.stream.clone_dtoh(&ids.slice(0..pairs)).ok()?;
        let mut seen = vec![false; first.n_experts];
        for &e in &ids {
            if let Some(s) = seen.get_mut(e as usize) {
                *s = true;
            }
        }
        let chosen = seen.iter().filter(|&&s| s).count();
        let active: u64 = sparse.iter().map(|m| m.active_bytes()).sum();
        let touched: u64 = sparse.iter().map(|m| m.touched_bytes(chosen)).sum();
        let embd_row = self.embd.parts.first().map_or(0, |m| m.row_bytes());
        // decode_bytes counts one token's experts and one embedding row.
        Some(self.decode_bytes - active + touched + embd_row * n_tok.saturating_sub(1) as u64)
    }
}
