//! `dustoff bench --plan`: the CUDA memory plan of a benchmark's sequences, printed before
//! anything is loaded (no GPU needed): weights as the backend keeps them, the KV cache, the
//! recurrent states of hybrid models (one per sequence, and the prefix-snapshot pool), the step
//! workspace; and whether it passes the plan's check on a card with `free` bytes. It is the
//! plan `CudaBackend` checks for the same options (`CudaOptions::max_seqs` = the sequences).
//! Sizes in GB = 1e9 bytes.

use serde::Serialize;

use crate::backend::cuda::plan::memory::{
    plan_memory_for, MemoryPlan, SeqPlan, WorkspaceParts, CONTEXT_ASSUMED, HEADROOM,
};
use crate::backend::kv_type::KvType;
use crate::model::config::ModelConfig;

pub use crate::backend::cuda::plan::memory::V100_32GB_FREE;

#[derive(Clone, Debug, Serialize)]
pub struct PlanReport {
    pub sequences: usize,
    pub positions_per_sequence: usize,
    pub weights_bytes: u64,
    pub kv_bytes: u64,
    pub kv_type: KvType,
    /// Recurrent states of the sequences themselves (hybrid models; 0 otherwise).
    pub live_state_bytes: u64,
    /// Prefix-reuse snapshots the pool holds (`DUSTOFF_STATE_SNAPSHOTS`).
    pub snapshots: usize,
    pub snapshot_bytes: u64,
    pub workspace_bytes: u64,
    /// The workspace by buffer.
    pub workspace_parts: WorkspaceParts,
    /// The CUDA context (assumed, outside the plan: the free memory is read after it).
    pub context_bytes: u64,
    /// Weights + KV + live states + snapshots + workspace.
    pub total_bytes: u64,
    /// Weights + KV + live states: what the sequences themselves hold.
    pub weights_kv_state_bytes: u64,
    pub free_bytes: u64,
    /// The share of `free_bytes` a plan may use (`HEADROOM`).
    pub budget_bytes: u64,
    /// `Ok` or the check's refusal (with its numbers), for `total_bytes` against `free_bytes`.
    pub verdict: Result<(), String>,
    /// The most sequences of this length (up to 256) that pass the same check.
    pub fitting_sequences: usize,
    /// Tokens of the largest step the workspace is sized for.
    pub step_tokens: usize,
    /// Where the plan does not fit with steps larger than the engine's default
    /// (`DEFAULT_MAX_BATCH_TOKENS`): that step size and the plan's total with it.
    pub with_default_step: Option<(usize, u64)>,
}

/// The plan of `seqs` sequences of `ctx` positions each (KV blocks of `block_size`, steps of
/// `step_tokens`) for a model whose device matrices take `matrices` bytes (`wide`: the
/// widened-matrix scratch), with the default snapshot pool.
pub fn plan_report(
    cfg: &ModelConfig,
    (matrices, wide): (u64, u64),
    seqs: usize,
    ctx: usize,
    (block_size, step_tokens): (usize, usize),
    free: u64,
    kv: KvType,
) -> PlanReport {
    // (the backend's plan for `n` sequences, its KV blocks)
    let plan = |n: usize| -> (MemoryPlan, usize) {
        let blocks = n * ctx.div_ceil(block_size).max(1);
        let p = plan_memory_for(cfg, matrices, wide, blocks, block_size, step_tokens, ctx, SeqPlan::new(n));
        (p.with_kv_type(cfg, kv), blocks)
    };
    let fits = |p: &MemoryPlan, blocks: usize| p.check(free, "the card", blocks * block_size, cfg);
    let (own, blocks) = plan(seqs);
    let default_step = crate::engine::batch::DEFAULT_MAX_BATCH_TOKENS.max(seqs);
    let with_default_step = (fits(&own, blocks).is_err() && step_tokens > default_step).then(|| {
        let p = plan_memory_for(cfg, matrices, wide, blocks, block_size, default_step, ctx, SeqPlan::new(seqs));
        (default_step, p.with_kv_type(cfg, kv).total)
    });
    let fitting_sequences = (1..=256)
        .take_while(|&n| {
            let (p, b) = plan(n);
            fits(&p, b).is_ok()
        })
        .last()
        .unwrap_or(0);
    let live = own.seqs.running as u64 * own.state_per_seq;
    PlanReport {
        sequences: seqs,
        positions_per_sequence: ctx,
        weights_bytes: own.weights,
        kv_bytes: own.kv,
        kv_type: own.kv_type,
        live_state_bytes: live,
        snapshots: own.seqs.snapshots,
        snapshot_bytes: own.state - live,
        workspace_bytes: own.workspace,
        workspace_parts: own.parts,
        context_bytes: CONTEXT_ASSUMED,
        total_bytes: own.total,
        weights_kv_state_bytes: own.weights + own.kv + live,
        free_bytes: free,
        budget_bytes: (free as f64 * HEADROOM) as u64,
        verdict: fits(&own, blocks),
        fitting_sequences,
        step_tokens,
        with_default_step,
    }
}

impl PlanReport {
    pub fn print_human(&self) {
        let gb = |b: u64| format!("{:.2} GB", b as f64 / 1e9);
        println!(
            "memory plan for {} sequences of {} positions (GB = 1e9 bytes)",
            self.sequences, self.positions_per_sequence
        );
        println!("weights            {}", gb(self.weights_bytes));
        println!("KV cache           {} ({})", gb(self.kv_bytes), self.kv_type);
        println!(
            "recurrent states   {} (+ {} for a pool of {} prefix snapshots)",
            gb(self.live_state_bytes),
            gb(self.snapshot_bytes),
            self.snapshots
        );
        println!("workspace          {} (steps of {} tokens)", gb(self.workspace_bytes), self.step_tokens);
        let w = &self.workspace_parts;
        for (what, b) in [
            ("step buffers", w.step),
            ("attention partials", w.attention),
            ("logits", w.logits),
            ("RoPE tables", w.rope),
            ("widening scratch", w.wide_scratch),
            ("experts, linear layers", w.experts_linear),
            ("cuBLAS (allowance)", w.cublas),
        ] {
            if b > 0 {
                println!("  {what:22} {:8.1} MB", b as f64 / 1e6);
            }
        }
        println!("weights+KV+states  {}", gb(self.weights_kv_state_bytes));
        let free = format!(
            "{:.0}% of {} free ({:.0} MiB) is {}",
            HEADROOM * 100.0,
            gb(self.free_bytes),
            self.free_bytes as f64 / (1u64 << 20) as f64,
            gb(self.budget_bytes)
        );
        match &self.verdict {
            Ok(()) => println!(
                "total              {}: fits ({free}; {} to spare)",
                gb(self.total_bytes),
                gb(self.budget_bytes - self.total_bytes)
            ),
            Err(e) => println!(
                "total              {}: misses by {} ({free})\n  {e}",
                gb(self.total_bytes),
                gb(self.total_bytes.saturating_sub(self.budget_bytes))
            ),
        }
        println!(
            "with the context   {} (+ {} assumed for the CUDA context: what a measured peak reads)",
            gb(self.total_bytes + self.context_bytes),
            gb(self.context_bytes)
        );
        println!("sequences that fit {} (of {} positions each)", self.fitting_sequences, self.positions_per_sequence);
        if let Some((step, total)) = self.with_default_step {
            let how = if total <= self.budget_bytes { "fits" } else { "does not fit either" };
            println!(
                "with --max-batch-tokens {step} (smaller steps, less workspace) the total is {}: {how}",
                gb(total)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::plan::memory::wide_len;
    use crate::backend::cuda::synth::mix::{synthetic_matrix_bytes, WeightMix};
    use crate::engine::batch::DEFAULT_MAX_BATCH_TOKENS;
    use crate::model::shapes::shape;

    /// The goal: Qwen3.6-35B-A3B in the Q4_K_M mix with 64 sequences of 4,096
    /// positions on a V100-SXM2-32GB (33.55e9 bytes free after the context). The weights (every
    /// expert, as repacked: about the 21 GB of the released GGUF), the KV of the 10 attention
    /// layers (64 x 4,096 x 10 x 2 x 512 x 2 bytes, F16), the f32 states of the 30 linear
    /// layers (30 x (3 x 8,192 + 32 x 128 x 128) x 4 bytes per sequence, one per sequence),
    /// the pool of 8 prefix snapshots and the workspace of the engine's 512-token steps pass
    /// the backend's check (with 0.15 GB to spare: one sequence more fits, two do not).
    #[test]
    fn qwen36_35b_a3b_64_sequences_of_4096_fit_a_32_gb_v100() {
        let c = shape("qwen3.6-35b-a3b").unwrap();
        let (bytes, wide) = (synthetic_matrix_bytes(&c, WeightMix::Q4KM), wide_len(&c) as u64 * 2);
        let report =
            |n: usize, step: usize| plan_report(&c, (bytes, wide), n, 4096, (16, step), V100_32GB_FREE, KvType::F16);
        let r = report(64, DEFAULT_MAX_BATCH_TOKENS);
        r.print_human();
        assert!((20.5e9..21.8e9).contains(&(r.weights_bytes as f64)), "{r:?}");
        assert_eq!(r.kv_bytes, 64 * 4096 * 10 * 2 * 512 * 2);
        let per_seq = 30 * (3 * 8192 + 32 * 128 * 128) * 4;
        assert_eq!(r.live_state_bytes, 64 * per_seq);
        assert_eq!((r.snapshots, r.snapshot_bytes), (8, 8 * per_seq));
        assert!(r.weights_kv_state_bytes < 31_000_000_000, "{r:?}");
        // Sized by one 4,096-position sequence and 512-token steps, not by the pool of 262,144.
        assert!(r.workspace_bytes < 500_000_000, "{r:?}");
        assert_eq!(r.total_bytes, r.weights_kv_state_bytes + r.snapshot_bytes + r.workspace_bytes);
        assert!(r.verdict.is_ok(), "{r:?}");
        let n = r.fitting_sequences;
        assert!((64..72).contains(&n), "{r:?}");
        assert!(report(n, DEFAULT_MAX_BATCH_TOKENS).verdict.is_ok());
        let e = report(n + 1, DEFAULT_MAX_BATCH_TOKENS).verdict.unwrap_err();
        // Already 4-bit: the refusal offers what would help, not 4-bit weights.
        let fewer = format!("fewer parallel sequences: {n} fit");
        assert!(!e.contains("4-bit") && e.contains(&fewer) && e.contains("fewer prefix snapshots"), "{e}");
        // The bench's batched default (2,048-token steps) needs 0.5 GB more workspace (MoE
        // pairs, linear-layer and step buffers for 4x the tokens): 0.28 GB over; the report
        // says that the engine's step fits.
        let big = report(64, 2048);
        assert!(big.workspace_bytes > r.workspace_bytes + 450_000_000, "{big:?}");
        assert!(big.verdict.is_err() && big.with_default_step == Some((512, r.total_bytes)), "{big:?}");
        assert!(r.with_default_step.is_none());
    }
}
