//! The recurrent-state buffers of hybrid models' Gated DeltaNet layers on the CPU: fixed-size
//! slots indexed by the slot numbers of the plan (`plan::StatePlan`), and the zero / copy
//! orders run on them. Which slot holds which sequence or prefix snapshot is the engine's
//! (`engine::state_pool`). The mixer that reads and updates a layer's state is
//! `layers::gated_deltanet`; the full-attention layers of hybrid models are `layers::attention`.

use crate::backend::state_slots::{SlotPositions, StateSlots};
use crate::backend::BackendError;
use crate::engine::plan::{StateOp, StepPlan};
use crate::model::config::ModelConfig;
use crate::model::hybrid::HybridConfig;

/// The CPU backend's recurrent states: the slot buffers of a model with Gated DeltaNet layers,
/// nothing for other models (their plans carry no state part). The backend calls every step's
/// `begin_step` / `end_step` without asking which kind of model it runs.
pub struct RecurrentStates(Option<HybridCpu>);

impl RecurrentStates {
    pub fn new(c: &ModelConfig) -> Self {
        RecurrentStates(c.hybrid.as_ref().map(HybridCpu::new))
    }

    /// The slots the engine may use (none for a model without recurrent layers).
    pub fn slots(&self) -> StateSlots {
        self.0.as_ref().map(HybridCpu::slots).unwrap_or_default()
    }

    /// Offers the engine at most `n` snapshot slots.
    pub fn set_max_snapshots(&mut self, n: usize) {
        if let Some(h) = &mut self.0 {
            h.max_snapshots = n;
        }
    }

    /// See [`HybridCpu::begin_step`].
    pub fn begin_step(&mut self, plan: &StepPlan) -> Result<(), BackendError> {
        self.0.as_mut().map_or(Ok(()), |h| h.begin_step(plan))
    }

    /// See [`HybridCpu::end_step`].
    pub fn end_step(&mut self, plan: &StepPlan) {
        if let Some(h) = &mut self.0 {
            h.end_step(plan);
        }
    }

    /// The states the Gated DeltaNet layers read and update.
    pub(super) fn layers(&mut self) -> Option<&mut HybridCpu> {
        self.0.as_mut()
    }
}

/// The recurrent states of the CPU backend: `[n_slots, per_seq]` f32 (per linear layer the last
/// `K - 1` conv inputs `[K - 1, C]`, then the delta-rule matrices `[n_v, d_k, d_v]`), grown to
/// the highest slot a plan names (host memory: never shrunk).
pub struct HybridCpu {
    h: HybridConfig,
    /// Per layer: its index among the linear-attention layers.
    linear_index: Vec<Option<usize>>,
    /// f32 values of one slot.
    per_seq: usize,
    data: Vec<f32>, // [n_slots, per_seq]
    /// Tokens each slot's state absorbed (the guard against a plan that skips some).
    positions: SlotPositions,
    /// Prefix snapshots the engine may keep (unbounded unless set: host memory).
    max_snapshots: usize,
}

impl HybridCpu {
    pub fn new(h: &HybridConfig) -> Self {
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
        HybridCpu {
            h: h.clone(),
            linear_index,
            per_seq: next * h.state_len_per_layer(),
            data: Vec::new(),
            positions: SlotPositions::default(),
            max_snapshots: usize::MAX,
        }
    }

    /// The slots the engine may use: as many running sequences as it likes (the buffer grows),
    /// `max_snapshots` snapshots.
    pub fn slots(&self) -> StateSlots {
        StateSlots { running: usize::MAX, snapshots: self.max_snapshots }
    }

    fn state_mut(&mut self, slot: u32) -> &mut [f32] {
        let i = slot as usize;
        &mut self.data[i * self.per_seq..(i + 1) * self.per_seq]
    }

    fn run(&mut self, ops: &[StateOp]) {
        for op in ops {
            match *op {
                StateOp::Zero { slot } => self.state_mut(slot).fill(0.0),
                StateOp::Copy { from, to } => {
                    let (f, t, n) = (from as usize, to as usize, self.per_seq);
                    self.data.copy_within(f * n..(f + 1) * n, t * n);
                }
            }
        }
    }

    /// Checks the plan's state part (a chunk must continue its slot's state exactly: a gap
    /// or a slot never written is refused rather than run with a wrong state), then runs its
    /// `before` orders.
    pub fn begin_step(&mut self, plan: &StepPlan) -> Result<(), BackendError> {
        self.positions.begin(plan, self.slots().total())?;
        if let Some(top) = plan.state.highest_slot() {
            let need = (top as usize + 1) * self.per_seq;
            if self.data.len() < need {
                self.data.resize(need, 0.0);
            }
        }
        self.run(&plan.state.before);
        Ok(())
    }

    /// After the step: the chunks' states absorbed their tokens; the `after` orders (snapshots).
    pub fn end_step(&mut self, plan: &StepPlan) {
        self.positions.end(plan);
        self.run(&plan.state.after);
    }

    /// The hybrid configuration the states are sized by.
    pub(super) fn config(&self) -> &HybridConfig {
        &self.h
    }

    /// Layer `l`'s index among the linear-attention layers (`None` for an attention layer).
    pub(super) fn linear_index(&self, l: usize) -> Option<usize> {
        self.linear_index.get(l).copied().flatten()
    }

    /// The state of linear layer number `j` in `slot`: the last `K - 1` conv inputs `[K - 1, C]`,
    /// then the delta-rule matrices `[n_v, d_k, d_v]`; `None` beyond the buffer.
    pub(super) fn layer_state(&mut self, slot: u32, j: usize) -> Option<&mut [f32]> {
        let len = self.h.state_len_per_layer();
        let i = slot as usize;
        self.data.get_mut(i * self.per_seq..(i + 1) * self.per_seq)?.get_mut(j * len..(j + 1) * len)
    }
}
