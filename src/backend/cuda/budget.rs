//! `--max-gpu-memory SIZE`: the most device memory one process may take on a GPU (a card shared
//! with other services, or a V100's 32 GB emulated on a larger test card). The memory plan is
//! checked against the smaller of the driver's free memory and this cap less the CUDA context
//! ([`CONTEXT_ASSUMED`], which the free memory is read after), so weights + KV cache + recurrent
//! states + workspace + the plan's headroom stay within it; `--slots auto` and the KV pool are
//! sized from the same figure.
//!
//! Sizes: `32GB` = 32e9 bytes, `30GiB` = 30 x 2^30 bytes; K/M/G/T with or without `B`, the
//! binary forms with `iB`; decimals allowed (`31.5GB`). A bare number is refused (bytes or GB?).

use super::memory::{plan_memory, MemoryPlan, SeqPlan, CONTEXT_ASSUMED};
use crate::backend::kv_type::KvType;
use crate::model::config::ModelConfig;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("memory size '{0}': give a number with a unit, e.g. 32GB (1e9 bytes) or 30GiB (2^30 bytes)")]
    NoUnit(String),
    #[error("memory size '{0}': unknown unit '{1}' (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")]
    Unit(String, String),
    #[error("memory size '{0}': '{1}' is not a positive number")]
    Number(String, String),
    #[error("memory size '{0}' is smaller than the {ctx} MiB a CUDA context takes", ctx = CONTEXT_ASSUMED >> 20)]
    TooSmall(String),
}

/// `--max-gpu-memory`: bytes one process may hold on a GPU, its CUDA context included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryCap {
    pub bytes: u64,
}

impl std::str::FromStr for MemoryCap {
    type Err = SizeError;
    fn from_str(s: &str) -> Result<Self, SizeError> {
        let bytes = parse_size(s)?;
        if bytes <= CONTEXT_ASSUMED {
            return Err(SizeError::TooSmall(s.to_string()));
        }
        Ok(MemoryCap { bytes })
    }
}

impl std::fmt::Display for MemoryCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.2} GB", self.bytes as f64 / 1e9)
    }
}

/// Bytes of a size with a unit (`32GB`, `30GiB`, `512 MiB`, `31.5G`).
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = (t[..split].trim(), t[split..].trim());
    if unit.is_empty() {
        return Err(SizeError::NoUnit(s.to_string()));
    }
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        _ => return Err(SizeError::Unit(s.to_string(), unit.to_string())),
    };
    match num.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok((v * scale).round() as u64),
        _ => Err(SizeError::Number(s.to_string(), num.to_string())),
    }
}

/// The bytes a memory plan is checked against on a device with `free` bytes free after its
/// context: `free`, or less under a cap (the cap less the context, which `free` does not count).
pub fn available(cap: Option<MemoryCap>, free: u64) -> u64 {
    cap.map_or(free, |c| free.min(c.bytes.saturating_sub(CONTEXT_ASSUMED)))
}

/// A device's name for the plan's messages, with the cap when there is one.
pub fn label(device: &str, cap: Option<MemoryCap>) -> String {
    match cap {
        Some(c) => format!("{device} within --max-gpu-memory {c}"),
        None => device.to_string(),
    }
}

/// The most KV blocks (at most `want`) whose plan fits in `avail` bytes, for a model whose
/// matrices take `matrices` bytes (`wide`: the widening scratch), `seqs` sequences, steps of
/// `step` tokens and the KV cache in type `kv`, with RoPE tables and attention partials for
/// sequences as long as the pool (as the commands' `cuda_options` place a model); 0 when not
/// even one block fits.
pub fn fit_blocks(
    cfg: &ModelConfig,
    (matrices, wide): (u64, u64),
    avail: u64,
    (block_size, want): (usize, usize),
    step: usize,
    seqs: SeqPlan,
    kv: KvType,
) -> usize {
    let plan = |blocks: usize| -> MemoryPlan {
        plan_memory(cfg, matrices, wide, blocks, block_size, step, seqs).with_kv_type(cfg, kv)
    };
    let fits = |blocks: usize| plan(blocks).check(avail, "", blocks * block_size, cfg).is_ok();
    // The plan grows with the blocks: the largest count that fits, by bisection.
    let (mut lo, mut hi) = (0, want);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_decimal_and_binary_units() {
        assert_eq!(parse_size("32GB").unwrap(), 32_000_000_000);
        assert_eq!(parse_size("30GiB").unwrap(), 30 << 30);
        assert_eq!(parse_size(" 512 MiB ").unwrap(), 512 << 20);
        assert_eq!(parse_size("31.5g").unwrap(), 31_500_000_000);
        assert_eq!(parse_size("1tb").unwrap(), 1_000_000_000_000);
        assert!(matches!(parse_size("32"), Err(SizeError::NoUnit(_))));
        assert!(matches!(parse_size("32 parsecs"), Err(SizeError::Unit(_, u)) if u == "parsecs"));
        assert!(matches!(parse_size("GB"), Err(SizeError::Number(..))));
        assert!(matches!(parse_size("1.2.3GB"), Err(SizeError::Number(..))));
        let e = "100MB".parse::<MemoryCap>().unwrap_err().to_string();
        assert!(e.contains("100MB") && e.contains("CUDA context"), "{e}");
    }

    #[test]
    fn the_cap_less_the_context_bounds_the_free_memory() {
        let cap: MemoryCap = "32GB".parse().unwrap();
        assert_eq!(available(Some(cap), 140_000_000_000), 32_000_000_000 - CONTEXT_ASSUMED);
        assert_eq!(available(Some(cap), 10_000_000_000), 10_000_000_000, "a fuller card gives less");
        assert_eq!(available(None, 10_000_000_000), 10_000_000_000);
        assert_eq!(label("cuda:0 X", Some(cap)), "cuda:0 X within --max-gpu-memory 32.00 GB");
    }

    /// Issue 29: Qwen3-30B-A3B in llama.cpp's Q4_K_M mix (18.55 GB) on a card with 140 GB
    /// free, within `--max-gpu-memory 32GB`: 95% of 32e9 less the 512 MiB context is 29.89 GB;
    /// after the weights (18.6 GB), their widening scratch and the workspace about 10 GB hold
    /// KV at 98,304 bytes a position (48 layers x K and V x 512 x 2 bytes): 45 sequences of
    /// 2,000 + 200 tokens (2,216 positions with the block of slack `run` adds). The same job on
    /// the whole card runs the cap of `--slots auto`; the 8-bit cache holds 1.8x the sequences.
    #[test]
    fn qwen3_30b_a3b_q4_k_m_within_32_gb_runs_45_sequences_of_2200() {
        use crate::backend::cuda::memory::{f16_matrix_bytes, plan_memory_for, wide_len, DeviceWeightBytes};
        use crate::backend::cuda::synth::{synthetic_matrix_bytes, WeightMix};
        use crate::commands::common::{fit_slots, MAX_AUTO_SLOTS};
        let c = crate::model::shapes::shape("qwen3-30b-a3b").unwrap();
        let bytes = DeviceWeightBytes {
            matrices: synthetic_matrix_bytes(&c, WeightMix::Q4KM),
            wide_scratch: wide_len(&c) as u64 * 2,
        };
        let (h200_free, per_seq, step) = (140_000_000_000u64, 2216, 512);
        let cap: MemoryCap = "32GB".parse().unwrap();
        let avail = available(Some(cap), h200_free);
        assert_eq!(avail, 31_463_129_088);
        let n = fit_slots(&c, bytes, avail, (per_seq, step), KvType::F16);
        let kv_per_seq = per_seq as u64 * 48 * 2 * 512 * 2;
        let budget = (avail as f64 * super::super::memory::HEADROOM) as u64;
        let rough = (budget - bytes.matrices - bytes.wide_scratch) / kv_per_seq;
        assert!((43..=47).contains(&n) && n as u64 <= rough, "{n} sequences (weights and KV alone: {rough})");
        // The boundary: n sequences' plan passes the backend's check, n + 1 do not.
        let plan = |n: usize| {
            let blocks = (n * per_seq).div_ceil(16);
            plan_memory_for(
                &c,
                bytes.matrices,
                bytes.wide_scratch,
                blocks,
                16,
                step.max(n),
                n * per_seq,
                SeqPlan::new(n),
            )
        };
        assert!(plan(n).check(avail, "x", n * per_seq, &c).is_ok());
        assert!(plan(n + 1).check(avail, "x", (n + 1) * per_seq, &c).is_err());
        // 30 GiB is 32.2e9 bytes, 0.2 GB more: one sequence more; the whole card: the cap of
        // --slots auto.
        let gib =
            fit_slots(&c, bytes, available(Some("30GiB".parse().unwrap()), h200_free), (per_seq, step), KvType::F16);
        assert_eq!(gib, n + 1, "30 GiB vs 32 GB");
        assert_eq!(fit_slots(&c, bytes, available(None, h200_free), (per_seq, step), KvType::F16), MAX_AUTO_SLOTS);
        // The 8-bit cache (34 bytes per 32 values against 64): 1.88x the positions per byte, so
        // the cap of --slots auto; past the cap, the KV pool of 64 slots within 32 GB holds 74
        // sequences' positions, 1.64x: the commands size the RoPE tables and the attention
        // partials by the pool's positions (`cuda_options`: a sequence may take the whole pool),
        // so the larger pool takes 1.2 GB more workspace.
        assert_eq!(fit_slots(&c, bytes, avail, (per_seq, step), KvType::Q8), MAX_AUTO_SLOTS);
        let q8_blocks = fit_blocks(
            &c,
            (bytes.matrices, bytes.wide_scratch),
            avail,
            (16, (128 * per_seq).div_ceil(16)),
            step.max(64),
            SeqPlan::new(64),
            KvType::Q8,
        );
        let q8_seqs = q8_blocks * 16 / per_seq;
        assert!(q8_seqs * 100 >= n * 160, "8-bit: {q8_seqs} sequences, F16: {n}");
        // The KV pool for 64 slots within the cap: what fits, about n sequences' worth.
        let blocks = fit_blocks(
            &c,
            (bytes.matrices, bytes.wide_scratch),
            avail,
            (16, (64 * per_seq).div_ceil(16)),
            step.max(64),
            SeqPlan::new(64),
            KvType::F16,
        );
        let seqs = blocks * 16 / per_seq;
        assert!((n - 2..=n).contains(&seqs), "{blocks} blocks hold {seqs} sequences of {per_seq} (slots: {n})");
        // F16 weights (61 GB) do not fit: refused with the numbers and the cap named.
        let f16 = f16_matrix_bytes(&c);
        let e = plan_memory_for(&c, f16, 0, 1024, 16, step, 16_384, SeqPlan::new(1))
            .check(avail, &label("cuda:0 NVIDIA H200", Some(cap)), 16_384, &c)
            .unwrap_err();
        for part in ["within --max-gpu-memory 32.00 GB", "weights 61.", "free 31.46 GB", "4-bit weights", "f16)"] {
            assert!(e.contains(part), "{part} missing from: {e}");
        }
    }
}
