//! `dustoff quantize`: a Hugging Face directory (BF16/F16/F32) or an F16/BF16/F32 GGUF to a
//! quantized GGUF, optionally calibrated with an importance matrix, with `quantize-report.json`
//! beside the output.
//!
//! An HF directory is first converted to an F16 GGUF next to the output (`dustoff convert`'s
//! exact BF16 -> F16 policy; removed afterwards), which is then quantized tensor by tensor; the
//! calibration runs on that F16 model on the CPU backend.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::commands::convert::ConvertArgs;
use crate::commands::eval::{self, EvalArgs, EvalSummary};
use crate::model::loader::load_model;
use crate::quantize::calibrate::{calibrate, read_texts, token_windows};
use crate::quantize::imatrix::Imatrix;
use crate::quantize::mix::{QuantType, TYPE_NAMES};
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
        }
    }
}

#[derive(Debug, Serialize)]
pub struct QuantizeSummary {
    pub report_path: PathBuf,
    pub report: QuantizeReport,
    pub calibration_tokens: Option<u64>,
    pub imatrix_written: Option<PathBuf>,
    pub verify: Option<EvalSummary>,
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
        if let Some(t) = self.calibration_tokens {
            s += &format!("calibration: {t} tokens\n");
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

fn usage(msg: String) -> anyhow::Error {
    QuantizeError::Usage(msg).into()
}

pub fn run(a: &QuantizeArgs) -> anyhow::Result<QuantizeSummary> {
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
    if a.calibration_ctx < 8 {
        return Err(usage("--calibration-ctx must be at least 8".into()));
    }
    let pool = match a.threads {
        Some(n) => Some(rayon::ThreadPoolBuilder::new().num_threads(n.max(1)).build()?),
        None => None,
    };
    match &pool {
        Some(p) => p.install(|| quantize(a, qtype)),
        None => quantize(a, qtype),
    }
}

/// The F16 GGUF made from an HF directory, removed when dropped.
struct TempSource(PathBuf);
impl Drop for TempSource {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn quantize(a: &QuantizeArgs, qtype: QuantType) -> anyhow::Result<QuantizeSummary> {
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

    let (imatrix, imatrix_name, cal_tokens) = match (&a.imatrix, &a.calibration) {
        (Some(p), _) => (Some(Imatrix::load(p)?), p.display().to_string(), None),
        (None, Some(cal)) => {
            let m = load_model(&src)?;
            let docs = read_texts(cal)?;
            let windows = token_windows(&m.tokenizer, &docs, a.calibration_ctx, a.calibration_tokens)?;
            if windows.is_empty() {
                return Err(usage(format!("calibration file {} holds no tokens", cal.display())));
            }
            eprintln!("calibration: {} windows of up to {} tokens on the CPU", windows.len(), a.calibration_ctx);
            let im = calibrate(&m, &windows, &cal.display().to_string())?;
            let name = a.imatrix_out.as_ref().map_or_else(|| cal.display().to_string(), |p| p.display().to_string());
            (Some(im), name, Some(windows.iter().map(|w| w.len() as u64).sum::<u64>()))
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
    let report_path = a.output.parent().unwrap_or(Path::new(".")).join("quantize-report.json");
    let text = serde_json::to_string_pretty(&report)?;
    std::fs::write(&report_path, text).map_err(|source| QuantizeError::Io { path: report_path.clone(), source })?;
    let verify = if a.verify {
        Some(eval::run(&EvalArgs {
            models: vec![a.output.clone()],
            reference: Some(src.clone()),
            text: None,
            ctx: 128,
            max_tokens: 512,
        })?)
    } else {
        None
    };
    Ok(QuantizeSummary { report_path, report, calibration_tokens: cal_tokens, imatrix_written, verify })
}
