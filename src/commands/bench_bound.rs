//! The bound of a batched decode step (`bench --batch`): the step must read the weights it
//! touches once (a mixture-of-experts step: the experts its tokens chose, counted by the
//! backend from its routing output, `Backend::last_step_weight_bytes`) and each sequence's KV
//! cache up to its position (bytes as stored: F16 or 8-bit), or do its arithmetic (2 FLOPs per
//! weight a token uses, 4 per cached position, head dimension and query head of every attention
//! layer) at the card's tensor-core rate, whichever takes longer. The share of the bound is the
//! bound's time over the measured time of the same steps.

use serde::Serialize;

use crate::backend::Backend;
use crate::model::config::ModelConfig;

/// Weights one token multiplies with (every dense matrix and the head, its `n_used` experts
/// and the router of each sparse layer; not the embedding lookup).
pub fn params_per_token(c: &ModelConfig) -> u64 {
    let all = crate::backend::cuda::memory::f16_matrix_bytes(c) / 2;
    let unused: usize = (0..c.n_layers)
        .filter_map(|l| c.moe.as_ref().filter(|m| m.is_sparse(l)))
        .map(|m| (m.n_experts - m.n_used.min(m.n_experts)) * 3 * m.expert_ffn_dim * c.dim)
        .sum();
    let embd = if c.tied_embeddings { 0 } else { c.vocab_size * c.dim };
    all - (unused + embd) as u64
}

/// What one step cost in bytes and arithmetic.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepCost {
    pub weight_bytes: u64,
    pub kv_bytes: u64,
    pub flops: f64,
}

impl StepCost {
    /// The step of `contexts.len()` decode tokens, token i attending `contexts[i]` positions.
    pub fn of<B: Backend + ?Sized>(b: &B, contexts: &[usize]) -> StepCost {
        let c = b.config();
        let n = contexts.len();
        let weight_bytes = b.last_step_weight_bytes(n).unwrap_or_else(|| b.decode_weight_bytes());
        let positions: u64 = contexts.iter().map(|&p| p as u64).sum();
        let attn = 4.0 * (c.n_heads * c.head_dim * c.n_kv_layers()) as f64 * positions as f64;
        StepCost {
            weight_bytes,
            kv_bytes: positions * b.kv_bytes_per_position(),
            flops: 2.0 * params_per_token(c) as f64 * n as f64 + attn,
        }
    }

    /// Seconds the step takes at least on a device of `bandwidth` bytes/s (the measured copy
    /// rate, bytes read + written, as every bandwidth share of `bench` counts it) and `flops`
    /// FLOP/s (`None`: no FLOP side).
    pub fn seconds(&self, bandwidth: f64, flops: Option<f64>) -> f64 {
        let bytes = (self.weight_bytes + self.kv_bytes) as f64 / bandwidth;
        flops.map_or(bytes, |f| bytes.max(self.flops / f))
    }
}

/// The bound of a row's decode steps, summed, against their measured time.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RowBound {
    pub steps: u64,
    /// Means per step.
    pub weight_gb_per_step: f64,
    pub kv_gb_per_step: f64,
    pub tflop_per_step: f64,
    /// Steps whose arithmetic, not their bytes, set the bound.
    pub flop_bound_steps: u64,
    /// The bound's seconds over the measured seconds.
    pub share: f64,
}

/// The bound of `steps` over `measured_s` seconds.
pub fn row_bound(steps: &[StepCost], measured_s: f64, bandwidth: f64, flops: Option<f64>) -> RowBound {
    let n = steps.len().max(1) as f64;
    let bound: f64 = steps.iter().map(|s| s.seconds(bandwidth, flops)).sum();
    let flop_bound =
        steps.iter().filter(|s| flops.is_some_and(|f| s.flops / f > (s.weight_bytes + s.kv_bytes) as f64 / bandwidth));
    RowBound {
        steps: steps.len() as u64,
        weight_gb_per_step: steps.iter().map(|s| s.weight_bytes as f64).sum::<f64>() / n / 1e9,
        kv_gb_per_step: steps.iter().map(|s| s.kv_bytes as f64).sum::<f64>() / n / 1e9,
        tflop_per_step: steps.iter().map(|s| s.flops).sum::<f64>() / n / 1e12,
        flop_bound_steps: flop_bound.count() as u64,
        share: bound / measured_s.max(1e-9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::shapes::shape;

    /// Qwen3-8B: 8.19e9 parameters less the 0.62e9 of the untied embedding; Qwen3-30B-A3B:
    /// 3.3e9 active of 30.5e9 (8 of 128 experts a layer), as the model card says.
    #[test]
    fn params_per_token_count_the_experts_a_token_uses() {
        let dense = params_per_token(&shape("qwen3-8b").unwrap()) as f64;
        assert!((7.5e9..7.6e9).contains(&dense), "{dense}");
        let moe = params_per_token(&shape("qwen3-30b-a3b").unwrap()) as f64;
        assert!((3.0e9..3.4e9).contains(&moe), "{moe}");
    }

    /// 64 sequences at ~900 positions of Qwen3-8B in F16 KV: 64 x 900 x 36 x 2 x 1024 x 2 bytes
    /// = 8.5 GB of KV; with 4.7 GB of weights on a 4,000 GB/s card the bound is 3.3 ms, and
    /// the arithmetic (64 x 2 x 7.6e9 + attention) at 989 TFLOP/s is far below it.
    #[test]
    fn a_kv_heavy_step_is_bound_by_its_bytes() {
        let c = shape("qwen3-8b").unwrap();
        let kv_pos = (36 * 2 * 1024 * 2) as u64;
        let positions = 64 * 900u64;
        let attn = 4.0 * (32 * 128 * 36) as f64 * positions as f64;
        let s = StepCost {
            weight_bytes: 4_700_000_000,
            kv_bytes: positions * kv_pos,
            flops: 2.0 * params_per_token(&c) as f64 * 64.0 + attn,
        };
        let t = s.seconds(4e12, Some(989e12));
        assert!((t - (4.7e9 + 8.49e9) / 4e12).abs() < 1e-5, "{t}");
        let r = row_bound(&[s, s], 2.0 * t / 0.25, 4e12, Some(989e12));
        assert_eq!((r.steps, r.flop_bound_steps), (2, 0));
        assert!((r.share - 0.25).abs() < 1e-9 && (r.weight_gb_per_step - 4.7).abs() < 1e-9, "{r:?}");
    }
}
