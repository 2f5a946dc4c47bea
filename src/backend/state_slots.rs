//! What a hybrid model's backend keeps beside its recurrent-state buffers: how many slots it
//! holds buffers for (the one number the engine's state pool, `engine::state_pool`, needs from
//! it) and how many tokens each slot's state has absorbed. The pool decides which slot holds
//! what; the counts here are a guard only, so that a plan that would continue a sequence from
//! a state that is not its own (a gap, a slot never written) is refused instead of running.

use crate::backend::BackendError;
use crate::engine::plan::{StateOp, StepPlan};

/// The recurrent-state slots a backend holds buffers for (none for models without state).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateSlots {
    /// Sequences that may run at once (each holds one live slot).
    pub running: usize,
    /// Prefix snapshots kept beside them.
    pub snapshots: usize,
}

impl StateSlots {
    /// Slots in all: slot numbers run from 0 to `total() - 1`.
    pub fn total(&self) -> usize {
        self.running.saturating_add(self.snapshots)
    }
}

/// Tokens absorbed by each slot's state (`None`: never written).
#[derive(Clone, Debug, Default)]
pub struct SlotPositions {
    pos: Vec<Option<usize>>,
}

impl SlotPositions {
    fn get(&self, slot: u32) -> Option<usize> {
        self.pos.get(slot as usize).copied().flatten()
    }

    fn set(&mut self, slot: u32, p: Option<usize>) {
        let i = slot as usize;
        if self.pos.len() <= i {
            self.pos.resize(i + 1, None);
        }
        self.pos[i] = p;
    }

    fn apply(&mut self, ops: &[StateOp]) {
        for op in ops {
            match *op {
                StateOp::Zero { slot } => self.set(slot, Some(0)),
                StateOp::Copy { from, to } => self.set(to, self.get(from)),
            }
        }
    }

    /// Before a step on a pool of `n_slots`: checks the plan's state part, follows its `before`
    /// orders and checks that every chunk continues its slot's state (a chunk at position `p`
    /// needs a state that absorbed exactly `p` tokens). Nothing changes when the plan is refused;
    /// the caller then runs the `before` orders on its buffers.
    pub fn begin(&mut self, plan: &StepPlan, n_slots: usize) -> Result<(), BackendError> {
        plan.validate_state(n_slots)?;
        let mut next = self.clone();
        next.apply(&plan.state.before);
        for (c, &slot) in plan.chunks.iter().zip(&plan.state.slots) {
            let held = next.get(slot);
            if held != Some(c.start_pos) {
                return Err(BackendError::Plan(format!(
                    "sequence {} continues at position {} on state slot {slot}, but its recurrent state {} (a \
                     hybrid model's sequence must run from position 0 without gaps, or from a restored snapshot)",
                    c.seq,
                    c.start_pos,
                    held.map_or("does not exist".to_string(), |p| format!("holds {p} tokens")),
                )));
            }
        }
        *self = next;
        Ok(())
    }

    /// After the step ran: the chunks' states absorbed their tokens; then the `after` orders
    /// (which the caller runs on its buffers too).
    pub fn end(&mut self, plan: &StepPlan) {
        for (c, &slot) in plan.chunks.iter().zip(&plan.state.slots) {
            self.set(slot, Some(c.start_pos + c.tokens.len()));
        }
        self.apply(&plan.state.after);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::plan::{SeqChunk, StatePlan};

    fn plan(seq: u64, n: usize, start_pos: usize, slot: u32, before: Vec<StateOp>) -> StepPlan {
        let chunk = SeqChunk { seq, tokens: vec![1; n], start_pos, block_table: vec![0], want_logits: true };
        StepPlan { chunks: vec![chunk], state: StatePlan { slots: vec![slot], before, after: Vec::new() } }
    }

    #[test]
    fn a_chunk_must_continue_the_state_of_its_slot() {
        let mut p = SlotPositions::default();
        let e = p.begin(&plan(7, 2, 16, 0, vec![]), 4).unwrap_err().to_string();
        assert!(e.contains("sequence 7") && e.contains("does not exist"), "{e}");
        // Position 0 needs a zeroed slot.
        assert!(p.begin(&plan(1, 3, 0, 0, vec![]), 4).is_err());
        let first = plan(1, 3, 0, 0, vec![StateOp::Zero { slot: 0 }]);
        p.begin(&first, 4).unwrap();
        p.end(&first);
        let e = p.begin(&plan(1, 1, 5, 0, vec![]), 4).unwrap_err().to_string();
        assert!(e.contains("holds 3 tokens"), "{e}");
        // A copy carries the count: slot 2 continues where slot 0 stood.
        let copied = plan(2, 1, 3, 2, vec![StateOp::Copy { from: 0, to: 2 }]);
        p.begin(&copied, 4).unwrap();
        p.end(&copied);
        assert_eq!((p.get(0), p.get(2)), (Some(3), Some(4)));
        assert!(p.begin(&plan(2, 1, 4, 9, vec![]), 4).is_err(), "slot 9 is beyond the pool");
    }
}
