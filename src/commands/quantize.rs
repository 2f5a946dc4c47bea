//! `dustoff quantize`: a Hugging Face directory (BF16/F16/F32) or an F16/BF16/F32 GGUF to a
//! quantized GGUF, optionally calibrated with an importance matrix, with `<output>.report.json`
//! beside the output.
//!
//! An HF directory is first converted to an F16 GGUF next to the output (`dustoff convert`'s
//! exact BF16 -> F16 policy; removed afterwards), which is then quantized tensor by tensor; the
//! calibration runs on that F16 model, on the GPU when one is usable (`--device auto`), else on
//! the CPU backend. Its text is a plain file, JSONL `text` records, or, with `--pipeline P`, the
//! records of a job input rendered into the prompts that job will feed. `--verify` scores the
//! output against the source (`dustoff eval` on a short built-in text) and records the result
//! in `<output>.report.json`; `--verify-max-kl X` fails the command (exit 1) above a mean KL.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::commands::convert::ConvertArgs;
use crate::commands::device_choice::calibration_device;
use crate::job::pipeline::Pipeline;
use crate::model::loader::load_model;
use crate::quantize::calibrate::{calibrate, read_texts, token_windows, CalibrationDevice};
use crate::quantize::imatrix::Imatrix;
use crate::quantize::mix::{QuantType, TYPE_NAMES};
use crate::quantize::prompts::{pipeline_windows, PromptWindows};
use crate::quantize::write::{quantize_gguf, QuantizeOptions, QuantizeReport};
use crate::quantize::QuantizeError;

#[derive(Clone, Debug)]
pub struct QuantizeArgs {
    pub model: PathBuf,
    pub output: PathBuf,
    pub qtype: String,
    pub calibration: Option<PathBuf>,
    pub calibration_tokens: usize,
    pub calibration_ctx: usize,
    pub imatrix: Option<PathBuf>,
    pub imatrix_out: Option<PathBuf>,
    pub allow_requantize: bool,
    pub threads: Option<usize>,
    pub verify: bool,
    /// `--verify-max-kl X`: fail (exit 1) when the verification's mean KL divergence exceeds X
    /// (implies `verify`).
    pub verify_max_kl: Option<f64>,
    /// `--pipeline P`: the calibration file holds that pipeline's job records (see
    /// `quantize::prompts`).
    pub pipeline: Option<String>,
    /// `--device cpu|cuda|cuda:N|auto` for the calibration passes.
    pub device: String,
}

impl Default for QuantizeArgs {
    fn default() -> Self {
        QuantizeArgs {
            model: PathBuf::new(),
            output: PathBuf::new(),
            qtype: "q4_k_m".into(),
            calibration: None,
            calibration_tokens: 100_000,
            calibration_ctx: 512,
            imatrix: None,
            imatrix_out: None,
            allow_requantize: false,
            threads: None,
            verify: false,
            verify_max_kl: None,
            pipeline: None,
            device: "auto".into(),
        }
    }
}

/// How the importance matrix was made (absent with `--imatrix` or without calibration).
#[derive(Clone, Debug, Serialize)]
pub struct CalibrationInfo {
    pub file: PathBuf,
    /// `cpu` or `cuda:N`.
    pub device: String,
    pub tokens: u64,
    pub windows: usize,
    /// With `--pipeline`: its path and the records used, skipped and truncated.
    pub pipeline: Option<PathBuf>,
    pub prompts: Option<PromptWindows>,
}

pub use super::verify::{verify, Verify};

#[derive(Debug, Serialize)]
pub struct QuantizeSummary {
    pub report_path: PathBuf,
    pub report: QuantizeReport,
    pub calibration_tokens: Option<u64>,
    pub calibration: Option<CalibrationInfo>,
    pub imatrix_written: Option<PathBuf>,
    pub verify: Option<Verify>,
}

impl QuantizeSummary {
    /// False when `--verify-max-kl` was exceeded (exit code 1).
    pub fn passed(&self) -> bool {
        self.verify.as_ref().is_none_or(|v| v.passed)
    }
}

/// `<output>.report.json`: the quantizer's report plus how it was calibrated and verified.
#[derive(Serialize)]
struct ReportFile<'a> {
    #[serde(flatten)]
    report: &'a QuantizeReport,
    calibration: Option<&'a CalibrationInfo>,
    verify: Option<&'a Verify>,
}

impl QuantizeSummary {
    pub fn to_text(&self) -> String {
        let r = &self.report;
        let mut s = format!(
            "wrote {} ({}, {:.2} bits/weight, {} -> {} bytes) in {:.1}s; report {}\n",
            r.output.display(),
            r.qtype,
            r.bits_per_weight,
            r.bytes_in,
            r.bytes_out,
            r.seconds,
            self.report_path.display()
        );
        if let Some(c) = &self.calibration {
            s += &format!("calibration: {} tokens in {} windows on {}", c.tokens, c.windows, c.device);
            if let (Some(p), Some(w)) = (&c.pipeline, &c.prompts) {
                s += &format!(
                    ", prompts of {} ({} records, {} skipped, {} truncated)",
                    p.display(),
                    w.records,
                    w.skipped,
                    w.truncated
                );
            }
            s += "\n";
        }
        if r.imatrix.is_some() {
            s += &importance_line(r);
        }
        if !r.fallbacks.is_empty() {
            // Grouped by (wanted -> used); the report lists every tensor.
            let mut groups: std::collections::BTreeMap<(String, String), usize> = Default::default();
            for t in &r.tensors {
                if let Some(f) = &t.fallback_from {
                    *groups.entry((f.clone(), t.to.clone())).or_default() += 1;
                }
            }
            let parts: Vec<String> = groups.iter().map(|((f, t), n)| format!("{n} {f} -> {t}")).collect();
            s += &format!(
                "{} tensor(s) fell back to another type (row length not a whole number of blocks): {}\n",
                r.fallbacks.len(),
                parts.join(", ")
            );
        }
        if let Some(v) = &self.verify {
            s += &v.to_text();
        }
        s
    }
}

/// The console line on the importance of the matrices: how many were calibrated, which were
/// left without (named), and the experts no calibration token was routed to (counted, with
/// their fallback; the report lists each).
fn importance_line(r: &QuantizeReport) -> String {
    let quantized = r.tensors.iter().filter(|t| t.to != "F32" && t.to != t.from).count();
    let mut s = format!(
        "importance: {} of {quantized} quantized matrices calibrated",
        quantized.saturating_sub(r.missing_importance.len())
    );
    if r.routed_expert_matrices + r.unrouted_experts.len() > 0 {
        s += &format!(
            " ({} expert matrices from their routed tokens, {} never routed: gate/up take their layer's router input, down uniform weights)",
            r.routed_expert_matrices,
            r.unrouted_experts.len()
        );
    }
    if r.missing_importance.is_empty() {
        s += "\n";
    } else {
        let why =
            |n: &str| if n == "token_embd.weight" { " (an embedding lookup: no activation reaches it)" } else { "" };
        let named: Vec<String> = r.missing_importance.iter().map(|n| format!("{n}{}", why(n))).collect();
        s += &format!("; without importance: {}\n", named.join(", "));
    }
    s
}

fn usage(msg: String) -> anyhow::Error {
    QuantizeError::Usage(msg).into()
}

pub fn run(a: &QuantizeArgs) -> anyhow::Result<QuantizeSummary> {
    // Ctrl-C stops between calibration windows and tensors, removing what was written.
    crate::sys::interrupt::install();
    let qtype = QuantType::parse(&a.qtype)
        .ok_or_else(|| usage(format!("unknown --type {:?}; one of {TYPE_NAMES}", a.qtype)))?;
    if !a.model.exists() {
        return Err(usage(format!("--model {} does not exist", a.model.display())));
    }
    if a.output.exists() {
        return Err(usage(format!("{} exists; remove it or choose another --output", a.output.display())));
    }
    if a.calibration.is_some() && a.imatrix.is_some() {
        return Err(usage("give --calibration FILE or --imatrix FILE, not both".into()));
    }
    if a.pipeline.is_some() && a.calibration.is_none() {
        return Err(usage(
            "--pipeline needs --calibration FILE (that pipeline's job records, JSONL or Parquet)".into(),
        ));
    }
    if a.verify_max_kl.is_some_and(|k| k.is_nan() || k < 0.0) {
        return Err(usage("--verify-max-kl must be a number >= 0".into()));
    }
    if a.calibration_ctx < 8 {
        return Err(usage("--calibration-ctx must be at least 8".into()));
    }
    if a.calibration_tokens == 0 {
        return Err(usage("--calibration-tokens must be at least 1".into()));
    }
    // Every file named is checked before the conversion or calibration (minutes on a large
    // model): the inputs exist, and neither the output nor the importance matrix written
    // replaces an input or each other.
    let mut inputs: Vec<&Path> = vec![&a.model];
    for (flag, p) in [("--calibration", &a.calibration), ("--imatrix", &a.imatrix)] {
        if let Some(p) = p {
            crate::job::outputs::check_input_file(flag, p)?;
            inputs.push(p);
        }
    }
    crate::job::outputs::check_output(&a.output, &inputs)?;
    if let Some(out) = &a.imatrix_out {
        if a.calibration.is_none() {
            return Err(usage(
                "--imatrix-out writes the importance matrix that --calibration computes: give --calibration FILE"
                    .into(),
            ));
        }
        if crate::job::outputs::same_path(out, &a.output) {
            return Err(usage(format!("--imatrix-out {} is the --output; name another file", out.display())));
        }
        crate::job::outputs::check_output(out, &inputs).map_err(|e| usage(format!("--imatrix-out: {e}")))?;
    }
    let device = calibration_device(&a.device, None)?;
    let pool = match a.threads {
        Some(n) => Some(rayon::ThreadPoolBuilder::new().num_threads(n.max(1)).build()?),
        None => None,
    };
    match &pool {
        Some(p) => p.install(|| quantize(a, qtype, &device)),
        None => quantize(a, qtype, &device),
    }
}

/// The F16 GGUF made from an HF directory, removed (with its conversion report) when dropped.
struct TempSource(PathBuf);
impl Drop for TempSource {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_file(crate::commands::convert::report_path(&self.0));
    }
}

fn quantize(a: &QuantizeArgs, qtype: QuantType, device: &CalibrationDevice) -> anyhow::Result<QuantizeSummary> {
    let mut _temp = None;
    let src: PathBuf = if a.model.is_dir() {
        let tmp = PathBuf::from(format!("{}.f16-source.gguf", a.output.display()));
        let _ = std::fs::remove_file(&tmp);
        eprintln!("converting {} to F16 ({})", a.model.display(), tmp.display());
        crate::commands::convert::run(ConvertArgs {
            model: a.model.clone(),
            output: tmp.clone(),
            ..Default::default()
        })?;
        _temp = Some(TempSource(tmp.clone()));
        tmp
    } else {
        a.model.clone()
    };

    let (imatrix, imatrix_name, calibration) = match (&a.imatrix, &a.calibration) {
        (Some(p), _) => (Some(Imatrix::load(p)?), p.display().to_string(), None),
        (None, Some(cal)) => {
            let m = load_model(&src)?;
            let (windows, pipeline, prompts) = match &a.pipeline {
                Some(p) => {
                    let p = Pipeline::resolve_in(p, &crate::job::search_path::pipeline_dirs(None))?;
                    let w = pipeline_windows(&m.tokenizer, &p, cal, a.calibration_tokens)?;
                    (w.windows.clone(), Some(p.path.clone()), Some(w))
                }
                None => {
                    let docs = read_texts(cal)?;
                    (token_windows(&m.tokenizer, &docs, a.calibration_ctx, a.calibration_tokens)?, None, None)
                }
            };
            if windows.is_empty() {
                return Err(usage(format!("calibration file {} holds no tokens", cal.display())));
            }
            let longest = windows.iter().map(Vec::len).max().unwrap_or(0);
            eprintln!("calibration: {} windows of up to {longest} tokens on {}", windows.len(), device.name());
            let im = calibrate(&m, &windows, &cal.display().to_string(), device)?;
            let name = a.imatrix_out.as_ref().map_or_else(|| cal.display().to_string(), |p| p.display().to_string());
            let tokens = windows.iter().map(|w| w.len() as u64).sum::<u64>();
            let info = CalibrationInfo {
                file: cal.clone(),
                device: device.name(),
                tokens,
                windows: windows.len(),
                pipeline,
                prompts,
            };
            (Some(im), name, Some(info))
        }
        (None, None) => (None, String::new(), None),
    };
    let mut imatrix_written = None;
    if let (Some(m), Some(p)) = (&imatrix, &a.imatrix_out) {
        m.save(p)?;
        imatrix_written = Some(p.clone());
    }
    let opts = QuantizeOptions { qtype, allow_requantize: a.allow_requantize, imatrix: imatrix.as_ref(), imatrix_name };
    let report = quantize_gguf(&src, &a.output, &opts)?;
    let report_path = crate::commands::convert::report_path(&a.output);
    // Written whole under a temporary name and renamed: a failure (a full disk) leaves no
    // truncated report; the first one also removes the output, so the same command runs again
    // (an output without its report would be refused as existing).
    let write_report = |verify: Option<&Verify>| -> anyhow::Result<()> {
        let file = ReportFile { report: &report, calibration: calibration.as_ref(), verify };
        let text = serde_json::to_string_pretty(&file)?;
        let tmp = PathBuf::from(format!("{}.tmp", report_path.display()));
        let written = std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, &report_path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(anyhow::anyhow!("cannot write {}: {e}", report_path.display()));
        }
        Ok(())
    };
    if let Err(e) = write_report(None) {
        let _ = std::fs::remove_file(&a.output);
        return Err(e.context(format!("{} removed: run the same command again", a.output.display())));
    }
    // The file is whole: a signal from here on ends the process (the verification has no
    // point to stop at).
    crate::sys::interrupt::finish(|| format!("after {} was written, before its verification", a.output.display()))?;
    // Against the source as given (an HF directory's BF16 weights computed in f32).
    let verify = if a.verify || a.verify_max_kl.is_some() {
        let v = verify(&a.output, &a.model, a.verify_max_kl)?;
        write_report(Some(&v))?;
        Some(v)
    } else {
        None
    };
    let calibration_tokens = calibration.as_ref().map(|c| c.tokens);
    Ok(QuantizeSummary { report_path, report, calibration_tokens, calibration, imatrix_written, verify })
}
