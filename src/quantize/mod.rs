//! Quantizing a model: block quantizers with importance weights ([`blocks`], [`search`]), the
//! tensor-type mix rules ([`mix`]), the importance matrix and its file ([`imatrix`]), calibration
//! on the CPU backend ([`calibrate`]) and the streaming GGUF -> GGUF writer ([`write`]).

pub mod blocks;
pub mod calibrate;
pub mod imatrix;
pub mod mix;
pub mod prompts;
pub mod search;
#[cfg(test)]
mod tests;
pub mod write;

use std::path::PathBuf;

use rayon::prelude::*;
use serde::Serialize;

use crate::model::quant::{dequantize_row, GgmlType};

#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    /// Bad flags or arguments (exit code 2).
    #[error("{0}")]
    Usage(String),
    #[error(
        "{path}: tensor '{tensor}' is already quantized ({dtype}); quantizing it again adds the new \
         format's rounding error on top of the old one (quality is lost twice, and calibration cannot \
         recover what the first quantization removed). Pass --allow-requantize to do it anyway, or \
         start from the F16/BF16/F32 model"
    )]
    Requantize { path: PathBuf, tensor: String, dtype: GgmlType },
    #[error("{path}: tensor '{tensor}': {reason}")]
    Tensor { path: PathBuf, tensor: String, reason: String },
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {reason}")]
    Calibration { path: PathBuf, reason: String },
    #[error(transparent)]
    Gguf(#[from] crate::model::gguf::GgufError),
    #[error(transparent)]
    GgufWrite(#[from] crate::model::gguf_writer::GgufWriteError),
    #[error(transparent)]
    Imatrix(#[from] imatrix::ImatrixError),
    #[error(transparent)]
    Load(#[from] crate::model::loader::LoadError),
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error("calibration on the GPU: {0}")]
    Cuda(#[from] crate::backend::cuda::CudaError),
    #[error(transparent)]
    Pipeline(#[from] crate::job::pipeline::PipelineError),
    #[error(transparent)]
    Records(#[from] crate::job::reader::ReadError),
    #[error("{0}")]
    Interrupted(#[from] crate::sys::interrupt::Interrupted),
}

impl QuantizeError {
    /// True for errors the user fixes by changing the command line (exit code 2).
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::Usage(_) | Self::Requantize { .. })
            || matches!(self, Self::Pipeline(p) if !matches!(p, crate::job::pipeline::PipelineError::Io { .. }))
    }
}

/// Squared-error sums of one quantized tensor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ErrorSums {
    /// `sum (x - x̂)^2` and `sum x^2` over every element.
    pub sq_err: f64,
    pub sq_ref: f64,
    /// The same weighted by the importance of each element's input column (0 without one).
    pub w_err: f64,
    pub w_ref: f64,
}

impl ErrorSums {
    fn add(&mut self, o: &ErrorSums) {
        self.sq_err += o.sq_err;
        self.sq_ref += o.sq_ref;
        self.w_err += o.w_err;
        self.w_ref += o.w_ref;
    }
    /// `sum (x - x̂)^2 / sum x^2`.
    pub fn relative(&self) -> f64 {
        if self.sq_ref > 0.0 {
            self.sq_err / self.sq_ref
        } else {
            0.0
        }
    }
    /// The importance-weighted relative error (`None` without importance).
    pub fn weighted_relative(&self) -> Option<f64> {
        (self.w_ref > 0.0).then(|| self.w_err / self.w_ref)
    }
}

/// Elements per rayon task (a range of whole rows).
const TASK_ELEMENTS: usize = 1 << 16;

/// The least-squares weights of one matrix's columns from its importance (`[cols]`): the mean
/// squared activations divided by their mean, floored at 1e-3 so that a column no calibration
/// token touched still gets a fit. `None` (or an all-zero importance): uniform weights.
///
/// NOTE: a common factor does not change the weighted fit, but the magnitude matters to the CPU:
/// with the raw importances (1e-5 to 1e1 on the sample model) the Q5_0 search took 2.6-3.7x the
/// time it took with the same importances times 1e6 (same result), as subnormal f32 arithmetic
/// behaves on x86. Mean 1 keeps the weights at the unweighted search's scale.
pub fn column_weights(importance: Option<&[f32]>, cols: usize) -> Vec<f32> {
    match importance {
        Some(imp) if imp.len() == cols => {
            let mean = imp.iter().map(|&v| f64::from(v)).sum::<f64>() / cols.max(1) as f64;
            if mean > 0.0 && mean.is_finite() {
                let inv = 1.0 / mean;
                imp.iter().map(|&v| if v.is_finite() { (f64::from(v) * inv).max(1e-3) as f32 } else { 1e-3 }).collect()
            } else {
                vec![1.0; cols]
            }
        }
        _ => vec![1.0; cols],
    }
}

/// The per-element weights of one row `x` quantized to `dtype`, from its column weights. For
/// Q4_0 `col_w[c] * sqrt(s2 + x_c^2)` with `s2` the row's mean square (llama.cpp's convention
/// for weighted quantization: it favours the large weights); for every other type `col_w[c]`.
/// Measured on the sample model (docs/BENCHMARKS.md, 2026-12-01): the magnitude factor lowered
/// q4_0's mean KL divergence 0.243 -> 0.231 but raised q4_k_m's (mostly Q5_0) 0.038 -> 0.040.
pub fn row_weights(dtype: GgmlType, col_w: &[f32], x: &[f32], out: &mut [f32]) {
    if dtype != GgmlType::Q4_0 {
        out.copy_from_slice(&col_w[..out.len()]);
        return;
    }
    let s2 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len().max(1) as f64;
    let s2 = s2 as f32;
    for ((o, &c), &v) in out.iter_mut().zip(col_w).zip(x) {
        *o = c * (s2 + v * v).sqrt();
    }
}

/// Quantizes a `[rows, cols]` tensor stored as `src_ty` rows (`src`) to `dst`, in parallel over
/// row ranges. `importance` (`[cols]`) weights the fit and the weighted error. Returns the packed
/// bytes and the error sums. The caller has checked that `dst` holds rows of `cols`.
pub fn quantize_tensor(
    src_ty: GgmlType,
    src: &[u8],
    rows: usize,
    cols: usize,
    dst: GgmlType,
    importance: Option<&[f32]>,
) -> Option<(Vec<u8>, ErrorSums)> {
    let src_rb = src_ty.row_bytes(cols)?;
    let dst_rb = dst.row_bytes(cols)?;
    if src.len() != src_rb.checked_mul(rows)? {
        return None;
    }
    let w = column_weights(importance, cols);
    let imp = importance.filter(|i| i.len() == cols);
    let rows_per_task = (TASK_ELEMENTS / cols.max(1)).max(1);
    let parts: Vec<Option<(Vec<u8>, ErrorSums)>> = src
        .par_chunks(src_rb * rows_per_task)
        .map(|chunk| {
            let mut out = Vec::with_capacity(chunk.len() / src_rb * dst_rb);
            let (mut x, mut y, mut rw) = (vec![0f32; cols], vec![0f32; cols], vec![0f32; cols]);
            let mut e = ErrorSums::default();
            for row in chunk.chunks_exact(src_rb) {
                dequantize_row(src_ty, row, &mut x);
                row_weights(dst, &w, &x, &mut rw);
                if !blocks::quantize_row_weighted(dst, &x, &rw, &mut out, &mut y) {
                    return None;
                }
                for c in 0..cols {
                    let (d, r) = (f64::from(x[c] - y[c]), f64::from(x[c]));
                    e.sq_err += d * d;
                    e.sq_ref += r * r;
                    if let Some(imp) = imp {
                        e.w_err += f64::from(imp[c]) * d * d;
                        e.w_ref += f64::from(imp[c]) * r * r;
                    }
                }
            }
            Some((out, e))
        })
        .collect();
    let mut bytes = Vec::with_capacity(rows * dst_rb);
    let mut sums = ErrorSums::default();
    for p in parts {
        let (b, e) = p?;
        bytes.extend_from_slice(&b);
        sums.add(&e);
    }
    Some((bytes, sums))
}
