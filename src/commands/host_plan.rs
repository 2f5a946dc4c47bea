//! The CPU backend's memory plan: what it allocates beside the mapped weights, checked against
//! the host memory still available before any of it is taken. Its KV cache holds f32 values
//! for every position of the pool (`CpuBackend::kv_bytes_per_token`), and a hybrid model keeps
//! a recurrent state per running sequence plus the engine's prefix snapshots (two per slot,
//! `engine::state_pool`). Without this check a large `--slots` or `bench --batch` aborted on
//! the allocation, or ran until the kernel's OOM killer ended the job.

use crate::backend::cpu::CpuBackend;
use crate::engine::batch::BLOCK_SIZE;
use crate::job::exit::UsageError;
use crate::model::config::ModelConfig;
use crate::sys::host_memory::Available;

/// Prefix snapshots of recurrent states the engine keeps per slot (`engine::state_pool`'s cap).
const SNAPSHOTS_PER_SLOT: u64 = 2;

/// Share of the available host memory a plan may take: the process's own buffers, the
/// tokenizer, the job's reader and writer and the page cache of the mapped weights need the rest.
const HOST_SHARE: f64 = 0.9;

/// Host bytes the CPU backend allocates for `positions` cached positions and `seqs`
/// sequences at once.
pub fn cpu_bytes(cfg: &ModelConfig, positions: usize, seqs: usize) -> u64 {
    let positions = positions.div_ceil(BLOCK_SIZE).max(1) as u64 * BLOCK_SIZE as u64;
    let kv = (CpuBackend::kv_bytes_per_token(cfg) as u64).saturating_mul(positions);
    let states =
        (cfg.state_bytes_per_seq() as u64).saturating_mul((seqs as u64).saturating_mul(1 + SNAPSHOTS_PER_SLOT));
    kv.saturating_add(states)
}

/// The most sequences of `per_seq` positions each whose plan fits `avail` (at least 1).
pub fn fit_seqs(cfg: &ModelConfig, per_seq: usize, avail: &Available) -> usize {
    let budget = (avail.bytes as f64 * HOST_SHARE) as u64;
    let each = cpu_bytes(cfg, per_seq, 1).max(1);
    (budget / each).max(1) as usize
}

/// Refuses (usage error, exit 2) a plan of `positions` positions over `seqs` sequences that
/// does not fit `avail`, with the numbers and how many sequences would fit.
pub fn check(cfg: &ModelConfig, positions: usize, seqs: usize, avail: &Available) -> Result<(), UsageError> {
    let need = cpu_bytes(cfg, positions, seqs);
    let budget = (avail.bytes as f64 * HOST_SHARE) as u64;
    if need <= budget {
        return Ok(());
    }
    let seqs = seqs.max(1);
    let per_seq = positions.div_ceil(seqs);
    let fit = (budget / cpu_bytes(cfg, per_seq, 1).max(1)) as usize;
    let state = if cfg.state_bytes_per_seq() > 0 {
        format!(
            " and {} of recurrent states ({seqs} sequences + {} prefix snapshots)",
            gb(cpu_bytes(cfg, 0, seqs) - cpu_bytes(cfg, 0, 0)),
            SNAPSHOTS_PER_SLOT * seqs as u64
        )
    } else {
        String::new()
    };
    let kv = cpu_bytes(cfg, positions, 0);
    let state = if state.is_empty() { state } else { format!("{state}, {} in all", gb(need)) };
    let fewer = if fit >= 1 && fit < seqs {
        format!("run fewer sequences at once (--slots, or bench's --batch): {fit} sequences of {per_seq} positions fit")
    } else {
        "shorter sequences (the job's max_tokens or limits.max_input_tokens, --ctx), or a machine with more memory"
            .into()
    };
    Err(UsageError::new(format!(
        "the CPU backend's memory does not fit this machine: a KV cache of {positions} positions ({seqs} sequence{}, {} layers, f32: {} a position) takes {}{state}, but {:.0}% of the {} available ({}) is {}; {fewer}",
        if seqs == 1 { "" } else { "s" },
        cfg.n_kv_layers(),
        human(CpuBackend::kv_bytes_per_token(cfg) as u64),
        gb(kv),
        HOST_SHARE * 100.0,
        gb(avail.bytes),
        avail.source,
        gb(budget),
    )))
}

fn gb(b: u64) -> String {
    format!("{:.2} GB", b as f64 / 1e9)
}

fn human(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MB", b as f64 / 1e6)
    } else {
        format!("{:.1} KB", b as f64 / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::shapes::shape;

    fn avail(gb: u64) -> Available {
        Available { bytes: gb << 30, source: "MemAvailable" }
    }

    #[test]
    fn the_kv_cache_is_f32_for_every_position_of_whole_blocks() {
        let c = shape("qwen3-8b").unwrap();
        // 36 layers x K and V x 8 KV heads x 128 x 4 bytes = 294,912 bytes a position.
        assert_eq!(cpu_bytes(&c, 16, 1), 16 * 294_912);
        assert_eq!(cpu_bytes(&c, 17, 1), 32 * 294_912, "a started block is allocated whole");
    }

    #[test]
    fn a_plan_past_the_memory_is_refused_with_what_fits() {
        let c = shape("qwen3-8b").unwrap();
        // 8 sequences of 4,096 positions: 9.66 GB of KV.
        assert!(check(&c, 8 * 4096, 8, &avail(16)).is_ok());
        let e = check(&c, 64 * 4096, 64, &avail(16)).unwrap_err().to_string();
        assert!(e.contains("262144 positions (64 sequences"), "{e}");
        // 16 GiB x 0.9 / 1.21 GB a sequence = 12.
        assert!(e.contains("--slots, or bench's --batch): 12 sequences of 4096 positions fit"), "{e}");
        assert_eq!(fit_seqs(&c, 4096, &avail(16)), 12);
        // Nothing fits: a shorter sequence is what to change.
        let e = check(&c, 1 << 20, 1, &avail(16)).unwrap_err().to_string();
        assert!(e.contains("shorter sequences"), "{e}");
        assert_eq!(fit_seqs(&c, 1 << 20, &avail(16)), 1, "at least one sequence is offered");
    }

    #[test]
    fn hybrid_models_count_states_and_snapshots() {
        let c = shape("qwen3.6-35b-a3b").unwrap();
        let per = c.state_bytes_per_seq() as u64;
        assert!(per > 0);
        assert_eq!(cpu_bytes(&c, 0, 4) - cpu_bytes(&c, 0, 0), 4 * 3 * per);
        let e = check(&c, 4 << 20, 4, &avail(1)).unwrap_err().to_string();
        assert!(e.contains("of recurrent states (4 sequences + 8 prefix snapshots)"), "{e}");
    }
}
