//! The dense SwiGLU FFN: `down(silu(gate h) * up h)`, gate and up in one fused product.

use super::super::matmul::{matmul, matmul_fused};
use super::super::{ops, take};
use super::Hooks;
use crate::model::layer::DenseFfn;

#[derive(Default)]
pub(super) struct Scratch {
    gate: Vec<f32>, // [n, ffn_dim]
    up: Vec<f32>,   // [n, ffn_dim]
}

/// `h` (`[n, dim]`, normed) -> `o` (`[n, dim]`).
pub(super) fn run(d: DenseFfn, s: &mut Scratch, hooks: &mut Hooks, h: &[f32], n: usize, o: &mut [f32]) {
    let f = d.gate.rows;
    let gate = take(&mut s.gate, n * f);
    let up = take(&mut s.up, n * f);
    hooks.input(&[d.gate, d.up], h, n);
    matmul_fused(&[d.gate, d.up], h, n, &mut [&mut *gate, &mut *up]);
    ops::silu_mul_inplace(gate, up);
    hooks.input(&[d.down], gate, n);
    matmul(d.down, gate, n, o);
}
