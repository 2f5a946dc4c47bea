//! The token mixers of hybrid models (Qwen3.5) on the CPU, and the per-sequence recurrent state
//! of their linear-attention layers.
//!
//! - Gated DeltaNet layer ([`HybridCpu::mixer`] with `HybridLayer::Linear`): input projections,
//!   causal conv1d + SiLU over the q|k|v channels, q/k L2 norm, gates, the delta rule per value
//!   head, gated RMSNorm, output projection (the ops are in `deltanet`).
//! - Full-attention layer (`HybridLayer::Attention`): query and output gate from one
//!   projection, per-head q/k RMSNorm, RoPE on the first `rotary_dim` dims of each head (halves
//!   pairing within those dims), GQA over the paged KV cache, output times `sigmoid(gate)`.
//!
//! The delta rule runs token by token here (`delta_rule_step`), also for prefill: a sequence's
//! result then does not depend on how its prompt was split into chunks, so chunked and whole
//! prefill give the same bits (the chunked form is the GPU's shape; it is tested against the
//! step form in `deltanet`).

use std::collections::HashMap;

use rayon::prelude::*;

use super::deltanet::{conv1d_silu, delta_rule_step, gated_rmsnorm, gates_inplace, l2norm_inplace};
use super::matmul::{matmul, matmul_fused};
use super::ops::{self, PagedKv};
use crate::backend::{snapshot_room, BackendError};
use crate::engine::plan::{SeqId, StepPlan};
use crate::model::config::{ModelConfig, RopeStyle};
use crate::model::hybrid::{DeltaNetWeights, HybridConfig, HybridLayer};
use crate::model::weights::LayerWeights;

/// One sequence's place in the pool and how many of its tokens the state has absorbed.
#[derive(Clone, Copy, Debug)]
struct Slot {
    index: usize,
    pos: usize,
}

/// The recurrent states of the running sequences: fixed-size slots (`per_seq` f32 values: per
/// linear layer the last `K - 1` conv inputs `[K - 1, C]` then the delta-rule matrices
/// `[n_v, d_k, d_v]`), reused after a sequence is released. The pool grows to the most
/// sequences alive at once and never shrinks.
struct StatePool {
    per_seq: usize,
    data: Vec<f32>, // [n_slots, per_seq]
    slots: HashMap<SeqId, Slot>,
    free: Vec<usize>,
}

impl StatePool {
    fn state_mut(&mut self, index: usize) -> &mut [f32] {
        &mut self.data[index * self.per_seq..(index + 1) * self.per_seq]
    }

    /// A zeroed slot for `seq` (its own again when it has one: a restart from position 0).
    fn reset(&mut self, seq: SeqId) {
        let index = match self.slots.get(&seq) {
            Some(s) => s.index,
            None => self.free.pop().unwrap_or_else(|| {
                self.data.resize(self.data.len() + self.per_seq, 0.0);
                self.data.len() / self.per_seq - 1
            }),
        };
        self.state_mut(index).fill(0.0);
        self.slots.insert(seq, Slot { index, pos: 0 });
    }

    fn release(&mut self, seq: SeqId) {
        if let Some(s) = self.slots.remove(&seq) {
            self.free.push(s.index);
        }
    }
}

/// Activation buffers of the hybrid mixers, kept across steps (grown on demand).
#[derive(Default)]
struct Scratch {
    a: Vec<f32>,    // attention: [n, q rows] query (+ gate); linear: [n, C] q|k|v projection
    b: Vec<f32>,    // attention: [n, kv_dim] K; linear: [n, C] conv output
    c: Vec<f32>,    // attention: [n, kv_dim] V; linear: [n, V] z
    d: Vec<f32>,    // attention: [n, q_dim] query; linear: [n, n_v] beta logits, then beta
    e: Vec<f32>,    // attention: [n, q_dim] gate; linear: [n, n_v] decay input, then g
    core: Vec<f32>, // [n, q_dim] attention output; linear: [n, V] delta-rule output
}

fn take(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    &mut buf[..n]
}

/// The hybrid part of the CPU backend: configuration, partial-RoPE frequencies, state pool.
pub struct HybridCpu {
    h: HybridConfig,
    /// `[rotary_dim / 2]`.
    inv_freq: Vec<f32>,
    /// Per layer: its index among the linear-attention layers.
    linear_index: Vec<Option<usize>>,
    pool: StatePool,
    /// Saved states by the chain hash of the prefix they follow: (state, tokens absorbed).
    snapshots: HashMap<[u8; 32], (Vec<f32>, usize)>,
    /// Most snapshots held at once (unbounded unless set: host memory).
    pub(super) max_snapshots: usize,
    scratch: Scratch,
}

/// The paged K/V arrays of one attention layer.
pub struct KvLayer<'a> {
    pub k: &'a mut [f32],
    pub v: &'a mut [f32],
    pub block_size: usize,
    /// The cache type the stored values follow (`kv_type::store_row`).
    pub kv_type: crate::backend::kv_type::KvType,
}

impl HybridCpu {
    pub fn new(c: &ModelConfig, h: &HybridConfig) -> Self {
        let mut next = 0;
        let linear_index = h
            .recurrent
            .iter()
            .map(|&r| {
                r.then(|| {
                    next += 1;
                    next - 1
                })
            })
            .collect();
        let per_seq = next * h.state_len_per_layer();
        HybridCpu {
            inv_freq: h.rope_inv_freq(c.rope_theta),
            h: h.clone(),
            linear_index,
            pool: StatePool { per_seq, data: Vec::new(), slots: HashMap::new(), free: Vec::new() },
            snapshots: HashMap::new(),
            max_snapshots: usize::MAX,
            scratch: Scratch::default(),
        }
    }

    /// Checks that every chunk continues its sequence's state exactly, then resets the state of
    /// every chunk that starts at position 0. A chunk that starts later must find the state its
    /// sequence left after `start_pos` tokens: a prefix-cache hit or a resumed sequence without
    /// one is refused rather than run with a wrong state.
    pub fn begin_step(&mut self, plan: &StepPlan) -> Result<(), BackendError> {
        for c in plan.chunks.iter().filter(|c| c.start_pos > 0) {
            match self.pool.slots.get(&c.seq) {
                Some(s) if s.pos == c.start_pos => {}
                found => {
                    return Err(BackendError::Plan(format!(
                        "sequence {} continues at position {}, but its recurrent state {} (a hybrid model's \
                         sequence must run from position 0 without gaps: no prefix reuse)",
                        c.seq,
                        c.start_pos,
                        found.map_or("does not exist".to_string(), |s| format!("holds {} tokens", s.pos)),
                    )))
                }
            }
        }
        for c in plan.chunks.iter().filter(|c| c.start_pos == 0) {
            self.pool.reset(c.seq);
        }
        Ok(())
    }

    /// Records that the step's chunks were absorbed into their states.
    pub fn end_step(&mut self, plan: &StepPlan) {
        for c in &plan.chunks {
            if let Some(s) = self.pool.slots.get_mut(&c.seq) {
                s.pos = c.start_pos + c.tokens.len();
            }
        }
    }

    /// Copies `seq`'s state under `key`.
    pub fn save(&mut self, seq: SeqId, key: &[u8; 32]) -> Result<(), BackendError> {
        let slot = self.pool.slots.get(&seq).copied().ok_or_else(|| BackendError::no_state_slot(seq))?;
        snapshot_room(seq, !self.snapshots.contains_key(key), self.snapshots.len(), self.max_snapshots)?;
        let state = self.pool.state_mut(slot.index).to_vec();
        self.snapshots.insert(*key, (state, slot.pos));
        Ok(())
    }

    /// Gives `seq` the state saved under `key`, which must follow exactly `pos` tokens.
    pub fn restore(&mut self, seq: SeqId, key: &[u8; 32], pos: usize) -> bool {
        let Some((state, at)) = self.snapshots.get(key) else { return false };
        if *at != pos {
            return false;
        }
        self.pool.reset(seq);
        let Some(slot) = self.pool.slots.get_mut(&seq) else { return false };
        slot.pos = pos;
        let index = slot.index;
        self.pool.state_mut(index).copy_from_slice(state);
        true
    }

    pub fn drop_snapshot(&mut self, key: &[u8; 32]) {
        self.snapshots.remove(key);
    }

    /// Frees the state of a finished sequence.
    pub fn release(&mut self, seq: SeqId) {
        self.pool.release(seq);
    }

    /// Bytes of one sequence's recurrent state.
    pub fn state_bytes_per_seq(&self) -> usize {
        self.pool.per_seq * 4
    }

    /// Layer `l`'s token mixer over the step's `n` tokens: `h` (`[n, dim]`, normed input) ->
    /// `o` (`[n, dim]`). Token `t` belongs to the sequence of `tables[t]` at `pos[t]`; the
    /// plan's chunks are contiguous runs of tokens, in plan order.
    #[allow(clippy::too_many_arguments)]
    pub fn mixer(
        &mut self,
        l: usize,
        lw: &LayerWeights,
        hl: &HybridLayer,
        c: &ModelConfig,
        plan: &StepPlan,
        tables: &[&[u32]],
        pos: &[usize],
        kv: KvLayer,
        h: &[f32],
        o: &mut [f32],
    ) {
        match hl {
            HybridLayer::Attention => self.attention(lw, c, tables, pos, kv, h, o),
            HybridLayer::Linear(d) => {
                let j = self.linear_index[l].unwrap_or(0);
                self.linear(j, d, c, plan, h, o)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &mut self,
        lw: &LayerWeights,
        c: &ModelConfig,
        tables: &[&[u32]],
        pos: &[usize],
        kv: KvLayer,
        h: &[f32],
        o: &mut [f32],
    ) {
        let n = pos.len();
        let (qd, kvd, hd) = (c.q_dim(), c.kv_dim(), c.head_dim);
        let gated = self.h.attn_output_gate;
        let s = &mut self.scratch;
        let qg = take(&mut s.a, n * lw.wq.rows);
        let k = take(&mut s.b, n * kvd);
        let v = take(&mut s.c, n * kvd);
        matmul_fused(&[&lw.wq, &lw.wk, &lw.wv], h, n, &mut [&mut *qg, &mut *k, &mut *v]);
        let q = take(&mut s.d, n * qd);
        let gate = take(&mut s.e, n * qd);
        if gated {
            // Per head the projection holds [query (hd), gate (hd)].
            for (i, pair) in qg.chunks_exact(2 * hd).enumerate() {
                q[i * hd..(i + 1) * hd].copy_from_slice(&pair[..hd]);
                gate[i * hd..(i + 1) * hd].copy_from_slice(&pair[hd..]);
            }
        } else {
            q.copy_from_slice(&qg[..n * qd]);
        }
        if let Some(w) = &lw.q_norm {
            ops::rmsnorm_heads_inplace(q, w, c.rms_eps);
        }
        if let Some(w) = &lw.k_norm {
            ops::rmsnorm_heads_inplace(k, w, c.rms_eps);
        }
        let (cos, sin) = ops::rope_table(pos, &self.inv_freq);
        let (rot, half) = (self.h.rotary_dim, self.h.rotary_dim / 2);
        for t in 0..n {
            let (cs, sn) = (&cos[t * half..(t + 1) * half], &sin[t * half..(t + 1) * half]);
            for head in
                q[t * qd..(t + 1) * qd].chunks_exact_mut(hd).chain(k[t * kvd..(t + 1) * kvd].chunks_exact_mut(hd))
            {
                ops::rope_token(&mut head[..rot], rot, cs, sn, RopeStyle::Halves);
            }
        }
        // K/V into the paged cache before attending (a token reads positions <= its own).
        let bs = kv.block_size;
        for t in 0..n {
            let blk = tables[t][pos[t] / bs] as usize;
            let off = (blk * bs + pos[t] % bs) * kvd;
            kv.k[off..off + kvd].copy_from_slice(&k[t * kvd..(t + 1) * kvd]);
            kv.v[off..off + kvd].copy_from_slice(&v[t * kvd..(t + 1) * kvd]);
            crate::backend::kv_type::store_row(kv.kv_type, &mut kv.k[off..off + kvd]);
            crate::backend::kv_type::store_row(kv.kv_type, &mut kv.v[off..off + kvd]);
        }
        let att = take(&mut s.core, n * qd);
        let paged = PagedKv { k: kv.k, v: kv.v, block_size: bs, n_kv_heads: c.n_kv_heads, head_dim: hd };
        ops::attend_batch(&paged, tables, pos, q, c.n_heads, att);
        if gated {
            for (a, &g) in att.iter_mut().zip(gate.iter()) {
                *a *= 1.0 / (1.0 + (-g).exp());
            }
        }
        matmul(&lw.wo, att, n, o);
    }

    /// Linear layer number `j` (among the linear layers) over the step's chunks.
    fn linear(&mut self, j: usize, d: &DeltaNetWeights, c: &ModelConfig, plan: &StepPlan, h: &[f32], o: &mut [f32]) {
        let hc = &self.h;
        let n = plan.n_tokens();
        let (ch, vd, nk, nv, dk, dv, kk) =
            (hc.conv_channels(), hc.value_dim(), hc.n_k_heads, hc.n_v_heads, hc.d_k, hc.d_v, hc.conv_kernel);
        let (conv_len, mat_len) = ((kk - 1) * ch, dk * dv);
        let layer_off = j * hc.state_len_per_layer();
        let s = &mut self.scratch;
        let qkv = take(&mut s.a, n * ch);
        let z = take(&mut s.c, n * vd);
        let beta = take(&mut s.d, n * nv);
        let g = take(&mut s.e, n * nv);
        matmul_fused(&[&d.w_qkv, &d.w_z, &d.w_b, &d.w_a], h, n, &mut [&mut *qkv, &mut *z, &mut *beta, &mut *g]);
        let mixed = take(&mut s.b, n * ch);
        let core = take(&mut s.core, n * vd);
        let q_scale = 1.0 / (dk as f32).sqrt();
        let mut t0 = 0;
        for chunk in &plan.chunks {
            let len = chunk.tokens.len();
            let Some(slot) = self.pool.slots.get(&chunk.seq).copied() else {
                // begin_step gave every chunk a slot; nothing else removes one mid-step.
                debug_assert!(false, "sequence {} has no recurrent state", chunk.seq);
                t0 += len;
                continue;
            };
            let state =
                &mut self.pool.data[slot.index * self.pool.per_seq..][layer_off..layer_off + conv_len + nv * mat_len];
            let (conv_state, mats) = state.split_at_mut(conv_len);
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
            let grouping = hc.grouping;
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
                    gated_rmsnorm(dst, &z[t * vd + hh * dv..t * vd + (hh + 1) * dv], &d.norm, c.rms_eps);
                }
            }
            t0 += len;
        }
        matmul(&d.w_out, core, n, o);
    }
}
