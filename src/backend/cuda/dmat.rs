//! Weight matrices on the device, carrying their format: F16 (converted from F16/BF16/F32 files,
//! or from block formats with `--weights f16`) or a GGML block format kept packed in the GPU
//! layout of `qformat`. A `Linear` is one or more such matrices stacked along rows (QKV,
//! gate/up): consecutive tensors of one format share a part, so one kernel reads their shared
//! input once; a mixed set (Q4_K_M's Q6_K attn_v beside Q4_K q/k) keeps a part per format.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::compile::kernels::Kernels;
use super::ops::embedding::FillUniform;
use super::ops::launch::Dev;
use super::ops::qlaunch::{FillQuant, QView};
use super::qformat::QFormat;
use super::weights::tensor_to_f16;
use super::CudaError;
use crate::model::quant::{quantize_row, GgmlType};
use crate::model::synth_scale::Scale;
use crate::model::weights::Tensor;

pub enum MatData {
    /// `[rows, cols]` F16.
    F16(CudaSlice<u16>),
    /// qs then aux (at `aux_off` bytes) in `fmt`'s layout.
    Quant { fmt: QFormat, buf: CudaSlice<u8>, aux_off: usize },
}

pub struct DevMat {
    pub rows: usize,
    pub cols: usize,
    pub data: MatData,
}

impl DevMat {
    /// Device bytes of the matrix (what one GEMV over it reads).
    pub fn bytes(&self) -> u64 {
        match &self.data {
            MatData::F16(_) => (self.rows * self.cols * 2) as u64,
            MatData::Quant { fmt, .. } => fmt.device_bytes(self.rows, self.cols).1 as u64,
        }
    }

    /// Bytes of one row (an embedding lookup reads one).
    pub fn row_bytes(&self) -> u64 {
        match &self.data {
            MatData::F16(_) => (self.cols * 2) as u64,
            MatData::Quant { fmt, .. } => {
                let (q, a) = fmt.row_parts(self.cols);
                (q + a) as u64
            }
        }
    }

    /// The format name (`F16`, `Q4_K`, ...).
    pub fn format(&self) -> GgmlType {
        match &self.data {
            MatData::F16(_) => GgmlType::F16,
            MatData::Quant { fmt, .. } => fmt.dtype,
        }
    }

    pub fn f16(&self, s: &CudaStream) -> Option<Dev<u16>> {
        match &self.data {
            MatData::F16(w) => Some(Dev::of(w, s)),
            MatData::Quant { .. } => None,
        }
    }

    pub fn quant(&self, s: &CudaStream) -> Option<QView> {
        match &self.data {
            MatData::F16(_) => None,
            MatData::Quant { fmt, buf, aux_off } => {
                Some(QView { fmt: *fmt, buf: Dev::of(buf, s), aux_off: *aux_off, rows: self.rows, cols: self.cols })
            }
        }
    }

    /// Tensors of one format and width stacked along rows, uploaded in the GPU layout of that
    /// format (or as F16 when `to_f16`, or when the format is a float type). Returns the matrix
    /// and the count of values clamped to the F16 range.
    pub fn upload(s: &Arc<CudaStream>, ts: &[&Tensor], to_f16: bool, what: &str) -> Result<(DevMat, u64), CudaError> {
        let cols = ts.first().map_or(0, |t| t.cols);
        let rows = ts.iter().map(|t| t.rows).sum();
        if let Some(t) = ts.iter().find(|t| t.cols != cols || (!to_f16 && t.dtype != ts[0].dtype)) {
            return Err(CudaError::Weights(format!(
                "tensor {} ({}, {} wide) cannot stack with {}",
                t.name, t.dtype, t.cols, ts[0].name
            )));
        }
        let fmt = ts.first().and_then(|t| QFormat::of(t.dtype)).filter(|_| !to_f16);
        let Some(fmt) = fmt else {
            let mut v = Vec::with_capacity(rows * cols);
            let mut clamped = 0;
            for t in ts {
                let (h, c) = tensor_to_f16(t)?;
                v.extend_from_slice(&h);
                clamped += c;
            }
            let w = s.clone_htod(&v).map_err(CudaError::driver(format!("uploading {what}")))?;
            return Ok((DevMat { rows, cols, data: MatData::F16(w) }, clamped));
        };
        let parts: Vec<&[u8]> = ts.iter().map(|t| t.bytes()).collect();
        let (img, aux_off) = fmt.repack_parts(&parts, rows, cols);
        let buf = s.clone_htod(&img).map_err(CudaError::driver(format!("uploading {what}")))?;
        Ok((DevMat { rows, cols, data: MatData::Quant { fmt, buf, aux_off } }, 0))
    }

    /// A `[rows, cols]` matrix of random weights made on the GPU from `seed`, uniform in
    /// +-`scale`'s amplitude (F16; `Scale::Matrix`: +-sqrt(3 / cols)), or (block formats) random
    /// codes with scales taken from host-quantized blocks of such values: the same byte count
    /// and value spread as a real file of the format.
    pub fn synthetic(
        s: &Arc<CudaStream>,
        k: &mut Kernels,
        dtype: GgmlType,
        rows: usize,
        cols: usize,
        (scale, seed): (Scale, u64),
        what: &str,
    ) -> Result<DevMat, CudaError> {
        let alloc = |n: usize| {
            // SAFETY: every element is written by the fill kernels below before any read.
            unsafe { s.alloc::<u8>(n.max(1)) }.map_err(CudaError::driver(format!("allocating {what} ({rows}x{cols})")))
        };
        let scale = scale.amplitude(cols.max(1));
        let Some(fmt) = QFormat::of(dtype) else {
            // SAFETY: every element is written by the fill kernel before any read.
            let buf = unsafe { s.alloc::<u16>((rows * cols).max(1)) }
                .map_err(CudaError::driver(format!("allocating {what} ({rows}x{cols})")))?;
            FillUniform { out: Dev::of(&buf, s), seed, scale }.launch(k, s)?;
            return Ok(DevMat { rows, cols, data: MatData::F16(buf) });
        };
        if !cols.is_multiple_of(dtype.block_size()) {
            return Err(CudaError::Weights(format!("{what}: {cols} columns are not whole {dtype} blocks")));
        }
        // 64 template blocks of the format, quantized on the host from uniform values.
        let mut rng = StdRng::seed_from_u64(seed);
        let n_tmpl = 64;
        let vals: Vec<f32> = (0..n_tmpl * dtype.block_size()).map(|_| rng.random_range(-scale..scale)).collect();
        let (img, aux_off) = fmt.repack(&quantize_row(dtype, &vals), 1, vals.len());
        let tmpl = s.clone_htod(&img[aux_off..]).map_err(CudaError::driver("uploading weight templates"))?;
        let (aux_off, total) = fmt.device_bytes(rows, cols);
        let buf = alloc(total)?;
        let w = QView { fmt, buf: Dev::of(&buf, s), aux_off, rows, cols };
        FillQuant { w, tmpl: Dev::of(&tmpl, s), seed }.launch(k, s)?;
        // The template buffer must outlive the kernel that reads it.
        s.synchronize().map_err(CudaError::driver("filling synthetic weights"))?;
        Ok(DevMat { rows, cols, data: MatData::Quant { fmt, buf, aux_off } })
    }
}

/// One or more matrices of the same width stacked along rows; part `i` gives output rows
/// `offset(i) ..` of the product.
pub struct Linear {
    pub parts: Vec<DevMat>,
}

impl Linear {
    pub fn rows(&self) -> usize {
        self.parts.iter().map(|p| p.rows).sum()
    }

    pub fn cols(&self) -> usize {
        self.parts.first().map_or(0, |p| p.cols)
    }

    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(DevMat::bytes).sum()
    }

    /// Uploads `ts` (stacked in order), grouping consecutive tensors of one format into one part.
    pub fn upload(s: &Arc<CudaStream>, ts: &[&Tensor], to_f16: bool, what: &str) -> Result<(Linear, u64), CudaError> {
        let mut parts = Vec::new();
        let mut clamped = 0;
        let mut i = 0;
        while i < ts.len() {
            let same = |t: &Tensor| to_f16 || t.dtype == ts[i].dtype;
            let n = ts[i..].iter().take_while(|t| same(t)).count();
            let (m, c) = DevMat::upload(s, &ts[i..i + n], to_f16, what)?;
            parts.push(m);
            clamped += c;
            i += n;
        }
        Ok((Linear { parts }, clamped))
    }
}
