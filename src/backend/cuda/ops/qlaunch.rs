//! Launchers of the quantized-weight kernels (kernels/gemv_q8.cu, kernels/gemv_quant.cu,
//! kernels/dequant.cu). Same conventions as `launch`: a struct of arguments, shape checks,
//! `#[repr(C)]` params mirrors.

use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::entries::{self, Gemv, QUANTIZE_X_Q8, SPLITK_REDUCE_Q};
use super::super::compile::kernels::Kernels;
use super::super::qformat::QFormat;
use super::super::CudaError;
use super::launch::{
    allow_smem, blocks_for, check, check_product_out, extent, i32_of, launch, need, Dev, GEMV_MAX_TOKENS,
};

/// A kernel's parameter struct: the `#[repr(C)]` mirror of the struct the kernel takes by
/// value (same fields in the same order: device addresses as u64, then 32-bit values).
macro_rules! kernel_params {
    ($name:ident { $($field:ident: $ty:ty),* $(,)? }) => {
        #[repr(C)]
        #[derive(Clone, Copy, Debug)]
        struct $name {
            $($field: $ty),*
        }
        // SAFETY: plain-old-data (integers and device addresses) with the C layout of the
        // kernel's struct, trailing padding included where there is any.
        unsafe impl DeviceRepr for $name {}
    };
}
pub(in crate::backend::cuda) use kernel_params;

/// A quantized matrix on the device: `rows x cols` in `fmt`'s layout (qformat.rs), qs at the
/// start of `buf`, aux at `aux_off` bytes.
#[derive(Clone, Copy, Debug)]
pub struct QView {
    pub fmt: QFormat,
    pub buf: Dev<u8>,
    pub aux_off: usize,
    pub rows: usize,
    pub cols: usize,
}

impl QView {
    /// Checks the buffer against the layout; returns (qs pointer, aux pointer, qs row bytes,
    /// aux row bytes).
    fn ptrs(&self, kernel: &'static str) -> Result<(u64, u64, i32, i32), CudaError> {
        let f = self.fmt;
        check(kernel, self.cols.is_multiple_of(f.dtype.block_size()), || {
            format!("{} columns are not whole {} blocks", self.cols, f.dtype)
        })?;
        let (aux_off, total) = f.device_bytes(self.rows, self.cols);
        check(kernel, aux_off == self.aux_off, || format!("aux at {} bytes, the layout says {aux_off}", self.aux_off))?;
        need(kernel, "weights", self.buf, total)?;
        check(kernel, self.buf.ptr.is_multiple_of(16), || "weights must be 16-byte aligned".into())?;
        let (qr, ar) = f.row_parts(self.cols);
        Ok((self.buf.ptr, self.buf.ptr + aux_off as u64, i32_of(kernel, qr)?, i32_of(kernel, ar)?))
    }
}

kernel_params! { GemvQParams {
    qs: u64, aux: u64, x: u64, out: u64, bias: u64, rows: i32, cols: i32, n_tok: i32, x_stride: i32,
    out_stride: i32, accumulate: i32, qs_row: i32, aux_row: i32
} }

/// Warps (one row each) of a quantized GEMV block (kernels/gemv_quant.cu: GEMVQ_WARPS).
const GEMVQ_WARPS: usize = 4;

/// Bytes of an int8-quantized step input `[n_tok, cols]` (kernels/quant.cuh, "int8
/// activations"): `(offset of the lo codes, offset of the scales, total)`: qx `[n_tok, cols]`
/// int8 hi codes, then from the next 256-byte boundary ql (lo codes, the same shape), then xs
/// `[n_tok, cols / 16]` (f32 d, f32 d * sum(q) + dl * sum(l)).
pub fn q8x_bytes(n_tok: usize, cols: usize) -> (usize, usize, usize) {
    let plane = (n_tok * cols).div_ceil(256) * 256;
    (plane, 2 * plane, 2 * plane + n_tok * (cols / 16) * 8)
}

/// The planes `(qx, ql, xs)` (device addresses) of the int8 activations `xq` of `[n_tok, cols]`
/// (layout [`q8x_bytes`]) that a kernel writes or reads (`what`: "int8 input" / "int8 output"),
/// checked: whole 32-value blocks, 256-byte aligned, long enough.
pub fn q8x_planes(
    kernel: &'static str,
    what: &str,
    xq: Dev<u8>,
    n_tok: usize,
    cols: usize,
) -> Result<(u64, u64, u64), CudaError> {
    check(kernel, cols.is_multiple_of(32), || format!("{what}: {cols} columns are not whole 32-value blocks"))?;
    check(kernel, xq.ptr.is_multiple_of(256), || format!("the {what} must be 256-byte aligned"))?;
    let (ql, xs, total) = q8x_bytes(n_tok, cols);
    need(kernel, what, xq, total)?;
    Ok((xq.ptr, xq.ptr + ql as u64, xq.ptr + xs as u64))
}

kernel_params! { QuantizeXParams { x: u64, qx: u64, ql: u64, xs: u64, n_tok: i32, cols: i32, x_stride: i32 } }

/// `x [n_tok, x_stride]` f32 quantized into `xq` (layout: [`q8x_bytes`]) in blocks of 32:
/// the input of the int8 GEMV ([`GemvQ`] with `xq`). CPU twin: `q8x::quantize`.
pub struct QuantizeX {
    pub x: Dev<f32>,
    pub xq: Dev<u8>,
    pub n_tok: usize,
    pub cols: usize,
    pub x_stride: usize,
}

impl QuantizeX {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "quantize_x_q8";
        check(K, self.cols.is_multiple_of(32), || format!("{} columns are not whole 32-value blocks", self.cols))?;
        check(
            K,
            self.x_stride.is_multiple_of(4) && self.x.ptr.is_multiple_of(16) && self.cols <= self.x_stride,
            || format!("input stride {} must be a multiple of 4, the input 16-byte aligned", self.x_stride),
        )?;
        need(K, "input", self.x, extent(self.n_tok, self.x_stride, self.cols))?;
        let (qx, ql, xs) = q8x_planes(K, "int8 input", self.xq, self.n_tok, self.cols)?;
        let threads = self.n_tok * self.cols / 4;
        if threads == 0 {
            return Ok(());
        }
        let p = QuantizeXParams {
            x: self.x.ptr,
            qx,
            ql,
            xs,
            n_tok: i32_of(K, self.n_tok)?,
            cols: i32_of(K, self.cols)?,
            x_stride: i32_of(K, self.x_stride)?,
        };
        launch(k, s, QUANTIZE_X_Q8, (blocks_for(K, threads, 256)?, 1, 1), 256, 0, &p)
    }
}

kernel_params! { GemvQ8Params {
    qs: u64, aux: u64, qx: u64, ql: u64, xs: u64, out: u64, bias: u64, rows: i32, cols: i32, n_tok: i32,
    out_stride: i32, accumulate: i32, qs_row: i32, aux_row: i32
} }

/// `out[t, r] (+)= sum_c w[r, c] x[t, c] (+ bias[r])` for `n_tok <= 8`, `w` quantized; with
/// `swiglu`, `w` is the stacked gate/up `[2 rows, cols]` and `out[t, r] = silu(gate) * up`.
/// With `xq` (the input already quantized by [`QuantizeX`], `[n_tok, cols]`) the int8 dp4a
/// kernel (gemv_q8.cu) reads it and `x` is not read; without, the f32-input kernel
/// (gemv_quant.cu) reads `x`.
pub struct GemvQ {
    pub w: QView,
    pub x: Dev<f32>,
    pub out: Dev<f32>,
    pub bias: Option<Dev<f32>>,
    /// Output rows (with `swiglu`: half of `w.rows`).
    pub rows: usize,
    pub n_tok: usize,
    pub x_stride: usize,
    pub out_stride: usize,
    pub accumulate: bool,
    pub swiglu: bool,
    pub xq: Option<Dev<u8>>,
}

impl GemvQ {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        self.launch_rows(k, s, super::super::tuning::tuning().qgemv_rows2)
    }

    /// As [`GemvQ::launch`]; `rows2`: the 1-token int8 kernel reads 2 weight rows per warp
    /// instead of 4 (`DUSTOFF_QGEMV_ROWS=2` sets it for `launch`).
    pub fn launch_rows(&self, k: &mut Kernels, s: &CudaStream, rows2: bool) -> Result<(), CudaError> {
        const K: &str = "gemv_quant";
        let (qs, aux, qs_row, aux_row) = self.w.ptrs(K)?;
        let cols = self.w.cols;
        check(K, self.n_tok >= 1 && self.n_tok <= GEMV_MAX_TOKENS, || format!("{} tokens (1..=8)", self.n_tok))?;
        let want_rows = if self.swiglu { 2 * self.rows } else { self.rows };
        check(K, self.w.rows == want_rows, || format!("{} weight rows for {} outputs", self.w.rows, self.rows))?;
        check(K, !(self.swiglu && (self.accumulate || self.bias.is_some())), || "SwiGLU takes no bias".into())?;
        let gemv = Gemv { n_tok: self.n_tok, swiglu: self.swiglu };
        // Output rows per warp (RowsPerWarp / RowsPerWarpQ8, halved for SwiGLU).
        let per_warp = if self.n_tok == 1 { 4 } else { 2 } / if self.swiglu { 2 } else { 1 };
        let grid = blocks_for(K, self.rows, GEMVQ_WARPS * per_warp)?;
        if let Some(xq) = self.xq {
            check_product_out(K, (self.out, self.out_stride), self.bias, self.rows, self.n_tok)?;
            check(K, self.rows <= self.out_stride, || "rows overlap their stride".into())?;
            let (qx, ql, xs) = q8x_planes(K, "int8 input", xq, self.n_tok, cols)?;
            if self.rows == 0 {
                return Ok(());
            }
            let p = GemvQ8Params {
                qs,
                aux,
                qx,
                ql,
                xs,
                out: self.out.ptr,
                bias: self.bias.map_or(0, |b| b.ptr),
                rows: i32_of(K, self.rows)?,
                cols: i32_of(K, cols)?,
                n_tok: self.n_tok as i32,
                out_stride: i32_of(K, self.out_stride)?,
                accumulate: i32::from(self.accumulate),
                qs_row,
                aux_row,
            };
            // Output rows per group of 64 threads, 2 groups a block (gemv_q8.cu entries):
            // weight rows 4 (2 with `rows2` at 1 token); SwiGLU halves them.
            let weight_rows = if self.n_tok == 1 && rows2 { 2 } else { 4 };
            let group_rows = weight_rows / if self.swiglu { 2 } else { 1 };
            let grid = blocks_for(K, self.rows, 2 * group_rows)?;
            let entry = entries::gemv_q8(&self.w.fmt, gemv, rows2);
            return launch(k, s, entry, (grid, 1, 1), (32 * GEMVQ_WARPS) as u32, 0, &p);
        }
        check(K, self.x_stride.is_multiple_of(4) && self.x.ptr.is_multiple_of(16), || {
            format!("input stride {} must be a multiple of 4 and the input 16-byte aligned", self.x_stride)
        })?;
        check(K, cols <= self.x_stride && self.rows <= self.out_stride, || "rows overlap their stride".into())?;
        need(K, "input", self.x, extent(self.n_tok, self.x_stride, cols))?;
        check_product_out(K, (self.out, self.out_stride), self.bias, self.rows, self.n_tok)?;
        if self.rows == 0 {
            return Ok(());
        }
        let p = GemvQParams {
            qs,
            aux,
            x: self.x.ptr,
            out: self.out.ptr,
            bias: self.bias.map_or(0, |b| b.ptr),
            rows: i32_of(K, self.rows)?,
            cols: i32_of(K, cols)?,
            n_tok: self.n_tok as i32,
            x_stride: i32_of(K, self.x_stride)?,
            out_stride: i32_of(K, self.out_stride)?,
            accumulate: i32::from(self.accumulate),
            qs_row,
            aux_row,
        };
        let entry = entries::gemv_quant(&self.w.fmt, gemv);
        launch(k, s, entry, (grid, 1, 1), (32 * GEMVQ_WARPS) as u32, 0, &p)
    }
}

kernel_params! { GemmQParams {
    qs: u64, aux: u64, x: u64, out: u64, bias: u64, part: u64, rows: i32, cols: i32, n_tok: i32,
    out_stride: i32, accumulate: i32, qs_row: i32, aux_row: i32
} }

kernel_params! { SplitReduceParams {
    part: u64, out: u64, bias: u64, rows: i32, n_tok: i32, out_stride: i32, accumulate: i32, nk: i32
} }

/// Rows and columns of the weight tile of one block (kernels/gemm_quant.cu: QG_BM, QG_BK).
const GEMMQ_BM: usize = 64;
const GEMMQ_BK: usize = 128;
/// Blocks the GEMM aims for (split-K below it): ~2 per SM on an H200, 3 on a V100.
const GEMMQ_TARGET_BLOCKS: usize = 256;
/// A block's start-up (its first fetch, not hidden behind a product, and its partial sums)
/// in units of one chunk's time, for the split-K choice ([`GemmQ::splits`]).
const SPLIT_COST: usize = 2;
/// Weight rows of the 128-row batch tile (gemm_quant.cu QR_BM).
const QR_BM: usize = 128;
/// Fewest tokens of a step for the 128-row batch tile by default (`DUSTOFF_QGEMM_R128`); 0: off
/// (the default until the tile is measured against the 64-row tiles on the GPU).
const R128_MIN_TOKENS: usize = 0;

/// Which block tile a packed GEMM launch takes (kernels/gemm_quant.cu).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum QTile {
    /// The default for the shape and step.
    Auto,
    /// 64 weight rows a block (4 warps; above 64 tokens the 128-token prefill tile).
    Rows64,
    /// 128 weight rows a block (8 warps): steps of 9+ tokens, rows a multiple of 128.
    Rows128,
}

/// `out[t, r] (+)= sum_c w[r, c] x16[t, c] (+ bias[r])` for 9+ tokens on the packed weights
/// (kernels/gemm_quant.cu: tiles dequantized into shared memory, wmma): `x16` is the step
/// input cast to F16 (`[ceil16(n_tok), cols]`, above 64 tokens `[ceil64(n_tok), cols]`; rows
/// past `n_tok` read and dropped);
/// `part` the split-K scratch (`[k, n_tok, rows]` f32; the splits shrink to what it holds).
pub struct GemmQ {
    pub w: QView,
    pub x16: Dev<u16>,
    pub out: Dev<f32>,
    pub bias: Option<Dev<f32>>,
    pub n_tok: usize,
    pub out_stride: usize,
    pub accumulate: bool,
    pub part: Option<Dev<f32>>,
}

impl GemmQ {
    /// Whether the kernel takes a `[rows, cols]` matrix (whole 64-row, 128-column tiles).
    pub fn fits(rows: usize, cols: usize) -> bool {
        rows.is_multiple_of(GEMMQ_BM) && cols.is_multiple_of(GEMMQ_BK) && rows > 0
    }

    /// Rows of F16 input the kernel reads for `n_tok` tokens (the 128-token prefill tile reads
    /// no padding rows).
    pub fn input_rows(n_tok: usize) -> usize {
        if n_tok <= 64 {
            n_tok.div_ceil(16) * 16
        } else if Self::prefill_tile(n_tok) {
            n_tok
        } else {
            n_tok.div_ceil(64) * 64
        }
    }

    /// Whether a step of `n_tok` tokens takes the 128-token prefill tile (gemm_quant.cu
    /// `gemmq_<fmt>_w128`): above 64 tokens, unless `DUSTOFF_QGEMM_Z64=1`.
    fn prefill_tile(n_tok: usize) -> bool {
        n_tok > 64 && !super::super::tuning::tuning().qgemm_z64
    }

    /// The tile a step of `n_tok` tokens takes on `[rows, _]` ([`QTile::Auto`] resolved): the
    /// 128-row batch tile from [`R128_MIN_TOKENS`] (`DUSTOFF_QGEMM_R128`) where the rows are
    /// whole 128-row tiles, else the 64-row tiles.
    fn tile(rows: usize, n_tok: usize, asked: QTile) -> QTile {
        let r128_fits = rows.is_multiple_of(QR_BM) && n_tok >= 9;
        match asked {
            QTile::Rows128 if r128_fits => QTile::Rows128,
            QTile::Auto => {
                let from = super::super::tuning::tuning().qgemm_r128.unwrap_or(R128_MIN_TOKENS);
                if r128_fits && from > 0 && n_tok >= from {
                    QTile::Rows128
                } else {
                    QTile::Rows64
                }
            }
            _ => QTile::Rows64,
        }
    }

    /// Split-K scratch (f32 elements) a step of `n_tok` tokens on `[rows, cols]` can use: the
    /// most splits [`GemmQ::splits`] picks on the 64-row tiles at the default block target.
    pub fn part_len(rows: usize, cols: usize, n_tok: usize) -> usize {
        if !(9..=64).contains(&n_tok) || !Self::fits(rows, cols) {
            return 0;
        }
        let (_, most) = Self::split_range(rows / GEMMQ_BM, cols, GEMMQ_TARGET_BLOCKS, usize::MAX);
        if most > 1 {
            most * n_tok * rows
        } else {
            0
        }
    }

    /// K splits for `[rows, cols]` at `n_tok` tokens with `part_len` floats of scratch: `base`
    /// blocks unsplit, `slots` blocks resident at once ([`Kernels::resident_blocks`]). First the
    /// splits that bring the grid to the block target (`DUSTOFF_QGEMM_BLOCKS`); then, up to twice
    /// as many, those that fill the last wave best: a grid of 384 blocks where 264 are resident
    /// (the 8B gate/up at 64 tokens on an H100) runs two waves, the second 45% full. Each
    /// candidate costs its waves times a block's chunks plus [`SPLIT_COST`] chunks of start-up
    /// (`DUSTOFF_QGEMM_SPLIT_COST`; 0: the target alone).
    fn splits(base: usize, slots: usize, (rows, cols): (usize, usize), n_tok: usize, part_len: usize) -> usize {
        let t = super::super::tuning::tuning();
        let fit = part_len / (n_tok * rows).max(1);
        if fit <= 1 {
            return 1;
        }
        let (want, most) = Self::split_range(base, cols, t.qgemm_blocks.unwrap_or(GEMMQ_TARGET_BLOCKS), fit);
        let start = t.qgemm_split_cost.unwrap_or(SPLIT_COST);
        if start == 0 {
            return want;
        }
        let chunks = (cols / GEMMQ_BK) as f64;
        let cost = |nk: usize| (base * nk).div_ceil(slots.max(1)) as f64 * (chunks / nk as f64 + start as f64);
        (1..=most).min_by(|&a, &b| cost(a).total_cmp(&cost(b))).unwrap_or(want)
    }

    /// The splits that bring `base` blocks to `target` (at least 2 chunks a split, at most `fit`)
    /// and the most [`GemmQ::splits`] considers: twice those.
    fn split_range(base: usize, cols: usize, target: usize, fit: usize) -> (usize, usize) {
        let max = (cols / GEMMQ_BK / 2).max(1).min(fit);
        let want = target.div_ceil(base.max(1)).clamp(1, max);
        (want, (2 * want).min(max))
    }

    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        self.launch_tile(k, s, QTile::Auto).map(|_| ())
    }

    /// [`GemmQ::launch`] on the tile `asked` where the shape and step allow it (else the 64-row
    /// tiles): the parity tests run every tile whatever the default. Returns the tile launched.
    pub fn launch_tile(&self, k: &mut Kernels, s: &CudaStream, asked: QTile) -> Result<QTile, CudaError> {
        const K: &str = "gemm_quant";
        let (qs, aux, qs_row, aux_row) = self.w.ptrs(K)?;
        let (rows, cols, n) = (self.w.rows, self.w.cols, self.n_tok);
        check(K, Self::fits(rows, cols), || format!("[{rows}, {cols}] is not whole 64 x 128 tiles"))?;
        check(K, n >= 1, || "no tokens".into())?;
        check(K, rows <= self.out_stride, || "rows overlap their stride".into())?;
        check(K, self.x16.ptr.is_multiple_of(16), || "the F16 input must be 16-byte aligned".into())?;
        // Tiles of 16 tokens per block (4 above 64 tokens), blocks of 64 tokens along z.
        let tiles = n.div_ceil(16).min(4);
        let z = n.div_ceil(64);
        need(K, "input", self.x16, Self::input_rows(n) * cols)?;
        check_product_out(K, (self.out, self.out_stride), self.bias, rows, n)?;
        let tile = Self::tile(rows, n, asked);
        let mut p = GemmQParams {
            qs,
            aux,
            x: self.x16.ptr,
            out: self.out.ptr,
            bias: self.bias.map_or(0, |b| b.ptr),
            part: 0,
            rows: i32_of(K, rows)?,
            cols: i32_of(K, cols)?,
            n_tok: n as i32,
            out_stride: i32_of(K, self.out_stride)?,
            accumulate: i32::from(self.accumulate),
            qs_row,
            aux_row,
        };
        if tile != QTile::Rows128 && Self::prefill_tile(n) {
            // Dynamic shared memory (QW_SMEM): the staged [64 + 128, 136] F16 tiles.
            const SMEM: usize = (GEMMQ_BM + 128) * (GEMMQ_BK + 8) * 2;
            let entry = entries::gemm_quant_w128(&self.w.fmt);
            allow_smem(k, entry, SMEM)?;
            let grid = ((rows / GEMMQ_BM) as u32, 1, u32::try_from(n.div_ceil(128)).unwrap_or(u32::MAX));
            return launch(k, s, entry, grid, 256, SMEM as u32, &p).map(|_| tile);
        }
        // (entry, row blocks, token tiles along z, threads, dynamic shared memory bytes)
        let (entry, row_blocks, z, threads, smem) = match tile {
            QTile::Rows128 => {
                // QR_SMEM: the staged [128 + 32 halves, 136] F16 tiles.
                let halves = n.div_ceil(32).min(2);
                let entry = entries::gemm_quant_r128(&self.w.fmt, halves);
                (entry, rows / QR_BM, n.div_ceil(32 * halves), 256, (QR_BM + 32 * halves) * (GEMMQ_BK + 8) * 2)
            }
            _ => (entries::gemm_quant(&self.w.fmt, tiles), rows / GEMMQ_BM, z, 128, 0),
        };
        if smem > 0 {
            allow_smem(k, entry, smem)?;
        }
        let (threads, smem) = (threads as u32, smem as u32);
        let slots = k.resident_blocks(entry, threads, smem)?;
        let nk = Self::splits(row_blocks * z, slots, (rows, cols), n, self.part.map_or(0, |p| p.len));
        let grid = (row_blocks as u32, nk as u32, u32::try_from(z).unwrap_or(u32::MAX));
        if nk == 1 {
            return launch(k, s, entry, grid, threads, smem, &p).map(|_| tile);
        }
        let part = self.part.expect("splits > 1 only with a scratch");
        p.part = part.ptr;
        launch(k, s, entry, grid, threads, smem, &p)?;
        let r = SplitReduceParams {
            part: part.ptr,
            out: self.out.ptr,
            bias: p.bias,
            rows: p.rows,
            n_tok: p.n_tok,
            out_stride: p.out_stride,
            accumulate: p.accumulate,
            nk: nk as i32,
        };
        launch(k, s, SPLITK_REDUCE_Q, (blocks_for(K, n * rows, 256)?, 1, 1), 256, 0, &r)?;
        Ok(tile)
    }
}

kernel_params! { DequantParams {
    qs: u64, aux: u64, out: u64, row0: i64, n_rows: i32, cols: i32, qs_row: i32, aux_row: i32
} }

/// Threads of a widening block, and the columns of a row it widens: DQ_PASSES (2) rounds of
/// DQ_THREADS lanes storing 8 values each (kernels/dequant.cu).
const DEQUANT_THREADS: usize = 256;
const DEQUANT_COLS: usize = 2 * DEQUANT_THREADS * 8;

/// Rows `row0 .. row0 + n_rows` of a quantized matrix widened to F16 into `out`
/// (`[n_rows, cols]`, 16-byte aligned): the scratch the tensor-core GEMM and cuBLAS read.
pub struct DequantF16 {
    pub w: QView,
    pub out: Dev<u16>,
    pub row0: usize,
    pub n_rows: usize,
}

impl DequantF16 {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "dequant_f16";
        let (qs, aux, qs_row, aux_row) = self.w.ptrs(K)?;
        check(K, self.row0 + self.n_rows <= self.w.rows, || {
            format!("rows {}..{} of {}", self.row0, self.row0 + self.n_rows, self.w.rows)
        })?;
        check(K, self.out.ptr.is_multiple_of(16), || "output must be 16-byte aligned".into())?;
        need(K, "output", self.out, self.n_rows * self.w.cols)?;
        let units = self.n_rows * self.w.cols / self.w.fmt.unit;
        if units == 0 {
            return Ok(());
        }
        let p = DequantParams {
            qs,
            aux,
            out: self.out.ptr,
            row0: self.row0 as i64,
            n_rows: i32_of(K, self.n_rows)?,
            cols: i32_of(K, self.w.cols)?,
            qs_row,
            aux_row,
        };
        // One block per (row, DEQUANT_COLS columns of it).
        let blocks = blocks_for(K, self.n_rows * self.w.cols.div_ceil(DEQUANT_COLS), 1)?;
        launch(k, s, entries::dequant(&self.w.fmt), (blocks, 1, 1), DEQUANT_THREADS as u32, 0, &p)
    }
}

kernel_params! { EmbeddingQParams {
    qs: u64, aux: u64, ids: u64, out: u64, n_tok: i32, cols: i32, qs_row: i32, aux_row: i32
} }

/// `out[t] = f32(table[ids[t]])` from a quantized table `[vocab, dim]`; ids `< vocab` (checked
/// on the host).
pub struct EmbeddingQ {
    pub table: QView,
    pub ids: Dev<u32>,
    pub out: Dev<f32>,
    pub n_tok: usize,
}

impl EmbeddingQ {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "embedding_quant";
        let (qs, aux, qs_row, aux_row) = self.table.ptrs(K)?;
        need(K, "ids", self.ids, self.n_tok)?;
        need(K, "output", self.out, self.n_tok * self.table.cols)?;
        if self.n_tok == 0 {
            return Ok(());
        }
        let p = EmbeddingQParams {
            qs,
            aux,
            ids: self.ids.ptr,
            out: self.out.ptr,
            n_tok: i32_of(K, self.n_tok)?,
            cols: i32_of(K, self.table.cols)?,
            qs_row,
            aux_row,
        };
        launch(k, s, entries::embedding_q(&self.table.fmt), (blocks_for(K, self.n_tok, 1)?, 1, 1), 128, 0, &p)
    }
}

kernel_params! { FillBytesParams { out: u64, n: i64, seed: u64 } }

kernel_params! { TileAuxParams { out: u64, tmpl: u64, n_blocks: i64, seed: u64, ab: i32, n_tmpl: i32 } }

/// Synthetic quantized weights made on the GPU: random qs bytes, and aux blocks each copied
/// from one of the host-quantized templates `tmpl` (`[n_tmpl, fmt.ab]`), chosen by a hash.
pub struct FillQuant {
    pub w: QView,
    pub tmpl: Dev<u8>,
    pub seed: u64,
}

impl FillQuant {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "fill_quant";
        let (qs, aux, _, _) = self.w.ptrs(K)?;
        let f = self.w.fmt;
        let n_blocks = self.w.rows * (self.w.cols / f.dtype.block_size());
        check(K, self.tmpl.len >= f.ab && self.tmpl.len.is_multiple_of(f.ab), || "template size".into())?;
        let words = n_blocks * f.qb / 4;
        if words == 0 {
            return Ok(());
        }
        let p = FillBytesParams { out: qs, n: words as i64, seed: self.seed };
        launch(k, s, "fill_random_u32", (blocks_for(K, words, 256)?.min(65_535), 1, 1), 256, 0, &p)?;
        let p = TileAuxParams {
            out: aux,
            tmpl: self.tmpl.ptr,
            n_blocks: n_blocks as i64,
            seed: self.seed ^ 0x5bd1_e995,
            ab: f.ab as i32,
            n_tmpl: i32_of(K, self.tmpl.len / f.ab)?,
        };
        launch(k, s, "tile_aux", (blocks_for(K, n_blocks * f.ab, 256)?.min(65_535), 1, 1), 256, 0, &p)
    }
}

#[cfg(test)]
mod tests {
    use super::{GemmQ, QTile};

    /// The 128-row tile where a launch asks for it needs whole 128-row tiles and 9+ tokens.
    #[test]
    fn r128_tile_only_on_whole_tiles() {
        assert_eq!(GemmQ::tile(256, 8, QTile::Rows128), QTile::Rows64);
        assert_eq!(GemmQ::tile(192, 32, QTile::Rows128), QTile::Rows64);
        assert_eq!(GemmQ::tile(256, 32, QTile::Rows128), QTile::Rows128);
    }

    /// The split-K choice by whole waves (default start-up of 2 chunks, no environment).
    #[test]
    fn splits_fill_whole_waves() {
        let part = usize::MAX / 2;
        // Qwen3-8B gate/up at 64 tokens: 384 blocks of the 64-row tile. Where 264 are resident
        // (2 an SM on 132 SMs) one split runs a second wave 45% full; two splits fill three.
        assert_eq!(GemmQ::splits(384, 264, (24_576, 4096), 64, part), 2);
        // Where 396 are resident (3 an SM) one wave holds them: no split.
        assert_eq!(GemmQ::splits(384, 396, (24_576, 4096), 48, part), 1);
        // qkv [6144, 4096], 96 blocks: the block target (256) asks for 3 splits, 288 blocks over
        // 264 slots (two waves, the second nearly empty); 5 splits fill the second wave.
        assert_eq!(GemmQ::splits(96, 264, (6144, 4096), 64, part), 5);
        // o [4096, 4096], 64 blocks: 4 splits fit one wave (256 of 264).
        assert_eq!(GemmQ::splits(64, 264, (4096, 4096), 64, part), 4);
        // The scratch bounds the splits: room for 2 x [n_tok, rows] partials.
        assert_eq!(GemmQ::splits(96, 264, (6144, 4096), 64, 2 * 64 * 6144), 2);
        // No scratch: no split.
        assert_eq!(GemmQ::splits(96, 264, (6144, 4096), 64, 0), 1);
    }

    /// The scratch the step plans holds every split [`GemmQ::splits`] can pick on the 64-row tile.
    #[test]
    fn part_len_holds_the_most_splits() {
        for (rows, cols) in [(24_576, 4096), (6144, 4096), (4096, 4096), (4096, 12_288), (2048, 768)] {
            for n in [9, 16, 33, 64] {
                let len = GemmQ::part_len(rows, cols, n);
                for slots in [80, 160, 264, 396, 660] {
                    let nk = GemmQ::splits(rows / 64, slots, (rows, cols), n, usize::MAX / 2);
                    assert!(nk == 1 || nk * n * rows <= len, "[{rows}, {cols}] at {n}: {nk} splits, {len} floats");
                }
            }
        }
        assert_eq!(GemmQ::part_len(4096, 4096, 8), 0, "GEMV steps take no scratch");
    }
}
