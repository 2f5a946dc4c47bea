//! Softmax attention over the paged KV cache, plain or gated (`MixerKind::Attention`,
//! `GatedAttention`): Q/K/V from one fused product (biases added where the layer has them),
//! per-head Q/K RMSNorm where it has them, RoPE on the first `rotary_dim` dims of each head, the
//! step's K/V written into the cache, GQA attention, with the gate `out * sigmoid(gate)`, and
//! the output projection. The gated query projection holds per head `[query (hd), gate (hd)]`.

use super::super::matmul::{matmul, matmul_fused};
use super::super::ops::{self, PagedKv};
use super::super::take;
use super::{Hooks, StepCtx};
use crate::model::layer::AttentionWeights;

#[derive(Default)]
pub(super) struct Scratch {
    qg: Vec<f32>,   // [n, wq rows]: the query projection (query and gate when gated)
    q: Vec<f32>,    // [n, q_dim]: gated: the query heads
    gate: Vec<f32>, // [n, q_dim]: gated: the gate heads
    k: Vec<f32>,    // [n, kv_dim]
    v: Vec<f32>,    // [n, kv_dim]
    att: Vec<f32>,  // [n, q_dim] attention output
}

/// `h` (`[n, dim]`, normed) -> `o` (`[n, dim]`); `kc`, `vc` are the layer's paged K and V
/// (`[num_blocks, block_size, n_kv_heads, head_dim]`).
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    cx: &StepCtx,
    a: AttentionWeights,
    gated: bool,
    kc: &mut [f32],
    vc: &mut [f32],
    s: &mut Scratch,
    hooks: &mut Hooks,
    h: &[f32],
    o: &mut [f32],
) {
    let c = cx.c;
    let (n, pos, tables) = (cx.pos.len(), cx.pos, cx.tables);
    let (qd, kvd, hd) = (c.q_dim(), c.kv_dim(), c.head_dim);
    let Scratch { qg, q: q_buf, gate: gate_buf, k, v, att } = s;
    let qg = take(qg, n * a.wq.rows);
    let k = take(k, n * kvd);
    let v = take(v, n * kvd);
    hooks.input(&[a.wq, a.wk, a.wv], h, n);
    matmul_fused(&[a.wq, a.wk, a.wv], h, n, &mut [&mut *qg, &mut *k, &mut *v]);
    let (q, gate): (&mut [f32], Option<&[f32]>) = if gated {
        let (q, g) = (take(q_buf, n * qd), take(gate_buf, n * qd));
        for (i, pair) in qg.chunks_exact(2 * hd).enumerate() {
            q[i * hd..(i + 1) * hd].copy_from_slice(&pair[..hd]);
            g[i * hd..(i + 1) * hd].copy_from_slice(&pair[hd..]);
        }
        (q, Some(&*g))
    } else {
        (qg, None)
    };
    for (buf, bias, width) in [(&mut *q, a.bq, qd), (&mut *k, a.bk, kvd), (&mut *v, a.bv, kvd)] {
        if let Some(b) = bias {
            buf.chunks_exact_mut(width).for_each(|r| ops::add_inplace(r, b));
        }
    }
    if let Some(w) = a.q_norm {
        ops::rmsnorm_heads_inplace(q, w, c.rms_eps);
    }
    if let Some(w) = a.k_norm {
        ops::rmsnorm_heads_inplace(k, w, c.rms_eps);
    }
    let (rot, half, style) = (cx.rope.rotary_dim, cx.rope.rotary_dim / 2, cx.rope.style);
    for t in 0..n {
        let (cs, sn) = (&cx.cos[t * half..(t + 1) * half], &cx.sin[t * half..(t + 1) * half]);
        for head in q[t * qd..(t + 1) * qd].chunks_exact_mut(hd).chain(k[t * kvd..(t + 1) * kvd].chunks_exact_mut(hd)) {
            ops::rope_token(&mut head[..rot], rot, cs, sn, style);
        }
    }
    // Write this step's K/V into the paged cache before attending (causal: a token reads
    // positions <= its own, all of which are now in the cache).
    let bs = cx.block_size;
    for t in 0..n {
        let blk = tables[t][pos[t] / bs] as usize;
        let off = (blk * bs + pos[t] % bs) * kvd;
        kc[off..off + kvd].copy_from_slice(&k[t * kvd..(t + 1) * kvd]);
        vc[off..off + kvd].copy_from_slice(&v[t * kvd..(t + 1) * kvd]);
        for row in [&mut kc[off..off + kvd], &mut vc[off..off + kvd]] {
            crate::backend::kv_type::store_row(cx.kv_type, row);
            if cx.round_f16_cache {
                row.iter_mut().for_each(|v| *v = half::f16::from_f32(*v).to_f32());
            }
        }
    }
    let att = take(att, n * qd);
    let kv = PagedKv { k: kc, v: vc, block_size: bs, n_kv_heads: c.n_kv_heads, head_dim: hd };
    ops::attend_batch(&kv, tables, pos, q, c.n_heads, att);
    if let Some(gate) = gate {
        for (x, &g) in att.iter_mut().zip(gate) {
            *x *= 1.0 / (1.0 + (-g).exp());
        }
    }
    hooks.input(&[a.wo], att, n);
    matmul(a.wo, att, n, o);
}
