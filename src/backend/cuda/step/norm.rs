//! The layer norms of the decode step folded into the products that read them (attention norm
//! -> QKV, FFN norm -> gate/up): the kernel that prepares the product's input (int8 planes or
//! F16 cast) also normalizes it, and the one-token F16 GEMV normalizes inside its own loads
//! (fused_norm.rs). Each norm was a launch of its own before, 72 of the ~300 (F16) to ~430
//! (quantized) launches of a Qwen3-8B decode step. `h` still receives the normed input wherever
//! the product may read it in f32 (a part of a mixed QKV that takes another path).

use crate::backend::cuda::compile::kernels::Kernels;
use crate::backend::cuda::dmat::Linear;
use crate::backend::cuda::matmul::{input_form, packed_gemv, tc_min_tokens, Mm, Product, XForm};
use crate::backend::cuda::ops as l;
use crate::backend::cuda::ops::fused_norm::{GemvNorm, RmsNormF16, RmsNormQ8};
use crate::backend::cuda::ops::launch::Dev;
use crate::backend::cuda::CudaError;

/// The norm in front of a product: `h = rmsnorm(x) * w`, rows of `dim`.
#[derive(Clone, Copy)]
pub(in crate::backend::cuda) struct NormIn {
    pub x: Dev<f32>,
    pub w: Dev<f32>,
    pub h: Dev<f32>,
    pub n: usize,
    pub dim: usize,
    pub eps: f32,
}

impl NormIn {
    /// The norm alone (`h` `[n, dim]` f32), for widths and steps that no product folds it into.
    pub(in crate::backend::cuda) fn plain(self) -> l::RmsNorm {
        l::RmsNorm {
            x: self.x,
            w: self.w,
            out: self.h,
            rows: None,
            n_src_rows: self.n,
            n_outer: self.n,
            n_inner: 1,
            dim: self.dim,
            in_stride: self.dim,
            out_stride: self.dim,
            eps: self.eps,
        }
    }
}

/// Normalizes into `h` and, in the same launch, writes `x16` in the form the product reads
/// (`form`); returns what `x16` now holds.
pub(in crate::backend::cuda) fn prepare(
    k: &mut Kernels,
    mm: &mut Mm,
    a: NormIn,
    form: XForm,
) -> Result<XForm, CudaError> {
    let s = mm.s;
    let (x, w, h, n_tok, dim, eps) = (a.x, a.w, a.h, a.n, a.dim, a.eps);
    // The fused kernels take whole 32-value blocks; other widths keep the plain norm.
    let form = if dim.is_multiple_of(32) { form } else { XForm::None };
    match form {
        XForm::Q8 => RmsNormQ8 { x, w, h, xq: mm.x16.bytes(), n_tok, dim, eps }.launch(k, s)?,
        XForm::F16 => RmsNormF16 { x, w, h, x16: mm.x16, n_tok, dim, eps }.launch(k, s)?,
        XForm::None => a.plain().launch(k, s)?,
    }
    Ok(form)
}

/// `p` on `rmsnorm(a.x)`: `p.x` is `a.h` (written unless the one-token F16 GEMV normalizes in
/// its own loads).
pub(in crate::backend::cuda) fn norm_product(
    k: &mut Kernels,
    mm: &mut Mm,
    a: NormIn,
    p: Product,
) -> Result<(), CudaError> {
    let s = mm.s;
    if let [m] = &p.lin.parts[..] {
        if let (Some(w), XForm::None) = (m.f16(s), input_form(m, p.n)) {
            let g = GemvNorm {
                w,
                x: a.x,
                g: a.w,
                out: p.out,
                bias: p.bias,
                rows: m.rows,
                cols: m.cols,
                n_tok: p.n,
                out_stride: m.rows,
                accumulate: p.accumulate,
                swiglu: false,
                eps: a.eps,
            };
            return g.launch(k, s);
        }
    }
    let have = prepare(k, mm, a, input_form(&p.lin.parts[0], p.n))?;
    mm.run_with(k, p, have)
}

/// `act[t, r] = silu(gate) * up` of the stacked gate/up `wgu` (`[2 ffn, dim]`) on
/// `rmsnorm(a.x)`, as `step::swiglu` on a normed input: the fused SwiGLU GEMV where the weights
/// are one part, else the product into `gu` then `silu_mul`.
#[allow(clippy::too_many_arguments)]
pub(in crate::backend::cuda) fn norm_swiglu(
    k: &mut Kernels,
    mm: &mut Mm,
    a: NormIn,
    wgu: &Linear,
    gu: Dev<f32>,
    act: Dev<f32>,
    ffn: usize,
) -> Result<(), CudaError> {
    let s = mm.s;
    let n = a.n;
    if let [m] = &wgu.parts[..] {
        if let (Some(w), true) = (m.f16(s), n < tc_min_tokens()) {
            let g = GemvNorm {
                w,
                x: a.x,
                g: a.w,
                out: act,
                bias: None,
                rows: ffn,
                cols: m.cols,
                n_tok: n,
                out_stride: ffn,
                accumulate: false,
                swiglu: true,
                eps: a.eps,
            };
            return g.launch(k, s);
        }
        if let (Some(w), true) = (m.quant(s), packed_gemv(m, n)) {
            let have = prepare(k, mm, a, input_form(m, n))?;
            return mm.swiglu_q_with(k, w, a.h, n, act, ffn, have);
        }
    }
    let have = prepare(k, mm, a, input_form(&wgu.parts[0], n))?;
    mm.run_with(k, Product { lin: wgu, bias: None, x: a.h, n, out: gu, accumulate: false }, have)?;
    l::SiluMul { gu, out: act, n_tok: n, ffn }.launch(k, s)
}
