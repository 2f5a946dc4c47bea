//! Launcher of the tensor-core GEMM for decode batches (kernels/gemm_tc.cu): 2..=64 tokens per
//! step read each weight once, with F16 inputs and F32 accumulation on the tensor cores (wmma
//! m16n16k16, valid on compute_70). Same conventions as `launch`.

use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::kernels::Kernels;
use super::super::CudaError;
use super::launch::{check, check_product_out, i32_of, launch, need, Dev};
use super::qlaunch::kernel_params;

/// Most tokens one tensor-core GEMM launch serves (4 tiles of 16).
pub const TC_MAX_TOKENS: usize = 64;

kernel_params! { TcParams {
    w: u64, x: u64, out: u64, bias: u64, rows: i32, cols: i32, n_tok: i32, out_stride: i32, accumulate: i32
} }

kernel_params! { Tc2Params {
    w: u64, x: u64, out: u64, bias: u64, part: u64, rows: i32, cols: i32, n_tok: i32, out_stride: i32,
    accumulate: i32, nk: i32
} }

/// Blocks the 64-row kernel aims for (split-K below it): ~2 per SM on an H200, 3 on a V100.
const TC64_TARGET_BLOCKS: usize = 256;

/// Rows per block of the wide-tile kernel for a matrix of `rows` rows: 128 (8 warps) where the
/// rows allow it, else 64 (4 warps). `DUSTOFF_TC_ROWS=64` forces 64 (for comparisons).
pub fn tc64_block_rows(rows: usize) -> usize {
    if rows.is_multiple_of(128) && !super::super::tuning::tuning().tc_rows64 {
        128
    } else {
        64
    }
}

/// K splits of the wide-tile kernel for a `[rows, cols]` matrix (1: no split), each split
/// keeping at least 4 chunks of 64 columns.
pub fn tc64_splits(rows: usize, cols: usize) -> usize {
    let row_blocks = (rows / tc64_block_rows(rows)).max(1);
    TC64_TARGET_BLOCKS.div_ceil(row_blocks).clamp(1, (cols / 64 / 4).max(1))
}

/// Scratch (f32 elements) the 64-row kernel needs for split-K partial sums.
pub fn tc64_part_len(rows: usize, cols: usize, n_tok: usize) -> usize {
    match tc64_splits(rows, cols) {
        1 => 0,
        k => k * n_tok * rows,
    }
}

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
    /// Split-K scratch for the 64-row kernel (`tc64_part_len`); without it no split is made.
    pub part: Option<Dev<f32>>,
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
        check_product_out(K, (self.out, self.out_stride), self.bias, self.rows, self.n_tok)?;
        if self.rows == 0 || self.cols == 0 {
            return Ok(());
        }
        if self.rows.is_multiple_of(64) && self.cols.is_multiple_of(64) {
            return self.launch64(k, s);
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

    /// The 64-row kernel (shared x tile, split-K where the matrix has few rows).
    fn launch64(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "gemm_tc64_f16";
        let mut nk = tc64_splits(self.rows, self.cols);
        let part_need = tc64_part_len(self.rows, self.cols, self.n_tok);
        if nk > 1 && self.part.is_none_or(|p| p.len < part_need) {
            nk = 1;
        }
        let bm = tc64_block_rows(self.rows);
        let entry = match (bm, tc_padded(self.n_tok)) {
            (64, 16) => "gemm_tc64_f16_t16",
            (64, 32) => "gemm_tc64_f16_t32",
            (64, 48) => "gemm_tc64_f16_t48",
            (64, _) => "gemm_tc64_f16_t64",
            (_, 16) => "gemm_tc128_f16_t16",
            (_, 32) => "gemm_tc128_f16_t32",
            (_, 48) => "gemm_tc128_f16_t48",
            _ => "gemm_tc128_f16_t64",
        };
        let p = Tc2Params {
            w: self.w.ptr,
            x: self.x.ptr,
            out: self.out.ptr,
            bias: self.bias.map_or(0, |b| b.ptr),
            part: if nk > 1 { self.part.map_or(0, |b| b.ptr) } else { 0 },
            rows: i32_of(K, self.rows)?,
            cols: i32_of(K, self.cols)?,
            n_tok: self.n_tok as i32,
            out_stride: i32_of(K, self.out_stride)?,
            accumulate: i32::from(self.accumulate),
            nk: nk as i32,
        };
        let blocks = u32::try_from(self.rows / bm)
            .map_err(|_| CudaError::Shape { kernel: K, reason: format!("{} rows exceed the grid", self.rows) })?;
        launch(k, s, entry, (blocks, nk as u32, 1), (bm * 2) as u32, 0, &p)?;
        if nk > 1 {
            let n = self.n_tok * self.rows;
            launch(k, s, "splitk_reduce_f32", (super::launch::blocks_for(K, n, 256)?, 1, 1), 256, 0, &p)?;
        }
        Ok(())
    }
}
