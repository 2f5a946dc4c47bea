//! Calibration: text in, importance matrix out. The text (JSONL records with a `text` field, or
//! a plain text file) is tokenized as one stream, cut into windows of `ctx` tokens, and every
//! window runs through the model on the CPU backend, or on the CUDA backend, with an
//! [`Imatrix`] tapping the inputs of every matrix. Pipeline prompts as windows: [`super::prompts`].

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::imatrix::Imatrix;
use super::QuantizeError;
use crate::backend::cpu::tap::ActivationTap;
use crate::backend::cpu::CpuBackend;
use crate::backend::Backend;
use crate::engine::single::SingleSeq;
use crate::model::loader::LoadedModel;
use crate::tokenizer::Tokenizer;

/// The documents of a calibration or evaluation file: the `text` field of every JSONL record
/// (a `.jsonl` file, or any file whose first non-empty line is a JSON object), else the whole
/// file as one document.
pub fn read_texts(path: &Path) -> Result<Vec<String>, QuantizeError> {
    let bytes = std::fs::read(path).map_err(|source| QuantizeError::Io { path: path.to_path_buf(), source })?;
    let text = String::from_utf8(bytes)
        .map_err(|e| QuantizeError::Calibration { path: path.to_path_buf(), reason: format!("not UTF-8 text: {e}") })?;
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let jsonl = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("jsonl"))
        || serde_json::from_str::<serde_json::Value>(first).is_ok_and(|v| v.is_object());
    if !jsonl {
        return Ok(vec![text]);
    }
    let mut docs = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |reason: String| QuantizeError::Calibration { path: path.to_path_buf(), reason };
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(format!("line {}: {e}", i + 1)))?;
        match v.get("text").and_then(|t| t.as_str()) {
            Some(t) => docs.push(t.to_string()),
            None => return Err(bad(format!("line {}: no string field \"text\"", i + 1))),
        }
    }
    Ok(docs)
}

/// Tokenizes `docs` as one stream (documents separated by a blank line) and cuts it into
/// windows of `ctx` tokens, each starting with BOS when the tokenizer adds one, until
/// `max_tokens` tokens are taken. A last window shorter than `ctx / 4` is dropped (too little
/// context to be representative).
pub fn token_windows(
    tok: &Tokenizer,
    docs: &[String],
    ctx: usize,
    max_tokens: usize,
) -> Result<Vec<Vec<u32>>, QuantizeError> {
    let joined = docs.join("\n\n");
    let ids = tok.encode(&joined, false, false)?;
    let bos = tok.add_bos_default().then(|| tok.bos_id()).flatten();
    let body = ctx.saturating_sub(usize::from(bos.is_some())).max(1);
    let mut out = Vec::new();
    let mut taken = 0usize;
    for chunk in ids.chunks(body) {
        let n = chunk.len().min(max_tokens.saturating_sub(taken));
        // A short tail (or the end of the budget) is too little context to be representative.
        if n == 0 || (n < ctx / 4 && !out.is_empty()) {
            break;
        }
        let mut w: Vec<u32> = bos.into_iter().collect();
        w.extend_from_slice(&chunk[..n]);
        taken += n;
        out.push(w);
    }
    Ok(out)
}

/// Progress of long work: an indicatif bar on a terminal, a log line every 15 s otherwise.
pub struct Progress {
    bar: Option<ProgressBar>,
    what: String,
    total: u64,
    done: u64,
    start: Instant,
    last: Instant,
}

impl Progress {
    pub fn new(total: u64, what: &str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr_with_hz(4));
            let tmpl = format!("{{elapsed_precise}} [{{bar:30}}] {{pos}}/{{len}} {what} ETA {{eta}}");
            b.set_style(
                ProgressStyle::with_template(&tmpl)
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            b
        });
        let now = Instant::now();
        Progress { bar, what: what.to_string(), total, done: 0, start: now, last: now }
    }

    pub fn inc(&mut self, n: u64) {
        self.done += n;
        match &self.bar {
            Some(b) => b.inc(n),
            None if self.last.elapsed().as_secs() >= 15 => {
                self.last = Instant::now();
                eprintln!("{}/{} {} ({:.0}s)", self.done, self.total, self.what, self.start.elapsed().as_secs_f64());
            }
            None => {}
        }
    }

    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

/// Where the calibration forward passes run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CalibrationDevice {
    Cpu,
    /// The CUDA backend with its activation tap (`backend::cuda::tap`); `ptx_dir` as
    /// `--ptx-dir` (`None`: `DUSTOFF_PTX_DIR`, else NVRTC).
    Cuda {
        ordinal: usize,
        ptx_dir: Option<PathBuf>,
    },
}

impl CalibrationDevice {
    pub fn name(&self) -> String {
        match self {
            CalibrationDevice::Cpu => "cpu".into(),
            CalibrationDevice::Cuda { ordinal, .. } => format!("cuda:{ordinal}"),
        }
    }
}

/// Runs the calibration windows through `model` on `device` and returns the importance matrix.
/// Each window is one sequence from position 0 (its own KV cache), fed in prefill chunks.
pub fn calibrate(
    model: &LoadedModel,
    windows: &[Vec<u32>],
    dataset: &str,
    device: &CalibrationDevice,
) -> Result<Imatrix, QuantizeError> {
    let ctx = windows.iter().map(Vec::len).max().unwrap_or(1);
    let bs = crate::engine::batch::BLOCK_SIZE;
    let blocks = ctx.div_ceil(bs) + 1;
    let fresh = Box::new(Imatrix { dataset: dataset.to_string(), ..Default::default() });
    let tap: Box<dyn ActivationTap> = match device {
        CalibrationDevice::Cpu => {
            let mut b = CpuBackend::new(model.config.clone(), model.weights.clone(), blocks, bs);
            b.set_tap(fresh);
            feed_windows(&mut b, windows)?;
            b.take_tap().ok_or_else(|| QuantizeError::Usage("calibration tap missing".into()))?
        }
        CalibrationDevice::Cuda { ordinal, ptx_dir } => {
            use crate::backend::cuda::{CudaBackend, CudaOptions, CudaTap};
            let opts = CudaOptions {
                ordinal: *ordinal,
                num_blocks: blocks,
                block_size: bs,
                ptx_dir: ptx_dir.clone(),
                max_positions: blocks * bs,
                f16_weights: false,
                max_batch_tokens: crate::engine::batch::DEFAULT_MAX_BATCH_TOKENS,
                // One calibration sequence at a time, no prefix reuse.
                max_seqs: 1,
                max_snapshots: 0,
                max_memory: None,
                kv_type: crate::backend::kv_type::KvType::F16,
                cublas: crate::backend::cuda::model::cublas_wanted(),
            };
            let mut b = CudaBackend::new(model.config.clone(), &model.weights, &opts)?;
            b.set_tap(CudaTap::new(fresh, &model.weights));
            feed_windows(&mut b, windows)?;
            b.take_tap().ok_or_else(|| QuantizeError::Usage("calibration tap missing".into()))?.into_inner()
        }
    };
    let mut m = *tap
        .into_any()
        .downcast::<Imatrix>()
        .map_err(|_| QuantizeError::Usage("calibration tap has the wrong type".into()))?;
    // Sums as the file stores them (f32), so a saved and reloaded matrix quantizes identically.
    for e in m.entries.values_mut() {
        e.sum_sq.iter_mut().for_each(|v| *v = f64::from(*v as f32));
    }
    m.tokens = windows.iter().map(|w| w.len() as u64).sum();
    m.chunks = windows.len() as u32;
    Ok(m)
}

/// Every window through `b` (whose tap records the activations), with progress.
fn feed_windows<B: Backend>(b: &mut B, windows: &[Vec<u32>]) -> Result<(), QuantizeError> {
    let total: u64 = windows.iter().map(|w| w.len() as u64).sum();
    let mut pb = Progress::new(total, "calibration tokens");
    for w in windows {
        crate::sys::interrupt::check(|| "during the calibration; nothing was written".into())?;
        let mut seq = SingleSeq::new(b, 0, w.len())?;
        seq.feed(b, w)?;
        pb.inc(w.len() as u64);
    }
    pb.finish();
    Ok(())
}
