//! Launcher of the tensor-core GEMM for decode batches (kernels/gemm_tc.cu): 2..=64 tokens per
//! step read each weight once, with F16 inputs and F32 accumulation on the tensor cores (wmma
//! m16n16k16, valid on compute_70). Same conventions as `launch`.

use cudarc::driver::{CudaStream, DeviceRepr};

use super::kernels::Kernels;
use super::launch::{check, extent, i32_of, launch, need, Dev};
use super::CudaError;

/// Most tokens one tensor-core GEMM launch serves (4 tiles of 16).
pub const TC_MAX_TOKENS: usize = 64;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct TcParams {
    w: u64,
    x: u64,
    out: u64,
    bias: u64,
    rows: i32,
    cols: i32,
    n_tok: i32,
    out_stride: i32,
    accumulate: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct (trailing padding included).
unsafe impl DeviceRepr for TcParams {}

/// Tokens rounded up to the kernel's tile of 16: the input rows the kernel reads.
pub fn tc_padded(n_tok: usize) -> usize {
    n_tok.div_ceil(16) * 16
}

/// `out[t, r] (+)= sum_c w[r, c] x[t, c] (+ bias[r])` for `1 <= n_tok <= 64`: `w` F16
/// `[rows, cols]`, `x` F16 `[tc_padded(n_tok), cols]` contiguous (rows past `n_tok` are read,
/// their results dropped), `out` f32 `[n_tok, out_stride]`.
pub struct GemmTc {
    pub w: Dev<u16>,
    pub x: Dev<u16>,
    pub out: Dev<f32>,
    pub bias: Option<Dev<f32>>,
    pub rows: usize,
    pub cols: usize,
    pub n_tok: usize,
    pub out_stride: usize,
    pub accumulate: bool,
}

impl GemmTc {
    /// Whether the kernel takes this shape (else use cuBLAS): 16-row tiles, 32-column chunks,
    /// 32-byte aligned operands.
    pub fn fits(w: Dev<u16>, x: Dev<u16>, rows: usize, cols: usize, n_tok: usize) -> bool {
        (1..=TC_MAX_TOKENS).contains(&n_tok)
            && rows.is_multiple_of(16)
            && cols.is_multiple_of(32)
            && w.ptr.is_multiple_of(32)
            && x.ptr.is_multiple_of(32)
    }

    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "gemm_tc_f16";
        check(K, Self::fits(self.w, self.x, self.rows, self.cols, self.n_tok), || {
            format!(
                "[{}x{}] x {} tokens: rows must be a multiple of 16 and cols of 32, 1..=64 tokens, operands 32-byte aligned",
                self.rows, self.cols, self.n_tok
            )
        })?;
        check(K, self.rows <= self.out_stride, || "rows overlap their stride".into())?;
        need(K, "weights", self.w, self.rows * self.cols)?;
        need(K, "input", self.x, tc_padded(self.n_tok) * self.cols)?;
        need(K, "output", self.out, extent(self.n_tok, self.out_stride, self.rows))?;
        if let Some(b) = self.bias {
            need(K, "bias", b, self.rows)?;
        }
        if self.rows == 0 || self.cols == 0 {
            return Ok(());
        }
        // Threads of a block: kernels/gemm_tc.cu TcWarps<NT16>::N * 32; a block computes 16 rows.
        let (entry, threads) = match tc_padded(self.n_tok) {
            16 => ("gemm_tc_f16_t16", 512),
            32 => ("gemm_tc_f16_t32", 384),
            48 => ("gemm_tc_f16_t48", 256),
            _ => ("gemm_tc_f16_t64", 224),
        };
        let p = TcParams {
            w: self.w.ptr,
            x: self.x.ptr,
            out: self.out.ptr,
            bias: self.bias.map_or(0, |b| b.ptr),
            rows: i32_of(K, self.rows)?,
            cols: i32_of(K, self.cols)?,
            n_tok: self.n_tok as i32,
            out_stride: i32_of(K, self.out_stride)?,
            accumulate: i32::from(self.accumulate),
        };
        let blocks = u32::try_from(self.rows / 16)
            .map_err(|_| CudaError::Shape { kernel: K, reason: format!("{} rows exceed the grid", self.rows) })?;
        launch(k, s, entry, (blocks, 1, 1), threads, 0, &p)
    }
}
