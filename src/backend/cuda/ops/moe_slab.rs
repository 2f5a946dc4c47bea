//! What the launchers of the MoE kernel files (moe.cu, moe_q8.cu, the shared expert) share:
//! one expert slab's (all experts' `[rows, cols]` matrices of one projection stacked in one
//! buffer) device bytes and kernel view, and the inputs of the pair-mode down + weighted sum,
//! which both moe.cu (f32 activations) and moe_q8.cu (int8) launch, and the row-walk sizes that
//! close both files' pair-mode parameter structs.

use cudarc::driver::CudaStream;

use super::super::dmat::{DevMat, MatData};
use super::super::qformat::QFormat;
use super::super::CudaError;
use super::launch::{check, grid_yz, i32_of, need, Dev};
use crate::model::quant::GgmlType;

/// Device bytes of a `[rows, cols]` slab of `dtype` (F16 for the float types or `to_f16`).
pub fn slab_bytes(dtype: GgmlType, rows: usize, cols: usize, to_f16: bool) -> u64 {
    match QFormat::of(dtype).filter(|_| !to_f16) {
        Some(f) => f.device_bytes(rows, cols).1 as u64,
        None => (rows * cols * 2) as u64,
    }
}

/// A slab's kernel view: (format index of MOE_ENTRIES, qs, aux, qs row bytes, aux row bytes,
/// elements per unit), checked against the buffer.
pub fn slab_view(m: &DevMat, s: &CudaStream) -> Result<(usize, u64, u64, usize, usize, usize), CudaError> {
    const K: &str = "moe expert slab";
    match &m.data {
        MatData::F16(b) => {
            let d = Dev::of(b, s);
            need(K, "F16 slab", d, m.rows * m.cols)?;
            check(K, m.cols.is_multiple_of(8), || format!("F16 rows of {} (a multiple of 8)", m.cols))?;
            Ok((super::super::compile::entries::SLAB_F16, d.ptr, d.ptr, m.cols * 2, 0, 8))
        }
        MatData::Quant { fmt, buf, aux_off } => {
            let d = Dev::of(buf, s);
            let (want_off, total) = fmt.device_bytes(m.rows, m.cols);
            check(K, *aux_off == want_off, || format!("aux at {aux_off}, the layout says {want_off}"))?;
            need(K, "slab", d, total)?;
            check(K, m.cols.is_multiple_of(fmt.unit), || format!("{} columns, units of {}", m.cols, fmt.unit))?;
            let (qr, ar) = fmt.row_parts(m.cols);
            Ok((fmt.index, d.ptr, d.ptr + *aux_off as u64, qr, ar, fmt.unit))
        }
    }
}

/// The pair-mode down product and weighted sum:
/// `x[t, r] += sum_j wts[t k + j] * (down_{ids[t k + j]}[r] . act[t k + j])`, slot 0 first
/// (the order of `moe::MoeCombine`); `k <= 8` (a warp per slot); `act` `[n_tok k, ffn]`.
/// Launched by `launch` (moe.rs, f32 activations) or `launch_q8` (moe_q8.rs, int8).
pub struct MoeDownSum<'a> {
    pub down: &'a DevMat,
    pub n_experts: usize,
    pub act: Dev<f32>,
    pub ids: Dev<i32>,
    pub wts: Dev<f32>,
    pub x: Dev<f32>,
    pub n_tok: usize,
    pub k: usize,
}

impl MoeDownSum<'_> {
    /// (rows, cols) of one expert's down matrix, the slab checked against the experts and `k`.
    pub(in crate::backend::cuda) fn expert_shape(&self, kernel: &'static str) -> Result<(usize, usize), CudaError> {
        check(kernel, self.n_experts > 0 && self.down.rows.is_multiple_of(self.n_experts), || {
            format!("{} slab rows for {} experts", self.down.rows, self.n_experts)
        })?;
        check(kernel, (1..=8).contains(&self.k), || format!("{} experts per token (1..=8)", self.k))?;
        Ok((self.down.rows / self.n_experts, self.down.cols))
    }

    /// Checks the pair buffers for experts of `rows` x `cols`; the number of pairs.
    pub(in crate::backend::cuda) fn check_pairs(
        &self,
        kernel: &'static str,
        rows: usize,
        cols: usize,
    ) -> Result<usize, CudaError> {
        let pairs = self.n_tok * self.k;
        check(kernel, self.act.ptr.is_multiple_of(16), || "16-byte aligned activations".into())?;
        need(kernel, "activations", self.act, pairs * cols)?;
        need(kernel, "ids", self.ids, pairs)?;
        need(kernel, "weights", self.wts, pairs)?;
        need(kernel, "residual", self.x, self.n_tok * rows)?;
        grid_yz(kernel, self.n_tok, "tokens")?;
        Ok(pairs)
    }
}

/// The sizes that close the pair-mode parameter structs of moe.cu (`DownSumParams`) and
/// moe_q8.cu (`MoeQ8Params`): `rows, cols, k, qs_row, aux_row, lpr`, i32 each, in this order
/// after the pointers (the same bytes as six i32 fields there).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(in crate::backend::cuda) struct RowWalk {
    rows: i32,
    cols: i32,
    k: i32,
    qs_row: i32,
    aux_row: i32,
    lpr: i32,
}

impl RowWalk {
    /// Experts of `rows` x `cols`, `k` slots, `qs_row` / `aux_row` bytes a row, `lpr` lanes a row.
    pub(in crate::backend::cuda) fn new(
        kernel: &'static str,
        (rows, cols): (usize, usize),
        k: usize,
        (qs_row, aux_row): (usize, usize),
        lpr: usize,
    ) -> Result<Self, CudaError> {
        Ok(RowWalk {
            rows: i32_of(kernel, rows)?,
            cols: i32_of(kernel, cols)?,
            k: i32_of(kernel, k)?,
            qs_row: i32_of(kernel, qs_row)?,
            aux_row: i32_of(kernel, aux_row)?,
            lpr: i32_of(kernel, lpr)?,
        })
    }
}
