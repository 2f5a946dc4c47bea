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
}

impl StepPlan {
    pub fn n_tokens(&self) -> usize {
        self.chunks.iter().map(|c| c.tokens.len()).sum()
    }
}
