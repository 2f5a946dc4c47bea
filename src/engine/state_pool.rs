//! The recurrent states of a hybrid model's sequences, owned by the engine beside the KV block
//! pool (`kv`): which slot of the backend's state buffers each running sequence holds, which
//! slots hold prefix snapshots (by the chain hash of the prefix, with its length), which
//! snapshot goes when the pool is full (the least recently used), and the slot orders each step
//! runs (`plan::StatePlan`). The backends hold only the buffers and run the orders.
//!
//! A step's orders: `before` it, the restores of the sequences admitted on a prefix hit
//! (snapshot slot -> live slot), then a zeroed state for every chunk at position 0; `after`
//! it, the snapshots of states that reached the end of a shared prefix (live slot -> snapshot
//! slot), so a snapshot holds the state after exactly that prefix.
//!
//! NOTE: a step may fail after its orders ran or before (out of memory: the engine retries with
//! fewer sequences and tokens). So a restore is sent again with every plan of its sequence until
//! a step that ran the sequence succeeds; it reads a snapshot slot that is not evicted while a
//! restore waits on it, and writes are ordered after it, so running it twice is harmless. A
//! snapshot counts only once its step succeeded (`step_done`); the next plan frees the slots
//! of a failed step's snapshots.

use std::collections::{HashMap, HashSet, VecDeque};

use super::kv::BlockHash;
use super::plan::{SeqChunk, SeqId, StateOp, StatePlan, StepPlan};
use crate::backend::StateSlots;

/// Why the pool cannot give a step its states.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// The scheduler resumed a sequence after a prefix the pool holds no snapshot of.
    #[error("sequence {seq}: no recurrent-state snapshot after its {pos} cached tokens")]
    NoSnapshot { seq: SeqId, pos: usize },
    /// More sequences run than the backend holds live states for (the engine treats it as out
    /// of device memory: it runs fewer at once).
    #[error("sequence {seq}: the recurrent-state pool holds the {running} sequences the backend was planned for")]
    Full { seq: SeqId, running: usize },
}

/// A prefix snapshot: the state after the prefix whose last block has chain hash `hash`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Snapshot {
    hash: BlockHash,
    slot: u32,
    /// Tokens of the prefix.
    pos: usize,
}

/// The engine's recurrent-state pool over the backend's `StateSlots`.
#[derive(Debug)]
pub struct StatePool {
    /// Most sequences holding a live slot at once (the backend's).
    running: usize,
    /// Most snapshots at once: `2 x` the engine's slots, at most the backend's.
    snapshot_cap: usize,
    /// Slots given back; `next`: the lowest never given out.
    free: Vec<u32>,
    next: u32,
    live: HashMap<SeqId, u32>,
    /// Least recently used first.
    snapshots: VecDeque<Snapshot>,
    /// Restores not yet run by a successful step of their sequence: (sequence, snapshot slot).
    restoring: Vec<(SeqId, u32)>,
    /// Snapshots the last plan's `after` orders write; they count once its step succeeded.
    saving: Vec<Snapshot>,
}

impl StatePool {
    /// The pool of an engine of `engine_slots` slots over a backend holding `slots`.
    pub fn new(slots: StateSlots, engine_slots: usize) -> Self {
        StatePool {
            running: slots.running,
            snapshot_cap: engine_slots.saturating_mul(2).min(slots.snapshots),
            free: Vec::new(),
            next: 0,
            live: HashMap::new(),
            snapshots: VecDeque::new(),
            restoring: Vec::new(),
            saving: Vec::new(),
        }
    }

    fn take_slot(&mut self) -> u32 {
        self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        })
    }

    fn live_slot(&mut self, seq: SeqId) -> Result<u32, StateError> {
        if let Some(&s) = self.live.get(&seq) {
            return Ok(s);
        }
        if self.live.len() >= self.running {
            return Err(StateError::Full { seq, running: self.running });
        }
        let s = self.take_slot();
        self.live.insert(seq, s);
        Ok(s)
    }

    /// `seq` was admitted after the cached prefix of `pos` tokens ending in block `hash`: it
    /// continues from that prefix's snapshot (the most recently used now).
    pub fn restore(&mut self, seq: SeqId, hash: BlockHash, pos: usize) -> Result<(), StateError> {
        let i = self
            .snapshots
            .iter()
            .position(|s| s.hash == hash && s.pos == pos)
            .ok_or(StateError::NoSnapshot { seq, pos })?;
        let Some(snap) = self.snapshots.remove(i) else { return Err(StateError::NoSnapshot { seq, pos }) };
        self.snapshots.push_back(snap);
        self.restoring.retain(|&(s, _)| s != seq);
        self.restoring.push((seq, snap.slot));
        Ok(())
    }

    /// Whether a snapshot of `hash` is held or being saved.
    fn holds(&self, hash: &BlockHash) -> bool {
        self.snapshots.iter().chain(&self.saving).any(|s| s.hash == *hash)
    }

    /// Frees the least recently used snapshot that no waiting restore reads; its hash (the
    /// prefix is no longer a state point), `None` when every one is read.
    fn evict(&mut self) -> Option<BlockHash> {
        let read: HashSet<u32> = self.restoring.iter().map(|&(_, s)| s).collect();
        let i = self.snapshots.iter().position(|s| !read.contains(&s.slot))?;
        let old = self.snapshots.remove(i)?;
        self.free.push(old.slot);
        Some(old.hash)
    }

    /// The state part of a step of `chunks`: a live slot per chunk, the restores and zeroed
    /// states before it, the snapshots after it of the chunks `snapshot_after` names (the chain
    /// hash of the prefix a chunk ends). Also the snapshots evicted to make room: their prefixes
    /// are no longer state points.
    pub fn plan(
        &mut self,
        chunks: &[SeqChunk],
        snapshot_after: impl Fn(&SeqChunk) -> Option<BlockHash>,
    ) -> Result<(StatePlan, Vec<BlockHash>), StateError> {
        // A failed step's snapshots do not count (its `after` orders may not have run).
        let failed: Vec<u32> = self.saving.drain(..).map(|s| s.slot).collect();
        self.free.extend(failed);
        let slots = chunks.iter().map(|c| self.live_slot(c.seq)).collect::<Result<Vec<u32>, _>>()?;
        let running: HashMap<SeqId, u32> = chunks.iter().map(|c| c.seq).zip(slots.iter().copied()).collect();
        let mut before: Vec<StateOp> = self
            .restoring
            .iter()
            .filter_map(|&(seq, from)| running.get(&seq).map(|&to| StateOp::Copy { from, to }))
            .collect();
        before.extend(
            chunks.iter().zip(&slots).filter(|(c, _)| c.start_pos == 0).map(|(_, &slot)| StateOp::Zero { slot }),
        );
        let (mut after, mut evicted) = (Vec::new(), Vec::new());
        for (c, &from) in chunks.iter().zip(&slots) {
            let Some(hash) = snapshot_after(c) else { continue };
            if self.snapshot_cap == 0 || self.holds(&hash) {
                continue;
            }
            while self.snapshots.len() + self.saving.len() >= self.snapshot_cap {
                let Some(old) = self.evict() else { break };
                evicted.push(old);
            }
            if self.snapshots.len() + self.saving.len() >= self.snapshot_cap {
                continue; // every snapshot is about to be restored from: no room this time
            }
            let to = self.take_slot();
            after.push(StateOp::Copy { from, to });
            self.saving.push(Snapshot { hash, slot: to, pos: c.start_pos + c.tokens.len() });
        }
        Ok((StatePlan { slots, before, after }, evicted))
    }

    /// `plan` ran: its restores are done and its snapshots count. Returns the prefixes that are
    /// state points now.
    pub fn step_done(&mut self, plan: &StepPlan) -> Vec<BlockHash> {
        self.restoring.retain(|(seq, _)| !plan.chunks.iter().any(|c| c.seq == *seq));
        let saved: Vec<Snapshot> = self.saving.drain(..).collect();
        self.snapshots.extend(&saved);
        saved.iter().map(|s| s.hash).collect()
    }

    /// `seq` finished or restarts from position 0: its live slot is free.
    pub fn release(&mut self, seq: SeqId) {
        self.restoring.retain(|&(s, _)| s != seq);
        if let Some(slot) = self.live.remove(&seq) {
            self.free.push(slot);
        }
    }

    /// Snapshots held (after the last successful step).
    pub fn num_snapshots(&self) -> usize {
        self.snapshots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(seq: SeqId, start_pos: usize, n: usize) -> SeqChunk {
        SeqChunk { seq, tokens: vec![1; n], start_pos, block_table: vec![0], want_logits: true }
    }

    fn hash(i: u8) -> BlockHash {
        [i; 32]
    }

    /// Plans `chunks` (each `snap` names a chunk's prefix hash) and reports it done.
    fn step(pool: &mut StatePool, chunks: Vec<SeqChunk>, snap: &[(SeqId, u8)]) -> (StatePlan, Vec<BlockHash>) {
        let due = |c: &SeqChunk| snap.iter().find(|(s, _)| *s == c.seq).map(|&(_, h)| hash(h));
        let (state, evicted) = pool.plan(&chunks, due).unwrap();
        let plan = StepPlan { chunks, state: state.clone() };
        pool.step_done(&plan);
        (state, evicted)
    }

    #[test]
    fn a_snapshot_is_saved_after_its_step_and_restored_into_the_new_sequences_slot() {
        let mut pool = StatePool::new(StateSlots { running: 4, snapshots: 8 }, 2);
        // Sequence 1 runs 32 tokens from position 0 and ends the shared prefix (hash 7).
        let (s, _) = step(&mut pool, vec![chunk(1, 0, 32)], &[(1, 7)]);
        assert_eq!(s.slots, vec![0]);
        assert_eq!(s.before, vec![StateOp::Zero { slot: 0 }]);
        assert_eq!(s.after, vec![StateOp::Copy { from: 0, to: 1 }]);
        // A snapshot of the wrong length, or of another prefix, is refused.
        assert_eq!(pool.restore(2, hash(7), 16), Err(StateError::NoSnapshot { seq: 2, pos: 16 }));
        assert_eq!(pool.restore(2, hash(8), 32), Err(StateError::NoSnapshot { seq: 2, pos: 32 }));
        pool.restore(2, hash(7), 32).unwrap();
        let (s, _) = step(&mut pool, vec![chunk(1, 32, 1), chunk(2, 32, 5)], &[]);
        assert_eq!(s.slots, vec![0, 2]);
        assert_eq!(s.before, vec![StateOp::Copy { from: 1, to: 2 }], "the restore, no zeroing");
        assert!(s.after.is_empty());
        // Done: the next step of sequence 2 restores nothing.
        let (s, _) = step(&mut pool, vec![chunk(2, 37, 1)], &[]);
        assert!(s.before.is_empty(), "{s:?}");
    }

    #[test]
    fn a_full_pool_evicts_the_least_recently_used_snapshot() {
        // Engine of 1 slot: 2 snapshots at most (the backend would hold 8).
        let mut pool = StatePool::new(StateSlots { running: 8, snapshots: 8 }, 1);
        step(&mut pool, vec![chunk(1, 0, 16)], &[(1, 1)]);
        step(&mut pool, vec![chunk(2, 0, 16)], &[(2, 2)]);
        // Using prefix 1 makes prefix 2 the least recently used.
        pool.restore(3, hash(1), 16).unwrap();
        step(&mut pool, vec![chunk(3, 16, 1)], &[]);
        let (s, evicted) = step(&mut pool, vec![chunk(4, 0, 16)], &[(4, 3)]);
        assert_eq!(evicted, vec![hash(2)]);
        assert_eq!(pool.num_snapshots(), 2);
        assert_eq!(s.after.len(), 1);
        assert_eq!(pool.restore(5, hash(2), 16), Err(StateError::NoSnapshot { seq: 5, pos: 16 }));
        pool.restore(5, hash(1), 16).unwrap();
        pool.restore(6, hash(3), 16).unwrap();
        // A prefix already held is not saved twice; a backend with no snapshot slots saves none.
        let (s, evicted) = step(&mut pool, vec![chunk(7, 0, 16)], &[(7, 3)]);
        assert!(s.after.is_empty() && evicted.is_empty(), "{s:?}");
        let mut none = StatePool::new(StateSlots { running: 4, snapshots: 0 }, 4);
        let (s, _) = step(&mut none, vec![chunk(1, 0, 16)], &[(1, 1)]);
        assert!(s.after.is_empty());
    }

    #[test]
    fn released_slots_are_reused_and_a_full_pool_of_live_states_is_refused() {
        let mut pool = StatePool::new(StateSlots { running: 2, snapshots: 2 }, 2);
        step(&mut pool, vec![chunk(1, 0, 3), chunk(2, 0, 3)], &[]);
        assert_eq!(pool.plan(&[chunk(3, 0, 3)], |_| None), Err(StateError::Full { seq: 3, running: 2 }));
        pool.release(1);
        let (s, _) = step(&mut pool, vec![chunk(2, 3, 1), chunk(3, 0, 3)], &[]);
        assert_eq!(s.slots, vec![1, 0], "sequence 3 takes the slot sequence 1 gave back");
        assert_eq!(s.before, vec![StateOp::Zero { slot: 0 }]);
    }

    #[test]
    fn a_failed_step_sends_its_restore_again_and_its_snapshot_does_not_count() {
        let mut pool = StatePool::new(StateSlots { running: 4, snapshots: 1 }, 4);
        step(&mut pool, vec![chunk(1, 0, 16)], &[(1, 1)]);
        pool.restore(2, hash(1), 16).unwrap();
        // This plan's step fails: it would restore 2 and snapshot 3's prefix (evicting prefix 1
        // is not allowed while 2 waits to read it, so there is no room).
        let (s, evicted) = pool.plan(&[chunk(2, 16, 1), chunk(3, 0, 16)], |c| (c.seq == 3).then(|| hash(9))).unwrap();
        assert_eq!(s.before, vec![StateOp::Copy { from: 1, to: 2 }, StateOp::Zero { slot: 3 }]);
        assert!(s.after.is_empty() && evicted.is_empty(), "{s:?}");
        // The retry (no step_done in between) restores again; once it succeeds, prefix 1 may go.
        let (s, _) = step(&mut pool, vec![chunk(2, 16, 1)], &[]);
        assert_eq!(s.before, vec![StateOp::Copy { from: 1, to: 2 }]);
        let (s, evicted) = pool.plan(&[chunk(3, 0, 16)], |_| Some(hash(9))).unwrap();
        assert_eq!((evicted, s.after.clone()), (vec![hash(1)], vec![StateOp::Copy { from: 3, to: 1 }]));
        // That step fails too: its snapshot is forgotten, the slot is free again.
        let (s, _) = pool.plan(&[chunk(3, 0, 16)], |_| None).unwrap();
        assert!(s.after.is_empty());
        assert_eq!(pool.step_done(&StepPlan { chunks: vec![chunk(3, 0, 16)], state: s }), Vec::<BlockHash>::new());
        assert_eq!(pool.num_snapshots(), 0);
    }
}
