//! The bound of an engine step: a step must read the weights it touches once (a mixture-of-experts
//! step: the experts its tokens chose, counted by the backend from its routing output,
//! `Backend::last_step_weight_bytes`) and each sequence's KV cache up to where its chunk ends
//! (bytes as stored: F16 or 8-bit), or do its arithmetic (2 FLOPs per weight a token uses; 4 per
//! attended position, head dimension and query head of every attention layer), whichever takes
//! longer at the device's copy rate and tensor-core rate. The share of the bound is the bound's
//! seconds over the measured seconds of the same steps: `bench --batch` tallies its decode
//! steps, a job (`dustoff run` on a GPU) every step it runs, prefill chunks included.

use serde::Serialize;

use crate::backend::Backend;
use crate::engine::plan::StepPlan;
use crate::model::config::ModelConfig;

/// Weights one token multiplies with (every dense matrix and the head, its `n_used` experts
/// and the router of each sparse layer; not the embedding lookup).
pub fn params_per_token(c: &ModelConfig) -> u64 {
    let all = crate::backend::cuda::plan::memory::f16_matrix_bytes(c) / 2;
    let unused: usize = (0..c.n_layers)
        .filter_map(|l| c.sparse_ffn(l))
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
    /// A step of chunks `(start, len)`: `len` new tokens at positions `start..start + len` of one
    /// sequence each. Each chunk reads its sequence's KV up to `start + len` once; its token at
    /// position p attends p + 1 positions (causal).
    pub fn of_chunks<B: Backend + ?Sized>(b: &B, chunks: impl Iterator<Item = (usize, usize)>) -> StepCost {
        let c = b.config();
        let (mut n_tok, mut read, mut attended) = (0usize, 0u64, 0f64);
        for (start, len) in chunks {
            let end = start + len;
            n_tok += len;
            read += end as u64;
            // sum of (p + 1) for p in start..end
            attended += (end * (end + 1) - start * (start + 1)) as f64 / 2.0;
        }
        let weight_bytes = b.last_step_weight_bytes(n_tok).unwrap_or_else(|| b.decode_weight_bytes());
        let attn = 4.0 * (c.n_heads * c.head_dim * c.n_kv_layers()) as f64 * attended;
        StepCost {
            weight_bytes,
            kv_bytes: read * b.kv_bytes_per_position(),
            flops: 2.0 * params_per_token(c) as f64 * n_tok as f64 + attn,
        }
    }

    /// The step of `contexts.len()` decode tokens, token i attending `contexts[i]` positions.
    pub fn of<B: Backend + ?Sized>(b: &B, contexts: &[usize]) -> StepCost {
        Self::of_chunks(b, contexts.iter().map(|&p| (p.saturating_sub(1), 1)))
    }

    /// The step the engine just ran (`plan`).
    pub fn of_plan<B: Backend + ?Sized>(b: &B, plan: &StepPlan) -> StepCost {
        Self::of_chunks(b, plan.chunks.iter().map(|c| (c.start_pos, c.tokens.len())))
    }

    /// Seconds the step takes at least at `rates`.
    pub fn seconds(&self, rates: BoundRates) -> f64 {
        let bytes = (self.weight_bytes + self.kv_bytes) as f64 / rates.bandwidth;
        rates.flops.map_or(bytes, |f| bytes.max(self.flops / f))
    }

    /// Whether its arithmetic, not its bytes, sets the bound.
    fn flop_bound(&self, rates: BoundRates) -> bool {
        rates.flops.is_some_and(|f| self.flops / f > (self.weight_bytes + self.kv_bytes) as f64 / rates.bandwidth)
    }
}

/// The rates a bound is taken at: the device's measured copy rate (bytes read + written per
/// second, as every bandwidth share of `bench` counts it) and its tensor-core FLOP/s (`None`:
/// no FLOP side).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BoundRates {
    pub bandwidth: f64,
    pub flops: Option<f64>,
}

/// A V100-SXM2's peak rates (900 GB/s of HBM2, 125 TFLOP/s of F16 tensor cores): a step's
/// bound at these rates is the least time it can take on the card dustoff is built for, whatever
/// the card the steps were measured on.
pub const V100: BoundRates = BoundRates { bandwidth: 900e9, flops: Some(125e12) };

/// Steps against their bound, summed.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BoundTally {
    pub steps: u64,
    /// The bound's seconds and the measured seconds of the tallied steps.
    pub bound_seconds: f64,
    pub measured_seconds: f64,
    /// Means per step.
    pub weight_gb_per_step: f64,
    pub kv_gb_per_step: f64,
    pub tflop_per_step: f64,
    /// Steps whose arithmetic, not their bytes, set the bound.
    pub flop_bound_steps: u64,
    /// `bound_seconds / measured_seconds`.
    pub share: f64,
    /// The same steps' bound at [`V100`]'s rates: no V100 runs them in less (the steps of a job
    /// within `--max-gpu-memory 32GB` are the ones a 32 GB V100 would run).
    pub v100_bound_seconds: f64,
}

impl BoundTally {
    /// Adds one step that cost `cost` and took `seconds`.
    pub fn add(&mut self, cost: &StepCost, seconds: f64, rates: BoundRates) {
        let n = self.steps as f64;
        let mean = |m: f64, x: f64| (m * n + x) / (n + 1.0);
        self.weight_gb_per_step = mean(self.weight_gb_per_step, cost.weight_bytes as f64 / 1e9);
        self.kv_gb_per_step = mean(self.kv_gb_per_step, cost.kv_bytes as f64 / 1e9);
        self.tflop_per_step = mean(self.tflop_per_step, cost.flops / 1e12);
        self.steps += 1;
        self.flop_bound_steps += u64::from(cost.flop_bound(rates));
        self.bound_seconds += cost.seconds(rates);
        self.v100_bound_seconds += cost.seconds(V100);
        self.measured_seconds += seconds;
        self.share = self.bound_seconds / self.measured_seconds.max(1e-9);
    }

    /// `steps` that took `measured_s` seconds together.
    pub fn of(steps: &[StepCost], measured_s: f64, rates: BoundRates) -> BoundTally {
        let mut t = BoundTally::default();
        for s in steps {
            t.add(s, 0.0, rates);
        }
        t.measured_seconds = measured_s;
        t.share = t.bound_seconds / measured_s.max(1e-9);
        t
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
        let rates = BoundRates { bandwidth: 4e12, flops: Some(989e12) };
        let t = s.seconds(rates);
        assert!((t - (4.7e9 + 8.49e9) / 4e12).abs() < 1e-5, "{t}");
        let r = BoundTally::of(&[s, s], 2.0 * t / 0.25, rates);
        assert_eq!((r.steps, r.flop_bound_steps), (2, 0));
        assert!((r.share - 0.25).abs() < 1e-9 && (r.weight_gb_per_step - 4.7).abs() < 1e-9, "{r:?}");
        // Step by step, the same totals.
        let mut step_by_step = BoundTally::default();
        step_by_step.add(&s, t / 0.25, rates);
        step_by_step.add(&s, t / 0.25, rates);
        assert!((step_by_step.share - r.share).abs() < 1e-12 && step_by_step.steps == 2);
        // At a V100's rates the same steps are bound by their bytes too: 13.19 GB at 900 GB/s.
        let v100 = 2.0 * (4.7e9 + 8.49e9) / 900e9;
        assert!((r.v100_bound_seconds - v100).abs() < 1e-4, "{r:?}");
        // A 512-token prefill chunk of one sequence is bound by its arithmetic on the same card.
        let p = StepCost { weight_bytes: 4_700_000_000, kv_bytes: 512 * kv_pos, flops: 2.0 * 7.5e9 * 512.0 };
        assert!(p.flop_bound(rates) && !s.flop_bound(rates));
    }
}
