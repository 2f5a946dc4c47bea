//! Hybrid models (Qwen3.5, Qwen3.5-MoE, Qwen3-Next) on the CUDA backend: the device weights of
//! a Gated DeltaNet layer ([`LinearW`], held by its `LayerW`), and the backend's
//! recurrent part ([`RecurrentCuda`]): the step buffers of both mixers and each sequence's
//! recurrent state on the device. The layers' launches are in
//! `layers/deltanet.rs` and `layers/attention.rs`.
//!
//! State: a device pool `[n_slots, per_seq]` f32 of slots laid out as the CPU's (per linear
//! layer: conv window `[K - 1, C]`, then the delta-rule matrices `[n_v, d_k, d_v]`), one per
//! sequence the backend was planned for (`CudaOptions::max_seqs`) and one per prefix snapshot
//! (`CudaOptions::max_snapshots`), allocated once, so the memory plan is what the device holds
//! and the pool never moves under a captured graph. Which slot holds what is the engine's
//! (`engine::state_pool`): a plan names each chunk's slot and the zero / copy orders to run
//! before and after the step (device memset and copies within the pool).
//!
//! Per step the host writes the chunk table (per chunk: first token, tokens, slot) and
//! uploads it into a buffer of fixed address, so a captured decode graph stays valid.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::device::{up, zeros};
use super::dmat::Linear;
use super::ops::deltanet::{StatePool, DN_AB_ROW, DN_CH};
use super::ops::launch::{allocated, Dev};
use super::CudaError;
use crate::backend::state_slots::{SlotPositions, StateSlots};
use crate::backend::BackendError;
use crate::engine::plan::{StateOp, StepPlan};
use crate::model::config::ModelConfig;
use crate::model::hybrid::{DeltaNetWeights, HybridConfig};

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

/// The recurrent part of `CudaBackend` (hybrid models): the state pool and the step buffers of
/// the linear-attention and gated-attention layers.
pub struct RecurrentCuda {
    h: HybridConfig,
    /// f32 values of one sequence's state.
    per_seq: usize,
    pool: CudaSlice<f32>, // [slots.total(), per_seq]
    /// The slots of the pool: the running sequences' and the snapshots'.
    pub(super) slots: StateSlots,
    /// Tokens each slot's state absorbed (the guard against a plan that skips some).
    positions: SlotPositions,
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
    super::tuning::tuning().dn_fused
}

/// Whether the step form of the delta rule normalizes its output in the same launch
/// (`dn_recur_norm_f32`; `DUSTOFF_DN_RECUR_NORM=0`: `dn_recur_f32` then `dn_gated_norm_f32`).
fn recur_norm_fused() -> bool {
    super::tuning::tuning().dn_recur_norm
}

/// Fewest tokens of one chunk that take the chunked delta rule (in steps that are not
/// replayed as graphs); `DUSTOFF_DN_CHUNK_MIN` overrides the default of one sub-chunk
/// (`DN_CH`); 0 turns the chunked form off.
pub(super) fn chunked_min_tokens() -> usize {
    super::tuning::tuning().dn_chunk_min.unwrap_or(DN_CH)
}

/// Width of the widest projection row a step writes into `proj`: a linear layer's stacked
/// q|k|v, z, b, a, or an attention layer's q (with its gate), k, v.
fn proj_width(c: &ModelConfig, h: &HybridConfig) -> usize {
    let lin = h.conv_channels() + h.value_dim() + 2 * h.n_v_heads;
    let q = if h.attn_output_gate { 2 * c.q_dim() } else { c.q_dim() };
    lin.max(q + 2 * c.kv_dim())
}

/// Bytes of the step buffers of `RecurrentCuda::ensure` for `cap` tokens (the memory plan).
pub fn workspace_bytes(c: &ModelConfig, h: &HybridConfig, cap: usize) -> u64 {
    let f32s = proj_width(c, h) + h.conv_channels() + h.value_dim().max(c.q_dim()) + h.n_v_heads * DN_AB_ROW;
    (cap * f32s * 4 + (1 + 3 * cap) * 4) as u64
}

impl RecurrentCuda {
    /// The recurrent part of model `c` once its `n_linear` Gated DeltaNet layers are uploaded;
    /// `None` for a model without a hybrid section.
    pub(super) fn for_model(
        s: &Arc<CudaStream>,
        c: &ModelConfig,
        n_linear: usize,
        seqs: super::plan::seqs::SeqPlan,
    ) -> Result<Option<Self>, CudaError> {
        match &c.hybrid {
            Some(h) => Ok(Some(Self::new(s, h, n_linear, seqs)?)),
            None => Ok(None),
        }
    }

    /// The recurrent part of a model of `n_linear` Gated DeltaNet layers (their weights are in
    /// their `LayerW`): a state pool for `seqs`.
    pub(super) fn new(
        s: &Arc<CudaStream>,
        h: &HybridConfig,
        n_linear: usize,
        seqs: super::plan::seqs::SeqPlan,
    ) -> Result<Self, CudaError> {
        let per_seq = n_linear * h.state_len_per_layer();
        let slots = StateSlots { running: seqs.running.max(1), snapshots: seqs.snapshots };
        Ok(RecurrentCuda {
            h: h.clone(),
            per_seq,
            pool: zeros(s, slots.total() * per_seq, "recurrent state pool")?,
            slots,
            positions: SlotPositions::default(),
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

    /// Runs zero / copy orders on the pool's slots, in order (stream-ordered with the step).
    fn run(&mut self, s: &Arc<CudaStream>, ops: &[StateOp]) -> Result<(), CudaError> {
        let n = self.per_seq;
        for op in ops {
            match *op {
                StateOp::Zero { slot } => {
                    let r = slot as usize * n..(slot as usize + 1) * n;
                    s.memset_zeros(&mut self.pool.slice_mut(r))
                        .map_err(CudaError::driver("zeroing a recurrent state"))?;
                }
                StateOp::Copy { from, to } if from == to => {}
                StateOp::Copy { from, to } => {
                    let (f, t) = (from as usize, to as usize);
                    // Two disjoint views of the one pool: split at the higher slot.
                    let (mut lo, mut hi) = self.pool.split_at_mut(f.max(t) * n);
                    let r = if f < t {
                        s.memcpy_dtod(&lo.slice(f * n..(f + 1) * n), &mut hi.slice_mut(0..n))
                    } else {
                        s.memcpy_dtod(&hi.slice(0..n), &mut lo.slice_mut(t * n..(t + 1) * n))
                    };
                    r.map_err(CudaError::driver("copying a recurrent state"))?;
                }
            }
        }
        Ok(())
    }

    /// Checks the plan's state part (every chunk continues its slot's state exactly, as the
    /// CPU backend checks), runs its `before` orders (restores, zeroed states) and uploads the
    /// chunk table. `last_tok`: the flat index of each chunk's last token.
    pub(super) fn begin_step(
        &mut self,
        s: &Arc<CudaStream>,
        plan: &StepPlan,
        last_tok: &[usize],
    ) -> Result<(), BackendError> {
        self.positions.begin(plan, self.slots.total())?;
        self.run(s, &plan.state.before)?;
        let t = &mut self.host_chunks;
        t.clear();
        t.push(plan.chunks.len() as i32);
        for ((c, &last), &slot) in plan.chunks.iter().zip(last_tok).zip(&plan.state.slots) {
            t.extend([(last + 1 - c.tokens.len()) as i32, c.tokens.len() as i32, slot as i32]);
        }
        let dev = self.chunks.as_mut().ok_or_else(|| BackendError::Plan("chunk table not allocated".into()))?;
        s.memcpy_htod(&self.host_chunks, &mut dev.slice_mut(0..self.host_chunks.len()))
            .map_err(CudaError::driver("uploading the chunk table"))?;
        Ok(())
    }

    /// After the step: the states absorbed the step's chunks; runs the `after` orders
    /// (snapshots of states that reached a shared prefix's end).
    pub(super) fn end_step(&mut self, s: &Arc<CudaStream>, plan: &StepPlan) -> Result<(), CudaError> {
        self.positions.end(plan);
        self.run(s, &plan.state.after)
    }

    fn buf(b: &Option<CudaSlice<f32>>, s: &CudaStream) -> Result<Dev<f32>, CudaError> {
        allocated(b, s, "hybrid", "work buffers")
    }

    /// The linear weights of layer `li` (a Gated DeltaNet layer).
    pub(super) fn config(&self) -> &HybridConfig {
        &self.h
    }

    /// Rotated dims of each attention head (partial RoPE).
    pub(super) fn rotary_dim(&self) -> usize {
        self.h.rotary_dim
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

/// Gated DeltaNet layer `i` on the device, number `index` among the linear layers (values
/// clamped to F16 added to `clamped`).
pub(super) fn upload_linear(
    s: &Arc<CudaStream>,
    i: usize,
    d: &DeltaNetWeights,
    index: usize,
    f16: bool,
    clamped: &mut u64,
) -> Result<LinearW, CudaError> {
    let name = |x: &str| format!("layer {i} {x}");
    let (proj, c1) = Linear::upload(s, &[&d.w_qkv, &d.w_z, &d.w_b, &d.w_a], f16, &name("linear in"))?;
    let (out, c2) = Linear::upload(s, &[&d.w_out], f16, &name("linear out"))?;
    *clamped += c1 + c2;
    Ok(LinearW {
        proj,
        conv: up(s, &d.conv, &name("conv1d"))?,
        neg_a: up(s, &d.neg_a, &name("ssm_a"))?,
        dt_bias: up(s, &d.dt_bias, &name("dt_bias"))?,
        norm: up(s, &d.norm, &name("ssm_norm"))?,
        out,
        index,
    })
}
