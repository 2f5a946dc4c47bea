//! The scheduler: which sequences run in the next step, and which of their tokens.
//!
//! Every step mixes, under a token budget (`max_batch_tokens`):
//! 1. one token for each running sequence whose next token is its last known one (decode);
//! 2. chunks of prefill for running sequences part way through their prompt (chunked prefill);
//! 3. new sequences from the waiting queue while slots (`slots`) and budget remain.
//!
//! A sequence is its tokens (prompt, then generated) and how many of them are in the KV cache;
//! a step runs `tokens[num_computed..]` or a prefix of it. Decode is a chunk of one token.
//! When a decode needs a block and none is free, the newest running sequence is preempted by
//! recomputation: its blocks are freed and it goes back to the front of the waiting queue with
//! everything it generated, to be prefilled again (no token is lost or drawn twice).
//!
//! A waiting request whose prefix is being computed by a running sequence (see `kv::PrefixMatch`)
//! is held back until those blocks are in the cache, and later requests go first; it then
//! reuses the blocks instead of computing the same prefix again.

use std::collections::{HashSet, VecDeque};

use super::kv::{BlockHash, KvCache, KvError};
use super::plan::{SeqChunk, SeqId, StepPlan};

/// Waiting requests held back for a shared prefix that admission looks past, at most: bounds
/// the work of one step when thousands of queued requests share one prefix.
const MAX_LOOKAHEAD: usize = 256;

/// The token budget an out-of-memory recovery does not go below (a prefill chunk this small
/// needs little workspace; smaller would only slow the job).
pub const MIN_OOM_BUDGET: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Sequences in flight at most.
    pub slots: usize,
    /// Tokens per step at most (decode tokens + prefill chunks).
    pub max_batch_tokens: usize,
    /// Blocks kept free when admitting a request while others run, so running sequences can
    /// grow a while before anyone is preempted.
    pub watermark_blocks: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sequence {
    pub id: SeqId,
    /// The prompt, then the generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Leading tokens whose K/V are in the cache.
    pub num_computed: usize,
    /// The most tokens ever computed (positions below it run again after a preemption).
    pub max_computed: usize,
    /// Prompt tokens served by the prefix cache at first admission (for per-request reports).
    pub cached_tokens: usize,
    /// Models with recurrent state: a chunk ends at this position so the state there can be
    /// snapshotted (the end of the prefix this prompt shares with cached blocks).
    pub snapshot_at: Option<usize>,
}

impl Sequence {
    /// Tokens still to run through the model.
    fn remaining(&self) -> usize {
        self.tokens.len() - self.num_computed
    }

    /// Whether the tokens still to run are its last one, or were all appended after its
    /// prompt (and any re-run) was computed: those need KV positions beyond the ones its
    /// admission allocated.
    fn is_decoding(&self) -> bool {
        self.remaining() == 1 || (self.remaining() > 1 && self.num_computed >= self.prompt_len)
    }
}

/// Counters over the scheduler's lifetime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    pub steps: u64,
    /// Sum over steps of the sequences in the step (for the average slot occupancy).
    pub seq_steps: u64,
    /// Prompt positions run through the model (re-runs after preemption included).
    pub prompt_tokens_computed: u64,
    /// Generated positions run again after a preemption.
    pub recomputed_tokens: u64,
    /// Prompt tokens served from the prefix cache at admission.
    pub cached_tokens: u64,
    pub preemptions: u64,
    /// Times a request was held back because its prefix was being computed by another.
    pub prefix_waits: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error("sequence {0} is not running")]
    NotRunning(SeqId),
    #[error("sequence {0} is already queued or running")]
    Duplicate(SeqId),
    #[error("sequence {0} has an empty prompt")]
    EmptyPrompt(SeqId),
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvCache,
    waiting: VecDeque<Sequence>,
    /// In admission order: the last one is preempted first.
    running: Vec<Sequence>,
    /// Ids of all queued and running sequences.
    ids: HashSet<SeqId>,
    stats: SchedulerStats,
    /// Admitted this step from a prefix hit on a model with recurrent state: (sequence, hash of
    /// the prefix, its length); the engine restores the state snapshot before the step runs.
    restores: Vec<(SeqId, BlockHash, usize)>,
    /// Sequences preempted since the engine last asked (they restart from position 0).
    preempted: Vec<SeqId>,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, kv: KvCache) -> Self {
        Scheduler {
            cfg,
            kv,
            waiting: VecDeque::new(),
            running: Vec::new(),
            ids: HashSet::new(),
            stats: SchedulerStats::default(),
            restores: Vec::new(),
            preempted: Vec::new(),
        }
    }

    /// The state restores the engine must do before running the last planned step.
    pub fn take_restores(&mut self) -> Vec<(SeqId, BlockHash, usize)> {
        std::mem::take(&mut self.restores)
    }
    /// The prefix whose recurrent state the engine snapshots after chunk `c` of the last
    /// planned step: the chain hash of its last block, when `c` ends at its sequence's
    /// `snapshot_at` (the end of a shared prefix whose K/V were cached without a state).
    pub fn snapshot_after(&self, c: &SeqChunk) -> Option<BlockHash> {
        let s = self.running.iter().find(|s| s.id == c.seq)?;
        let p = s.snapshot_at.filter(|&p| p == c.start_pos + c.tokens.len())?;
        self.kv.block_hash(s.id, (p / self.kv.block_size()).checked_sub(1)?)
    }
    /// The sequences preempted since the last call: their per-sequence backend state (a hybrid
    /// model's recurrent state) is stale, and its slot is needed by the sequences that run.
    pub fn take_preempted(&mut self) -> Vec<SeqId> {
        std::mem::take(&mut self.preempted)
    }
    /// See [`KvCache::add_state_point`] / [`KvCache::remove_state_point`].
    pub fn set_state_point(&mut self, hash: BlockHash, present: bool) {
        if present {
            self.kv.add_state_point(hash);
        } else {
            self.kv.remove_state_point(&hash);
        }
    }

    pub fn kv(&self) -> &KvCache {
        &self.kv
    }
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }
    pub fn stats(&self) -> &SchedulerStats {
        &self.stats
    }
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }
    pub fn num_running(&self) -> usize {
        self.running.len()
    }
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }
    pub fn running(&self) -> &[Sequence] {
        &self.running
    }
    pub fn waiting(&self) -> impl Iterator<Item = &Sequence> {
        self.waiting.iter()
    }
    pub fn get(&self, id: SeqId) -> Option<&Sequence> {
        self.running.iter().find(|s| s.id == id).or_else(|| self.waiting.iter().find(|s| s.id == id))
    }

    /// Queues a new sequence at the back.
    pub fn add(&mut self, id: SeqId, prompt: Vec<u32>) -> Result<(), SchedulerError> {
        let n = prompt.len();
        self.add_continued(id, prompt, n)
    }

    /// Queues a new sequence whose tokens after `prompt_len` are generated already (tokens a
    /// grammar forces before the model has chosen any): they are run with the prompt, and
    /// counted as generated.
    pub fn add_continued(&mut self, id: SeqId, tokens: Vec<u32>, prompt_len: usize) -> Result<(), SchedulerError> {
        if tokens.is_empty() || prompt_len == 0 {
            return Err(SchedulerError::EmptyPrompt(id));
        }
        if !self.ids.insert(id) {
            return Err(SchedulerError::Duplicate(id));
        }
        let prompt = tokens;
        let prompt_len = prompt_len.min(prompt.len());
        self.waiting.push_back(Sequence {
            id,
            tokens: prompt,
            prompt_len,
            num_computed: 0,
            max_computed: 0,
            cached_tokens: 0,
            snapshot_at: None,
        });
        Ok(())
    }

    /// Plans the next step. Empty when there is nothing to run.
    pub fn schedule(&mut self) -> Result<StepPlan, SchedulerError> {
        let mut budget = self.cfg.max_batch_tokens;
        let mut plan = StepPlan::default();

        // 1. Decode: the new tokens of each running sequence past its prefill: one sampled token,
        // or that token and the tokens a grammar forced after it (run as one chunk).
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            if !self.running[i].is_decoding() {
                i += 1;
                continue;
            }
            if !self.reserve_positions(i)? {
                break; // sequence i preempted itself, and everything after it went first
            }
            let n = self.running[i].remaining().min(budget);
            plan.chunks.push(self.chunk(i, n)?);
            budget -= n;
            i += 1;
        }

        // 2. Prefill chunks of running sequences (their slots were allocated at admission).
        for i in 0..self.running.len() {
            if budget == 0 {
                break;
            }
            let rem = self.running[i].remaining();
            if rem > 1 && !self.running[i].is_decoding() {
                let n = self.prefill_len(i, budget);
                plan.chunks.push(self.chunk(i, n)?);
                budget -= n;
            }
        }

        // 3. Admission: new sequences while slots and budget remain.
        let mut w = 0;
        while w < self.waiting.len().min(MAX_LOOKAHEAD) && self.running.len() < self.cfg.slots && budget > 0 {
            let m = self.kv.lookup_prefix(&self.waiting[w].tokens);
            if m.pending_on.is_some() || self.snapshot_in_progress(&m) {
                // NOTE: its prefix is being computed by a running sequence; admitting it now
                // would compute the same blocks twice. It keeps its place; later requests go first.
                self.stats.prefix_waits += 1;
                w += 1;
                continue;
            }
            // The first request may use every block: nothing else runs that could be starved.
            let reserve = if self.running.is_empty() { 0 } else { self.cfg.watermark_blocks };
            if !self.kv.can_allocate(&self.waiting[w].tokens, reserve) {
                break; // first come, first served for memory: no overtaking a large request
            }
            let Some(mut seq) = self.waiting.remove(w) else { break };
            let cached = self.kv.allocate(seq.id, &seq.tokens)?;
            seq.num_computed = cached;
            if seq.max_computed == 0 {
                seq.cached_tokens = cached.min(seq.prompt_len);
            }
            self.stats.cached_tokens += cached.min(seq.prompt_len) as u64;
            if self.kv.state_points_required() {
                if cached > 0 {
                    let hash = self.kv.block_hash(seq.id, cached / self.kv.block_size() - 1);
                    self.restores.push((seq.id, hash.ok_or(KvError::UnknownSeq(seq.id))?, cached));
                }
                // NOTE: the cached K/V reach further than any state snapshot: compute the shared
                // prefix again, stop there and snapshot, so the next prompts resume from it.
                seq.snapshot_at = (m.shared_tokens > cached).then_some(m.shared_tokens);
            }
            self.running.push(seq);
            let i = self.running.len() - 1;
            let n = self.prefill_len(i, budget);
            plan.chunks.push(self.chunk(i, n)?);
            budget -= n;
        }

        if !plan.chunks.is_empty() {
            self.stats.steps += 1;
            self.stats.seq_steps += plan.chunks.len() as u64;
        }
        debug_assert!(plan.n_tokens() <= self.cfg.max_batch_tokens);
        Ok(plan)
    }

    /// After a step ran out of device memory: halves the slots and the token budget (not below
    /// one slot and [`MIN_OOM_BUDGET`] tokens) and preempts the newest running sequences beyond
    /// the new slot count; they are recomputed later, so nothing is lost. The next `schedule`
    /// plans the smaller step. False when there is nothing left to shrink.
    pub fn shrink_after_oom(&mut self) -> Result<bool, SchedulerError> {
        let (slots, budget) = (self.cfg.slots, self.cfg.max_batch_tokens);
        let new_slots = (slots / 2).max(1);
        let new_budget = (budget / 2).max(MIN_OOM_BUDGET).max(new_slots).min(budget);
        if new_slots == slots && new_budget == budget && self.running.len() <= 1 {
            return Ok(false);
        }
        self.cfg.slots = new_slots;
        self.cfg.max_batch_tokens = new_budget;
        while self.running.len() > new_slots {
            self.preempt(self.running.len() - 1)?;
        }
        Ok(true)
    }

    /// Makes sure running sequence `i` has a KV position for each of its tokens, preempting the newest
    /// sequences while blocks are short. False when `i` itself had to be preempted.
    fn reserve_positions(&mut self, i: usize) -> Result<bool, SchedulerError> {
        let id = self.running[i].id;
        let need = self.running[i].tokens.len();
        while self.kv.num_positions(id).ok_or(KvError::UnknownSeq(id))? < need {
            if self.kv.may_append(id) {
                self.kv.append_position(id)?;
                continue;
            }
            let victim = self.running.len() - 1;
            self.preempt(victim)?;
            if victim == i {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Frees running sequence `i`'s blocks and puts it back at the front of the queue, with its
    /// generated tokens: it is prefilled again from its cached prefix (if any survives).
    fn preempt(&mut self, i: usize) -> Result<(), SchedulerError> {
        let mut seq = self.running.remove(i);
        self.kv.free(seq.id)?;
        self.preempted.push(seq.id);
        seq.num_computed = 0;
        self.waiting.push_front(seq);
        self.stats.preemptions += 1;
        Ok(())
    }

    /// Whether a running sequence is about to snapshot the state after the prefix that `m`
    /// finds cached without a state (then waiting for it beats computing the prefix again).
    fn snapshot_in_progress(&self, m: &super::kv::PrefixMatch) -> bool {
        let p = m.shared_tokens;
        if !self.kv.state_points_required() || p <= m.cached_tokens {
            return false;
        }
        let j = p / self.kv.block_size() - 1;
        let h = m.hash_at(j);
        self.running.iter().any(|s| s.snapshot_at == Some(p) && self.kv.block_hash(s.id, j) == h)
    }

    /// Prefill tokens of running sequence `i` for this step: its remaining ones within `budget`,
    /// ending at its `snapshot_at` when it has not reached it yet.
    fn prefill_len(&self, i: usize, budget: usize) -> usize {
        let s = &self.running[i];
        let n = s.remaining().min(budget);
        match s.snapshot_at {
            Some(p) if p > s.num_computed => n.min(p - s.num_computed),
            _ => n,
        }
    }

    /// The next `n` tokens of running sequence `i`.
    fn chunk(&self, i: usize, n: usize) -> Result<SeqChunk, SchedulerError> {
        let s = &self.running[i];
        let start = s.num_computed;
        let table = self.kv.block_table(s.id).ok_or(KvError::UnknownSeq(s.id))?;
        Ok(SeqChunk {
            seq: s.id,
            tokens: s.tokens[start..start + n].to_vec(),
            start_pos: start,
            block_table: table.to_vec(),
            want_logits: start + n == s.tokens.len(),
        })
    }

    /// Records that the backend ran `plan`: the chunks' K/V are in the cache now.
    pub fn on_step_done(&mut self, plan: &StepPlan) -> Result<(), SchedulerError> {
        for c in &plan.chunks {
            let seq = self.running.iter_mut().find(|s| s.id == c.seq).ok_or(SchedulerError::NotRunning(c.seq))?;
            let end = c.start_pos + c.tokens.len();
            let overlap = |lo: usize, hi: usize| hi.min(end).saturating_sub(lo.max(c.start_pos)) as u64;
            self.stats.prompt_tokens_computed += overlap(0, seq.prompt_len);
            self.stats.recomputed_tokens += overlap(seq.prompt_len, seq.max_computed);
            seq.num_computed = end;
            seq.max_computed = seq.max_computed.max(end);
            self.kv.mark_computed(seq.id, &seq.tokens, end)?;
            // The engine planned the snapshot with the step (`snapshot_after`).
            if seq.snapshot_at.is_some_and(|p| end >= p) {
                seq.snapshot_at = None;
            }
        }
        Ok(())
    }

    /// Appends a sampled token to running sequence `id` (after a chunk with logits).
    pub fn append_token(&mut self, id: SeqId, token: u32) -> Result<(), SchedulerError> {
        let seq = self.running.iter_mut().find(|s| s.id == id).ok_or(SchedulerError::NotRunning(id))?;
        seq.tokens.push(token);
        Ok(())
    }

    /// Ends running sequence `id`: its slot and blocks are free for the next step.
    pub fn finish(&mut self, id: SeqId) -> Result<Sequence, SchedulerError> {
        let i = self.running.iter().position(|s| s.id == id).ok_or(SchedulerError::NotRunning(id))?;
        let seq = self.running.remove(i);
        self.kv.free(id)?;
        self.ids.remove(&id);
        Ok(seq)
    }
}
