//! The Gated DeltaNet mixer (`MixerKind::DeltaNet`, the linear-attention layers of Qwen3.5 and
//! Qwen3-Next): input projections (q|k|v, z, b, a in one fused product), causal conv1d + SiLU
//! over the q|k|v channels, q/k L2 norm, gates, the delta rule per value head, gated RMSNorm,
//! output projection (the ops are `cpu::deltanet`). Each sequence's conv window and delta-rule
//! matrices live in the backend's state pool (`cpu::hybrid`).
//!
//! The delta rule runs token by token here (`delta_rule_step`), also for prefill: a sequence's
//! result then does not depend on how its prompt was split into chunks, so chunked and whole
//! prefill give the same bits (the chunked form is the GPU's shape; it is tested against the
//! step form in `deltanet`).

use rayon::prelude::*;

use super::super::deltanet::{conv1d_silu, delta_rule_step, gated_rmsnorm, gates_inplace, l2norm_inplace};
use super::super::hybrid::HybridCpu;
use super::super::matmul::{matmul, matmul_fused};
use super::super::take;
use super::{Hooks, StepCtx};
use crate::model::hybrid::DeltaNetWeights;

/// (`C` = q|k|v channels, `V` = `n_v d_v`.)
#[derive(Default)]
pub(super) struct Scratch {
    qkv: Vec<f32>,   // [n, C] q|k|v projection
    mixed: Vec<f32>, // [n, C] conv output
    z: Vec<f32>,     // [n, V]
    beta: Vec<f32>,  // [n, n_v] beta logits, then beta
    g: Vec<f32>,     // [n, n_v] decay input, then g
    core: Vec<f32>,  // [n, V] delta-rule output
}

/// Layer `l` over the step's chunks: `h` (`[n, dim]`, normed) -> `o` (`[n, dim]`).
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    cx: &StepCtx,
    l: usize,
    d: &DeltaNetWeights,
    state: &mut HybridCpu,
    s: &mut Scratch,
    hooks: &mut Hooks,
    h: &[f32],
    o: &mut [f32],
) {
    let hc = state.config();
    let n = cx.pos.len();
    let (ch, vd, nk, nv, dk, dv, kk) =
        (hc.conv_channels(), hc.value_dim(), hc.n_k_heads, hc.n_v_heads, hc.d_k, hc.d_v, hc.conv_kernel);
    let grouping = hc.grouping;
    let conv_len = (kk - 1) * ch;
    let mat_len = dk * dv;
    let j = state.linear_index(l).unwrap_or(0);
    let Scratch { qkv, mixed, z, beta, g, core } = s;
    let qkv = take(qkv, n * ch);
    let z = take(z, n * vd);
    let beta = take(beta, n * nv);
    let g = take(g, n * nv);
    hooks.input(&[&d.w_qkv, &d.w_z, &d.w_b, &d.w_a], h, n);
    matmul_fused(&[&d.w_qkv, &d.w_z, &d.w_b, &d.w_a], h, n, &mut [&mut *qkv, &mut *z, &mut *beta, &mut *g]);
    let mixed = take(mixed, n * ch);
    let core = take(core, n * vd);
    let q_scale = 1.0 / (dk as f32).sqrt();
    let mut t0 = 0;
    for (chunk, &slot) in cx.plan.chunks.iter().zip(&cx.plan.state.slots) {
        let len = chunk.tokens.len();
        let Some(layer_state) = state.layer_state(slot, j) else {
            // begin_step checked every chunk's slot and grew the buffer to the highest.
            debug_assert!(false, "sequence {} has no recurrent state", chunk.seq);
            t0 += len;
            continue;
        };
        let (conv_state, mats) = layer_state.split_at_mut(conv_len);
        let rows = t0 * ch..(t0 + len) * ch;
        conv1d_silu(&qkv[rows.clone()], conv_state, &d.conv, ch, kk, &mut mixed[rows]);
        for t in t0..t0 + len {
            let m = &mut mixed[t * ch..(t + 1) * ch];
            for head in m[..2 * nk * dk].chunks_exact_mut(dk) {
                l2norm_inplace(head, 1e-6);
            }
            m[..nk * dk].iter_mut().for_each(|x| *x *= q_scale);
            gates_inplace(&mut beta[t * nv..(t + 1) * nv], &mut g[t * nv..(t + 1) * nv], &d.neg_a, &d.dt_bias);
        }
        // Each value head runs its tokens in order through its own state matrix.
        let (mixed, beta, g) = (&*mixed, &*beta, &*g);
        let run_head = |(hh, sm): (usize, &mut [f32])| -> Vec<f32> {
            let kh = grouping.key_head(hh, nk, nv);
            let mut out = vec![0f32; len * dv];
            for (i, t) in (t0..t0 + len).enumerate() {
                let m = &mixed[t * ch..(t + 1) * ch];
                let qh = &m[kh * dk..(kh + 1) * dk];
                let kh_ = &m[nk * dk + kh * dk..nk * dk + (kh + 1) * dk];
                let vh = &m[2 * nk * dk + hh * dv..2 * nk * dk + (hh + 1) * dv];
                delta_rule_step(sm, qh, kh_, vh, g[t * nv + hh], beta[t * nv + hh], &mut out[i * dv..(i + 1) * dv]);
            }
            out
        };
        let per_head: Vec<Vec<f32>> = if len * nv * mat_len >= 1 << 16 && rayon::current_num_threads() > 1 {
            mats.par_chunks_exact_mut(mat_len).enumerate().map(run_head).collect()
        } else {
            mats.chunks_exact_mut(mat_len).enumerate().map(run_head).collect()
        };
        for (hh, out) in per_head.iter().enumerate() {
            for i in 0..len {
                let t = t0 + i;
                let dst = &mut core[t * vd + hh * dv..t * vd + (hh + 1) * dv];
                dst.copy_from_slice(&out[i * dv..(i + 1) * dv]);
                gated_rmsnorm(dst, &z[t * vd + hh * dv..t * vd + (hh + 1) * dv], &d.norm, cx.c.rms_eps);
            }
        }
        t0 += len;
    }
    hooks.input(&[&d.w_out], core, n);
    matmul(&d.w_out, core, n, o);
}
