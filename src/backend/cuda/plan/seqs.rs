//! The sequences a backend is planned for (`SeqPlan`), shared by the memory plan (`memory`),
//! the hybrid layers' state pools (`hybrid`) and the backend's options.

/// The sequences a backend is planned for: how many run at once (each holds a recurrent state
/// in hybrid models, and returns at most one logits row a step) and how many prefix-reuse
/// snapshots of a recurrent state it keeps (the engine evicts the least recently used beyond
/// them; a prefix whose snapshot was evicted is computed again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqPlan {
    pub running: usize,
    pub snapshots: usize,
}

/// Prefix snapshots a hybrid model keeps by default (`DUSTOFF_STATE_SNAPSHOTS`): the engine
/// snapshots only at the end of a prompt's longest shareable prefix, so a job needs one per
/// distinct shared prefix (a pipeline's system prompt and instruction); 8 leave room for a few.
pub const DEFAULT_STATE_SNAPSHOTS: usize = 8;

impl SeqPlan {
    /// `running` sequences and the snapshot pool of `DUSTOFF_STATE_SNAPSHOTS` (default
    /// [`DEFAULT_STATE_SNAPSHOTS`]).
    pub fn new(running: usize) -> Self {
        let snapshots = crate::sys::env::get("DUSTOFF_STATE_SNAPSHOTS")
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_STATE_SNAPSHOTS);
        SeqPlan { running: running.max(1), snapshots }
    }
}
