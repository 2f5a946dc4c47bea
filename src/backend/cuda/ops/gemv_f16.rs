//! Launchers of `kernels/gemv_f16.cu`: the F16 GEMV for 1..=8 tokens and its SwiGLU variant
//! (gate and up rows of one stacked matrix, `silu(gate) * up` written directly). Both kernels
//! take the one `GemvParams` struct below.

use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::kernels::Kernels;
use super::super::CudaError;
use super::launch::{blocks_for, check, check_product_out, extent, i32_of, launch, need, Dev, GEMV_MAX_TOKENS};

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct GemvParams {
    w: u64,
    x: u64,
    out: u64,
    bias: u64,
    rows: i32,
    cols: i32,
    n_tok: i32,
    x_stride: i32,
    out_stride: i32,
    accumulate: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for GemvParams {}

/// Threads of a GEMV block and the rows it computes (kernels/gemv_f16.cu: GEMV_THREADS,
/// GEMV_ROWS): its 8 warps split the columns.
pub(crate) const GEMV_THREADS: usize = 256;
pub(crate) const GEMV_ROWS: usize = 2;

/// `out[t, r] (+)= sum_c w[r, c] x[t, c] (+ bias[r])` for `n_tok <= 8` tokens; `w` F16
/// `[rows, cols]`, `x` f32 `[n_tok, x_stride]`, `out` f32 `[n_tok, out_stride]`.
pub struct Gemv {
    pub w: Dev<u16>,
    pub x: Dev<f32>,
    pub out: Dev<f32>,
    pub bias: Option<Dev<f32>>,
    pub rows: usize,
    pub cols: usize,
    pub n_tok: usize,
    pub x_stride: usize,
    pub out_stride: usize,
    pub accumulate: bool,
}

impl Gemv {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "gemv_f16";
        check(K, self.n_tok >= 1 && self.n_tok <= GEMV_MAX_TOKENS, || {
            format!("{} tokens (1..=8 allowed)", self.n_tok)
        })?;
        check(K, self.cols.is_multiple_of(8) && self.x_stride.is_multiple_of(4), || {
            format!(
                "cols {} must be a multiple of 8 and the input stride {} of 4 (16-byte loads)",
                self.cols, self.x_stride
            )
        })?;
        check(K, self.w.ptr.is_multiple_of(16) && self.x.ptr.is_multiple_of(16), || {
            "weights and input must be 16-byte aligned".into()
        })?;
        check(K, self.cols <= self.x_stride && self.rows <= self.out_stride, || "rows overlap their stride".into())?;
        need(K, "weights", self.w, self.rows * self.cols)?;
        need(K, "input", self.x, extent(self.n_tok, self.x_stride, self.cols))?;
        check_product_out(K, (self.out, self.out_stride), self.bias, self.rows, self.n_tok)?;
        // One token: 2, 4 or 8 rows a block (`DUSTOFF_GEMV_ROWS`).
        let (entry, rows_per_block) = match (self.n_tok, super::super::tuning::tuning().gemv_rows) {
            (1, 4) => ("gemv_f16_n1_r4", 4),
            (1, 8) => ("gemv_f16_n1_r8", 8),
            (1, _) => ("gemv_f16_n1", GEMV_ROWS),
            (2, _) => ("gemv_f16_n2", GEMV_ROWS),
            (3 | 4, _) => ("gemv_f16_n4", GEMV_ROWS),
            _ => ("gemv_f16_n8", GEMV_ROWS),
        };
        let p = GemvParams {
            w: self.w.ptr,
            x: self.x.ptr,
            out: self.out.ptr,
            bias: self.bias.map_or(0, |b| b.ptr),
            rows: i32_of(K, self.rows)?,
            cols: i32_of(K, self.cols)?,
            n_tok: self.n_tok as i32,
            x_stride: i32_of(K, self.x_stride)?,
            out_stride: i32_of(K, self.out_stride)?,
            accumulate: i32::from(self.accumulate),
        };
        launch(k, s, entry, (blocks_for(K, self.rows, rows_per_block)?, 1, 1), GEMV_THREADS as u32, 0, &p)
    }
}

/// `out[t, r] = silu(sum_c w[r, c] x[t, c]) * sum_c w[ffn + r, c] x[t, c]` for `r < ffn`,
/// `n_tok <= 8`: the stacked gate/up weights `[2 ffn, cols]` F16, `x` f32 `[n_tok, x_stride]`,
/// `out` f32 `[n_tok, out_stride]`.
pub struct GemvSwiglu {
    pub w: Dev<u16>,
    pub x: Dev<f32>,
    pub out: Dev<f32>,
    pub ffn: usize,
    pub cols: usize,
    pub n_tok: usize,
    pub x_stride: usize,
    pub out_stride: usize,
}

impl GemvSwiglu {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "gemv_swiglu_f16";
        check(K, self.n_tok >= 1 && self.n_tok <= GEMV_MAX_TOKENS, || {
            format!("{} tokens (1..=8 allowed)", self.n_tok)
        })?;
        check(K, self.cols.is_multiple_of(8) && self.x_stride.is_multiple_of(4), || {
            format!("cols {} must be a multiple of 8 and the input stride {} of 4", self.cols, self.x_stride)
        })?;
        check(K, self.w.ptr.is_multiple_of(16) && self.x.ptr.is_multiple_of(16), || {
            "weights and input must be 16-byte aligned".into()
        })?;
        check(K, self.cols <= self.x_stride && self.ffn <= self.out_stride, || "rows overlap their stride".into())?;
        need(K, "weights", self.w, 2 * self.ffn * self.cols)?;
        need(K, "input", self.x, extent(self.n_tok, self.x_stride, self.cols))?;
        check_product_out(K, (self.out, self.out_stride), None, self.ffn, self.n_tok)?;
        let entry = match self.n_tok {
            1 => "gemv_swiglu_f16_n1",
            2 => "gemv_swiglu_f16_n2",
            3 | 4 => "gemv_swiglu_f16_n4",
            _ => "gemv_swiglu_f16_n8",
        };
        let p = GemvParams {
            w: self.w.ptr,
            x: self.x.ptr,
            out: self.out.ptr,
            bias: 0,
            rows: i32_of(K, self.ffn)?,
            cols: i32_of(K, self.cols)?,
            n_tok: self.n_tok as i32,
            x_stride: i32_of(K, self.x_stride)?,
            out_stride: i32_of(K, self.out_stride)?,
            accumulate: 0,
        };
        launch(k, s, entry, (blocks_for(K, self.ffn, GEMV_ROWS)?, 1, 1), GEMV_THREADS as u32, 0, &p)
    }
}
