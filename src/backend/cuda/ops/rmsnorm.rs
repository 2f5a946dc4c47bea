//! Launcher of `kernels/rmsnorm.cu`: RMSNorm of f32 rows, optionally gathered through a row
//! list (the final norm of the rows that want logits).

use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::kernels::Kernels;
use super::super::CudaError;
use super::launch::{blocks_for, check, extent, i32_of, launch, need, Dev};

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct RmsNormParams {
    x: u64,
    w: u64,
    out: u64,
    rows: u64,
    n_outer: i32,
    n_inner: i32,
    dim: i32,
    in_stride: i32,
    out_stride: i32,
    eps: f32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for RmsNormParams {}

/// RMSNorm of `n_outer x n_inner` rows of width `dim`; row (o, i) starts at
/// `src(o) * in_stride + i * dim` where `src(o) = rows[o]` when `rows` is given (a gather of
/// `n_src_rows` candidate rows) else `o`. Output rows at `o * out_stride + i * dim`.
pub struct RmsNorm {
    pub x: Dev<f32>,
    pub w: Dev<f32>,
    pub out: Dev<f32>,
    pub rows: Option<Dev<i32>>,
    pub n_src_rows: usize,
    pub n_outer: usize,
    pub n_inner: usize,
    pub dim: usize,
    pub in_stride: usize,
    pub out_stride: usize,
    pub eps: f32,
}

impl RmsNorm {
    /// The plain form: `n` contiguous rows of width `dim` (`x`, `out`: `[n, dim]`), no gather.
    pub fn plain(x: Dev<f32>, w: Dev<f32>, out: Dev<f32>, n: usize, dim: usize, eps: f32) -> Self {
        RmsNorm {
            x,
            w,
            out,
            rows: None,
            n_src_rows: n,
            n_outer: n,
            n_inner: 1,
            dim,
            in_stride: dim,
            out_stride: dim,
            eps,
        }
    }

    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "rmsnorm_f32";
        let width = self.n_inner * self.dim;
        check(K, width <= self.in_stride && width <= self.out_stride, || "rows overlap their stride".into())?;
        need(K, "weight", self.w, self.dim)?;
        let src_rows = if self.rows.is_some() { self.n_src_rows } else { self.n_outer };
        need(K, "input", self.x, extent(src_rows, self.in_stride, width))?;
        need(K, "output", self.out, extent(self.n_outer, self.out_stride, width))?;
        if let Some(r) = self.rows {
            need(K, "row list", r, self.n_outer)?;
        }
        let n_rows = self.n_outer * self.n_inner;
        if n_rows == 0 {
            return Ok(());
        }
        let p = RmsNormParams {
            x: self.x.ptr,
            w: self.w.ptr,
            out: self.out.ptr,
            rows: self.rows.map_or(0, |r| r.ptr),
            n_outer: i32_of(K, self.n_outer)?,
            n_inner: i32_of(K, self.n_inner)?,
            dim: i32_of(K, self.dim)?,
            in_stride: i32_of(K, self.in_stride)?,
            out_stride: i32_of(K, self.out_stride)?,
            eps: self.eps,
        };
        let block = (self.dim.div_ceil(32) * 32).clamp(32, 256) as u32;
        launch(k, s, K, (blocks_for(K, n_rows, 1)?, 1, 1), block, 0, &p)
    }
}
