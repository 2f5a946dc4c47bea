//! The mixture-of-experts FFN (with the shared expert where the layer has one); the maths is
//! `cpu::moe`. The calibration tap sees the router's input; the experts read per-expert groups
//! of tokens inside `moe_ffn`, which the tap does not see yet.

use super::super::moe::{moe_ffn, MoeScratch};
use super::Hooks;
use crate::model::moe::MoeWeights;

/// `h` (`[n, dim]`, normed) -> `o` (`[n, dim]`).
pub(super) fn run(m: &MoeWeights, s: &mut MoeScratch, hooks: &mut Hooks, h: &[f32], n: usize, o: &mut [f32]) {
    hooks.input(&[&m.router], h, n);
    moe_ffn(m, h, n, o, s);
}
