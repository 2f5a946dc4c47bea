//! The one dispatcher of the step's matrix products: a kernel chosen by (weight format, tokens
//! in the step).
//!
//! | weights | tokens | kernel |
//! |---|---|---|
//! | F16 | below `tc_min_tokens` (1) | f32 GEMV (gemv_f16.cu) |
//! | F16 | up to `tc_max_tokens` (16) | tensor-core GEMM (gemm_tc.cu), input cast to F16 |
//! | F16 | more | cuBLAS |
//! | block format | 1..=4 (`DUSTOFF_QGEMV_MAX_TOKENS`, up to 8) | input quantized once to two int8 planes, then the dp4a GEMV on the packed blocks (gemv_q8.cu); `DUSTOFF_QGEMV_F32=1`: the f32-input GEMV (gemv_quant.cu) |
//! | block format | up to 64 (whole 64 x 128 tiles; `DUSTOFF_QGEMM_MAX_TOKENS`) | tensor-core GEMM dequantizing its tiles into shared memory (gemm_quant.cu; above 64 tokens, where allowed, its 128-token prefill tile) |
//! | block format | other shapes, or above that | the matrix (or a row chunk of it) widened into one F16 scratch, reused by every matrix of the step, then the F16 path |
//!
//! A `Linear` of several parts (a QKV of mixed formats) runs one product per part into its rows
//! of the output. `swiglu` is the gate/up product with its activation (a fused GEMV where one
//! exists for the shape, else the product and `silu_mul`).

use cudarc::driver::CudaStream;

use super::compile::kernels::Kernels;
use super::dmat::{DevMat, Linear};
use super::ops as l;
use super::ops::gemm_tc::{GemmTc, TC_MAX_TOKENS};
use super::ops::gemv_f16::GemvSwiglu;
use super::ops::launch::{Dev, GEMV_MAX_TOKENS};
use super::ops::qlaunch::{DequantF16, GemmQ, GemvQ, QView, QuantizeX};
use super::tuning::tuning;
use super::CudaError;
use crate::model::config::ModelConfig;
use crate::model::layer::{describe, MixerKind};

/// Fewest tokens that take the tensor-core GEMM instead of the f32 GEMV on F16 weights (at most
/// 8 use the GEMV). `DUSTOFF_TC_MIN_TOKENS` overrides the default of 2 (for comparisons).
pub(super) fn tc_min_tokens() -> usize {
    tuning().tc_min_tokens.unwrap_or(2).clamp(2, l::GEMV_MAX_TOKENS + 1)
}

/// Most tokens that take the tensor-core GEMM; larger steps use cuBLAS (faster from 32 tokens
/// on in `kernel_breakdown`, H200). `DUSTOFF_TC_MAX_TOKENS` overrides the default of 16.
fn tc_max_tokens() -> usize {
    tuning().tc_max_tokens.unwrap_or(16).min(TC_MAX_TOKENS)
}

/// Most tokens of a step that read quantized matrices with the GEMV on the packed blocks
/// (`DUSTOFF_QGEMV_MAX_TOKENS` overrides the default of 4); larger steps take the packed GEMM.
/// Measured on the H200 (docs/BENCHMARKS.md, 2026-12-01 session 3): 8 sequences of Q4_K_M
/// decoded at 615 tok/s with the 8-token int8 GEMV and at 902 with the GEMM (16-token tile);
/// the 8-token GEMV of gate/up took 116 us against the GEMM's 81. Session 4's GEMV: 76 us
/// against 70 (Q4_K gate/up), and 66 against 43 (down): the GEMM still wins at 8 tokens.
fn qgemv_max_tokens() -> usize {
    tuning().qgemv_max_tokens.unwrap_or(4).min(GEMV_MAX_TOKENS)
}

/// Most tokens of a step for the tensor-core GEMM on the packed blocks by default; larger
/// steps (prefill) widen the matrices to F16 for cuBLAS. Measured (same session): prefill 768
/// of Q4_K_M at 7.0k tok/s through the packed GEMM (64-token tiles along z, wmma) against
/// 15.1k widened; batched 32 / 64 sequences decoded at 2,805 / 3,966 tok/s with the GEMM
/// against 1,597 / 2,843 widened. Session 4 (docs/BENCHMARKS.md): the 128-token tile of 8
/// warps (`gemmq_<fmt>_w128`) prefilled at 6.9k tok/s against 13.7k widened: prefill stays
/// widened (the issue allows a per-matrix F16 scratch reused across layers where faster).
const QGEMM_MAX_TOKENS: usize = 64;

/// Most tokens of a step for the tensor-core GEMM on the packed blocks; larger steps widen
/// the matrices to F16 (`DUSTOFF_QGEMM_MAX_TOKENS`; 0 widens every step above the GEMV's).
fn qgemm_max_tokens() -> usize {
    tuning().qgemm_max_tokens.unwrap_or(QGEMM_MAX_TOKENS)
}

/// Whether quantized models of shape `c` need the F16 scratch that matrices are widened into:
/// some matrix shape the packed GEMM does not take (rows a multiple of 64, columns of 128; the
/// parts of a mixed QKV or gate/up included), steps the GEMM does not serve (above
/// [`qgemm_max_tokens`]: prefill), or a mixture-of-experts or hybrid model (their other
/// matrices may go through the scratch).
pub fn wide_scratch_needed(c: &ModelConfig) -> bool {
    if describe(&c.layer_kinds()).is_some() || qgemm_max_tokens() != usize::MAX {
        return true;
    }
    let (d, q, kv, f) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
    let shapes = [(q + 2 * kv, d), (q + kv, d), (q, d), (kv, d), (d, q), (2 * f, d), (f, d), (d, f), (c.vocab_size, d)];
    !shapes.iter().all(|&(rows, cols)| GemmQ::fits(rows, cols))
}

/// Most elements of the F16 scratch (32 MB): larger matrices are widened in row chunks, each
/// followed by its F16 GEMM (still large: 1,280 rows of the Qwen3-8B down matrix at least).
/// `DUSTOFF_WIDE_MB=N` sets N MB instead (for comparisons of the chunking).
const WIDE_CAP: usize = 16 << 20;

fn wide_cap() -> usize {
    tuning().wide_mb.map_or(WIDE_CAP, |mb| (mb << 20) / 2)
}

/// Elements of the F16 scratch for widened quantized matrices (0 where none is needed): the
/// largest layer matrix up to [`WIDE_CAP`], and at least 128 rows of the widest one.
pub fn wide_scratch_len(c: &ModelConfig) -> usize {
    if !wide_scratch_needed(c) {
        return 0;
    }
    let (d, f) = (c.dim, c.ffn_dim);
    // Every layer kind's mixer projections (hybrid models: the linear layers' stacked input
    // projection and output, the gated q), the plain attention's and the dense FFN's.
    let kinds = c.layer_kinds();
    let mixers = kinds.iter().flat_map(|k| c.mixer_matrices(k.mixer));
    let plain = c.mixer_matrices(MixerKind::Attention);
    let shapes: Vec<(usize, usize)> = mixers.chain(plain).chain([(2 * f, d), (d, f)]).collect();
    let largest = shapes.iter().map(|&(r, k)| r * k).max().unwrap_or(0);
    let widest = shapes.iter().map(|&(_, k)| k).max().unwrap_or(0);
    largest.min(wide_cap()).max(128 * widest)
}

/// Whether the packed GEMV reads int8-quantized activations (the default).
fn q8_acts() -> bool {
    !tuning().qgemv_f32
}

/// What the step input has been converted into in the `x16` scratch.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum XForm {
    None,
    F16,
    Q8,
}

/// The form a step of `n` tokens reads `m`'s input in: the int8 planes (packed GEMV), F16 in
/// `x16` (tensor-core GEMM, packed GEMM, cuBLAS), or the f32 input itself (F16 GEMV).
pub fn input_form(m: &DevMat, n: usize) -> XForm {
    match (packed_gemv(m, n), q8_acts()) {
        (true, true) => XForm::Q8,
        (false, _) if n >= tc_min_tokens() => XForm::F16,
        _ => XForm::None,
    }
}

/// Whether a step of `n` tokens reads `m`'s packed blocks directly (else through the scratch).
pub fn packed_gemv(m: &DevMat, n: usize) -> bool {
    matches!(m.data, super::dmat::MatData::Quant { .. }) && n <= qgemv_max_tokens()
}

/// The buffers the products of one step use.
pub struct Mm<'a> {
    pub s: &'a CudaStream,
    /// None without cuBLAS: [`Mm::f16`] then slices large steps into tensor-core GEMMs.
    pub blas: Option<&'a cudarc::cublas::CudaBlas>,
    /// The step input cast to F16 (`[max(16, tokens), widest]`).
    pub x16: Dev<u16>,
    /// Split-K scratch of the tensor-core GEMM.
    pub part: Dev<f32>,
    /// F16 scratch for widened quantized matrices (none for an all-F16 model).
    pub wide: Option<Dev<u16>>,
}

/// `out[t, :rows] (+)= W x[t, :cols] (+ bias)` for `n` tokens; `x` `[n, cols]`, `out`
/// `[n, rows]`, both contiguous.
pub struct Product<'w> {
    pub lin: &'w Linear,
    pub bias: Option<Dev<f32>>,
    pub x: Dev<f32>,
    pub n: usize,
    pub out: Dev<f32>,
    pub accumulate: bool,
}

impl Mm<'_> {
    pub fn run(&mut self, k: &mut Kernels, p: Product) -> Result<(), CudaError> {
        self.run_with(k, p, XForm::None)
    }

    /// [`Mm::run`] where `x16` already holds `p.x` in the form `have` (a fused norm wrote it).
    pub fn run_with(&mut self, k: &mut Kernels, p: Product, mut have: XForm) -> Result<(), CudaError> {
        let (rows, cols) = (p.lin.rows(), p.lin.cols());
        // The parts share one conversion of the input (x16 holds either form: redone on a switch).
        let mut r0 = 0;
        for m in &p.lin.parts {
            let sub = Sub {
                m,
                bias: p.bias.map(|b| b.offset(r0)),
                x: p.x,
                n: p.n,
                out: p.out.offset(r0),
                out_stride: rows,
                accumulate: p.accumulate,
            };
            let want = input_form(m, p.n);
            if want != XForm::None && want != have {
                if want == XForm::Q8 {
                    QuantizeX { x: p.x, xq: self.x16.bytes(), n_tok: p.n, cols, x_stride: cols }.launch(k, self.s)?;
                } else {
                    l::CastF16 { x: p.x, out: self.x16, n: p.n * cols }.launch(k, self.s)?;
                }
                have = want;
            }
            self.part(k, sub)?;
            r0 += m.rows;
        }
        Ok(())
    }

    /// One part: rows `0..m.rows` of `out` (with its stride).
    fn part(&mut self, k: &mut Kernels, p: Sub) -> Result<(), CudaError> {
        let m = p.m;
        if let Some(w) = m.quant(self.s) {
            if packed_gemv(m, p.n) {
                return GemvQ {
                    w,
                    x: p.x,
                    out: p.out,
                    bias: p.bias,
                    rows: m.rows,
                    n_tok: p.n,
                    x_stride: m.cols,
                    out_stride: p.out_stride,
                    accumulate: p.accumulate,
                    swiglu: false,
                    xq: q8_acts().then(|| self.x16.bytes()),
                }
                .launch(k, self.s);
            }
            if p.n <= qgemm_max_tokens()
                && GemmQ::fits(m.rows, m.cols)
                && GemmQ::input_rows(p.n) * m.cols <= self.x16.len
            {
                let g = GemmQ {
                    w,
                    x16: self.x16,
                    out: p.out,
                    bias: p.bias,
                    n_tok: p.n,
                    out_stride: p.out_stride,
                    accumulate: p.accumulate,
                    part: Some(self.part),
                };
                return g.launch(k, self.s);
            }
            // Row chunks that fit the scratch (the output head is larger than any layer matrix).
            let wide = self.wide.filter(|d| d.len >= 128 * m.cols).ok_or_else(|| CudaError::Shape {
                kernel: "dequant_f16",
                reason: format!("no F16 scratch of 128 rows of {} for a {}-token step", m.cols, p.n),
            })?;
            let chunk = (wide.len / m.cols.max(1)) / 128 * 128;
            let mut r = 0;
            while r < m.rows {
                let n_rows = chunk.min(m.rows - r);
                DequantF16 { w, out: wide, row0: r, n_rows }.launch(k, self.s)?;
                let bias = p.bias.map(|b| b.offset(r));
                let out = p.out.offset(r);
                let (n, out_stride, accumulate) = (p.n, p.out_stride, p.accumulate);
                self.f16(k, F16Product { w: wide, rows: n_rows, cols: m.cols, bias, n, out, out_stride, accumulate })?;
                r += n_rows;
            }
            return Ok(());
        }
        let w = m.f16(self.s).expect("a matrix is F16 or quantized");
        if p.n < tc_min_tokens() {
            return l::Gemv {
                w,
                x: p.x,
                out: p.out,
                bias: p.bias,
                rows: m.rows,
                cols: m.cols,
                n_tok: p.n,
                x_stride: m.cols,
                out_stride: p.out_stride,
                accumulate: p.accumulate,
            }
            .launch(k, self.s);
        }
        let (rows, cols, bias, n, out) = (m.rows, m.cols, p.bias, p.n, p.out);
        self.f16(k, F16Product { w, rows, cols, bias, n, out, out_stride: p.out_stride, accumulate: p.accumulate })
    }

    /// `out[t, r] = silu(gate) * up` of a stacked quantized gate/up `w` (`[2 ffn, cols]`) for a
    /// step of `n` tokens that [`packed_gemv`] serves: the input quantized to int8 into `x16`
    /// (unless `have` says a fused norm already wrote it there), then the SwiGLU GEMV (or the
    /// f32-input one with `DUSTOFF_QGEMV_F32=1`).
    #[allow(clippy::too_many_arguments)]
    pub fn swiglu_q_with(
        &mut self,
        k: &mut Kernels,
        w: QView,
        x: Dev<f32>,
        n: usize,
        out: Dev<f32>,
        ffn: usize,
        have: XForm,
    ) -> Result<(), CudaError> {
        let cols = w.cols;
        let xq = q8_acts().then(|| self.x16.bytes());
        if let (Some(xq), false) = (xq, have == XForm::Q8) {
            QuantizeX { x, xq, n_tok: n, cols, x_stride: cols }.launch(k, self.s)?;
        }
        let g = GemvQ {
            w,
            x,
            out,
            bias: None,
            rows: ffn,
            n_tok: n,
            x_stride: cols,
            out_stride: ffn,
            accumulate: false,
            swiglu: true,
            xq,
        };
        g.launch(k, self.s)
    }

    /// F16 weights `[rows, cols]` times the F16 input already in `x16`.
    fn f16(&mut self, k: &mut Kernels, p: F16Product) -> Result<(), CudaError> {
        let F16Product { w, rows, cols, bias, n, out, out_stride, accumulate } = p;
        if n <= tc_max_tokens() && GemmTc::fits(w, self.x16, rows, cols, n) {
            let g = GemmTc {
                w,
                x: self.x16,
                out,
                bias,
                rows,
                cols,
                n_tok: n,
                out_stride,
                accumulate,
                part: Some(self.part),
            };
            return g.launch(k, self.s);
        }
        let Some(blas) = self.blas else {
            return self.f16_slices(k, p);
        };
        l::Gemm { w, x: self.x16, out, rows, cols, n_tok: n, out_stride, accumulate }.launch(blas)?;
        if let Some(b) = bias {
            l::BiasAdd { x: out, b, n_tok: n, n: rows, stride: out_stride }.launch(k, self.s)?;
        }
        Ok(())
    }

    /// [`Mm::f16`] without cuBLAS: the tensor-core GEMM of decode batches over slices of at most
    /// `TC_MAX_TOKENS` tokens. Each slice reads W again (from L2 or memory), so a long prompt
    /// runs slower than through cuBLAS; the sums are the same F32 accumulations of F16 products.
    /// `x16` holds `[n, cols]` with room for the last slice's padding to 16 rows (the work
    /// buffers are sized to a power of two of at least 16 tokens).
    fn f16_slices(&mut self, k: &mut Kernels, p: F16Product) -> Result<(), CudaError> {
        let F16Product { w, rows, cols, bias, n, out, out_stride, accumulate } = p;
        let mut t0 = 0;
        while t0 < n {
            let m = (n - t0).min(TC_MAX_TOKENS);
            let x = self.x16.offset(t0 * cols);
            let fits = GemmTc::fits(w, x, rows, cols, m);
            super::ops::launch::check("gemm_tc_f16", fits, || {
                format!(
                    "a [{rows}x{cols}] product of {n} tokens needs cuBLAS (rows not a multiple of 16 or columns \
                     of 32), and no libcublas was loaded"
                )
            })?;
            let part = Some(self.part);
            let out = out.offset(t0 * out_stride);
            GemmTc { w, x, out, bias, rows, cols, n_tok: m, out_stride, accumulate, part }.launch(k, self.s)?;
            t0 += m;
        }
        Ok(())
    }
}

/// A product on F16 weights `w` (`[rows, cols]`) of the `n` rows of F16 input in `Mm::x16`:
/// `out[t * out_stride + r] (+)= w[r] . x16[t] (+ bias[r])`.
#[derive(Clone, Copy)]
struct F16Product {
    w: Dev<u16>,
    rows: usize,
    cols: usize,
    bias: Option<Dev<f32>>,
    n: usize,
    out: Dev<f32>,
    out_stride: usize,
    accumulate: bool,
}

/// One part of a product.
struct Sub<'w> {
    m: &'w DevMat,
    bias: Option<Dev<f32>>,
    x: Dev<f32>,
    n: usize,
    out: Dev<f32>,
    out_stride: usize,
    accumulate: bool,
}

/// `act[t, r] = silu(gate) * up` of the stacked gate/up weights `[2 ffn, dim]` for `n` tokens:
/// one fused GEMV where the weights are one part (F16 at 1 token, a block format at 1..=8),
/// else the product into `gu` and `silu_mul`.
#[allow(clippy::too_many_arguments)]
pub(super) fn swiglu(
    k: &mut Kernels,
    mm: &mut Mm,
    wgu: &Linear,
    h: Dev<f32>,
    n: usize,
    gu: Dev<f32>,
    act: Dev<f32>,
    ffn: usize,
) -> Result<(), CudaError> {
    let s = mm.s;
    let dim = wgu.cols();
    if let [m] = &wgu.parts[..] {
        if let (Some(w), true) = (m.f16(s), n < tc_min_tokens()) {
            let g = GemvSwiglu { w, x: h, out: act, ffn, cols: dim, n_tok: n, x_stride: dim, out_stride: ffn };
            return g.launch(k, s);
        }
        if let (Some(w), true) = (m.quant(s), packed_gemv(m, n)) {
            return mm.swiglu_q_with(k, w, h, n, act, ffn, XForm::None);
        }
    }
    mm.run(k, Product { lin: wgu, bias: None, x: h, n, out: gu, accumulate: false })?;
    l::SiluMul { gu, out: act, n_tok: n, ffn }.launch(k, s)
}

#[cfg(test)]
mod scratch_tests {
    use super::{wide_cap, wide_scratch_len, wide_scratch_needed};
    use crate::model::shapes::{shape, SHAPES};

    /// Every projection of every layer kind of the real shapes is widened through the scratch:
    /// whole where it fits the cap, else in chunks of at least 128 rows.
    #[test]
    fn wide_scratch_holds_every_layer_kinds_matrices() {
        let mut checked = 0;
        for name in SHAPES {
            let c = shape(name).expect("a listed shape");
            if !wide_scratch_needed(&c) {
                continue;
            }
            checked += 1;
            let len = wide_scratch_len(&c);
            let (d, f) = (c.dim, c.ffn_dim);
            let kinds = c.layer_kinds();
            let dense = [(2 * f, d), (d, f)];
            for (rows, cols) in kinds.iter().flat_map(|k| c.mixer_matrices(k.mixer)).chain(dense) {
                assert!(len >= (rows * cols).min(wide_cap()) && len >= 128 * cols, "{name}: [{rows}, {cols}] in {len}");
            }
        }
        assert!(checked > 0, "no shape needs the scratch");
    }
}
