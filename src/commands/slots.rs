//! How many sequences a job runs at once and in which KV cache type: `--slots` and `--kv-cache`
//! (`auto`: what the memory plan fits within `--max-gpu-memory`), and the KV positions placed.

use anyhow::{Context, Result};

use super::device_choice::Device;
use super::placement::{MemoryFlags, Placement};
use crate::backend::cuda::plan::budget::{self, MemoryCap};
use crate::backend::kv_type::{KvChoice, KvType};
use crate::engine::batch::BLOCK_SIZE;
use crate::job::exit::UsageError;

/// `--slots`: a count, or `auto` (as many as the device's memory fits, see [`resolve_slots`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slots {
    Auto,
    Count(usize),
}

impl std::str::FromStr for Slots {
    type Err = UsageError;
    fn from_str(s: &str) -> Result<Self, UsageError> {
        match s.trim() {
            "auto" => Ok(Slots::Auto),
            t => match t.parse::<usize>() {
                Ok(0) => Err(UsageError::new("--slots 0: at least one sequence must run (a count >= 1, or auto)")),
                Ok(n) => Ok(Slots::Count(n)),
                Err(_) => Err(UsageError::new(format!("--slots '{s}': give a count >= 1 or auto"))),
            },
        }
    }
}

/// `--slots auto` never goes past this many sequences: batched decode still gains from 64 to 128
/// (H200, Q4_K_M: Qwen3-30B-A3B 3,326 -> 4,545 tok/s, Qwen3-8B 4,312 -> 5,623; docs/BENCHMARKS.md),
/// and an 8-bit KV cache within a 32 GB card holds ~1.9x the sequences F16 does (~95 against
/// ~50 of 2,200 positions for Qwen3-30B-A3B), which a cap of 64 would cut off.
pub const MAX_AUTO_SLOTS: usize = 128;

/// `--slots auto` on the CPU: KV memory is host memory and throughput stops growing past a few
/// sequences per core pair.
pub const CPU_AUTO_SLOTS: usize = 8;

/// The bytes a memory plan may take on `dev` (its free memory, within the cap) and the
/// device's name for the log, with the cap when there is one.
fn device_budget(dev: &crate::backend::cuda::CudaDevice, cap: Option<MemoryCap>) -> Result<(u64, String)> {
    let (free, _) = dev.mem_info()?;
    Ok((budget::available(cap, free as u64), budget::label(&dev.describe(), cap)))
}

/// The slot count and KV cache type to run with. Slots: a given count as is (a count that does
/// not fit is refused with numbers when the model is placed), `auto` on a GPU the most
/// sequences of `per_seq` cached positions each whose memory plan fits the device's free memory
/// (within `--max-gpu-memory`; at most [`MAX_AUTO_SLOTS`]), on the CPU [`CPU_AUTO_SLOTS`] or
/// fewer where the host memory holds fewer (`host_plan`). KV
/// type: a given one as is (refused for head sizes it cannot take), `auto` on a GPU as
/// [`auto_kv`] says; on the CPU F16. What was chosen is said in the log.
pub fn resolve_slots(
    slots: Slots,
    device: &Device,
    (cfg, weights): (&crate::model::config::ModelConfig, &crate::model::weights::ModelWeights),
    (per_seq, max_batch_tokens): (usize, usize),
    flags: MemoryFlags,
) -> Result<(usize, KvType)> {
    if let KvChoice::Fixed(t) = flags.kv_cache {
        if let Some(why) = t.refusal(cfg.head_dim) {
            return Err(UsageError::new(why).into());
        }
    }
    let q8_ok = KvType::Q8.refusal(cfg.head_dim).is_none();
    let Device::Cuda(ordinal) = device else {
        let kv = match flags.kv_cache {
            KvChoice::Fixed(t) => t,
            KvChoice::Auto => KvType::F16,
        };
        let n = match slots {
            Slots::Count(n) => n,
            Slots::Auto => {
                let avail = crate::sys::host_memory::available();
                let fit = avail.map_or(CPU_AUTO_SLOTS, |a| super::host_plan::fit_seqs(cfg, per_seq, &a));
                if fit < CPU_AUTO_SLOTS {
                    eprintln!(
                        "slots: {fit} (--slots auto on the CPU: {CPU_AUTO_SLOTS} sequences of {per_seq} cached positions do not fit the host memory available)"
                    );
                    fit
                } else {
                    eprintln!("slots: {CPU_AUTO_SLOTS} (--slots auto on the CPU)");
                    CPU_AUTO_SLOTS
                }
            }
        };
        return Ok((n, kv));
    };
    if let (Slots::Count(n), KvChoice::Fixed(t)) = (slots, flags.kv_cache) {
        return Ok((n, t));
    }
    let dev = crate::backend::cuda::device::CudaDevice::new(*ordinal)
        .with_context(|| format!("opening cuda:{ordinal} to size --slots auto and --kv-cache auto"))?;
    let (avail, name) = device_budget(&dev, flags.max_gpu_memory)?;
    let bytes = crate::backend::cuda::plan::memory::device_weight_bytes(cfg, weights, false);
    let fit = |kv: KvType| fit_slots(cfg, bytes, avail, (per_seq, max_batch_tokens), kv);
    let kv = match flags.kv_cache {
        KvChoice::Fixed(t) => t,
        KvChoice::Auto if !q8_ok => KvType::F16,
        KvChoice::Auto => {
            let (f16, q8) = (fit(KvType::F16), fit(KvType::Q8));
            // Measured on full-attention MoE models only; a hybrid's few attention layers (head
            // size 256: the one-pass decode kernel, which converts 8-bit values as it loads them)
            // keep the dense rule until measured.
            let moe = cfg.moe.is_some() && cfg.hybrid.is_none();
            let (kv, want) = auto_kv(f16, q8, slots, moe);
            let why = if moe && matches!(slots, Slots::Auto) {
                ": a mixture-of-experts model takes 8-bit whenever it fits more"
            } else {
                ""
            };
            eprintln!(
                "KV cache: {kv} (--kv-cache auto: {f16} sequences of {per_seq} positions fit in F16, {q8} in 8-bit; F16 wanted for {want}{why})"
            );
            kv
        }
    };
    let n = match slots {
        Slots::Count(n) => n,
        Slots::Auto => {
            let n = fit(kv);
            eprintln!(
                "slots: {} (--slots auto: the memory plan for {per_seq} cached positions per sequence, KV cache {kv}, fits {n} in {:.2} GB of {name}, cap {MAX_AUTO_SLOTS})",
                n.max(1),
                avail as f64 / 1e9,
            );
            n
        }
    };
    // Not even one fits: run one and let the memory check refuse it with the numbers.
    Ok((n.max(1), kv))
}

/// Sequences an F16 cache that fits them is kept for under `--kv-cache auto --slots auto` on a
/// dense model, even where the 8-bit cache would fit more: there a step batches enough
/// sequences that the 8-bit cache's extra ones bring no measurable gain, and F16 is exact.
/// Measured (H100, docs/BENCHMARKS.md): decode alone at the same count the 8-bit cache gives
/// 0.96-1.02x of F16 (Qwen3-8B, 0.96x at 64 sequences), and doubling 32 -> 64 sequences gave
/// 1.43x (H200). Full-attention mixture-of-experts models take the 8-bit cache whenever it
/// fits more (see [`auto_kv`]).
pub const AUTO_F16_ENOUGH: usize = 32;

/// The cache `--kv-cache auto` takes on a GPU where F16 fits `f16` sequences of the job and
/// 8-bit `q8`, and the count F16 had to fit for it: a given `--slots N`: N; `--slots auto` on
/// a dense model: as many as 8-bit, or [`AUTO_F16_ENOUGH`] when 8-bit fits more; on a
/// mixture-of-experts model with full attention in every layer (`moe`): as many as 8-bit. Else
/// the 8-bit cache.
///
/// Why MoE models differ: each batched decode step reads nearly every expert (a trained
/// model's routing spreads a step's tokens), so the weights a step reads are shared by as many
/// sequences as the step holds, and the 8-bit cache's extra sequences pay. Measured (lent H100,
/// compute_70 PTX, one lease, docs/BENCHMARKS.md "Nightly job benchmark"): the nightly job on
/// Qwen3-30B-A3B Q4_K_M within 32 GB ran 600 documents in 82.5 s with 115 8-bit slots against
/// 91.0 s with 61 F16 ones (1.10x), and its V100 bound is 76.6 against 103.7 s.
pub fn auto_kv(f16: usize, q8: usize, slots: Slots, moe: bool) -> (KvType, usize) {
    let want = match slots {
        Slots::Count(n) => n,
        Slots::Auto if moe => q8,
        Slots::Auto => q8.min(AUTO_F16_ENOUGH),
    };
    (if f16 >= want { KvType::F16 } else { KvType::Q8 }, want)
}

/// The most sequences (up to [`MAX_AUTO_SLOTS`]) of `per_seq` positions whose CUDA memory plan
/// (with workspace for steps of `max_batch_tokens`, raised to the slot count as the engine
/// does; the KV cache in type `kv`) fits in `free` bytes; 0 when not even one does.
pub fn fit_slots(
    cfg: &crate::model::config::ModelConfig,
    bytes: crate::backend::cuda::plan::memory::DeviceWeightBytes,
    free: u64,
    (per_seq, max_batch_tokens): (usize, usize),
    kv: KvType,
) -> usize {
    let fits = |n: usize| {
        let blocks = (n * per_seq).div_ceil(BLOCK_SIZE).max(1);
        let plan = crate::backend::cuda::plan::memory::plan_memory_for(
            cfg,
            bytes.matrices,
            bytes.wide_scratch,
            blocks,
            BLOCK_SIZE,
            max_batch_tokens.max(n),
            per_seq,
            crate::backend::cuda::plan::memory::SeqPlan::new(n),
        )
        .with_kv_type(cfg, kv);
        plan.check(free, "", blocks * BLOCK_SIZE, cfg).is_ok()
    };
    // The plan grows with n: the largest n that fits, by bisection.
    budget::largest_fitting(MAX_AUTO_SLOTS, fits)
}

/// KV positions to place for `slots` sequences of `per_seq` positions: all of them, except on a
/// GPU under `--max-gpu-memory` where the pool is the most blocks the plan fits within the cap
/// (the engine then admits and preempts sequences as blocks allow, said in the log). When not
/// even one sequence's blocks fit, all of them are asked for, so that placing the model
/// refuses with the numbers.
pub fn kv_positions(
    device: &Device,
    (cfg, weights): (&crate::model::config::ModelConfig, &crate::model::weights::ModelWeights),
    (slots, per_seq): (usize, usize),
    max_batch_tokens: usize,
    place: &Placement,
) -> Result<usize> {
    let (want, cap) = (slots * per_seq, place.max_gpu_memory);
    let (Device::Cuda(ordinal), Some(_)) = (device, cap) else {
        return Ok(want);
    };
    let dev = crate::backend::cuda::device::CudaDevice::new(*ordinal)
        .with_context(|| format!("opening cuda:{ordinal} to size the KV cache"))?;
    let (avail, name) = device_budget(&dev, cap)?;
    let bytes = crate::backend::cuda::plan::memory::device_weight_bytes(cfg, weights, false);
    let step =
        max_batch_tokens.max(slots).max(crate::backend::cuda::plan::memory::prefill_chunk(cfg, bytes.wide_scratch));
    let seqs = crate::backend::cuda::plan::memory::SeqPlan::new(slots);
    let want_blocks = want.div_ceil(BLOCK_SIZE).max(1);
    let blocks = budget::fit_blocks(
        cfg,
        (bytes.matrices, bytes.wide_scratch),
        avail,
        (BLOCK_SIZE, want_blocks),
        (step, place.max_seq_positions),
        seqs,
        place.kv_type,
    );
    if blocks >= want_blocks || blocks * BLOCK_SIZE < per_seq {
        return Ok(want);
    }
    eprintln!(
        "KV cache: {blocks} blocks ({} positions, {}) fit in {:.2} GB of {name}, not the {want} of {slots} x {per_seq}: sequences beyond them wait or are preempted",
        blocks * BLOCK_SIZE,
        place.kv_type,
        avail as f64 / 1e9
    );
    Ok(blocks * BLOCK_SIZE)
}

#[cfg(test)]
mod tests {
    #[test]
    fn auto_kv_keeps_f16_once_a_dense_model_batches_enough_sequences() {
        use crate::backend::kv_type::KvType::{F16, Q8};
        // A dense model with 61 F16 slots against 115 8-bit ones: F16.
        assert_eq!(super::auto_kv(61, 115, Slots::Auto, false), (F16, 32));
        // Few F16 sequences: the 8-bit cache's extra ones win.
        assert_eq!(super::auto_kv(20, 38, Slots::Auto, false), (Q8, 32));
        assert_eq!(super::auto_kv(0, 3, Slots::Auto, false), (Q8, 3));
        // 8-bit fits no more than F16: F16.
        assert_eq!(super::auto_kv(10, 10, Slots::Auto, false), (F16, 10));
        // A given count: F16 when it fits them all, whatever 8-bit would fit.
        assert_eq!(super::auto_kv(61, 115, Slots::Count(64), false), (Q8, 64));
        assert_eq!(super::auto_kv(61, 115, Slots::Count(61), false), (F16, 61));
    }

    #[test]
    fn auto_kv_takes_the_8_bit_cache_on_a_moe_model_whenever_it_fits_more() {
        use crate::backend::kv_type::KvType::{F16, Q8};
        // The nightly job on Qwen3-30B-A3B within 32 GB: 115 8-bit slots ran 1.10x 61 F16 ones.
        assert_eq!(super::auto_kv(61, 115, Slots::Auto, true), (Q8, 115));
        // F16 fits as many (the cap, or a short job): F16, exact.
        assert_eq!(super::auto_kv(256, 256, Slots::Auto, true), (F16, 256));
        // A given count decides as for a dense model.
        assert_eq!(super::auto_kv(61, 115, Slots::Count(61), true), (F16, 61));
        assert_eq!(super::auto_kv(61, 115, Slots::Count(64), true), (Q8, 64));
    }

    /// Issue 29: Qwen3-30B-A3B in llama.cpp's Q4_K_M mix (18.55 GB) on a card with 140 GB
    /// free, within `--max-gpu-memory 32GB`: 95% of 32e9 less the 512 MiB context is 29.89 GB;
    /// after the weights (18.6 GB), their widening scratch and the workspace about 10 GB hold
    /// KV at 98,304 bytes a position (48 layers x K and V x 512 x 2 bytes): 50 sequences of
    /// 2,000 + 200 tokens (2,216 positions with the block of slack `run` adds). The same job on
    /// the whole card runs the cap of `--slots auto`; the 8-bit cache holds 1.8x the sequences.
    #[test]
    fn qwen3_30b_a3b_q4_k_m_within_32_gb_runs_50_sequences_of_2200() {
        use crate::backend::cuda::plan::budget::{available, fit_blocks, label, MemoryCap};
        use crate::backend::cuda::plan::memory::SeqPlan;
        use crate::backend::cuda::plan::memory::{f16_matrix_bytes, plan_memory_for, wide_len, DeviceWeightBytes};
        use crate::backend::cuda::synth::mix::{synthetic_matrix_bytes, WeightMix};
        use crate::backend::kv_type::KvType;
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
        let budget = (avail as f64 * crate::backend::cuda::plan::memory::HEADROOM) as u64;
        let rough = (budget - bytes.matrices - bytes.wide_scratch) / kv_per_seq;
        assert!((48..=51).contains(&n) && n as u64 <= rough, "{n} sequences (weights and KV alone: {rough})");
        // The boundary: n sequences' plan passes the backend's check, n + 1 do not.
        let plan = |n: usize| {
            let blocks = (n * per_seq).div_ceil(16);
            plan_memory_for(&c, bytes.matrices, bytes.wide_scratch, blocks, 16, step.max(n), per_seq, SeqPlan::new(n))
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
        // --slots auto fits at least 1.8x the sequences of F16 (below the cap); and the KV pool
        // of 128 slots within 32 GB holds as many (the RoPE tables and attention partials are
        // sized by the longest sequence, `Placement::max_seq_positions`, not by the pool).
        let q8_auto = fit_slots(&c, bytes, avail, (per_seq, step), KvType::Q8);
        assert!(q8_auto * 100 >= n * 180 && q8_auto < MAX_AUTO_SLOTS, "8-bit: {q8_auto} sequences, F16: {n}");
        let q8_blocks = fit_blocks(
            &c,
            (bytes.matrices, bytes.wide_scratch),
            avail,
            (16, (128 * per_seq).div_ceil(16)),
            (step.max(64), Some(per_seq)),
            SeqPlan::new(64),
            KvType::Q8,
        );
        let q8_seqs = q8_blocks * 16 / per_seq;
        assert!(q8_seqs * 100 >= n * 180, "8-bit: {q8_seqs} sequences, F16: {n}");
        // The KV pool for 64 slots within the cap: what fits, about n sequences' worth.
        let blocks = fit_blocks(
            &c,
            (bytes.matrices, bytes.wide_scratch),
            avail,
            (16, (64 * per_seq).div_ceil(16)),
            (step.max(64), Some(per_seq)),
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

    use super::*;
    use crate::engine::batch::DEFAULT_MAX_BATCH_TOKENS;

    #[test]
    fn slots_parse_counts_and_auto_and_refuse_zero() {
        assert_eq!("auto".parse::<Slots>().unwrap(), Slots::Auto);
        assert_eq!("12".parse::<Slots>().unwrap(), Slots::Count(12));
        assert!("0".parse::<Slots>().unwrap_err().0.contains("--slots 0"));
        assert!("many".parse::<Slots>().is_err());
    }

    #[test]
    fn auto_slots_are_the_most_the_memory_plan_fits() {
        let c = crate::model::shapes::shape("qwen3-8b").unwrap();
        let f16 = crate::backend::cuda::plan::memory::DeviceWeightBytes {
            matrices: crate::backend::cuda::plan::memory::f16_matrix_bytes(&c),
            wide_scratch: 0,
        };
        let plan = |n: usize| {
            let blocks = (n * 4096).div_ceil(BLOCK_SIZE);
            crate::backend::cuda::plan::memory::plan_memory_for(
                &c,
                f16.matrices,
                f16.wide_scratch,
                blocks,
                BLOCK_SIZE,
                DEFAULT_MAX_BATCH_TOKENS.max(n),
                4096,
                crate::backend::cuda::plan::memory::SeqPlan::new(n),
            )
        };
        // A 32 GB V100 (30 GB free): 16 GB of F16 weights, then 4096-position sequences.
        let free = 30_000_000_000u64;
        let n = fit_slots(&c, f16, free, (4096, DEFAULT_MAX_BATCH_TOKENS), KvType::F16);
        assert!((1..MAX_AUTO_SLOTS).contains(&n), "{n}");
        assert!(plan(n).check(free, "", n * 4096, &c).is_ok());
        assert!(plan(n + 1).check(free, "", (n + 1) * 4096, &c).is_err(), "one more does not fit");
        // The cap, and nothing at all on a device smaller than the weights.
        assert_eq!(
            fit_slots(&c, f16, 1_000_000_000_000, (4096, DEFAULT_MAX_BATCH_TOKENS), KvType::F16),
            MAX_AUTO_SLOTS
        );
        assert_eq!(fit_slots(&c, f16, 8_000_000_000, (4096, DEFAULT_MAX_BATCH_TOKENS), KvType::F16), 0);
    }
}
