//! The mixture-of-experts FFN (with the shared expert where the layer has one); the maths is
//! `cpu::moe`. The calibration tap sees the router's input (every token), each routed expert's
//! gate/up and down inputs (the tokens routed to it: expert `e` of a GGUF file is the matrix
//! `blk.N.ffn_*_exps.weight[e]`) and the shared expert's inputs (every token).

use super::super::moe::{moe_ffn, moe_ffn_observed, MoeScratch};
use super::Hooks;
use crate::model::moe::MoeWeights;

/// `h` (`[n, dim]`, normed) -> `o` (`[n, dim]`).
pub(super) fn run(m: &MoeWeights, s: &mut MoeScratch, hooks: &mut Hooks, h: &[f32], n: usize, o: &mut [f32]) {
    hooks.input(&[&m.router], h, n);
    if hooks.tap.is_some() {
        moe_ffn_observed(m, h, n, o, s, &mut |mats, x, rows| hooks.input(mats, x, rows));
    } else {
        moe_ffn(m, h, n, o, s);
    }
}
