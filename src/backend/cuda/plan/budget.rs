//! `--max-gpu-memory SIZE`: the most device memory one process may take on a GPU (a card shared
//! with other services, or a V100's 32 GB emulated on a larger test card). The memory plan is
//! checked against the smaller of the driver's free memory and this cap less the CUDA context
//! ([`CONTEXT_ASSUMED`], which the free memory is read after), so weights + KV cache + recurrent
//! states + workspace + the plan's headroom stay within it; `--slots auto` and the KV pool are
//! sized from the same figure.
//!
//! Sizes: `32GB` = 32e9 bytes, `30GiB` = 30 x 2^30 bytes; K/M/G/T with or without `B`, the
//! binary forms with `iB`; decimals allowed (`31.5GB`). A bare number is refused (bytes or GB?).

use super::memory::{plan_memory_for, MemoryPlan, SeqPlan, CONTEXT_ASSUMED};
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
/// sequences of `longest` positions (`None`: as long as the pool; as the commands'
/// `cuda_options` place a model); 0 when not even one block fits.
pub fn fit_blocks(
    cfg: &ModelConfig,
    (matrices, wide): (u64, u64),
    avail: u64,
    (block_size, want): (usize, usize),
    (step, longest): (usize, Option<usize>),
    seqs: SeqPlan,
    kv: KvType,
) -> usize {
    let plan = |blocks: usize| -> MemoryPlan {
        let pool = blocks * block_size;
        let longest = longest.map_or(pool, |p| p.clamp(1, pool));
        plan_memory_for(cfg, matrices, wide, blocks, block_size, step, longest, seqs).with_kv_type(cfg, kv)
    };
    largest_fitting(want, |blocks| plan(blocks).check(avail, "", blocks * block_size, cfg).is_ok())
}

/// The largest `n` in `0..=most` with `fits(n)`, for a `fits` that holds up to some `n` and
/// not above it (memory plans grow with what they hold); 0 when not even 1 fits.
pub fn largest_fitting(most: usize, fits: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, most);
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
}
