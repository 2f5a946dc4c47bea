//! The contract between the scheduler and the backends: one forward step over several sequences.
//!
//! The scheduler knows nothing about tensors; the backend knows nothing about requests. A plan
//! names, per sequence, the new tokens to run, their positions and the KV blocks that hold (or
//! will hold) positions `0..start_pos + tokens.len()`.

/// Identifies a sequence for the lifetime of its request.
pub type SeqId = u64;

/// The work of one sequence in one step: a chunk of prefill, or one decode token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqChunk {
    pub seq: SeqId,
    /// New tokens to run; their K/V are written to the cache.
    pub tokens: Vec<u32>,
    /// Absolute position of `tokens[0]`; positions `0..start_pos` are already in the cache.
    pub start_pos: usize,
    /// Physical KV block ids, in order: position p lives in block `block_table[p / block_size]`
    /// at offset `p % block_size`. Covers at least `start_pos + tokens.len()` positions.
    pub block_table: Vec<u32>,
    /// Whether the backend returns the logits of the last token of this chunk.
    pub want_logits: bool,
}

/// One forward step: chunks of distinct sequences, run together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepPlan {
    pub chunks: Vec<SeqChunk>,
    /// Hybrid models: which recurrent-state slot each chunk runs on and the slot copies around
    /// the step (empty for models without recurrent state).
    pub state: StatePlan,
}

impl StepPlan {
    /// A step of `chunks` with no recurrent-state work (models without it).
    pub fn new(chunks: Vec<SeqChunk>) -> Self {
        StepPlan { chunks, state: StatePlan::default() }
    }

    pub fn n_tokens(&self) -> usize {
        self.chunks.iter().map(|c| c.tokens.len()).sum()
    }
}

/// One order on recurrent-state slots (the backend's buffers `[n_slots, state_len]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateOp {
    /// The state of a sequence that starts at position 0.
    Zero { slot: u32 },
    /// `to` takes `from`'s state (and the count of tokens it absorbed): a prefix snapshot
    /// saved (live slot -> snapshot slot) or restored (snapshot slot -> live slot).
    Copy { from: u32, to: u32 },
}

impl StateOp {
    /// The slot this order writes.
    pub fn target(&self) -> u32 {
        match *self {
            StateOp::Zero { slot } => slot,
            StateOp::Copy { to, .. } => to,
        }
    }
}

/// The recurrent-state part of a step, decided by the engine's state pool
/// (`engine::state_pool`); a backend only runs it on its slot buffers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatePlan {
    /// Per chunk, in plan order: the slot whose state the chunk reads and updates.
    pub slots: Vec<u32>,
    /// Run in order before the step: restores of prefix snapshots, then zeroed states.
    pub before: Vec<StateOp>,
    /// Run in order after the step: snapshots of states that reached a shared prefix's end.
    pub after: Vec<StateOp>,
}

impl StatePlan {
    /// One sequence on slot 0 (a caller that runs one sequence at a time, e.g.
    /// `single::SingleSeq`): zeroed when its chunk starts at position 0.
    pub fn single(start_pos: usize) -> Self {
        let before = if start_pos == 0 { vec![StateOp::Zero { slot: 0 }] } else { Vec::new() };
        StatePlan { slots: vec![0], before, after: Vec::new() }
    }

    /// Every chunk on a slot of its own, `slot_of(chunk)`, zeroed where the chunk starts at
    /// position 0: a caller that runs a fixed set of sequences side by side (e.g. eval's windows).
    pub fn fixed(chunks: &[SeqChunk], slot_of: impl Fn(&SeqChunk) -> u32) -> Self {
        let slots: Vec<u32> = chunks.iter().map(&slot_of).collect();
        let zero = chunks.iter().zip(&slots).filter(|(c, _)| c.start_pos == 0);
        let before = zero.map(|(_, &slot)| StateOp::Zero { slot }).collect();
        StatePlan { slots, before, after: Vec::new() }
    }

    /// The highest slot the plan names (`None`: none).
    pub fn highest_slot(&self) -> Option<u32> {
        let ops = self.before.iter().chain(&self.after);
        let op_slots = ops.flat_map(|op| match *op {
            StateOp::Zero { slot } => [slot, slot],
            StateOp::Copy { from, to } => [from, to],
        });
        self.slots.iter().copied().chain(op_slots).max()
    }
}

/// Why a backend refuses a plan (`BackendError::Plan` carries the text).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("sequence {0} appears twice in one step")]
    Repeated(SeqId),
    #[error("sequence {0} has an empty chunk")]
    Empty(SeqId),
    #[error("sequence {seq}: block table covers {covered} positions, the chunk reaches {end}")]
    ShortTable { seq: SeqId, covered: usize, end: usize },
    #[error("sequence {seq}: position {pos} is beyond the {max_pos} positions this backend was set up for")]
    Position { seq: SeqId, pos: usize, max_pos: usize },
    #[error("sequence {seq}: block {block} is beyond the pool of {num_blocks}")]
    Block { seq: SeqId, block: u32, num_blocks: usize },
    #[error("sequence {seq}: token id {token} is beyond the vocabulary ({vocab})")]
    Token { seq: SeqId, token: u32, vocab: usize },
    #[error("the plan names recurrent-state slots for {slots} of its {chunks} chunks")]
    StateSlots { slots: usize, chunks: usize },
    #[error("sequences {a} and {b} run on the same recurrent-state slot {slot}")]
    SharedSlot { a: SeqId, b: SeqId, slot: u32 },
    #[error("recurrent-state slot {slot} is beyond the {n_slots} slots this backend holds")]
    Slot { slot: u32, n_slots: usize },
}

/// What a backend can run: the bounds [`StepPlan::validate`] checks a plan against.
#[derive(Clone, Copy, Debug)]
pub struct PlanLimits {
    pub block_size: usize,
    pub num_blocks: usize,
    pub vocab_size: usize,
    /// Positions the backend's tables cover (RoPE, attention scratch); `None`: no such bound.
    pub max_pos: Option<usize>,
}

impl StepPlan {
    /// The one check every backend runs before a step: distinct sequences, non-empty chunks,
    /// block tables that cover the chunk and stay in the pool, token ids inside the vocabulary.
    pub fn validate(&self, lim: &PlanLimits) -> Result<(), PlanError> {
        let mut seen = std::collections::HashSet::new();
        for c in &self.chunks {
            let seq = c.seq;
            if !seen.insert(seq) {
                return Err(PlanError::Repeated(seq));
            }
            if c.tokens.is_empty() {
                return Err(PlanError::Empty(seq));
            }
            let end = c.start_pos + c.tokens.len();
            let covered = c.block_table.len() * lim.block_size;
            if covered < end {
                return Err(PlanError::ShortTable { seq, covered, end });
            }
            if let Some(max_pos) = lim.max_pos.filter(|&m| end > m) {
                return Err(PlanError::Position { seq, pos: end - 1, max_pos });
            }
            if let Some(&block) = c.block_table.iter().find(|&&b| b as usize >= lim.num_blocks) {
                return Err(PlanError::Block { seq, block, num_blocks: lim.num_blocks });
            }
            if let Some(&token) = c.tokens.iter().find(|&&t| t as usize >= lim.vocab_size) {
                return Err(PlanError::Token { seq, token, vocab: lim.vocab_size });
            }
        }
        Ok(())
    }

    /// The check of a hybrid model's backend holding `n_slots` state slots: one slot per
    /// chunk, no slot shared by two chunks, every slot the plan names inside the pool.
    pub fn validate_state(&self, n_slots: usize) -> Result<(), PlanError> {
        let st = &self.state;
        if st.slots.len() != self.chunks.len() {
            return Err(PlanError::StateSlots { slots: st.slots.len(), chunks: self.chunks.len() });
        }
        if let Some(slot) = st.highest_slot().filter(|&s| s as usize >= n_slots) {
            return Err(PlanError::Slot { slot, n_slots });
        }
        let mut seen = std::collections::HashMap::new();
        for (c, &slot) in self.chunks.iter().zip(&st.slots) {
            if let Some(a) = seen.insert(slot, c.seq) {
                return Err(PlanError::SharedSlot { a, b: c.seq, slot });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(seq: SeqId, tokens: Vec<u32>, start_pos: usize, block_table: Vec<u32>) -> SeqChunk {
        SeqChunk { seq, tokens, start_pos, block_table, want_logits: true }
    }

    #[test]
    fn validate_names_the_first_broken_rule() {
        let lim = PlanLimits { block_size: 4, num_blocks: 3, vocab_size: 10, max_pos: Some(8) };
        let plan = StepPlan::new;
        assert_eq!(plan(vec![chunk(1, vec![1, 2], 3, vec![0, 1])]).validate(&lim), Ok(()));
        let twice = plan(vec![chunk(1, vec![1], 0, vec![0]), chunk(1, vec![2], 1, vec![0])]);
        assert_eq!(twice.validate(&lim), Err(PlanError::Repeated(1)));
        assert_eq!(plan(vec![chunk(2, vec![], 0, vec![0])]).validate(&lim), Err(PlanError::Empty(2)));
        let short = plan(vec![chunk(3, vec![1, 2], 3, vec![0])]).validate(&lim);
        assert_eq!(short, Err(PlanError::ShortTable { seq: 3, covered: 4, end: 5 }));
        let far = plan(vec![chunk(4, vec![1], 8, vec![0, 1, 2])]).validate(&lim);
        assert_eq!(far, Err(PlanError::Position { seq: 4, pos: 8, max_pos: 8 }));
        let no_max = PlanLimits { max_pos: None, ..lim };
        assert_eq!(plan(vec![chunk(4, vec![1], 8, vec![0, 1, 2])]).validate(&no_max), Ok(()));
        let block = plan(vec![chunk(5, vec![1], 0, vec![3])]).validate(&lim);
        assert_eq!(block, Err(PlanError::Block { seq: 5, block: 3, num_blocks: 3 }));
        let token = plan(vec![chunk(6, vec![10], 0, vec![0])]).validate(&lim);
        assert_eq!(
            token.as_ref().map_err(ToString::to_string),
            Err("sequence 6: token id 10 is beyond the vocabulary (10)".into())
        );
    }

    #[test]
    fn validate_state_wants_one_distinct_slot_per_chunk_inside_the_pool() {
        let mut p = StepPlan::new(vec![chunk(1, vec![1], 0, vec![0]), chunk(2, vec![2], 0, vec![1])]);
        assert_eq!(p.validate_state(4), Err(PlanError::StateSlots { slots: 0, chunks: 2 }));
        p.state.slots = vec![3, 3];
        assert_eq!(p.validate_state(4), Err(PlanError::SharedSlot { a: 1, b: 2, slot: 3 }));
        p.state.slots = vec![0, 3];
        assert_eq!(p.validate_state(4), Ok(()));
        p.state.after = vec![StateOp::Copy { from: 3, to: 4 }];
        assert_eq!(p.validate_state(4), Err(PlanError::Slot { slot: 4, n_slots: 4 }));
        assert_eq!(p.validate_state(5), Ok(()));
    }
}
