//! `dustoff eval`: what quantization cost, measured on text. Every model (and the reference)
//! runs over the same token windows; the logits of every position of the second half of each
//! window (the first half is context, as llama.cpp's perplexity and KL-divergence tools do)
//! give each model's perplexity and, against the reference, the KL divergence
//! `KL(P_ref || P_model)` per position (mean, median, p99, max) and the share of positions
//! whose top-1 token agrees. `--kv-cache q8` runs the `--model`s with the 8-bit KV cache (the
//! CPU twin of the GPU's: `backend::kv_type`) and the reference with the full one, so the same
//! file as model and reference measures what the 8-bit cache costs.
//!
//! `--device cpu|cuda` chooses where the windows run, `--batch-windows N` how many at once (as
//! N sequences of one batched prefill: `windows.rs`). Either device hands back the same thing,
//! the output head's input at every scored position; the head, the log-softmax and the
//! statistics then run on the host, one code path for both (`stats.rs`).
//!
//! Memory: the models are placed one at a time (the reference first), each over every window,
//! and what is kept of each is its head input at the scored positions, `[positions, dim]` f32
//! (32,768 tokens of a width-2048 model: 16,384 positions, 134 MB). Its log-probabilities,
//! `[positions, vocab]`, would be `vocab / dim` times more (74x for a 151,936-token vocabulary:
//! 10 GB), so they are made window by window when the models are compared. So a GPU holds one
//! model and the KV cache of one batch of windows at a time, and no model is placed twice.

mod scorer_cpu;
mod scorer_cuda;
mod stats;
mod windows;

#[cfg(test)]
mod tests;

use std::path::PathBuf;

use serde::Serialize;

use crate::backend::kv_type::KvType;
use crate::commands::device_choice::calibration_device;
use crate::model::loader::load_model;
use crate::quantize::calibrate::{read_texts, token_windows, CalibrationDevice, Progress};
use crate::quantize::QuantizeError;
use scorer_cpu::CpuHead;
use scorer_cuda::CudaHead;
use stats::Scored;
pub use windows::STEP_TOKENS;

/// `--batch-windows` when none is given: 16 windows of 512 tokens are steps of 2,048 tokens
/// ([`STEP_TOKENS`]), each window's KV cache of 512 positions beside the model.
pub const DEFAULT_BATCH_WINDOWS: usize = 16;
/// `--batch-windows` at most (sequences of one step).
pub const MAX_BATCH_WINDOWS: usize = 256;

/// The text `--verify` scores when no file is given (prose written for dustoff).
pub const BUILTIN_TEXT: &str = "The old server had stood in the corner of the laboratory for seven years. \
Nobody remembered who had ordered it, and the label on its front had faded to a pale grey. Every night \
its fans spun up at two o'clock, when the backup began, and every morning they fell quiet again before \
the first students arrived. One winter the department decided to use it for something better. A student \
wrote a small program that read the archive of meeting notes, one document at a time, and asked a \
language model to summarize each of them in three sentences. The first night the program processed \
four hundred documents. The second night, after the student learned to reuse the shared instructions \
at the start of every prompt, it processed nine hundred. By the end of the month the whole archive, \
twenty years of notes about budgets, experiments, broken pumps and visiting speakers, had a short \
summary that anyone could search. The model was small and made mistakes: it confused two professors \
with the same family name, and it believed that a conference in Lisbon had taken place in Madrid. \
But the summaries were good enough to find the right document, and that was all anyone had asked for. \
When the head of the department saw the result, she asked how much the new hardware had cost. The \
student explained that there was no new hardware. The machine in the corner had done it, at night, \
while the building was empty, using the electricity it had always used to copy files nobody read. \
The following year three other groups borrowed the program. One of them translated old field reports, \
another extracted the names of chemicals from handwritten inventories, and the third simply counted \
how often the word \"urgent\" appeared in email subjects, which turned out to be more often than anyone \
had expected.";

#[derive(Clone, Debug)]
pub struct EvalArgs {
    pub models: Vec<PathBuf>,
    pub reference: Option<PathBuf>,
    /// JSONL (`text` field) or plain text; `None`: [`BUILTIN_TEXT`].
    pub text: Option<PathBuf>,
    pub ctx: usize,
    pub max_tokens: usize,
    /// The KV cache of the scored models (the reference keeps the full one).
    pub kv_type: KvType,
    /// `--device`: `cpu` (the default), `cuda`, `cuda:N` or `auto`.
    pub device: String,
    /// `--ptx-dir`: precompiled PTX for the GPU (`None`: `DUSTOFF_PTX_DIR`, else NVRTC).
    pub ptx_dir: Option<PathBuf>,
    /// `--batch-windows`: windows run at once, as sequences of one batched prefill.
    pub batch_windows: usize,
}

impl Default for EvalArgs {
    fn default() -> Self {
        EvalArgs {
            models: Vec::new(),
            reference: None,
            text: None,
            ctx: 512,
            max_tokens: 32_768,
            kv_type: KvType::F16,
            device: "cpu".into(),
            ptx_dir: None,
            batch_windows: DEFAULT_BATCH_WINDOWS,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct KlStats {
    pub mean: f64,
    pub median: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModelScore {
    pub model: PathBuf,
    pub perplexity: f64,
    /// Against the reference (absent without one).
    pub kl_divergence: Option<KlStats>,
    pub top1_agreement: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct EvalSummary {
    pub text: String,
    /// Where the windows ran: `cpu` or `cuda:N`.
    pub device: String,
    /// Windows run at once.
    pub batch_windows: usize,
    pub ctx: usize,
    pub windows: usize,
    pub scored_positions: usize,
    pub reference: Option<ModelScore>,
    pub models: Vec<ModelScore>,
}

impl EvalSummary {
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "eval on {} ({} windows of up to {} tokens, {} scored positions; {} at a time on {})\n",
            self.text, self.windows, self.ctx, self.scored_positions, self.batch_windows, self.device
        );
        s += &format!(
            "{:<48} {:>10} {:>10} {:>10} {:>10} {:>8}\n",
            "model", "PPL", "KL mean", "KL median", "KL p99", "top-1"
        );
        let row = |m: &ModelScore, tag: &str| {
            let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.5}"));
            format!(
                "{:<48} {:>10.4} {:>10} {:>10} {:>10} {:>8}\n",
                format!("{}{tag}", m.model.display()),
                m.perplexity,
                f(m.kl_divergence.as_ref().map(|k| k.mean)),
                f(m.kl_divergence.as_ref().map(|k| k.median)),
                f(m.kl_divergence.as_ref().map(|k| k.p99)),
                m.top1_agreement.map_or("-".to_string(), |v| format!("{:.2}%", 100.0 * v)),
            )
        };
        if let Some(r) = &self.reference {
            s += &row(r, " (reference)");
        }
        for m in &self.models {
            s += &row(m, "");
        }
        s
    }
}

fn usage(msg: String) -> anyhow::Error {
    QuantizeError::Usage(msg).into()
}

pub fn run(a: &EvalArgs) -> anyhow::Result<EvalSummary> {
    if a.models.is_empty() {
        return Err(usage("give at least one --model".into()));
    }
    if a.ctx < 8 {
        return Err(usage("--ctx must be at least 8".into()));
    }
    if !(1..=MAX_BATCH_WINDOWS).contains(&a.batch_windows) {
        return Err(usage(format!("--batch-windows must be 1..={MAX_BATCH_WINDOWS}, not {}", a.batch_windows)));
    }
    let device = calibration_device(&a.device, a.ptx_dir.clone())?;
    let (docs, text_name) = match &a.text {
        Some(p) => (read_texts(p)?, p.display().to_string()),
        None => (vec![BUILTIN_TEXT.to_string()], "the built-in text".to_string()),
    };
    let has_ref = a.reference.is_some();
    let mut models: Vec<Scored> = Vec::new();
    let mut windows: Option<Vec<Vec<u32>>> = None;
    let mut batch = a.batch_windows;
    for (i, p) in a.reference.iter().chain(&a.models).enumerate() {
        let m = load_model(p)?;
        if let Some(f) = models.first() {
            if f.head.rows != m.config.vocab_size {
                return Err(usage(format!(
                    "{} has a vocabulary of {}, {} of {}: not the same model family",
                    p.display(),
                    m.config.vocab_size,
                    f.path.display(),
                    f.head.rows
                )));
            }
        }
        let all = match &windows {
            Some(w) => w,
            None => windows.insert(token_windows(&m.tokenizer, &docs, a.ctx, a.max_tokens)?),
        };
        let usable: Vec<&[u32]> = all.iter().filter(|w| w.len() >= 4).map(Vec::as_slice).collect();
        if usable.is_empty() {
            return Err(usage(format!(
                "{text_name} is too short to score (no window of 4+ tokens within --max-tokens {})",
                a.max_tokens
            )));
        }
        // The cache holds the longest window, not --ctx (a --ctx far above the text would
        // allocate for positions no window reaches); a window past the model's context is refused.
        let longest = usable.iter().map(|w| w.len()).max().unwrap_or(0);
        if m.config.max_context > 0 && longest > m.config.max_context {
            return Err(usage(format!(
                "{}: windows of {longest} tokens exceed the model's context of {}; give --ctx {} or less",
                p.display(),
                m.config.max_context,
                m.config.max_context
            )));
        }
        let kv_ctx = longest;
        // No KV cache for more windows than there are.
        batch = batch.min(usable.len());
        // The reference (first when given) keeps the full cache.
        let kv = if has_ref && i == 0 { KvType::F16 } else { a.kv_type };
        if let Some(why) = kv.refusal(m.config.head_dim) {
            return Err(usage(format!("{}: {why}", p.display())));
        }
        let mut pb = Progress::new(usable.len() as u64, &format!("windows through {}", p.display()));
        let rows = match &device {
            CalibrationDevice::Cpu => {
                windows::head_rows(&mut CpuHead::new(&m, kv_ctx, batch, kv)?, &usable, kv_ctx, batch, &mut pb)?
            }
            CalibrationDevice::Cuda { ordinal, ptx_dir } => {
                let mut g = CudaHead::new(&m, (*ordinal, ptx_dir.clone()), kv_ctx, batch, kv)?;
                windows::head_rows(&mut g, &usable, kv_ctx, batch, &mut pb)?
            }
        };
        pb.finish();
        models.push(Scored { path: m.path.clone(), head: m.weights.output.clone(), rows });
        // `m` and its backend go here: the next model has the device to itself.
    }
    let windows = windows.unwrap_or_default();
    let usable: Vec<&[u32]> = windows.iter().filter(|w| w.len() >= 4).map(Vec::as_slice).collect();
    let (mut scores, scored) = stats::score(&models, &usable, has_ref);
    let reference = if has_ref { Some(scores.remove(0)) } else { None };
    Ok(EvalSummary {
        text: text_name,
        device: device.name(),
        batch_windows: batch,
        ctx: a.ctx,
        windows: windows.len(),
        scored_positions: scored,
        reference,
        models: scores,
    })
}
