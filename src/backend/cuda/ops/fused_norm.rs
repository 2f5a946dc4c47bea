//! Launchers of RMSNorm fused into the product that reads it (kernels/fused_norm.cu), and their
//! CPU twins. In the decode step the attention norm and the FFN norm each cost a launch of
//! their own before; now the norm runs inside the launch that prepares (or performs) the
//! product: with the int8 quantization of the packed-weight GEMV's input ([`RmsNormQ8`]), with
//! the F16 cast of the tensor-core GEMM's input ([`RmsNormF16`]), or inside the one-token F16
//! GEMV itself ([`GemvNorm`]). Same conventions as `launch`: a struct of arguments, shape
//! checks, one `#[repr(C)]` params struct per kernel struct.

use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::kernels::Kernels;
use super::super::CudaError;
use super::launch::{blocks_for, check, check_product_out, i32_of, launch, need, Dev, GEMV_MAX_TOKENS};
use super::qlaunch::q8x_planes;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct NormQ8Params {
    x: u64,
    w: u64,
    h: u64,
    qx: u64,
    ql: u64,
    xs: u64,
    x16: u64,
    n_tok: i32,
    dim: i32,
    eps: f32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct (trailing padding included).
unsafe impl DeviceRepr for NormQ8Params {}

/// The block size `rmsnorm_f32` takes for rows of `dim` (so the sums, and the bits, agree).
fn norm_block(dim: usize) -> u32 {
    (dim.div_ceil(32) * 32).clamp(32, 256) as u32
}

/// The checks both fused norms make, and their params without outputs beyond `h` (the callers
/// add the int8 planes or the f16 copy).
fn norm_rows(
    k: &'static str,
    x: Dev<f32>,
    w: Dev<f32>,
    h: Dev<f32>,
    n_tok: usize,
    dim: usize,
    eps: f32,
) -> Result<NormQ8Params, CudaError> {
    check(k, dim.is_multiple_of(32) && dim > 0, || format!("width {dim} is not whole 32-value blocks"))?;
    check(k, x.ptr.is_multiple_of(16) && h.ptr.is_multiple_of(16), || {
        "input and output must be 16-byte aligned".into()
    })?;
    check(k, n_tok <= 65_535 * 32, || format!("{n_tok} rows in one launch"))?;
    need(k, "weight", w, dim)?;
    need(k, "input", x, n_tok * dim)?;
    need(k, "normed output", h, n_tok * dim)?;
    Ok(NormQ8Params {
        x: x.ptr,
        w: w.ptr,
        h: h.ptr,
        qx: 0,
        ql: 0,
        xs: 0,
        x16: 0,
        n_tok: i32_of(k, n_tok)?,
        dim: i32_of(k, dim)?,
        eps,
    })
}

/// `h = rmsnorm(x) * w` (`[n_tok, dim]` f32) and `h` quantized into `xq` as the int8 GEMV reads
/// it (layout: `qlaunch::q8x_bytes`): `rmsnorm_f32` then `quantize_x_q8`, bit for bit, in one
/// launch. CPU twin: [`rmsnorm_q8_twin`].
pub struct RmsNormQ8 {
    pub x: Dev<f32>,
    pub w: Dev<f32>,
    pub h: Dev<f32>,
    pub xq: Dev<u8>,
    pub n_tok: usize,
    pub dim: usize,
    pub eps: f32,
}

impl RmsNormQ8 {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "rmsnorm_q8_f32";
        let rows = norm_rows(K, self.x, self.w, self.h, self.n_tok, self.dim, self.eps)?;
        let (qx, ql, xs) = q8x_planes(K, "int8 input", self.xq, self.n_tok, self.dim)?;
        if self.n_tok == 0 {
            return Ok(());
        }
        let p = NormQ8Params { qx, ql, xs, ..rows };
        launch(k, s, K, (self.n_tok as u32, 1, 1), norm_block(self.dim), 0, &p)
    }
}

/// `h = rmsnorm(x) * w` (`[n_tok, dim]` f32) and `x16 = f16(h)` (saturated): `rmsnorm_f32` then
/// `cast_f32_f16`, bit for bit, in one launch. CPU twin: `ops::rmsnorm` and `half::f16`.
pub struct RmsNormF16 {
    pub x: Dev<f32>,
    pub w: Dev<f32>,
    pub h: Dev<f32>,
    pub x16: Dev<u16>,
    pub n_tok: usize,
    pub dim: usize,
    pub eps: f32,
}

impl RmsNormF16 {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "rmsnorm_f16_f32";
        let rows = norm_rows(K, self.x, self.w, self.h, self.n_tok, self.dim, self.eps)?;
        need(K, "f16 output", self.x16, self.n_tok * self.dim)?;
        if self.n_tok == 0 {
            return Ok(());
        }
        let p = NormQ8Params { x16: self.x16.ptr, ..rows };
        launch(k, s, K, (self.n_tok as u32, 1, 1), norm_block(self.dim), 0, &p)
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct GemvNormParams {
    w: u64,
    x: u64,
    g: u64,
    out: u64,
    bias: u64,
    rows: i32,
    cols: i32,
    n_tok: i32,
    out_stride: i32,
    accumulate: i32,
    eps: f32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for GemvNormParams {}

/// Rows and threads of a `gemv_norm` block (kernels/fused_norm.cu: GN_ROWS, GN_THREADS).
const GN_ROWS: usize = 2;
const GN_THREADS: u32 = 256;

/// `out[t, r] (+)= sum_c w[r, c] rmsnorm(x[t])[c] (+ bias[r])` for `n_tok <= 8` tokens without
/// materializing the normed input: `x` `[n_tok, cols]` f32 (the residual stream), `g` the norm
/// weight `[cols]`, `w` F16 `[rows, cols]`. `swiglu`: `w` is the stacked gate/up `[2 rows,
/// cols]` and `out[t, r] = silu(gate) * up` (no bias, never accumulates). CPU twin:
/// [`gemv_norm_twin`].
pub struct GemvNorm {
    pub w: Dev<u16>,
    pub x: Dev<f32>,
    pub g: Dev<f32>,
    pub out: Dev<f32>,
    pub bias: Option<Dev<f32>>,
    pub rows: usize,
    pub cols: usize,
    pub n_tok: usize,
    pub out_stride: usize,
    pub accumulate: bool,
    pub swiglu: bool,
    pub eps: f32,
}

impl GemvNorm {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "gemv_norm_f16";
        check(K, self.n_tok >= 1 && self.n_tok <= GEMV_MAX_TOKENS, || {
            format!("{} tokens (1..=8 allowed)", self.n_tok)
        })?;
        check(K, self.cols.is_multiple_of(8), || format!("cols {} must be a multiple of 8", self.cols))?;
        check(K, [self.w.ptr, self.x.ptr, self.g.ptr].iter().all(|p| p.is_multiple_of(16)), || {
            "weights, input and norm weight must be 16-byte aligned".into()
        })?;
        check(K, self.rows <= self.out_stride, || "rows overlap the output stride".into())?;
        check(K, !self.swiglu || (self.bias.is_none() && !self.accumulate), || {
            "the SwiGLU form takes no bias and does not accumulate".into()
        })?;
        let w_rows = if self.swiglu { 2 * self.rows } else { self.rows };
        need(K, "weights", self.w, w_rows * self.cols)?;
        need(K, "input", self.x, self.n_tok * self.cols)?;
        need(K, "norm weight", self.g, self.cols)?;
        check_product_out(K, (self.out, self.out_stride), self.bias, self.rows, self.n_tok)?;
        // One token: 2, 4 or 8 rows a block (`DUSTOFF_GEMV_ROWS`), as the plain GEMV.
        let (v, rows_per_block) = match (self.n_tok, super::super::tuning::tuning().gemv_rows) {
            (1, 4) => (4, 4),
            (1, 8) => (5, 8),
            (1, _) => (0, GN_ROWS),
            (2, _) => (1, GN_ROWS),
            (3 | 4, _) => (2, GN_ROWS),
            _ => (3, GN_ROWS),
        };
        const PLAIN: [&str; 6] = [
            "gemv_norm_f16_n1",
            "gemv_norm_f16_n2",
            "gemv_norm_f16_n4",
            "gemv_norm_f16_n8",
            "gemv_norm_f16_n1_r4",
            "gemv_norm_f16_n1_r8",
        ];
        const SWIGLU: [&str; 6] = [
            "gemv_norm_swiglu_f16_n1",
            "gemv_norm_swiglu_f16_n2",
            "gemv_norm_swiglu_f16_n4",
            "gemv_norm_swiglu_f16_n8",
            "gemv_norm_swiglu_f16_n1_r4",
            "gemv_norm_swiglu_f16_n1_r8",
        ];
        let entry = if self.swiglu { SWIGLU[v] } else { PLAIN[v] };
        let p = GemvNormParams {
            w: self.w.ptr,
            x: self.x.ptr,
            g: self.g.ptr,
            out: self.out.ptr,
            bias: self.bias.map_or(0, |b| b.ptr),
            rows: i32_of(K, self.rows)?,
            cols: i32_of(K, self.cols)?,
            n_tok: self.n_tok as i32,
            out_stride: i32_of(K, self.out_stride)?,
            accumulate: i32::from(self.accumulate),
            eps: self.eps,
        };
        launch(k, s, entry, (blocks_for(K, self.rows, rows_per_block)?, 1, 1), GN_THREADS, 0, &p)
    }
}

/// One row's int8 activations as `q8x::quantize` gives them: hi codes, lo codes, block scales.
pub type Q8Row = (Vec<i8>, Vec<i8>, Vec<f32>);

/// CPU twin of [`RmsNormQ8`]: the normed rows `[n, dim]` and, per row, the two int8 planes and
/// block scales of `q8x::quantize`.
pub fn rmsnorm_q8_twin(x: &[f32], w: &[f32], eps: f32) -> (Vec<f32>, Vec<Q8Row>) {
    let mut h = vec![0f32; x.len()];
    crate::backend::cpu::ops::rmsnorm(x, w, eps, &mut h);
    let planes = h.chunks(w.len()).map(super::q8x::quantize).collect();
    (h, planes)
}

/// CPU twin of [`GemvNorm`]: `out` `[n, rows]` from F16 weights `w` (`[rows or 2 rows, cols]`
/// as f32 values), `x` `[n, cols]`, norm weight `g`; bias and accumulation as the launcher.
#[allow(clippy::too_many_arguments)]
pub fn gemv_norm_twin(
    w: &[f32],
    x: &[f32],
    g: &[f32],
    bias: Option<&[f32]>,
    rows: usize,
    swiglu: bool,
    eps: f32,
    out: &mut [f32],
    accumulate: bool,
) {
    let cols = g.len();
    let mut h = vec![0f32; x.len()];
    crate::backend::cpu::ops::rmsnorm(x, g, eps, &mut h);
    let dot = |r: usize, t: usize| -> f32 {
        let wr = &w[r * cols..(r + 1) * cols];
        let hr = &h[t * cols..(t + 1) * cols];
        wr.iter().zip(hr).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32
    };
    for t in 0..x.len() / cols {
        for r in 0..rows {
            let o = &mut out[t * rows + r];
            if swiglu {
                let (gt, u) = (dot(r, t), dot(rows + r, t));
                *o = gt / (1.0 + (-gt).exp()) * u;
            } else {
                let v = dot(r, t) + bias.map_or(0.0, |b| b[r]);
                *o = if accumulate { *o + v } else { v };
            }
        }
    }
}
