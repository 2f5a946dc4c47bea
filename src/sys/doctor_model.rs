//! `dustoff doctor --model`: the memory plan on each usable device and a projected decode rate.
//!
//! - CPU: weights are the file's packed tensors (mapped), the KV cache is f32. The projection is
//!   measured: one decode step's matrix products (every layer matrix and the head, one token,
//!   the kernel path this process uses) timed on the thread pool; attention and the small ops
//!   are left out, so the real rate is somewhat lower.
//! - GPU: the plan of the CUDA backend (`backend::cuda::plan::memory::plan_memory`, F16 weights) against
//!   the device's free memory; the projection is the copy-bandwidth bound times the share
//!   dustoff reached on an H200 ([`super::doctor_report::GPU_DECODE_SHARE`]).

use std::path::Path;
use std::time::Instant;

use super::doctor_report::{shown, CpuReport, CudaReport, DevicePlan, DoctorOptions, ModelReport, GPU_DECODE_SHARE};
use crate::backend::cpu::matmul::matmul;
use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::plan::memory::{device_weight_bytes, plan_memory};
use crate::backend::cuda::qformat::QFormat;
use crate::model::layer::Ffn;
use crate::model::loader::load_model;
use crate::model::weights::{ModelWeights, Tensor};

/// The KV block and the step budgets of a default run on the CPU and on a GPU.
const BLOCK: usize = crate::engine::batch::BLOCK_SIZE;
const STEP: usize = crate::engine::batch::DEFAULT_MAX_BATCH_TOKENS;
const GPU_STEP: usize = crate::engine::batch::DEFAULT_GPU_MAX_BATCH_TOKENS;

/// The weight matrices of the model (`active`: only those one decoded token reads: of a sparse
/// layer's experts the first `n_used`, standing for the ones the router picks), the head last.
fn matrices(w: &ModelWeights, active: bool) -> Vec<&Tensor> {
    let mut v: Vec<&Tensor> = Vec::new();
    for l in &w.layers {
        let l = l.typed();
        v.extend(l.mixer.matrices());
        match l.ffn {
            Ffn::Dense(d) => v.extend([d.gate, d.up, d.down]),
            Ffn::Moe(m) => {
                v.push(&m.router);
                let used = if active { m.n_used.min(m.experts.len()) } else { m.experts.len() };
                v.extend(m.experts[..used].iter().flat_map(|e| [&e.gate, &e.up, &e.down]));
                if let Some(s) = &m.shared {
                    v.extend([&s.gate, &s.expert.gate, &s.expert.up, &s.expert.down]);
                }
            }
        }
    }
    v.push(&w.output);
    v
}

/// Bytes of one matrix on the CUDA device: block formats packed, F16/BF16/F32 as F16.
fn gpu_bytes(t: &Tensor) -> u64 {
    match QFormat::of(t.dtype) {
        Some(f) => f.device_bytes(t.rows, t.cols).1 as u64,
        None => (t.rows * t.cols * 2) as u64,
    }
}

/// Median seconds of one token through every matrix (after a warm-up pass).
fn gemv_pass_seconds(ms: &[&Tensor]) -> f64 {
    let most_cols = ms.iter().map(|m| m.cols).max().unwrap_or(0);
    let most_rows = ms.iter().map(|m| m.rows).max().unwrap_or(0);
    let x: Vec<f32> = (0..most_cols).map(|i| ((i % 17) as f32 - 8.0) / 16.0).collect();
    let mut out = vec![0f32; most_rows];
    let mut times = Vec::new();
    for _ in 0..4 {
        let t = Instant::now();
        for m in ms {
            matmul(m, &x[..m.cols], 1, &mut out[..m.rows]);
        }
        times.push(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&out);
    times.remove(0);
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

pub(super) fn model_report(
    path: &Path,
    o: &DoctorOptions,
    cpu: &CpuReport,
    cuda: &CudaReport,
    problems: &mut Vec<String>,
) -> ModelReport {
    let m = match load_model(path) {
        Ok(m) => m,
        Err(e) => {
            problems.push(format!("model {}: {e}", shown(path)));
            return ModelReport {
                path: shown(path),
                error: Some(e.to_string()),
                arch: String::new(),
                layers: 0,
                context: o.ctx,
                slots: o.slots,
                plans: Vec::new(),
            };
        }
    };
    let c = &m.config;
    // A context past the model's is not one a job runs: plan the model's.
    let ctx = if c.max_context > 0 { o.ctx.min(c.max_context) } else { o.ctx };
    let held = if ctx < o.ctx { format!(" (--ctx {} held to the model's context)", o.ctx) } else { String::new() };
    let positions = ctx.saturating_mul(o.slots).div_ceil(BLOCK).saturating_mul(BLOCK);
    let mut plans = Vec::new();

    // CPU.
    let ms = matrices(&m.weights, true);
    let decode_bytes: u64 =
        ms.iter().map(|t| t.bytes().len() as u64).sum::<u64>() + m.weights.token_embd.row_bytes() as u64;
    let weights_bytes: u64 = matrices(&m.weights, false).iter().map(|t| t.bytes().len() as u64).sum::<u64>()
        + if c.tied_embeddings { 0 } else { m.weights.token_embd.bytes().len() as u64 };
    let kv = (CpuBackend::kv_bytes_per_token(c) as u64).saturating_mul(positions as u64);
    // Activations: a few [max_batch_tokens, ffn] f32 buffers and the logits; small next to KV.
    let workspace = (STEP * (4 * c.dim + 3 * c.ffn_dim) * 4 + 256 * c.vocab_size * 4) as u64;
    // Hybrid models: each sequence's recurrent state (conv window + delta-rule matrices of every
    // linear layer, f32), one per slot.
    let state_per_seq = c.state_bytes_per_seq() as u64;
    let state = state_per_seq.saturating_mul(o.slots as u64);
    let total = weights_bytes.saturating_add(kv).saturating_add(state).saturating_add(workspace);
    let avail = cpu.memory_available_bytes;
    let fits = avail.is_none_or(|a| total <= a);
    let (tok_s, projection) = if o.measure {
        // On a pool worker, as the backend runs its steps (forks are then cheap).
        let s = rayon::scope(|_| gemv_pass_seconds(&ms));
        (
            Some(1.0 / s),
            format!(
                "measured: one token through every matrix takes {:.2} ms on {} threads ({} kernels); attention and the rest come on top",
                s * 1e3,
                rayon::current_num_threads(),
                cpu.kernel_path
            ),
        )
    } else {
        (None, "not measured (--no-measure)".into())
    };
    let mut note =
        format!("weights mapped from the file; KV cache f32 for {positions} positions ({} x {ctx}{held})", o.slots);
    if let Some(summary) = c.state_summary() {
        note.push_str(&format!("; {summary}"));
    }
    plans.push(DevicePlan {
        device: "cpu".into(),
        weights_bytes,
        kv_bytes: kv,
        state_bytes: state,
        state_bytes_per_sequence: state_per_seq,
        workspace_bytes: workspace,
        total_bytes: total,
        available_bytes: avail,
        fits,
        note,
        decode_bytes_per_token: decode_bytes,
        projected_decode_tok_s: tok_s,
        projection,
    });

    // GPUs.
    for g in cuda.gpus.iter().filter(|g| g.usable) {
        // Weights as the CUDA backend keeps them (block formats packed).
        let b = device_weight_bytes(c, &m.weights, false);
        let seqs = crate::backend::cuda::plan::memory::SeqPlan::new(o.slots);
        let p = plan_memory(c, b.matrices, b.wide_scratch, positions / BLOCK, BLOCK, GPU_STEP, seqs);
        let device = format!("cuda:{}", g.info.ordinal);
        let (fits, note) = match g.free_memory_bytes {
            Some(free) => match p.check(free, &device, positions, c) {
                Ok(()) => {
                    let q8 = p.with_kv_type(c, crate::backend::kv_type::KvType::Q8).kv;
                    let mut n = format!(
                        "weights as the CUDA backend keeps them (block formats packed, the rest F16); KV cache F16 for {positions} positions ({:.2} GB; 8-bit, --kv-cache q8: {:.2} GB)",
                        p.kv as f64 / 1e9,
                        q8 as f64 / 1e9
                    );
                    if let Some(summary) = c.state_summary() {
                        n.push_str(&format!("; {summary}"));
                    }
                    (true, n)
                }
                Err(msg) => (false, msg),
            },
            None => (false, "free memory unknown".into()),
        };
        // Read a token: the matrices a token passes through (the chosen experts only, as
        // `matrices(.., true)` counts them) as the device holds them, and one embedding row.
        let gpu_decode = matrices(&m.weights, true).iter().map(|t| gpu_bytes(t)).sum::<u64>() + (c.dim * 2) as u64;
        let (tok_s, projection) = match g.copy_bandwidth_gb_s {
            Some(bw) => (
                Some(bw * 1e9 / gpu_decode as f64 * GPU_DECODE_SHARE),
                format!(
                    "{:.0}% of the bound {bw:.0} GB/s / {:.2} GB per token (the share dustoff reached on an H200)",
                    GPU_DECODE_SHARE * 100.0,
                    gpu_decode as f64 / 1e9
                ),
            ),
            None => (None, "copy bandwidth not measured".into()),
        };
        plans.push(DevicePlan {
            device,
            weights_bytes: p.weights,
            kv_bytes: p.kv,
            state_bytes: p.state,
            state_bytes_per_sequence: p.state_per_seq,
            workspace_bytes: p.workspace,
            total_bytes: p.total,
            available_bytes: g.free_memory_bytes,
            fits,
            note,
            decode_bytes_per_token: gpu_decode,
            projected_decode_tok_s: tok_s,
            projection,
        });
    }
    ModelReport {
        error: None,
        path: shown(path),
        arch: c.arch.name().to_string(),
        layers: c.n_layers,
        context: ctx,
        slots: o.slots,
        plans,
    }
}
