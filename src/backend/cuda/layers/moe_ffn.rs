//! The mixture-of-experts FFN (`FfnKind::Moe`): the routed experts (`cuda/moe.rs`), then the
//! gated shared expert where the layer has one (`cuda/shared_expert.rs`), for every layer
//! whose FFN is sparse whatever its mixer: `io.x += moe(h) + sigmoid(gate . h) shared(h)`.
//!
//! Where the norm before folds (`cx.pre`):
//! - no shared expert: into the MoE launches (`moe_ffn_normed`);
//! - a shared expert, one-stream steps: the shared expert runs inside the routed experts'
//!   three launches (`moe_shexp.rs`), which read `h` in f32, after a plain norm;
//! - a shared expert, other steps: the norm also writes the shared expert's int8 (or F16)
//!   input beside `h` (`step_norm::prepare`; the routed experts read `h` in f32 and leave
//!   `x16` alone).

use super::super::matmul::{input_form, XForm};
use super::super::moe::{moe_ffn, moe_ffn_normed, MoeLayerW};
use super::super::moe_shexp::{moe_ffn_shared, shared_pairs};
use super::super::shared_expert::shared_expert_ffn_with;
use super::super::step_norm::prepare;
use super::super::tap::TapPoint;
use super::super::CudaError;
use super::{Cx, Hooks};

/// `fold`: the shared expert's gate folded into its down product's int8 input.
pub(super) fn run(moe: &MoeLayerW, fold: bool, cx: Cx, hooks: &mut Hooks) -> Result<(), CudaError> {
    let Cx { c, k, mm, io, work, li, pre } = cx;
    let s = mm.s;
    let (n, h, x) = (io.n_tok, io.h, io.x);
    let Some(sh) = &moe.shared else {
        match pre {
            Some(a) => moe_ffn_normed(k, s, moe, &work.moe, x, a.w, a.eps, h, n)?,
            None => {
                hooks.input(li, TapPoint::Router, &work.h, n, c.dim)?;
                moe_ffn(k, s, moe, &work.moe, h, x, n)?;
            }
        }
        return hooks.mark("moe ffn");
    };
    let in_pairs = if hooks.tapped() { None } else { shared_pairs(moe, &work.moe, n, s) };
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
    hooks.input(li, TapPoint::Router, &work.h, n, c.dim)?;
    if let Some(pairs) = &in_pairs {
        moe_ffn_shared(k, s, moe, &work.moe, pairs, h, x, n)?;
        return hooks.mark("moe ffn");
    }
    // Qwen3.5-MoE / Qwen3-Next: routed experts, then the gated shared expert.
    moe_ffn(k, s, moe, &work.moe, h, x, n)?;
    hooks.mark("moe ffn")?;
    shared_expert_ffn_with(k, mm, sh, &work.shexp, h, x, n, have, fold)?;
    hooks.mark("shared expert")
}
