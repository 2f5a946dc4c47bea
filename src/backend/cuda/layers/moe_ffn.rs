//! The mixture-of-experts FFN (`FfnKind::Moe`): the routed experts (`cuda/moe.rs`), then the
//! gated shared expert where the layer has one (`cuda/ops/shared_expert.rs`), for every layer
//! whose FFN is sparse whatever its mixer: `io.x += moe(h) + sigmoid(gate . h) shared(h)`.
//!
//! Where the norm before folds (`cx.pre`):
//! - no shared expert: into the MoE launches (`moe_ffn_normed`);
//! - a shared expert, one-stream steps: the shared expert runs inside the routed experts'
//!   three launches (`moe/shexp.rs`), which read `h` in f32, after a plain norm;
//! - a shared expert, other steps: the norm also writes the shared expert's int8 (or F16)
//!   input beside `h` (`step::norm::prepare`; the routed experts read `h` in f32 and leave
//!   `x16` alone).

use super::super::matmul::{input_form, XForm};
use super::super::moe::shexp::{moe_ffn_shared, shared_pairs};
use super::super::moe::{moe_ffn, moe_ffn_grouped, moe_ffn_normed, MoeLayerW};
use super::super::ops::launch::allocated;
use super::super::ops::shared_expert::shared_expert_ffn_with;
use super::super::step::norm::prepare;
use super::super::tap::{ExpertRows, TapPoint};
use super::super::CudaError;
use super::{Cx, Hooks};

/// `fold`: the shared expert's gate folded into its down product's int8 input.
pub(super) fn run(moe: &MoeLayerW, fold: bool, cx: Cx, hooks: &mut Hooks) -> Result<(), CudaError> {
    if hooks.tapped() {
        return tapped(moe, fold, cx, hooks);
    }
    let Cx { k, mm, io, work, pre, .. } = cx;
    let (s, mw) = (mm.s, &work.experts);
    let (n, h, x) = (io.n_tok, io.h, io.x);
    let Some(sh) = &moe.shared else {
        match pre {
            Some(a) => moe_ffn_normed(k, s, moe, mw, x, a.w, a.eps, h, n)?,
            None => moe_ffn(k, s, moe, mw, h, x, n)?,
        }
        return hooks.mark("moe ffn");
    };
    let in_pairs = shared_pairs(moe, mw, n, s);
    let have = match pre {
        Some(a) => {
            let have = match in_pairs {
                None => prepare(k, mm, a, input_form(&sh.gu.parts[0], n))?,
                Some(_) => {
                    a.plain().launch(k, s)?;
                    XForm::None
                }
            };
            hooks.mark("rmsnorm")?;
            have
        }
        None => XForm::None,
    };
    if let Some(pairs) = &in_pairs {
        moe_ffn_shared(k, s, moe, mw, pairs, h, x, n)?;
        return hooks.mark("moe ffn");
    }
    // Qwen3.5-MoE / Qwen3-Next: routed experts, then the gated shared expert.
    moe_ffn(k, s, moe, mw, h, x, n)?;
    hooks.mark("moe ffn")?;
    shared_expert_ffn_with(k, mm, sh, &work.shexp, h, x, n, have, fold)?;
    hooks.mark("shared expert")
}

/// A tapped step, reported in the CPU's order: the router's input, the grouped walk whose
/// buffers hold every expert's inputs, then the shared expert apart with its inputs (gate row
/// and gate/up: the router's rows; down: its `silu(gate) * up`).
fn tapped(moe: &MoeLayerW, fold: bool, cx: Cx, hooks: &mut Hooks) -> Result<(), CudaError> {
    let Cx { c, k, mm, io, work, li, pre } = cx;
    let (s, mw) = (mm.s, &work.experts);
    let (n, h, x) = (io.n_tok, io.h, io.x);
    if let Some(a) = pre {
        // Not reached: a tap turns the folded norms off (the walker's `Hooks::norm`).
        a.plain().launch(k, s)?;
    }
    hooks.input(li, TapPoint::Router, h, n, c.dim)?;
    moe_ffn_grouped(k, s, moe, mw, h, x, n)?;
    let buf = |b, what| allocated(b, s, "moe tap", what);
    let rows = ExpertRows {
        h,
        offsets: buf(&mw.offsets, "group offsets")?,
        entries: buf(&mw.entries, "group entries")?,
        act: allocated(&mw.act, s, "moe tap", "expert activations")?,
        n_tok: n,
        k: moe.n_used,
        dim: c.dim,
        ffn: moe.ffn,
    };
    hooks.experts(li, &rows)?;
    hooks.mark("moe ffn")?;
    let Some(sh) = &moe.shared else { return Ok(()) };
    hooks.input(li, TapPoint::SharedIn, h, n, c.dim)?;
    shared_expert_ffn_with(k, mm, sh, &work.shexp, h, x, n, XForm::None, fold)?;
    // Its down input: `silu(gate) * up` in f32 (the gate scales the product after it).
    let act = allocated(&work.shexp.act, s, "shared expert tap", "activations")?;
    hooks.input(li, TapPoint::SharedDown, act, n, sh.ffn)?;
    hooks.mark("shared expert")
}
