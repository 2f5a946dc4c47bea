//! A model placed on its device as a backend (CPU or one GPU, kernels loaded and timed in the
//! log), real weights or random ones of a named shape.

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::device_choice::Device;
use super::placement::Placement;
use super::slots::MAX_AUTO_SLOTS;
use crate::backend::cpu::CpuBackend;
use crate::backend::Backend;
use crate::engine::batch::{BLOCK_SIZE, DEFAULT_MAX_BATCH_TOKENS};

/// Places a model on `device` with room for `tokens` cached positions over `seqs` sequences; on
/// a GPU the memory plan reserves workspace for steps of `max_batch_tokens` (the engine's
/// `--max-batch-tokens`) and is checked within `place.max_gpu_memory`, on the CPU within the
/// host memory still available (`host_plan`).
pub fn make_backend(
    cfg: &crate::model::config::ModelConfig,
    w: &crate::model::weights::ModelWeights,
    device: &Device,
    tokens: usize,
    (max_batch_tokens, seqs): (usize, usize),
    place: &Placement,
) -> Result<Box<dyn Backend>> {
    let blocks = tokens.div_ceil(BLOCK_SIZE).max(1);
    let b: Box<dyn Backend> = match *device {
        Device::Cpu => {
            if let Some(avail) = crate::sys::host_memory::available() {
                super::host_plan::check(cfg, blocks * BLOCK_SIZE, seqs, &avail)?;
            }
            Box::new(CpuBackend::new(cfg.clone(), w.clone(), blocks, BLOCK_SIZE).with_kv_type(place.kv_type)?)
        }
        Device::Cuda(ordinal) => Box::new(place_cuda(cfg, w, ordinal, blocks, (max_batch_tokens, seqs), place)?),
    };
    Ok(crate::backend::fault::FaultInjector::wrap_from_env(b)?)
}

/// The model on GPU `ordinal` with `blocks` KV blocks, its kernels loaded (timed in the log);
/// the memory plan reserves workspace for steps of `max_batch_tokens` tokens over `seqs`
/// sequences and is checked within `place.max_gpu_memory`. [`make_backend`]'s GPU half, for
/// commands that need the concrete backend (`eval` sets its head tap).
pub fn place_cuda(
    cfg: &crate::model::config::ModelConfig,
    w: &crate::model::weights::ModelWeights,
    ordinal: usize,
    blocks: usize,
    (max_batch_tokens, seqs): (usize, usize),
    place: &Placement,
) -> Result<crate::backend::cuda::model::CudaBackend> {
    let n = crate::backend::cuda::device::device_count();
    if ordinal >= n {
        bail!("device cuda:{ordinal} requested, but {n} CUDA device(s) are usable here; use --device cpu");
    }
    let opts = cuda_options(ordinal, blocks, (max_batch_tokens, seqs), place);
    let t = std::time::Instant::now();
    let mut b = crate::backend::cuda::model::CudaBackend::new(cfg.clone(), w, &opts)
        .with_context(|| format!("placing the model on cuda:{ordinal}"))?;
    let placed = t.elapsed().as_secs_f64();
    // Kernels now, not inside the first step: a first start from compute_70 PTX on a
    // new GPU (or driver) spends 20-30 s in the driver's JIT (the entries of the model's
    // formats and head size: docs/BENCHMARKS.md T7), which the operator should see named
    // rather than as a stalled job.
    let t = std::time::Instant::now();
    b.load_kernels().with_context(|| format!("loading the CUDA kernels on cuda:{ordinal}"))?;
    let kernels = t.elapsed().as_secs_f64();
    let jit =
        if kernels > 10.0 { " (compiled for this GPU once; the driver caches them for the next start)" } else { "" };
    eprintln!("cuda:{ordinal}: weights placed in {placed:.1} s, kernels ready in {kernels:.1} s{jit}");
    Ok(b)
}

/// `seqs`: the sequences that run at once (the recurrent-state pool of hybrid models).
pub(crate) fn cuda_options(
    ordinal: usize,
    blocks: usize,
    (max_batch_tokens, seqs): (usize, usize),
    place: &Placement,
) -> crate::backend::cuda::CudaOptions {
    let plan = crate::backend::cuda::plan::memory::SeqPlan::new(seqs);
    crate::backend::cuda::CudaOptions {
        max_seqs: plan.running,
        max_snapshots: plan.snapshots,
        ordinal,
        max_batch_tokens,
        num_blocks: blocks,
        block_size: BLOCK_SIZE,
        ptx_dir: place.ptx_dir.clone(),
        // RoPE tables cover the longest sequence (at most every position the pool holds).
        max_positions: place.max_seq_positions.map_or(blocks * BLOCK_SIZE, |p| p.clamp(1, blocks * BLOCK_SIZE)),
        f16_weights: place.f16_weights,
        max_memory: place.max_gpu_memory,
        kv_type: place.kv_type,
        cublas: crate::backend::cuda::model::cublas_wanted(),
    }
}

/// A random-weight model of a named shape on `device`, weights of type `dtype` (`f16`, `q8_0`,
/// ..., or on a GPU also `q4_k_m`, llama.cpp's mix). On a GPU the weights are generated there,
/// so an 8B shape takes seconds, not a 16 GB host buffer. The memory plan reserves workspace
/// for the engine's default step ([`DEFAULT_MAX_BATCH_TOKENS`]) and up to [`MAX_AUTO_SLOTS`]
/// sequences at once; see [`make_synthetic_backend_for`].
pub fn make_synthetic_backend(
    shape: &str,
    dtype: &str,
    device: &Device,
    tokens: usize,
    ptx_dir: Option<&Path>,
) -> Result<Box<dyn Backend>> {
    let place = Placement::with_ptx_dir(ptx_dir);
    make_synthetic_backend_for((shape, None), dtype, device, tokens, (DEFAULT_MAX_BATCH_TOKENS, MAX_AUTO_SLOTS), &place)
}

/// The config of a named shape, cut to its first `layers` when given (`bench --layers`); an
/// unknown name or a layer count outside 1..=the shape's is the command's to change (exit 2).
pub fn synthetic_config(shape: &str, layers: Option<usize>) -> Result<crate::model::config::ModelConfig> {
    let mut cfg = crate::model::shapes::shape(shape).ok_or_else(|| {
        crate::job::exit::UsageError::new(format!(
            "unknown shape '{shape}'; known: {}",
            crate::model::shapes::SHAPES.join(", ")
        ))
    })?;
    // As `synth --layers`: between 1 and the shape's own count (a larger one would be cut
    // silently and the report's name would claim layers the model lacks).
    if let Some(n) = layers {
        if n == 0 || n > cfg.n_layers {
            return Err(crate::job::exit::UsageError::new(format!(
                "--layers {n}: {shape} has {} layers; give 1 to {}",
                cfg.n_layers, cfg.n_layers
            ))
            .into());
        }
        cfg.keep_first_layers(n);
    }
    Ok(cfg)
}

/// As [`make_synthetic_backend`] (the shape cut to its first `layers` when given), planned for
/// steps of `max_batch_tokens` tokens and `seqs` sequences at once (`place.f16_weights` is not
/// read: `dtype` names the weights).
pub fn make_synthetic_backend_for(
    (shape, layers): (&str, Option<usize>),
    dtype: &str,
    device: &Device,
    tokens: usize,
    (max_batch_tokens, seqs): (usize, usize),
    place: &Placement,
) -> Result<Box<dyn Backend>> {
    let cfg = synthetic_config(shape, layers)?;
    match *device {
        Device::Cpu => {
            if cfg.hybrid.is_some() {
                return Err(crate::job::exit::UsageError::new(format!(
                    "--synthetic {shape}: random hybrid (linear-attention) weights are made on the GPU only; use --device cuda"
                ))
                .into());
            }
            let w = crate::model::synth::random_weights(&cfg, parse_dtype(dtype)?, 1);
            make_backend(
                &cfg,
                &w,
                device,
                tokens,
                (max_batch_tokens, seqs),
                &Placement { f16_weights: false, ..place.clone() },
            )
        }
        Device::Cuda(ordinal) => {
            use crate::backend::cuda::WeightMix;
            let mix = WeightMix::parse(dtype).ok_or_else(|| {
                crate::job::exit::UsageError::new(format!(
                    "--dtype {dtype}: synthetic GPU weights are f16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k or q4_k_m"
                ))
            })?;
            let place = Placement { f16_weights: false, ..place.clone() };
            let opts = cuda_options(ordinal, tokens.div_ceil(BLOCK_SIZE).max(1), (max_batch_tokens, seqs), &place);
            let b = crate::backend::cuda::model::CudaBackend::synthetic_mix(cfg, mix, 1, &opts)
                .with_context(|| format!("making a synthetic {shape} on cuda:{ordinal}"))?;
            Ok(Box::new(b))
        }
    }
}

/// Parses a weight type name (`f16`, `q8_0`, `q4_k`...).
pub fn parse_dtype(s: &str) -> Result<crate::model::quant::GgmlType> {
    crate::model::quant::GgmlType::from_name(s).ok_or_else(|| {
        let mixes = if s.contains("_m") { "; the k-quant mixes (q4_k_m) are made on the GPU only" } else { "" };
        crate::job::exit::UsageError::new(format!(
            "unknown weight type '{s}' (f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k){mixes}"
        ))
        .into()
    })
}
