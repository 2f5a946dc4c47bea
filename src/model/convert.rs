//! Converting a Hugging Face checkpoint (BF16, F16 or F32 safetensors) to F16, written as a
//! safetensors directory or a GGUF file, with an explicit, counted loss policy.
//!
//! Policy, value by value (`v` widened to f32 exactly):
//! - `|v| > 65504` (F16's largest finite value): written as ±65504, counted `clamped`;
//! - `v != 0` that rounds to zero in F16 (`|v| < 2^-25`): counted `underflowed`;
//! - `v` landing in F16's subnormal range (`|result| < 2^-14`, non-zero): counted `subnormal`
//!   (kept, with fewer significant bits);
//! - NaN and ±inf: kept as they are (the conversion does not hide a broken checkpoint) and
//!   counted `non_finite`; any non-finite value fails the conversion unless lossy is allowed;
//! - everything else rounds to nearest even. BF16 has 8 significant bits and F16 11, so a BF16
//!   value in F16's normal range converts exactly; an F32 source rounds (counted `inexact`).
//!
//! A tensor is *lossy* when `clamped + underflowed` exceeds `max_lossy_fraction` of its values
//! or it holds a non-finite value. Norms and biases go to F32 in GGUF (exact widening).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::gguf_writer::{permute_qk_rows, TensorOut};
use super::hf::PlannedTensor;
use super::quant::{dequantize_row, GgmlType, F16_MAX};
use super::safetensors::SafetensorsDir;

/// Smallest positive normal F16 (2^-14).
const F16_MIN_NORMAL: f32 = 6.103_515_6e-5;

/// What happened to the values of one tensor.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Counts {
    pub elements: u64,
    pub clamped: u64,
    pub underflowed: u64,
    pub subnormal: u64,
    pub non_finite: u64,
    /// Values whose F16 differs from the source value (includes the three above).
    pub inexact: u64,
    /// Largest finite |value| of the source.
    pub max_abs: f32,
}

impl Counts {
    pub fn is_lossy(&self, max_lossy_fraction: f64) -> bool {
        self.non_finite > 0 || (self.clamped + self.underflowed) as f64 > max_lossy_fraction * self.elements as f64
    }
}

/// The F16 bits of `v` under the policy, counting what happened in `c`.
pub fn f16_policy(v: f32, c: &mut Counts) -> u16 {
    c.elements += 1;
    if !v.is_finite() {
        c.non_finite += 1;
        return half::f16::from_f32(v).to_bits();
    }
    let a = v.abs();
    c.max_abs = c.max_abs.max(a);
    let h = if a > F16_MAX {
        c.clamped += 1;
        half::f16::from_bits(super::quant::f32_to_f16(v))
    } else {
        let h = half::f16::from_f32(v);
        let ha = h.to_f32().abs();
        if ha == 0.0 && v != 0.0 {
            c.underflowed += 1;
        } else if ha != 0.0 && ha < F16_MIN_NORMAL {
            c.subnormal += 1;
        }
        h
    };
    if h.to_f32() != v {
        c.inexact += 1;
    }
    h.to_bits()
}

/// Converts a packed float row (`BF16`, `F16` or `F32` bytes) to F16 bytes under the policy.
pub fn to_f16(ty: GgmlType, src: &[u8], c: &mut Counts) -> Vec<u8> {
    let n = src.len() / ty.type_size();
    let mut wide = vec![0f32; n];
    dequantize_row(ty, src, &mut wide);
    let mut out = Vec::with_capacity(n * 2);
    for v in wide {
        out.extend(f16_policy(v, c).to_le_bytes());
    }
    out
}

/// Widens a float row to F32 bytes (exact); non-finite values are counted.
pub fn to_f32(ty: GgmlType, src: &[u8], c: &mut Counts) -> Vec<u8> {
    let mut wide = vec![0f32; src.len() / ty.type_size()];
    dequantize_row(ty, src, &mut wide);
    f32_bytes(&wide, c)
}

/// One line of `<output>.report.json`.
#[derive(Clone, Debug, Serialize)]
pub struct TensorReport {
    /// Source (HF) name.
    pub name: String,
    /// Name in the output (the GGUF name when writing GGUF).
    pub output_name: String,
    pub shape: Vec<usize>,
    pub from: String,
    pub to: String,
    #[serde(flatten)]
    pub counts: Counts,
    pub lossy: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(transparent)]
    Hf(#[from] super::hf::HfError),
    #[error(transparent)]
    Safetensors(#[from] super::safetensors::SafetensorsError),
    #[error(transparent)]
    GgufWrite(#[from] super::gguf_writer::GgufWriteError),
    #[error(transparent)]
    Gguf(#[from] super::gguf::GgufError),
    #[error(transparent)]
    Load(#[from] super::loader::LoadError),
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error("cannot write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Usage(String),
    #[error(
        "{n} tensor(s) would lose values beyond the threshold ({first} first; see {report}); \
         pass --allow-lossy to write them anyway"
    )]
    Lossy { n: usize, first: String, report: PathBuf },
    #[error("verification of {path} failed: {reason}")]
    Verify { path: PathBuf, reason: String },
}

/// A change of a tensor's values between the checkpoint and the GGUF file (the hybrid
/// families' conventions: see `hf_hybrid`), applied to the widened f32 values in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Transform {
    /// `1 + w`: a zero-centred RMSNorm weight as llama.cpp's converter writes it.
    AddOne,
    /// `-exp(w)`: `A_log` -> `ssm_a`.
    NegExp,
    /// Output row `r` is source row `rows[r]`, rows of `row_len` values (regrouped projections,
    /// value heads reordered, fused experts split).
    Rows { rows: Vec<usize>, row_len: usize },
    /// Output column `c` of every row is source column `cols[c]` (rows of `cols.len()` values).
    Cols(Vec<usize>),
}

impl Transform {
    /// `v` transformed, or `None` when its length does not fit the transform.
    pub fn apply(&self, v: Vec<f32>) -> Option<Vec<f32>> {
        Some(match self {
            Transform::AddOne => v.into_iter().map(|w| 1.0 + w).collect(),
            Transform::NegExp => v.into_iter().map(|w| -w.exp()).collect(),
            Transform::Rows { rows, row_len } => {
                let mut out = Vec::with_capacity(rows.len() * row_len);
                for &r in rows {
                    out.extend_from_slice(v.get(r * row_len..(r + 1) * row_len)?);
                }
                out
            }
            Transform::Cols(cols) => {
                let width = cols.len();
                let src_width = cols.iter().max().map_or(0, |m| m + 1);
                if src_width == 0 || !v.len().is_multiple_of(src_width) {
                    return None;
                }
                let mut out = Vec::with_capacity(v.len() / src_width * width);
                for row in v.chunks_exact(src_width) {
                    out.extend(cols.iter().map(|&c| row[c]));
                }
                out
            }
        })
    }
}

/// A tensor of the output: where it comes from and how it is transformed.
#[derive(Clone, Debug)]
pub struct OutTensor {
    pub source: String,
    pub out: TensorOut,
    /// Llama Q/K rows permuted for adjacent-pair RoPE (GGUF output only).
    pub permute_heads: Option<usize>,
    /// When not empty: the source tensors stacked along a new outer axis, in order (the
    /// experts of a GGUF `ffn_*_exps` tensor, `[n_experts, rows, cols]`); `source` is the first.
    pub stacked: Vec<String>,
    /// The shape of each source when it is not the output's (a transform reshapes: a conv
    /// weight `[C, 1, K]` written `[C, K]`, a fused projection split); `None`: the output's
    /// shape, without the outer axis when stacked.
    pub source_shape: Option<Vec<usize>>,
    /// Applied in order after stacking and permutation.
    pub transforms: Vec<Transform>,
}

impl OutTensor {
    /// A tensor copied from `source` (converted to `dtype`), unchanged otherwise.
    pub fn plain(source: &str, name: &str, dtype: GgmlType, shape: Vec<usize>) -> Self {
        OutTensor {
            source: source.to_string(),
            out: TensorOut { name: name.to_string(), dtype, shape },
            permute_heads: None,
            stacked: Vec::new(),
            source_shape: None,
            transforms: Vec::new(),
        }
    }

    /// The source tensors whose values, concatenated, are this tensor's.
    pub fn sources(&self) -> Vec<&str> {
        if self.stacked.is_empty() {
            vec![self.source.as_str()]
        } else {
            self.stacked.iter().map(String::as_str).collect()
        }
    }
}

/// The output tensors of a GGUF file for `plan`: matrices F16; vectors and MoE routers
/// (`ffn_gate_inp`, which llama.cpp keeps in F32 too) F32; the per-expert matrices of a layer
/// stacked into one 3-D tensor per projection, placed where its first expert was.
pub fn gguf_outputs(plan: &[PlannedTensor]) -> Vec<OutTensor> {
    let mut outs: Vec<OutTensor> = Vec::new();
    let mut stacks: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for p in plan {
        if p.expert.is_some() {
            if let Some(&i) = stacks.get(p.gguf.as_str()) {
                outs[i].stacked.push(p.hf.clone());
                outs[i].out.shape[0] += 1;
                continue;
            }
            stacks.insert(p.gguf.as_str(), outs.len());
        }
        // Vectors, the router and the shared expert's gate row stay F32 (llama.cpp's converter).
        let f32 =
            p.is_vector() || p.gguf.ends_with("ffn_gate_inp.weight") || p.gguf.ends_with("ffn_gate_inp_shexp.weight");
        let shape = if p.expert.is_some() { [&[1][..], &p.shape].concat() } else { p.shape.clone() };
        let mut t = OutTensor::plain(&p.hf, &p.gguf, if f32 { GgmlType::F32 } else { GgmlType::F16 }, shape);
        t.permute_heads = p.permute_heads;
        if p.expert.is_some() {
            t.stacked = vec![p.hf.clone()];
        }
        outs.push(t);
    }
    outs
}

/// The values of output tensor `t` computed in f32 from the checkpoint (sources widened exactly,
/// stacked, permuted, transformed), with the source's element type.
pub fn source_values(st: &SafetensorsDir, t: &OutTensor) -> Result<(GgmlType, Vec<f32>), ConvertError> {
    let stacked_part = if t.stacked.is_empty() { &t.out.shape[..] } else { &t.out.shape[1..] };
    let part_shape = t.source_shape.as_deref().unwrap_or(stacked_part);
    let mut wide = Vec::new();
    let mut ty = GgmlType::F32;
    for name in t.sources() {
        let (src_ty, shape, src) = st.read(name)?;
        if shape != part_shape {
            return Err(super::hf::HfError::Shape {
                path: st.path_of(name),
                tensor: name.to_string(),
                expected: part_shape.to_vec(),
                found: shape.to_vec(),
            }
            .into());
        }
        ty = src_ty;
        let start = wide.len();
        wide.resize(start + src.len() / src_ty.type_size(), 0f32);
        dequantize_row(src_ty, src, &mut wide[start..]);
    }
    if let Some(heads) = t.permute_heads {
        let bytes: Vec<u8> = wide.iter().flat_map(|v| v.to_le_bytes()).collect();
        let p = permute_qk_rows(&bytes, t.out.shape[0], heads);
        wide = p.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    }
    for tr in &t.transforms {
        wide = tr
            .apply(wide)
            .ok_or_else(|| ConvertError::Usage(format!("tensor '{}': the source does not fit {tr:?}", t.out.name)))?;
    }
    let want: usize = t.out.shape.iter().product();
    if wide.len() != want {
        return Err(ConvertError::Usage(format!(
            "tensor '{}': {} values from {}, {want} expected for shape {:?}",
            t.out.name,
            wide.len(),
            t.source,
            t.out.shape
        )));
    }
    Ok((ty, wide))
}

/// Produces the bytes of one output tensor from the source checkpoint, with its report.
pub fn produce(
    st: &SafetensorsDir,
    t: &OutTensor,
    max_lossy_fraction: f64,
) -> Result<(Vec<u8>, TensorReport), ConvertError> {
    let (ty, wide) = source_values(st, t)?;
    let mut c = Counts::default();
    let bytes = match t.out.dtype {
        GgmlType::F16 => wide.iter().flat_map(|&v| f16_policy(v, &mut c).to_le_bytes()).collect(),
        GgmlType::F32 => f32_bytes(&wide, &mut c),
        other => return Err(ConvertError::Usage(format!("output type {other} is not supported"))),
    };
    let lossy = c.is_lossy(max_lossy_fraction);
    let report = TensorReport {
        name: t.source.clone(),
        output_name: t.out.name.clone(),
        shape: t.out.shape.clone(),
        from: ty.name().to_string(),
        to: t.out.dtype.name().to_string(),
        counts: c,
        lossy,
    };
    Ok((bytes, report))
}

/// F32 bytes of `v` (exact); non-finite values are counted.
fn f32_bytes(v: &[f32], c: &mut Counts) -> Vec<u8> {
    c.elements += v.len() as u64;
    let mut out = Vec::with_capacity(v.len() * 4);
    for &x in v {
        if x.is_finite() {
            c.max_abs = c.max_abs.max(x.abs());
        } else {
            c.non_finite += 1;
        }
        out.extend(x.to_le_bytes());
    }
    out
}

/// The sums (and the largest |value|) over every tensor's counts.
pub fn total_counts(reports: &[TensorReport]) -> Counts {
    let mut totals = Counts::default();
    for c in reports.iter().map(|r| &r.counts) {
        totals.elements += c.elements;
        totals.clamped += c.clamped;
        totals.underflowed += c.underflowed;
        totals.subnormal += c.subnormal;
        totals.non_finite += c.non_finite;
        totals.inexact += c.inexact;
        totals.max_abs = totals.max_abs.max(c.max_abs);
    }
    totals
}

/// Writes `<output>.report.json` (`{"tensors": [...], "totals": {...}}`) at `path`.
pub fn write_report(path: &Path, reports: &[TensorReport], extra: serde_json::Value) -> Result<(), ConvertError> {
    let totals = total_counts(reports);
    let mut j = serde_json::json!({"format_version": 1, "totals": totals, "tensors": reports});
    if let (Some(o), Some(e)) = (j.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    let text = serde_json::to_string_pretty(&j).unwrap_or_default();
    std::fs::write(path, text).map_err(|source| ConvertError::Io { path: path.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quant::{f32_to_bf16, quantize_row};

    /// Values at and beyond F16's edges (range, subnormals, NaN), stored as BF16 first (as a
    /// checkpoint holds them).
    #[test]
    fn policy_on_planted_values() {
        let planted = [65504.0f32, 65520.0, 1e6, -1e6, 1e-8, f32::NAN, 1.5, -0.0, 1e-6];
        let src = quantize_row(GgmlType::BF16, &planted);
        let mut c = Counts::default();
        let out = to_f16(GgmlType::BF16, &src, &mut c);
        let vals: Vec<f32> = out.chunks(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
        // 65504 and 65520 are not BF16 values: both round to 65536 in BF16, beyond F16's range.
        assert_eq!(crate::model::quant::bf16_to_f32(f32_to_bf16(65504.0)), 65536.0);
        assert_eq!(&vals[..4], &[65504.0, 65504.0, 65504.0, -65504.0]);
        assert_eq!(vals[4], 0.0);
        assert!(vals[5].is_nan());
        assert_eq!(vals[6], 1.5);
        assert!(vals[7] == 0.0 && vals[7].is_sign_negative());
        assert!(vals[8] > 0.0 && vals[8] < F16_MIN_NORMAL);
        assert_eq!((c.clamped, c.underflowed, c.subnormal, c.non_finite), (4, 1, 1, 1));
        assert_eq!(c.max_abs, crate::model::quant::bf16_to_f32(f32_to_bf16(1e6)));
        assert!(c.is_lossy(0.5), "NaN makes a tensor lossy whatever the threshold");
        let mut ok = Counts::default();
        to_f16(GgmlType::BF16, &quantize_row(GgmlType::BF16, &[1.0, -2.0, 1e-6]), &mut ok);
        assert!(!ok.is_lossy(0.0));
    }

    #[test]
    fn every_bf16_in_the_normal_f16_range_converts_exactly() {
        let mut c = Counts::default();
        for bits in 0..=u16::MAX {
            let v = crate::model::quant::bf16_to_f32(bits);
            if v.is_finite() && (v == 0.0 || (v.abs() >= F16_MIN_NORMAL && v.abs() <= F16_MAX)) {
                let h = f16_policy(v, &mut c);
                assert_eq!(half::f16::from_bits(h).to_f32(), v, "bf16 bits {bits:#06x}");
            }
        }
        assert_eq!(c.inexact, 0);
    }
}
