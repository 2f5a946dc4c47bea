//! The per-sequence recurrent state of hybrid models' Gated DeltaNet layers on the CPU: a pool
//! of fixed-size slots, one per running sequence, and prefix snapshots. The mixer that reads
//! and updates a layer's state is `layers::gated_deltanet`; the full-attention layers of hybrid
//! models are `layers::attention`.

use std::collections::HashMap;

use crate::backend::{snapshot_room, BackendError};
use crate::engine::plan::{SeqId, StepPlan};
use crate::model::hybrid::HybridConfig;

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

/// The recurrent states of the CPU backend: configuration, state pool, snapshots.
pub struct HybridCpu {
    h: HybridConfig,
    /// Per layer: its index among the linear-attention layers.
    linear_index: Vec<Option<usize>>,
    pool: StatePool,
    /// Saved states by the chain hash of the prefix they follow: (state, tokens absorbed).
    snapshots: HashMap<[u8; 32], (Vec<f32>, usize)>,
    /// Most snapshots held at once (unbounded unless set: host memory).
    pub(super) max_snapshots: usize,
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
        let per_seq = next * h.state_len_per_layer();
        HybridCpu {
            h: h.clone(),
            linear_index,
            pool: StatePool { per_seq, data: Vec::new(), slots: HashMap::new(), free: Vec::new() },
            snapshots: HashMap::new(),
            max_snapshots: usize::MAX,
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

    /// The hybrid configuration the states are sized by.
    pub(super) fn config(&self) -> &HybridConfig {
        &self.h
    }

    /// Layer `l`'s index among the linear-attention layers (`None` for an attention layer).
    pub(super) fn linear_index(&self, l: usize) -> Option<usize> {
        self.linear_index.get(l).copied().flatten()
    }

    /// The state of linear layer number `j` of `seq`: the last `K - 1` conv inputs `[K - 1, C]`,
    /// then the delta-rule matrices `[n_v, d_k, d_v]`; `None` when `seq` has no slot.
    pub(super) fn layer_state(&mut self, seq: SeqId, j: usize) -> Option<&mut [f32]> {
        let len = self.h.state_len_per_layer();
        let index = self.pool.slots.get(&seq)?.index;
        self.pool.state_mut(index).get_mut(j * len..(j + 1) * len)
    }
}
