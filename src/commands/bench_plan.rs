//! `dustoff bench --plan`: the CUDA memory plan of a benchmark's sequences, printed before
//! anything is loaded (no GPU needed): weights as the backend keeps them, the KV cache, the
//! recurrent states of hybrid models (live states and as many prefix snapshots), the step
//! workspace; and whether it passes the plan's check on a card with `free` bytes.

use serde::Serialize;

use crate::backend::cuda::memory::{plan_memory_for, MemoryPlan};
use crate::model::config::ModelConfig;

/// Free bytes of a 32 GB V100 after its CUDA context, the card the plan is judged against by
/// default (the figure the Qwen3-30B-A3B plan test uses).
pub const V100_32GB_FREE: u64 = 31_700_000_000;

#[derive(Clone, Debug, Serialize)]
pub struct PlanReport {
    pub sequences: usize,
    pub positions_per_sequence: usize,
    pub weights_bytes: u64,
    pub kv_bytes: u64,
    /// Recurrent states of the sequences themselves (hybrid models; 0 otherwise).
    pub live_state_bytes: u64,
    /// As many prefix-reuse snapshots again (the engine keeps up to 2 per slot).
    pub snapshot_bytes: u64,
    pub workspace_bytes: u64,
    /// Weights + KV + live states + snapshots + workspace.
    pub total_bytes: u64,
    /// Weights + KV + live states: what the sequences themselves hold.
    pub weights_kv_state_bytes: u64,
    pub free_bytes: u64,
    /// `Ok` or the check's refusal (with its numbers), for `total_bytes` against `free_bytes`.
    pub verdict: Result<(), String>,
    /// The most sequences of this length (up to 256) that pass the same check.
    pub fitting_sequences: usize,
    /// What `CudaBackend` plans today for the same KV pool: it does not know the slot count and
    /// reserves `planned_state_seqs(blocks)` states (64 for any pool of 64 blocks or more) and
    /// as many snapshots.
    pub backend_total_bytes: u64,
    pub backend_verdict: Result<(), String>,
}

/// The plan of `seqs` sequences of `ctx` positions each (KV blocks of `block_size`) for a
/// model whose device matrices take `matrices` bytes (`wide`: the widened-matrix scratch).
pub fn plan_report(
    cfg: &ModelConfig,
    matrices: u64,
    wide: u64,
    seqs: usize,
    ctx: usize,
    (block_size, step_tokens): (usize, usize),
    free: u64,
) -> PlanReport {
    let per_seq = cfg.hybrid.as_ref().map_or(0, |h| h.state_bytes_per_seq() as u64);
    // (the backend's plan, the plan with the states of `n` sequences and `n` snapshots, blocks)
    let plan = |n: usize| -> (MemoryPlan, MemoryPlan, usize) {
        let blocks = n * ctx.div_ceil(block_size).max(1);
        let p = plan_memory_for(cfg, matrices, wide, blocks, block_size, step_tokens, ctx);
        let state = 2 * n as u64 * per_seq;
        let own = MemoryPlan { state, total: p.total - p.state + state, ..p };
        (p, own, blocks)
    };
    let fits = |p: &MemoryPlan, blocks: usize| p.check(free, "the card", blocks * block_size, cfg);
    let (backend, own, blocks) = plan(seqs);
    let fitting_sequences = (1..=256)
        .take_while(|&n| {
            let (_, p, b) = plan(n);
            fits(&p, b).is_ok()
        })
        .last()
        .unwrap_or(0);
    let live = seqs as u64 * per_seq;
    PlanReport {
        sequences: seqs,
        positions_per_sequence: ctx,
        weights_bytes: own.weights,
        kv_bytes: own.kv,
        live_state_bytes: live,
        snapshot_bytes: own.state - live,
        workspace_bytes: own.workspace,
        total_bytes: own.total,
        weights_kv_state_bytes: own.weights + own.kv + live,
        free_bytes: free,
        verdict: fits(&own, blocks),
        fitting_sequences,
        backend_total_bytes: backend.total,
        backend_verdict: fits(&backend, blocks),
    }
}

impl PlanReport {
    pub fn print_human(&self) {
        let gb = |b: u64| format!("{:.2} GB", b as f64 / 1e9);
        let verdict = |v: &Result<(), String>| match v {
            Ok(()) => format!("fits in 90% of {} free", gb(self.free_bytes)),
            Err(e) => format!("does not fit: {e}"),
        };
        println!("memory plan for {} sequences of {} positions", self.sequences, self.positions_per_sequence);
        println!("weights            {}", gb(self.weights_bytes));
        println!("KV cache           {}", gb(self.kv_bytes));
        println!(
            "recurrent states   {} (+ {} of prefix snapshots)",
            gb(self.live_state_bytes),
            gb(self.snapshot_bytes)
        );
        println!("workspace          {}", gb(self.workspace_bytes));
        println!("weights+KV+states  {}", gb(self.weights_kv_state_bytes));
        println!("total              {}: {}", gb(self.total_bytes), verdict(&self.verdict));
        println!("sequences that fit {} (of {} positions each)", self.fitting_sequences, self.positions_per_sequence);
        println!(
            "backend plan today {}: {} (it reserves states for the KV pool, not the slots)",
            gb(self.backend_total_bytes),
            verdict(&self.backend_verdict)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::backend::{synthetic_matrix_bytes, wide_len, WeightMix};
    use crate::model::shapes::shape;

    /// Qwen3.6-35B-A3B in the Q4_K_M mix, 64 sequences of 4,096 positions: the weights (every
    /// expert, as repacked: about the 21 GB of the released GGUF), the KV of the 10 attention
    /// layers (64 x 4,096 x 10 x 2 x 512 x 2 bytes) and the f32 states of the 30 linear layers
    /// (30 x (3 x 8,192 + 32 x 128 x 128) x 4 bytes per sequence) hold under 32 GB; the plan
    /// with its snapshots, workspace and 10% headroom says how many sequences a V100 takes.
    #[test]
    fn qwen36_35b_a3b_64_sequences_of_4096() {
        let c = shape("qwen3.6-35b-a3b").unwrap();
        let bytes = synthetic_matrix_bytes(&c, WeightMix::Q4KM);
        let r = plan_report(&c, bytes, wide_len(&c) as u64 * 2, 64, 4096, (16, 512), V100_32GB_FREE);
        assert!((20.5e9..21.8e9).contains(&(r.weights_bytes as f64)), "{r:?}");
        assert_eq!(r.kv_bytes, 64 * 4096 * 10 * 2 * 512 * 2);
        assert_eq!(r.live_state_bytes, 64 * 30 * (3 * 8192 + 32 * 128 * 128) * 4);
        assert_eq!(r.snapshot_bytes, r.live_state_bytes);
        assert!(r.weights_kv_state_bytes < 32_000_000_000, "{r:?}");
        // Sized by one 4,096-position sequence, not by the whole pool of 262,144.
        assert!(r.workspace_bytes < 1_500_000_000, "{r:?}");
        assert_eq!(r.total_bytes, r.weights_bytes + r.kv_bytes + 2 * r.live_state_bytes + r.workspace_bytes);
        r.print_human();
        assert!(r.verdict.is_err() && r.backend_verdict.is_err(), "{r:?}");
        // The count that fits is the largest whose plan passes.
        let n = r.fitting_sequences;
        assert!(n < 256 && n > 0, "{r:?}");
        let next = plan_report(&c, bytes, wide_len(&c) as u64 * 2, n + 1, 4096, (16, 512), V100_32GB_FREE);
        assert!(
            next.verdict.is_err()
                && plan_report(&c, bytes, wide_len(&c) as u64 * 2, n, 4096, (16, 512), V100_32GB_FREE).verdict.is_ok()
        );
    }
}
