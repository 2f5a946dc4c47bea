//! GGUF -> GGUF quantization, one tensor at a time: the source is memory-mapped, each tensor is
//! widened row by row, quantized in parallel row ranges and written before the next is read, so
//! only one tensor of the output is ever in memory.
//!
//! Metadata is copied in the source's order, except `general.alignment` (the writer sets 32),
//! `general.file_type` and `general.quantization_version` (set for the new type, as llama.cpp
//! sets them); with an importance matrix the `quantize.imatrix.*` keys llama.cpp writes are added.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::imatrix::Imatrix;
use super::mix::{choose_in, MixModel, QuantType};
use super::{quantize_tensor, ErrorSums, QuantizeError};
use crate::model::gguf::{GgufFile, Value};
use crate::model::gguf_writer::{write_gguf, TensorOut};
use crate::model::quant::GgmlType;

/// GGML's quantization version of the block formats written here.
const QUANTIZATION_VERSION: u32 = 2;

pub struct QuantizeOptions<'a> {
    pub qtype: QuantType,
    pub allow_requantize: bool,
    pub imatrix: Option<&'a Imatrix>,
    /// Shown in the metadata and the report (the file given or written).
    pub imatrix_name: String,
}

/// One line of `<output>.report.json`.
#[derive(Clone, Debug, Serialize)]
pub struct TensorLine {
    pub name: String,
    /// Row-major, outermost first.
    pub shape: Vec<usize>,
    pub from: String,
    pub to: String,
    /// The type the mix rules asked for, when the row length forced another.
    pub fallback_from: Option<String>,
    pub bytes: usize,
    /// `sum (x - x̂)^2 / sum x^2` over the tensor.
    pub relative_error: f64,
    /// The same with each element weighted by its input column's importance (with an
    /// importance matrix that has this tensor).
    pub weighted_relative_error: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct QuantizeReport {
    pub format_version: u32,
    pub source: PathBuf,
    pub output: PathBuf,
    #[serde(rename = "type")]
    pub qtype: &'static str,
    pub file_type: u32,
    pub imatrix: Option<String>,
    /// Matrices quantized without importance because the matrix had no entry (with an
    /// importance matrix). The embedding table of an untied model is one by nature: it is
    /// looked up, never multiplied, so no activation reaches it (llama.cpp's has none either).
    pub missing_importance: Vec<String>,
    /// Experts of stacked tensors (`M[e]`) that no calibration token was routed to, each with
    /// its fallback: `gate`/`up` take the importance of their layer's router input (the same
    /// normed hidden state every expert of the layer reads, over every token), `down` uniform
    /// weights (its input is the expert's own activations, which nothing else measures).
    pub unrouted_experts: Vec<String>,
    /// How many of the stacked tensors' expert matrices had importance of their own.
    pub routed_expert_matrices: usize,
    pub tensors_in: usize,
    pub bytes_in: usize,
    pub bytes_out: usize,
    /// Bits per weight of the output's tensor data.
    pub bits_per_weight: f64,
    /// "name: wanted -> used" for every fallback.
    pub fallbacks: Vec<String>,
    pub seconds: f64,
    pub tensors: Vec<TensorLine>,
}

/// The number of transformer blocks (`{arch}.block_count`, else counted from `blk.N` names).
fn n_layers(g: &GgufFile) -> usize {
    let arch = g.get_str("general.architecture").ok().flatten().unwrap_or("llama").to_string();
    g.get_u64(&format!("{arch}.block_count")).ok().flatten().map(|v| v as usize).unwrap_or_else(|| {
        g.tensors
            .iter()
            .filter_map(|t| t.name.strip_prefix("blk.")?.split('.').next()?.parse::<usize>().ok())
            .max()
            .map_or(0, |m| m + 1)
    })
}

/// The importance an unrouted expert's matrix of stacked tensor `name` falls back on: for
/// `ffn_gate_exps` / `ffn_up_exps`, the layer's router input (`ffn_gate_inp`, every token's
/// normed hidden state, which is what the expert would have read); `None` (uniform weights)
/// for `ffn_down_exps`.
fn expert_fallback(m: &Imatrix, name: &str) -> Option<Vec<f32>> {
    let layer = name.strip_suffix(".ffn_gate_exps.weight").or_else(|| name.strip_suffix(".ffn_up_exps.weight"))?;
    m.importance(&format!("{layer}.ffn_gate_inp.weight"))
}

fn is_float(t: GgmlType) -> bool {
    matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Quantizes the GGUF file `src` into `out` (written as `out.partial`, renamed when complete).
pub fn quantize_gguf(src: &Path, out: &Path, o: &QuantizeOptions) -> Result<QuantizeReport, QuantizeError> {
    let t0 = Instant::now();
    let g = GgufFile::open(src)?;
    // Only the families dustoff runs: another would be written as if it were llama-like (its
    // keys and tensor kinds guessed) into a file no command loads.
    let arch = match g.get_str("general.architecture").ok().flatten() {
        Some(a) if crate::model::arch::by_gguf_name(a).is_some() => a.to_string(),
        Some(a) => {
            return Err(QuantizeError::Usage(format!(
                "{}: architecture '{a}' is not one dustoff runs ({}); nothing was written",
                src.display(),
                crate::model::arch::gguf_names()
            )))
        }
        None => {
            return Err(QuantizeError::Usage(format!(
                "{}: no general.architecture key: not a model file (an importance matrix?); nothing was written",
                src.display()
            )))
        }
    };
    let mix = MixModel {
        tied_head: g.tensor_info("output.weight").is_none(),
        n_layers: n_layers(&g),
        n_experts: g.get_u64(&format!("{arch}.expert_count")).ok().flatten().unwrap_or(0) as usize,
        has_imatrix: o.imatrix.is_some(),
    };
    let mut plan = Vec::with_capacity(g.tensors.len());
    for t in &g.tensors {
        let shape: Vec<usize> = t.dims.iter().rev().map(|&d| d as usize).collect();
        let ch = choose_in(o.qtype, &t.name, &shape, &mix);
        if ch.dtype != GgmlType::F32 && !is_float(t.dtype) && !o.allow_requantize {
            return Err(QuantizeError::Requantize { path: src.to_path_buf(), tensor: t.name.clone(), dtype: t.dtype });
        }
        plan.push((TensorOut { name: t.name.clone(), dtype: ch.dtype, shape }, ch.fallback_from));
    }

    let mut kv: Vec<(String, Value)> = Vec::new();
    for k in &g.metadata_order {
        if matches!(k.as_str(), "general.alignment" | "general.file_type" | "general.quantization_version") {
            continue;
        }
        if let Some(v) = g.get(k) {
            kv.push((k.clone(), v.clone()));
        }
    }
    let at = kv.iter().position(|(k, _)| !k.starts_with("general.")).unwrap_or(kv.len());
    kv.insert(at, ("general.file_type".into(), Value::U32(o.qtype.file_type())));
    kv.insert(at + 1, ("general.quantization_version".into(), Value::U32(QUANTIZATION_VERSION)));
    if let Some(m) = o.imatrix {
        kv.push(("quantize.imatrix.file".into(), Value::String(o.imatrix_name.clone())));
        kv.push(("quantize.imatrix.dataset".into(), Value::String(m.dataset.clone())));
        kv.push(("quantize.imatrix.entries_count".into(), Value::I32(m.entries.len() as i32)));
        kv.push(("quantize.imatrix.chunks_count".into(), Value::I32(m.chunks as i32)));
    }

    let total: u64 = g.tensors.iter().map(|t| t.n_elements()).sum();
    let mut pb = super::calibrate::Progress::new(total, "weights");
    let mut lines = Vec::with_capacity(plan.len());
    let mut missing = Vec::new();
    let (mut unrouted, mut routed) = (Vec::new(), 0usize);
    let outs: Vec<TensorOut> = plan.iter().map(|p| p.0.clone()).collect();
    let written = write_gguf(out, &kv, &outs, |i| -> Result<Vec<u8>, QuantizeError> {
        let (info, (t, fb)) = (&g.tensors[i], &plan[i]);
        let (rows, cols) = (info.n_rows(), info.row_len());
        let data = g.tensor_data(info);
        let fail = |reason: String| QuantizeError::Tensor { path: src.to_path_buf(), tensor: t.name.clone(), reason };
        let same = t.dtype == info.dtype;
        let calibrated = o.imatrix.filter(|_| !is_float(t.dtype) && !same);
        // A stacked tensor `[n_experts, rows, cols]`: one matrix per expert, each with its own
        // importance (`M[e]`), quantized slab by slab.
        let n_mat = if t.shape.len() == 3 { t.shape[0] } else { 1 };
        let (bytes, e) = if same {
            // Same type: the bytes as they are (no second rounding).
            (data.to_vec(), ErrorSums::default())
        } else if n_mat > 1 {
            let per = rows / n_mat;
            let slab = data.len() / n_mat;
            let (mut bytes, mut sums) = (Vec::new(), ErrorSums::default());
            let mut any = false;
            for ex in 0..n_mat {
                let imp = calibrated.and_then(|m| {
                    let own = m.importance(&format!("{}[{ex}]", t.name));
                    any |= own.is_some();
                    own.or_else(|| {
                        let fb = expert_fallback(m, &t.name);
                        unrouted.push(format!(
                            "{}[{ex}]: {}",
                            t.name,
                            if fb.is_some() { "router input" } else { "uniform" }
                        ));
                        fb
                    })
                });
                let imp = imp.filter(|v| v.len() == cols);
                let (b, es) =
                    quantize_tensor(info.dtype, &data[ex * slab..(ex + 1) * slab], per, cols, t.dtype, imp.as_deref())
                        .ok_or_else(|| fail(format!("cannot convert {} rows of {cols} to {}", info.dtype, t.dtype)))?;
                bytes.extend_from_slice(&b);
                sums.add(&es);
            }
            if calibrated.is_some() {
                if any {
                    routed += n_mat - unrouted.iter().filter(|u| u.starts_with(&format!("{}[", t.name))).count();
                } else {
                    missing.push(t.name.clone());
                }
            }
            (bytes, sums)
        } else {
            let imp = calibrated.and_then(|m| {
                let v = m.importance(&t.name);
                if v.is_none() {
                    missing.push(t.name.clone());
                }
                v.filter(|v| v.len() == cols)
            });
            quantize_tensor(info.dtype, data, rows, cols, t.dtype, imp.as_deref())
                .ok_or_else(|| fail(format!("cannot convert {} rows of {cols} to {}", info.dtype, t.dtype)))?
        };
        pb.inc(info.n_elements());
        lines.push(TensorLine {
            name: t.name.clone(),
            shape: t.shape.clone(),
            from: info.dtype.name().into(),
            to: t.dtype.name().into(),
            fallback_from: fb.map(|f| f.name().to_string()),
            bytes: bytes.len(),
            relative_error: e.relative(),
            weighted_relative_error: e.weighted_relative(),
        });
        Ok(bytes)
    });
    pb.finish();
    if let Err(e) = written {
        let _ = std::fs::remove_file(out.with_extension("gguf.partial"));
        return Err(e);
    }
    let bytes_out: usize = lines.iter().map(|l| l.bytes).sum();
    let weights: u64 = g.tensors.iter().map(|t| t.n_elements()).sum();
    Ok(QuantizeReport {
        format_version: 1,
        source: src.to_path_buf(),
        output: out.to_path_buf(),
        qtype: o.qtype.name(),
        file_type: o.qtype.file_type(),
        imatrix: o.imatrix.map(|_| o.imatrix_name.clone()),
        missing_importance: missing,
        unrouted_experts: unrouted,
        routed_expert_matrices: routed,
        tensors_in: g.tensors.len(),
        bytes_in: g.tensors.iter().map(|t| t.n_bytes).sum(),
        bytes_out,
        bits_per_weight: 8.0 * bytes_out as f64 / weights.max(1) as f64,
        fallbacks: lines
            .iter()
            .filter_map(|l| l.fallback_from.as_ref().map(|f| format!("{}: {f} -> {}", l.name, l.to)))
            .collect(),
        seconds: t0.elapsed().as_secs_f64(),
        tensors: lines,
    })
}
