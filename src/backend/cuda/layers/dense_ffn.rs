//! The dense SwiGLU FFN (`FfnKind::Dense`): `io.x += down(silu(gate h) * up h)`, gate and up
//! one stacked product (the fused SwiGLU GEMV for few tokens), the norm before folded into it
//! where `cx.pre` says (`step::norm::norm_swiglu`).

use super::super::dmat::Linear;
use super::super::matmul::{swiglu, Product};
use super::super::step::norm::norm_swiglu;
use super::super::tap::TapPoint;
use super::super::CudaError;
use super::{Cx, Hooks};

/// `wgu`: `[2 ffn, dim]` gate rows then up rows; `wdown`: `[dim, ffn]`.
pub(super) fn run((wgu, wdown): (&Linear, &Linear), cx: Cx, hooks: &mut Hooks) -> Result<(), CudaError> {
    let Cx { c, k, mm, io, li, pre, .. } = cx;
    let (n, ffn) = (io.n_tok, c.ffn_dim);
    hooks.input(li, TapPoint::GateUp, io.h, n, c.dim)?;
    match pre {
        Some(a) => {
            norm_swiglu(k, mm, a, wgu, io.gu, io.act, ffn)?;
            hooks.mark("norm+gate/up matmul")?;
        }
        None => {
            swiglu(k, mm, wgu, io.h, n, io.gu, io.act, ffn)?;
            hooks.mark("gate/up matmul")?;
        }
    }
    hooks.input(li, TapPoint::Down, io.act, n, ffn)?;
    let accumulate = hooks.adds_residual();
    mm.run(k, Product { lin: wdown, bias: None, x: io.act, n, out: io.x, accumulate })?;
    hooks.mark("down matmul")
}
