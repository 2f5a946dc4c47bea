//! Hybrid models (Qwen3.5, Qwen3.5-MoE, Qwen3-Next) on the CUDA backend: the device weights of
//! the Gated DeltaNet layers, the partial-RoPE tables of the attention layers, the step buffers
//! of both, and each sequence's recurrent state on the device. The layers' launches are in
//! `layers/deltanet.rs` and `layers/attention.rs`.
//!
//! State: one slot per running sequence in a device pool `[n_slots, per_seq]` f32, laid out
//! as the CPU's (per linear layer: conv window `[K - 1, C]`, then the delta-rule matrices
//! `[n_v, d_k, d_v]`). The pool holds the sequences the backend was planned for
//! (`CudaOptions::max_seqs`), allocated once, so the memory plan is what the device holds and
//! the pool never moves under a captured graph; a sequence beyond it is refused as out of
//! memory (the engine then runs fewer at once). Prefix-reuse snapshots are device copies of a
//! slot, keyed by the prefix's chain hash, at most `CudaOptions::max_snapshots` of them (the
//! engine evicts before it saves beyond them).
//!
//! Per step the host writes the chunk table (per chunk: first token, tokens, slot) and
//! uploads it into a buffer of fixed address, so a captured decode graph stays valid.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::deltanet::{StatePool, DN_AB_ROW, DN_CH};
use super::device::{up, zeros};
use super::dmat::Linear;
use super::launch::{allocated, Dev};
use super::CudaError;
use crate::backend::{snapshot_room, BackendError};
use crate::engine::plan::{SeqId, StepPlan};
use crate::model::config::ModelConfig;
use crate::model::hybrid::{HybridConfig, HybridLayer};
use crate::model::rope::rope_table;
use crate::model::weights::{LayerWeights, Tensor};

/// One Gated DeltaNet layer on the device (`C` q|k|v channels, `V = n_v d_v`).
pub(super) struct LinearW {
    /// `[C + V + 2 n_v, dim]`: `w_qkv`, `w_z`, `w_b`, `w_a` stacked (one read of the input).
    pub proj: Linear,
    pub conv: CudaSlice<f32>,    // [C, K]
    pub neg_a: CudaSlice<f32>,   // [n_v]
    pub dt_bias: CudaSlice<f32>, // [n_v]
    pub norm: CudaSlice<f32>,    // [d_v]
    pub out: Linear,             // [dim, V]
    /// Its number among the linear layers (its place in a state slot).
    pub index: usize,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    index: usize,
    pos: usize,
}

/// The hybrid part of `CudaBackend`.
pub struct HybridCuda {
    h: HybridConfig,
    pub(super) layers: Vec<Option<LinearW>>,
    rope_cos: CudaSlice<f32>, // [max_pos, rotary_dim / 2]
    rope_sin: CudaSlice<f32>,
    max_pos: usize,
    /// f32 values of one sequence's state.
    per_seq: usize,
    pool: CudaSlice<f32>, // [cap_slots, per_seq]
    cap_slots: usize,
    slots: HashMap<SeqId, Slot>,
    free: Vec<usize>,
    snapshots: HashMap<[u8; 32], (CudaSlice<f32>, usize)>,
    /// Most snapshots held at once (the plan's snapshot pool).
    pub(super) max_snapshots: usize,
    /// Chunk table of the current step: `[1 + 3 * cap_tok]`.
    host_chunks: Vec<i32>,
    chunks: Option<CudaSlice<i32>>,
    pub(super) cap_tok: usize,
    proj: Option<CudaSlice<f32>>,  // [cap, proj width]: either projection of a layer
    mixed: Option<CudaSlice<f32>>, // [cap, C] conv output
    core: Option<CudaSlice<f32>>,  // [cap, max(V, q_dim)]: delta-rule output / queries
    ab: Option<CudaSlice<f32>>,    // [cap, n_v, DN_AB_ROW]: the chunked form's sub-chunk table
    /// The step form's delta rule with the gated norm (and the out projection's int8 input)
    /// in one launch.
    pub(super) recur_norm: bool,
}

/// Whether a linear layer runs conv + L2 norm + gates as one kernel (`DUSTOFF_DN_FUSED=0`:
/// as `dn_conv_silu_f32` then `dn_prep_f32`, for comparison).
pub(super) fn fused_conv_prep() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::sys::env::get("DUSTOFF_DN_FUSED").is_none_or(|v| v != "0"))
}

/// Whether the step form of the delta rule normalizes its output in the same launch
/// (`dn_recur_norm_f32`; `DUSTOFF_DN_RECUR_NORM=0`: `dn_recur_f32` then `dn_gated_norm_f32`).
fn recur_norm_fused() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::sys::env::get("DUSTOFF_DN_RECUR_NORM").is_none_or(|v| v != "0"))
}

/// Fewest tokens of one chunk that take the chunked delta rule (in steps that are not
/// replayed as graphs); `DUSTOFF_DN_CHUNK_MIN` overrides the default of one sub-chunk
/// (`DN_CH`); 0 turns the chunked form off.
pub(super) fn chunked_min_tokens() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| crate::sys::env::get("DUSTOFF_DN_CHUNK_MIN").and_then(|v| v.parse().ok()).unwrap_or(DN_CH))
}

/// Width of the widest projection row a step writes into `proj`: a linear layer's stacked
/// q|k|v, z, b, a, or an attention layer's q (with its gate), k, v.
fn proj_width(c: &ModelConfig, h: &HybridConfig) -> usize {
    let lin = h.conv_channels() + h.value_dim() + 2 * h.n_v_heads;
    let q = if h.attn_output_gate { 2 * c.q_dim() } else { c.q_dim() };
    lin.max(q + 2 * c.kv_dim())
}

/// Bytes of the step buffers of `HybridCuda::ensure` for `cap` tokens (the memory plan).
pub fn workspace_bytes(c: &ModelConfig, h: &HybridConfig, cap: usize) -> u64 {
    let f32s = proj_width(c, h) + h.conv_channels() + h.value_dim().max(c.q_dim()) + h.n_v_heads * DN_AB_ROW;
    (cap * f32s * 4 + (1 + 3 * cap) * 4) as u64
}

impl HybridCuda {
    /// Uploads the linear layers of `w` (the attention layers use the plain `LayerW` fields).
    pub(super) fn new(
        s: &Arc<CudaStream>,
        c: &ModelConfig,
        h: &HybridConfig,
        layers: &[LayerWeights],
        f16: bool,
        (max_pos, seqs): (usize, super::seqs::SeqPlan),
        clamped: &mut u64,
    ) -> Result<Self, CudaError> {
        let mut out = Vec::with_capacity(layers.len());
        let mut index = 0;
        for (i, lw) in layers.iter().enumerate() {
            match &lw.hybrid {
                Some(HybridLayer::Linear(d)) => {
                    let name = |x: &str| format!("layer {i} {x}");
                    let (proj, c1) = Linear::upload(s, &[&d.w_qkv, &d.w_z, &d.w_b, &d.w_a], f16, &name("linear in"))?;
                    let (o, c2) = Linear::upload(s, &[&d.w_out], f16, &name("linear out"))?;
                    *clamped += c1 + c2;
                    out.push(Some(LinearW {
                        proj,
                        conv: up(s, &d.conv, &name("conv1d"))?,
                        neg_a: up(s, &d.neg_a, &name("ssm_a"))?,
                        dt_bias: up(s, &d.dt_bias, &name("dt_bias"))?,
                        norm: up(s, &d.norm, &name("ssm_norm"))?,
                        out: o,
                        index,
                    }));
                    index += 1;
                }
                Some(HybridLayer::Attention) | None => out.push(None),
            }
        }
        Self::from_layers(s, c, h, out, max_pos, seqs)
    }

    /// The hybrid part around uploaded linear layers (`None` for attention layers).
    pub(super) fn from_layers(
        s: &Arc<CudaStream>,
        c: &ModelConfig,
        h: &HybridConfig,
        out: Vec<Option<LinearW>>,
        max_pos: usize,
        seqs: super::seqs::SeqPlan,
    ) -> Result<Self, CudaError> {
        let index = out.iter().flatten().count();
        let max_pos = max_pos.max(1);
        let positions: Vec<usize> = (0..max_pos).collect();
        let (cos, sin) = rope_table(&positions, &h.rope_inv_freq(c.rope_theta));
        let per_seq = index * h.state_len_per_layer();
        let cap_slots = seqs.running.max(1);
        Ok(HybridCuda {
            h: h.clone(),
            layers: out,
            rope_cos: up(s, &cos, "partial RoPE cos table")?,
            rope_sin: up(s, &sin, "partial RoPE sin table")?,
            max_pos,
            per_seq,
            pool: zeros(s, cap_slots * per_seq, "recurrent state pool")?,
            cap_slots,
            slots: HashMap::new(),
            free: (0..cap_slots).rev().collect(),
            snapshots: HashMap::new(),
            max_snapshots: seqs.snapshots,
            host_chunks: Vec::new(),
            chunks: None,
            cap_tok: 0,
            proj: None,
            mixed: None,
            core: None,
            ab: None,
            recur_norm: recur_norm_fused(),
        })
    }

    /// The fused decode launches on, or their separate launches (`CudaBackend::set_hybrid_fusion`).
    pub(super) fn set_fusion(&mut self, on: bool) {
        self.recur_norm = on;
    }

    /// Bytes of one sequence's recurrent state on the device.
    pub fn state_bytes_per_seq(&self) -> usize {
        self.per_seq * 4
    }

    /// Bytes of weight matrices a decode step reads in the linear layers.
    pub(super) fn matrix_bytes(&self) -> u64 {
        self.layers.iter().flatten().map(|l| l.proj.bytes() + l.out.bytes()).sum()
    }

    /// Buffers for `cap` tokens; true when any was (re)allocated (graphs hold the old ones).
    pub(super) fn ensure(&mut self, s: &Arc<CudaStream>, c: &ModelConfig, cap: usize) -> Result<bool, CudaError> {
        if cap <= self.cap_tok {
            return Ok(false);
        }
        let h = &self.h;
        self.proj = None;
        self.proj = Some(zeros(s, cap * proj_width(c, h), "hybrid projection")?);
        self.mixed = None;
        self.mixed = Some(zeros(s, cap * h.conv_channels(), "conv output")?);
        self.core = None;
        self.core = Some(zeros(s, cap * h.value_dim().max(c.q_dim()), "delta-rule output")?);
        self.ab = None;
        self.ab = Some(zeros(s, cap * h.n_v_heads * DN_AB_ROW, "chunked delta-rule table")?);
        self.chunks = None;
        self.chunks = Some(zeros(s, 1 + 3 * cap, "chunk table")?);
        self.cap_tok = cap;
        Ok(true)
    }

    /// A zeroed slot for `seq` (its own again when it has one: a restart from position 0).
    fn reset(&mut self, s: &Arc<CudaStream>, seq: SeqId) -> Result<(), CudaError> {
        let index = match self.slots.get(&seq) {
            Some(sl) => sl.index,
            None => self.free.pop().ok_or_else(|| {
                CudaError::OutOfMemory(format!(
                    "sequence {seq}: the recurrent-state pool holds the {} sequences the backend was planned for",
                    self.cap_slots
                ))
            })?,
        };
        let r = index * self.per_seq..(index + 1) * self.per_seq;
        s.memset_zeros(&mut self.pool.slice_mut(r)).map_err(CudaError::driver("zeroing a recurrent state"))?;
        self.slots.insert(seq, Slot { index, pos: 0 });
        Ok(())
    }

    /// Checks that every chunk continues its sequence's state exactly (as the CPU backend
    /// does), gives chunks at position 0 a zeroed slot, and uploads the chunk table. `last_tok`:
    /// the flat index of each chunk's last token.
    pub(super) fn begin_step(
        &mut self,
        s: &Arc<CudaStream>,
        plan: &StepPlan,
        last_tok: &[usize],
    ) -> Result<(), BackendError> {
        for c in plan.chunks.iter().filter(|c| c.start_pos > 0) {
            match self.slots.get(&c.seq) {
                Some(sl) if sl.pos == c.start_pos => {}
                found => {
                    return Err(BackendError::Plan(format!(
                        "sequence {} continues at position {}, but its recurrent state {} (a hybrid model's \
                         sequence must run from position 0 without gaps)",
                        c.seq,
                        c.start_pos,
                        found.map_or("does not exist".to_string(), |sl| format!("holds {} tokens", sl.pos)),
                    )))
                }
            }
        }
        for c in plan.chunks.iter().filter(|c| c.start_pos == 0) {
            self.reset(s, c.seq)?;
        }
        let t = &mut self.host_chunks;
        t.clear();
        t.push(plan.chunks.len() as i32);
        for (c, &last) in plan.chunks.iter().zip(last_tok) {
            let slot = self.slots.get(&c.seq).map_or(0, |sl| sl.index);
            t.extend([(last + 1 - c.tokens.len()) as i32, c.tokens.len() as i32, slot as i32]);
        }
        let dev = self.chunks.as_mut().ok_or_else(|| BackendError::Plan("chunk table not allocated".into()))?;
        s.memcpy_htod(&self.host_chunks, &mut dev.slice_mut(0..self.host_chunks.len()))
            .map_err(CudaError::driver("uploading the chunk table"))?;
        Ok(())
    }

    /// Records that the step's chunks were absorbed into their states.
    pub(super) fn end_step(&mut self, plan: &StepPlan) {
        for c in &plan.chunks {
            if let Some(sl) = self.slots.get_mut(&c.seq) {
                sl.pos = c.start_pos + c.tokens.len();
            }
        }
    }

    pub(super) fn release(&mut self, seq: SeqId) {
        if let Some(sl) = self.slots.remove(&seq) {
            self.free.push(sl.index);
        }
    }

    /// A device copy of `seq`'s state under `key`.
    pub(super) fn save(&mut self, s: &Arc<CudaStream>, seq: SeqId, key: &[u8; 32]) -> Result<(), BackendError> {
        let sl = self.slots.get(&seq).copied().ok_or_else(|| BackendError::no_state_slot(seq))?;
        snapshot_room(seq, !self.snapshots.contains_key(key), self.snapshots.len(), self.max_snapshots)?;
        let r = sl.index * self.per_seq..(sl.index + 1) * self.per_seq;
        let copy = s.clone_dtod(&self.pool.slice(r)).map_err(CudaError::driver("copying a state snapshot"))?;
        self.snapshots.insert(*key, (copy, sl.pos));
        Ok(())
    }

    /// Gives `seq` the state saved under `key`, which must follow exactly `pos` tokens.
    pub(super) fn restore(&mut self, s: &Arc<CudaStream>, seq: SeqId, key: &[u8; 32], pos: usize) -> bool {
        match self.snapshots.get(key) {
            Some((_, at)) if *at == pos => {}
            _ => return false,
        }
        if self.reset(s, seq).is_err() {
            return false;
        }
        let Some(sl) = self.slots.get_mut(&seq) else { return false };
        sl.pos = pos;
        let r = sl.index * self.per_seq..(sl.index + 1) * self.per_seq;
        let Some((snap, _)) = self.snapshots.get(key) else { return false };
        s.memcpy_dtod(snap, &mut self.pool.slice_mut(r)).is_ok()
    }

    pub(super) fn drop_snapshot(&mut self, key: &[u8; 32]) {
        self.snapshots.remove(key);
    }

    fn buf(b: &Option<CudaSlice<f32>>, s: &CudaStream) -> Result<Dev<f32>, CudaError> {
        allocated(b, s, "hybrid", "work buffers")
    }

    /// The linear weights of layer `li` (a Gated DeltaNet layer).
    pub(super) fn linear_layer(&self, li: usize) -> Result<&LinearW, CudaError> {
        self.layers.get(li).and_then(Option::as_ref).ok_or_else(|| CudaError::Shape {
            kernel: "deltanet",
            reason: format!("layer {li} has no linear-attention weights on the device"),
        })
    }

    pub(super) fn config(&self) -> &HybridConfig {
        &self.h
    }

    /// Rotated dims of each attention head (partial RoPE).
    pub(super) fn rotary_dim(&self) -> usize {
        self.h.rotary_dim
    }

    /// The partial-RoPE tables (`[max_pos, rotary_dim / 2]` each) and their positions.
    pub(super) fn rope(&self, s: &CudaStream) -> (Dev<f32>, Dev<f32>, usize) {
        (Dev::of(&self.rope_cos, s), Dev::of(&self.rope_sin, s), self.max_pos)
    }

    /// `[cap, proj width]`: either projection of a layer.
    pub(super) fn proj_buf(&self, s: &CudaStream) -> Result<Dev<f32>, CudaError> {
        Self::buf(&self.proj, s)
    }
    /// `[cap, C]`: the conv output.
    pub(super) fn mixed_buf(&self, s: &CudaStream) -> Result<Dev<f32>, CudaError> {
        Self::buf(&self.mixed, s)
    }
    /// `[cap, max(V, q_dim)]`: the delta-rule output, or an attention layer's queries.
    pub(super) fn core_buf(&self, s: &CudaStream) -> Result<Dev<f32>, CudaError> {
        Self::buf(&self.core, s)
    }
    /// The chunked form's sub-chunk table.
    pub(super) fn ab_buf(&self, s: &CudaStream) -> Result<Dev<f32>, CudaError> {
        Self::buf(&self.ab, s)
    }

    /// The state pool as layer `d`'s launches see it.
    pub(super) fn state_pool(&self, s: &CudaStream, d: &LinearW, max_chunks: usize) -> Result<StatePool, CudaError> {
        Ok(StatePool {
            state: Dev::of(&self.pool, s),
            slot_stride: self.per_seq,
            layer_off: d.index * self.h.state_len_per_layer(),
            chunks: allocated(&self.chunks, s, "hybrid", "chunk table")?,
            max_chunks,
        })
    }

    /// Tokens of the longest chunk of the current step.
    pub(super) fn longest_chunk(&self) -> usize {
        self.host_chunks.iter().skip(2).step_by(3).copied().max().unwrap_or(0).max(0) as usize
    }
}

impl LinearW {
    /// The conv weights `[C, K]`.
    pub(super) fn conv_dev(&self, s: &CudaStream) -> Dev<f32> {
        Dev::of(&self.conv, s)
    }
    /// `-exp(A_log)` `[n_v]`, the dt bias `[n_v]` and the gated norm's weight `[d_v]`.
    pub(super) fn gates_dev(&self, s: &CudaStream) -> (Dev<f32>, Dev<f32>, Dev<f32>) {
        (Dev::of(&self.neg_a, s), Dev::of(&self.dt_bias, s), Dev::of(&self.norm, s))
    }
}

/// The matrices of a hybrid layer the CUDA backend uploads beside the plain ones (the linear
/// layers' projections), for the shape checks and the memory plan.
pub fn hybrid_matrices(lw: &LayerWeights) -> Vec<&Tensor> {
    match &lw.hybrid {
        Some(HybridLayer::Linear(d)) => vec![&d.w_qkv, &d.w_z, &d.w_b, &d.w_a, &d.w_out],
        _ => Vec::new(),
    }
}
