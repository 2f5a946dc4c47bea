//! `dustoff bench` from its flags to a result: which mode runs (one stream, `--batch`,
//! `--shared-prefix`, `--constrained`), on a backend sized for that mode's KV needs, and how
//! the rows are printed. The measurements themselves are in `bench` and `bench_constrained`.

use std::path::PathBuf;

use anyhow::Result;

use super::backend_setup;
use super::bench::{bench, bench_batched_runs, bench_shared_prefix, print_prompt_table};

/// One stream's timed runs without `--runs`.
pub const ONE_STREAM_RUNS: usize = 3;
use super::device_choice::Device;
use super::model_load;
use super::placement::Placement;
use crate::backend::cuda::plan::budget::MemoryCap;
use crate::backend::Backend;
use crate::engine::batch::BLOCK_SIZE;
use crate::job::exit::{ExitCode, UsageError};

/// The flags of `dustoff bench` (see its `--help`).
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub model: PathBuf,
    /// A named shape with random weights instead of `model`.
    pub synthetic: Option<String>,
    /// `--layers`: the synthetic shape cut to its first N layers.
    pub layers: Option<usize>,
    pub dtype: String,
    /// `--weights f16`: widen block formats to F16 on the GPU.
    pub f16_weights: bool,
    pub device: Device,
    pub ptx_dir: Option<PathBuf>,
    /// One stream: one row per prompt length; the batched modes take the first.
    pub prompt_tokens: Vec<usize>,
    pub gen_tokens: usize,
    /// `--runs`: one stream's timed runs (default [`ONE_STREAM_RUNS`]), each `--batch` row's
    /// (default 1).
    pub runs: Option<usize>,
    pub json: bool,
    pub batch: Vec<usize>,
    /// `REQUESTS,SHARED,UNIQUE` of the shared-prefix job.
    pub shared_prefix: Option<Vec<usize>>,
    pub slots: usize,
    pub constrained: Option<String>,
    pub max_batch_tokens: usize,
    /// `--plan`: print the CUDA memory plan of the mode's sequences and exit.
    pub plan: bool,
    /// The free GPU memory `--plan` is judged against, in GB.
    pub plan_free_gb: Option<f64>,
    /// `--tensor-parallel N`: the model split over N ranks.
    pub tensor_parallel: Option<usize>,
    /// `--devices`: the GPUs of the ranks.
    pub devices: Option<String>,
    /// `--max-gpu-memory`: what the bench may take on the GPU (with `--plan`: the plan is
    /// judged against it, less the CUDA context, when that is less than `plan_free_gb`).
    pub max_gpu_memory: Option<MemoryCap>,
    /// `--kv-cache`: the KV cache's element type.
    pub kv_type: crate::backend::kv_type::KvType,
}

/// Zero sizes measure nothing (they printed NaN or "100% from the cache"): refused up front
/// naming the flag (exit 2).
fn check_sizes(a: &BenchOptions) -> Result<(), UsageError> {
    let zero = |flag: &str| Err(UsageError::new(format!("{flag} must be at least 1")));
    if a.runs == Some(0) {
        return zero("--runs");
    }
    if a.runs.is_some() && (a.shared_prefix.is_some() || a.constrained.is_some()) {
        return Err(UsageError::new(
            "--runs: --shared-prefix and --constrained run each case once (one stream and --batch repeat)",
        ));
    }
    if a.gen_tokens == 0 {
        return zero("--gen-tokens");
    }
    if a.prompt_tokens.contains(&0) {
        return zero("--prompt-tokens");
    }
    if a.batch.contains(&0) {
        return zero("each --batch size");
    }
    if a.slots == 0 {
        return zero("--slots");
    }
    if a.max_batch_tokens == 0 {
        return zero("--max-batch-tokens");
    }
    if a.shared_prefix.as_ref().is_some_and(|v| v.first() == Some(&0) || v.get(2) == Some(&0)) {
        return Err(UsageError::new("--shared-prefix REQUESTS,SHARED,UNIQUE: REQUESTS and UNIQUE must be at least 1"));
    }
    Ok(())
}

/// Runs the mode the options ask for and prints its rows.
pub fn run(a: &BenchOptions) -> Result<ExitCode> {
    check_sizes(a)?;
    let prompt_tokens = a.prompt_tokens.first().copied().unwrap_or(768);
    let ctx = prompt_tokens + a.gen_tokens;
    // The backend is made for the mode's KV needs below; `make` builds it on the device.
    let loaded = match &a.synthetic {
        Some(_) => None,
        None => Some(model_load::load(&a.model)?),
    };
    let name = match &a.synthetic {
        Some(shape) => match a.layers {
            Some(n) => format!("synthetic {shape} (first {n} layers) {}", a.dtype),
            None => format!("synthetic {shape} {}", a.dtype),
        },
        None => a.model.display().to_string(),
    };
    let place = Placement {
        ptx_dir: a.ptx_dir.clone(),
        f16_weights: a.f16_weights,
        max_gpu_memory: a.max_gpu_memory,
        kv_type: a.kv_type,
        // Modes differ in their longest sequence: a sequence may take the whole pool.
        max_seq_positions: None,
    };
    if let Some(n) = a.tensor_parallel {
        if a.synthetic.is_some() {
            return Err(UsageError::new(format!(
                "--tensor-parallel {n} splits a loaded model: write the shape to a file with `dustoff synth --shape \
                 SHAPE --type TYPE --tokenizer DIR --output F.gguf` and bench --model F.gguf"
            ))
            .into());
        }
        if a.f16_weights {
            return Err(
                UsageError::new("--tensor-parallel keeps the weights' own formats: leave out --weights f16").into()
            );
        }
    }
    // `seqs`: the most sequences a step of the mode runs.
    let make = |tokens: usize, step: usize, seqs: usize| -> Result<Box<dyn Backend>> {
        match (&a.synthetic, &loaded) {
            (None, Some(m)) if a.tensor_parallel.is_some() => super::tensor_parallel::backend_for(
                &m.config,
                &m.weights,
                &a.device,
                a.tensor_parallel,
                a.devices.as_deref(),
                tokens,
                (step, seqs),
                &place,
            ),
            (Some(shape), _) => {
                let dtype = if a.f16_weights { "f16" } else { a.dtype.as_str() };
                backend_setup::make_synthetic_backend_for(
                    (shape, a.layers),
                    dtype,
                    &a.device,
                    tokens,
                    (step, seqs),
                    &place,
                )
            }
            (None, Some(m)) => {
                backend_setup::make_backend(&m.config, &m.weights, &a.device, tokens, (step, seqs), &place)
            }
            (None, None) => unreachable!("a model is loaded when no shape is given"),
        }
    };
    if a.plan {
        // The sequences of the mode: the largest batch, else the shared-prefix job's slots, else
        // one stream; each of its prompt plus generated tokens.
        let seqs = match (a.batch.iter().max(), &a.shared_prefix) {
            (Some(&n), _) => n,
            (None, Some(_)) => a.slots,
            (None, None) => 1,
        };
        let ctx = match (&a.shared_prefix, a.batch.is_empty()) {
            // The shared-prefix job's sequences: the shared part, their own part, the generated.
            (Some(sp), true) if sp.len() == 3 => sp[1] + sp[2] + a.gen_tokens,
            _ => a.prompt_tokens.iter().copied().max().unwrap_or(prompt_tokens) + a.gen_tokens,
        };
        let (cfg, bytes) = match (&a.synthetic, &loaded) {
            (Some(shape), _) => {
                let cfg = backend_setup::synthetic_config(shape, a.layers)?;
                let dtype = if a.f16_weights { "f16" } else { a.dtype.as_str() };
                let mix = crate::backend::cuda::WeightMix::parse(dtype)
                    .ok_or_else(|| UsageError::new(format!("--dtype {dtype}: not a GPU weight type")))?;
                let m = crate::backend::cuda::synth::mix::synthetic_matrix_bytes(&cfg, mix);
                let packed = m < crate::backend::cuda::plan::memory::f16_matrix_bytes(&cfg);
                let wide = if packed { crate::backend::cuda::plan::memory::wide_len(&cfg) as u64 * 2 } else { 0 };
                (cfg, crate::backend::cuda::plan::memory::DeviceWeightBytes { matrices: m, wide_scratch: wide })
            }
            (None, Some(m)) => {
                // Under --tensor-parallel one GPU holds rank 0's shard (the ranks' are equal).
                let (c, w) = match a.tensor_parallel {
                    Some(n) => {
                        super::tensor_parallel::check_split(&m.config, &vec![a.device.clone(); n])?;
                        super::tensor_parallel::rank0_shard(&m.config, &m.weights, n)?
                    }
                    None => (m.config.clone(), m.weights.clone()),
                };
                let bytes = crate::backend::cuda::plan::memory::device_weight_bytes(&c, &w, a.f16_weights);
                (c, bytes)
            }
            (None, None) => unreachable!("a model is loaded when no shape is given"),
        };
        if let Some(n) = a.tensor_parallel {
            println!(
                "tensor parallel {n}: the plan of one GPU's rank (1/{n} of the split weights and of the KV cache)"
            );
        }
        let free = a.plan_free_gb.map_or(super::bench_plan::V100_32GB_FREE, |g| (g * 1e9) as u64);
        let free = crate::backend::cuda::plan::budget::available(a.max_gpu_memory, free);
        // The step size the mode's backend is made for (below).
        let step = if seqs > 1 {
            a.max_batch_tokens.max(seqs)
        } else {
            crate::backend::cuda::plan::memory::prefill_chunk(&cfg, bytes.wide_scratch)
        };
        let r = super::bench_plan::plan_report(
            &cfg,
            (bytes.matrices, bytes.wide_scratch),
            seqs,
            ctx,
            (BLOCK_SIZE, step),
            free,
            a.kv_type,
        );
        r.print_human();
        return Ok(ExitCode::Ok);
    }
    let fingerprint = *blake3::hash(name.as_bytes()).as_bytes();
    if let (Some(p), Some(m)) = (&a.constrained, &loaded) {
        let batches = if a.batch.is_empty() { vec![32] } else { a.batch.clone() };
        let most = batches.iter().max().copied().unwrap_or(1);
        let b = make(most * (ctx + BLOCK_SIZE), a.max_batch_tokens.max(most), most)?;
        let shape = (prompt_tokens, a.gen_tokens, a.max_batch_tokens);
        let rows = super::bench_constrained::run(b, m, p, fingerprint, shape, &batches)?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&rows)?);
        } else {
            super::bench_constrained::print_table(&rows);
        }
        return Ok(ExitCode::Ok);
    }
    if let Some(sp) = &a.shared_prefix {
        let [requests, shared, unique] = sp[..] else {
            return Err(UsageError::new("--shared-prefix takes REQUESTS,SHARED,UNIQUE (e.g. 256,1000,300)").into());
        };
        let gen = a.gen_tokens;
        let tokens = a.slots * (shared + unique + gen + BLOCK_SIZE) + shared * 2;
        let b = make(tokens, a.max_batch_tokens.max(a.slots), a.slots)?;
        let rows = bench_shared_prefix(b, fingerprint, a.slots, a.max_batch_tokens, (shared, unique, requests, gen))?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&rows)?);
            return Ok(ExitCode::Ok);
        }
        println!("| prefix cache | seconds | prompt tokens | computed | from the cache |");
        println!("|---|---|---|---|---|");
        for r in &rows {
            let cached = 1.0 - r.prompt_tokens_computed as f64 / r.prompt_tokens.max(1) as f64;
            let on = if r.prefix_cache { "on" } else { "off" };
            println!(
                "| {on} | {:.2} | {} | {} | {:.1}% |",
                r.seconds,
                r.prompt_tokens,
                r.prompt_tokens_computed,
                cached * 100.0
            );
        }
        if let [on, off] = &rows[..] {
            println!("speed-up of the prefix cache: {:.2}x", off.seconds / on.seconds.max(1e-9));
        }
        return Ok(ExitCode::Ok);
    }
    if !a.batch.is_empty() {
        let most = a.batch.iter().copied().max().unwrap_or(1);
        let b = make(most * (ctx + BLOCK_SIZE), a.max_batch_tokens.max(most), most)?;
        let (shape, runs) = ((prompt_tokens, a.gen_tokens), a.runs.unwrap_or(1));
        let rows = bench_batched_runs(b, fingerprint, shape, &a.batch, a.max_batch_tokens, runs)?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&rows)?);
            return Ok(ExitCode::Ok);
        }
        println!(
            "| sequences | prefill s | decode tok/s (total) | share of bandwidth bound (one token's weights + KV) | share of step bound | weights / KV GB, TFLOP per step |"
        );
        println!("|---|---|---|---|---|---|");
        for r in &rows {
            let share = r.bandwidth_share.map(|s| format!("{:.1}%", s * 100.0)).unwrap_or_else(|| "-".into());
            let (bound, per_step) = match &r.step_bound {
                Some(b) => (
                    format!("{:.1}%", b.share * 100.0),
                    format!(
                        "{:.2} / {:.2}, {:.3}{}",
                        b.weight_gb_per_step,
                        b.kv_gb_per_step,
                        b.tflop_per_step,
                        if b.flop_bound_steps > 0 {
                            format!(" ({} steps FLOP-bound)", b.flop_bound_steps)
                        } else {
                            String::new()
                        }
                    ),
                ),
                None => ("-".into(), "-".into()),
            };
            println!(
                "| {} | {:.2} | {:.1} | {share} | {bound} | {per_step} |",
                r.sequences, r.prefill_s, r.decode_tok_s
            );
        }
        return Ok(ExitCode::Ok);
    }
    // One stream: the prompt is prefilled in steps of `Backend::prefill_chunk` tokens.
    let longest = a.prompt_tokens.iter().copied().max().unwrap_or(prompt_tokens);
    let mut b = make(longest + a.gen_tokens, crate::engine::single::PREFILL_CHUNK, 1)?;
    let b = b.as_mut();
    let mut reports = Vec::new();
    for &p in &a.prompt_tokens {
        let r = bench(b, &name, p, a.gen_tokens, a.runs.unwrap_or(ONE_STREAM_RUNS))?;
        if !a.json {
            r.print_human();
        }
        reports.push(r);
    }
    if a.json {
        match &reports[..] {
            [r] => println!("{}", serde_json::to_string_pretty(r)?),
            all => println!("{}", serde_json::to_string_pretty(all)?),
        }
    } else if reports.len() > 1 {
        print_prompt_table(&reports);
    }
    Ok(ExitCode::Ok)
}
