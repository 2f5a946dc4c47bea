//! The engine loop: schedule -> backend step -> sample -> postprocess, over many requests.
//!
//! Determinism: each request samples from its own `Sampler`, seeded by its own seed, and only
//! from its own logits; so what a request generates does not depend on which other requests
//! share its steps, on the slot count, on chunking or on prefix reuse (given a backend whose
//! per-sequence results do not depend on the batch, as the CPU backend's do not).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::constraint::{fill_masks, ConstraintMetrics, MaskTimes, SeqConstraint};
pub use super::finish::FinishReason;
use super::kv::KvCache;
use super::plan::{SeqId, StepPlan};
use super::sampler::{Sampler, SamplingParams};
use super::scheduler::{Scheduler, SchedulerConfig, SchedulerError};
use super::state_pool::{StateError, StatePool};
use super::step_cost::{BoundRates, BoundTally, StepCost};
use crate::backend::{Backend, BackendError};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Sequences in flight at most (`--slots`).
    pub slots: usize,
    /// Tokens per step at most (`--max-batch-tokens`); at least `slots`.
    pub max_batch_tokens: usize,
    /// Reuse the K/V of shared prefixes (`--no-prefix-cache` turns it off).
    pub prefix_cache: bool,
    /// Names the model and its numerics: cached blocks are only reused under the same one.
    pub model_fingerprint: [u8; 32],
}

/// Tokens per KV block of every backend the commands make (the block pool's page size).
pub const BLOCK_SIZE: usize = 16;

/// `--max-batch-tokens` on the CPU when none is given: also the step the GPU memory plan
/// reserves workspace for when a backend is made without an engine configuration.
pub const DEFAULT_MAX_BATCH_TOKENS: usize = 512;

/// `--max-batch-tokens` of `run` and `generate` on a GPU when none is given: larger prefill
/// chunks give each expert of a MoE more tokens per grouped product (H200, nightly job
/// benchmark of docs/BENCHMARKS.md: 22,648 documents an hour against 21,108 at 512).
pub const DEFAULT_GPU_MAX_BATCH_TOKENS: usize = 2048;

/// The default step budget of a device kind.
pub fn default_max_batch_tokens(gpu: bool) -> usize {
    if gpu {
        DEFAULT_GPU_MAX_BATCH_TOKENS
    } else {
        DEFAULT_MAX_BATCH_TOKENS
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            slots: 8,
            max_batch_tokens: DEFAULT_MAX_BATCH_TOKENS,
            prefix_cache: true,
            model_fingerprint: [0; 32],
        }
    }
}

impl EngineConfig {
    /// The configuration of a command: `max_batch_tokens` is raised to `slots` where it is
    /// smaller (see [`EngineConfig::validate`]), so the budget the memory plan reserves for is
    /// the one the engine steps with.
    pub fn new(slots: usize, max_batch_tokens: usize, prefix_cache: bool, model_fingerprint: [u8; 32]) -> Self {
        EngineConfig { slots, max_batch_tokens: max_batch_tokens.max(slots), prefix_cache, model_fingerprint }
    }

    /// The rules an engine is built under (checked by [`Engine::new`]).
    pub fn validate(&self) -> Result<(), EngineError> {
        if self.slots == 0 {
            return Err(EngineError::Config("slots must be at least 1".into()));
        }
        // NOTE: with fewer tokens than slots, decodes could take the whole budget every step and
        // a sequence part way through its prompt would never finish it.
        if self.max_batch_tokens < self.slots {
            return Err(EngineError::Config(format!(
                "max_batch_tokens ({}) must be at least slots ({})",
                self.max_batch_tokens, self.slots
            )));
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub id: u64,
    pub prompt: Vec<u32>,
    /// Generated tokens at most (the stop token not counted).
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Tokens that end generation; they are not part of the output.
    pub stop_ids: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Completion {
    pub id: u64,
    pub prompt_tokens: usize,
    pub token_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    /// Prompt tokens whose K/V came from the prefix cache.
    pub cached_prompt_tokens: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A generated token, for streaming (`index` counts from 0 within the request).
    Token {
        id: u64,
        index: usize,
        token: u32,
    },
    Finished(Completion),
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EngineMetrics {
    pub requests_finished: u64,
    /// Prompt tokens of the admitted requests.
    pub prompt_tokens: u64,
    /// Prompt positions actually run through the model (after prefix reuse; re-runs after a
    /// preemption included).
    pub prompt_tokens_computed: u64,
    /// Prompt tokens served from the prefix cache.
    pub prompt_tokens_cached: u64,
    /// Generated positions run again after a preemption.
    pub recomputed_tokens: u64,
    pub generated_tokens: u64,
    pub steps: u64,
    pub slots: usize,
    /// Mean sequences per step.
    pub avg_running: f64,
    /// `avg_running / slots`.
    pub slot_occupancy: f64,
    pub kv_block_size: usize,
    pub kv_blocks_total: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_peak: usize,
    pub kv_evictions: u64,
    pub preemptions: u64,
    /// Times a request waited for another to compute the prefix they share.
    pub prefix_waits: u64,
    /// Steps that ran out of device memory and were retried with fewer sequences and tokens.
    pub oom_recoveries: u64,
    /// Constrained decoding: requests, masks, forced tokens, mask time.
    pub constraint: ConstraintMetrics,
    /// Every step against its bound (`step_cost`), when the engine was given the device's
    /// rates ([`Engine::with_step_bound`]).
    pub step_bound: Option<BoundTally>,
    /// The most device memory the backend held (GPU backends).
    pub peak_device_bytes: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("engine config: {0}")]
    Config(String),
    #[error("request {id}: {reason}")]
    InvalidRequest { id: u64, reason: String },
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    #[error("backend step failed: {0}")]
    Backend(#[from] BackendError),
    #[error("backend returned {got} logit rows for {want} sequences")]
    Logits { got: usize, want: usize },
}

/// What the engine keeps per request besides the scheduler's sequence.
struct RequestState {
    prompt_tokens: usize,
    /// Generated tokens at most: `max_tokens`, capped by the model's context.
    max_tokens: usize,
    sampler: Sampler,
    stop_ids: Vec<u32>,
    generated: Vec<u32>,
    /// The output grammar's state: masks the sampler, forces tokens, may end the sequence.
    constraint: Option<SeqConstraint>,
}

pub struct Engine<B: Backend> {
    backend: B,
    cfg: EngineConfig,
    sched: Scheduler,
    /// Hybrid models: which state slot each sequence and prefix snapshot holds.
    states: Option<StatePool>,
    requests: HashMap<SeqId, RequestState>,
    /// Events produced outside a step (a request with `max_tokens == 0`).
    pending: Vec<Event>,
    metrics: EngineMetrics,
    mask_times: MaskTimes,
    /// The device's rates, when steps are tallied against their bound.
    bound_rates: Option<BoundRates>,
}

impl<B: Backend> Engine<B> {
    pub fn new(backend: B, cfg: EngineConfig) -> Result<Self, EngineError> {
        cfg.validate()?;
        let (num_blocks, block_size) = (backend.num_blocks(), backend.block_size());
        if num_blocks == 0 || block_size == 0 {
            return Err(EngineError::Config(format!("backend has {num_blocks} KV blocks of {block_size} tokens")));
        }
        let mut kv = KvCache::new(num_blocks, block_size, cfg.model_fingerprint, cfg.prefix_cache);
        let states = backend.config().hybrid.is_some().then(|| StatePool::new(backend.state_slots(), cfg.slots));
        if states.is_some() && backend.state_slots().running == 0 {
            return Err(EngineError::Config(format!(
                "{}: the model keeps a recurrent state per sequence, but the backend holds no state slots",
                backend.describe()
            )));
        }
        if states.is_some() {
            // NOTE: a sequence of a hybrid model resumes after cached blocks only where the pool
            // holds a snapshot of its linear-attention state (see `kv::require_state_points`).
            kv.require_state_points();
        }
        let sched_cfg = SchedulerConfig {
            slots: cfg.slots,
            max_batch_tokens: cfg.max_batch_tokens,
            watermark_blocks: num_blocks / 100,
        };
        let metrics = EngineMetrics {
            slots: cfg.slots,
            kv_block_size: block_size,
            kv_blocks_total: num_blocks,
            ..Default::default()
        };
        Ok(Engine {
            backend,
            cfg,
            sched: Scheduler::new(sched_cfg, kv),
            states,
            requests: HashMap::new(),
            pending: Vec::new(),
            metrics,
            mask_times: MaskTimes::default(),
            bound_rates: None,
        })
    }

    /// Tallies every step against its bound at the device's `rates` (`EngineMetrics::step_bound`):
    /// the step's cost is read after it ran (the experts it routed to), its time is the wall
    /// time of the backend call, token choice included.
    pub fn with_step_bound(mut self, rates: BoundRates) -> Self {
        self.bound_rates = Some(rates);
        self.metrics.step_bound = Some(BoundTally::default());
        self
    }

    /// Gives the backend back (e.g. to build an engine with other settings over the same
    /// weights). Its KV contents are meaningless to a new engine, which starts with an empty pool.
    pub fn into_backend(self) -> B {
        self.backend
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }
    pub fn has_work(&self) -> bool {
        self.sched.has_work() || !self.pending.is_empty()
    }
    /// Requests queued or running.
    pub fn num_active(&self) -> usize {
        self.requests.len()
    }

    /// Queues a request. Refused (and nothing queued) when it could never run: empty prompt,
    /// unknown token ids, longer than the model's context, or larger than the whole KV cache.
    pub fn add_request(&mut self, req: Request) -> Result<(), EngineError> {
        self.add_constrained(req, None)
    }

    /// Queues a request whose output follows a grammar (`Grammar::start`): each token is sampled
    /// among the ones the grammar allows, tokens it forces are appended without sampling, and
    /// the grammar's end ends the request (`Stop`). Refused as `add_request` refuses.
    pub fn add_constrained(&mut self, req: Request, constraint: Option<SeqConstraint>) -> Result<(), EngineError> {
        let invalid = |reason: String| EngineError::InvalidRequest { id: req.id, reason };
        if self.requests.contains_key(&req.id) {
            return Err(invalid("a request with this id is already queued or running".into()));
        }
        if req.prompt.is_empty() {
            return Err(invalid("empty prompt".into()));
        }
        let model = self.backend.config();
        if let Some(t) = req.prompt.iter().find(|&&t| t as usize >= model.vocab_size) {
            return Err(invalid(format!("token id {t} is beyond the vocabulary ({})", model.vocab_size)));
        }
        let ctx = model.max_context;
        if req.prompt.len() >= ctx {
            return Err(invalid(format!("prompt of {} tokens does not fit the context of {ctx}", req.prompt.len())));
        }
        let max_tokens = req.max_tokens.min(ctx - req.prompt.len());
        // The last generated token is never run, so the sequence needs prompt + max_tokens - 1
        // positions; a request that needs more than the pool would preempt itself forever.
        let kv = self.sched.kv();
        let positions = req.prompt.len() + max_tokens.saturating_sub(1);
        let capacity = kv.num_blocks() * kv.block_size();
        if positions > capacity {
            return Err(invalid(format!(
                "needs {positions} KV positions (prompt + max_tokens), the cache holds {capacity}"
            )));
        }
        let longest = self.backend.max_seq_positions();
        if positions > longest {
            return Err(invalid(format!(
                "needs {positions} positions (prompt + max_tokens); the backend was sized for sequences of at most {longest}"
            )));
        }
        let prompt_tokens = req.prompt.len();
        let mut constraint = constraint;
        // Tokens the grammar forces before the model chooses any run with the prompt.
        let mut forced = constraint.as_mut().map(SeqConstraint::take_forced).unwrap_or_default();
        let cut = forced.len() > max_tokens;
        forced.truncate(max_tokens);
        self.metrics.constraint.constrained_requests += u64::from(constraint.is_some());
        self.metrics.constraint.forced_tokens += forced.len() as u64;
        let ended = !cut && constraint.as_ref().is_some_and(SeqConstraint::ended);
        if max_tokens == 0 || ended || forced.len() == max_tokens {
            for (index, &token) in forced.iter().enumerate() {
                self.pending.push(Event::Token { id: req.id, index, token });
            }
            self.metrics.generated_tokens += forced.len() as u64;
            self.pending.push(Event::Finished(Completion {
                id: req.id,
                prompt_tokens,
                token_ids: forced,
                finish_reason: if ended { FinishReason::Stop } else { FinishReason::Length },
                cached_prompt_tokens: 0,
            }));
            self.metrics.requests_finished += 1;
            self.metrics.prompt_tokens += prompt_tokens as u64;
            return Ok(());
        }
        let mut tokens = req.prompt;
        tokens.extend_from_slice(&forced);
        self.sched.add_continued(req.id, tokens, prompt_tokens)?;
        for (index, &token) in forced.iter().enumerate() {
            self.pending.push(Event::Token { id: req.id, index, token });
        }
        self.metrics.generated_tokens += forced.len() as u64;
        self.metrics.prompt_tokens += prompt_tokens as u64;
        self.requests.insert(
            req.id,
            RequestState {
                prompt_tokens,
                max_tokens,
                sampler: Sampler::new(req.sampling),
                stop_ids: req.stop_ids,
                generated: forced,
                constraint,
            },
        );
        Ok(())
    }

    /// Runs one step: schedule, run the backend, sample, and retire finished requests (their
    /// slots are free for the next step). Returns the generated tokens and finished requests.
    /// When the backend fails, nothing counts as computed: calling `step` again retries.
    pub fn step(&mut self) -> Result<Vec<Event>, EngineError> {
        let mut events = std::mem::take(&mut self.pending);
        let mut plan = self.sched.schedule()?;
        // A preempted sequence restarts from position 0: its recurrent state (hybrid models) is
        // stale, and the planned state pool holds only the sequences that run.
        for id in self.sched.take_preempted() {
            if let Some(states) = &mut self.states {
                states.release(id);
            }
        }
        if plan.chunks.is_empty() {
            return Ok(events);
        }
        let t0 = Instant::now();
        let tokens = match self.plan_states(&mut plan).and_then(|()| self.next_tokens(&plan)) {
            // NOTE: out of memory inside a step: fewer sequences and tokens, then the caller's next
            // `step` retries (the scheduler counts nothing of a failed step as computed).
            Err(EngineError::Backend(e)) if e.is_out_of_memory() => {
                if !self.sched.shrink_after_oom()? {
                    return Err(EngineError::Backend(e));
                }
                self.metrics.oom_recoveries += 1;
                let c = self.sched.config();
                eprintln!(
                    "{e}; retrying with at most {} sequences and {} tokens per step",
                    c.slots, c.max_batch_tokens
                );
                return Ok(events);
            }
            r => r?,
        };
        if let (Some(rates), Some(tally)) = (self.bound_rates, self.metrics.step_bound.as_mut()) {
            tally.add(&StepCost::of_plan(&self.backend, &plan), t0.elapsed().as_secs_f64(), rates);
        }
        self.postprocess(&plan, tokens, &mut events)?;
        Ok(events)
    }

    /// Runs the plan on the backend and picks the next token of every chunk that wants one, in
    /// plan order (`None` where a chunk's request is unknown). When every such request is
    /// greedy the backend chooses (on the device where it can: no logits download), under the
    /// masks of the constrained ones; else each request's sampler draws from its logits, in parallel (64 x 152k
    /// logits is ~10 ms on one core; each request owns its sampler, so the draws do not depend
    /// on the threads), among the tokens its grammar allows.
    fn next_tokens(&mut self, plan: &StepPlan) -> Result<Vec<Option<u32>>, EngineError> {
        let want = plan.chunks.iter().filter(|c| c.want_logits).count();
        let rows = || plan.chunks.iter().filter(|c| c.want_logits).filter_map(|c| self.requests.get(&c.seq));
        let greedy = rows().count() == want && rows().all(|r| r.sampler.is_greedy());
        let constrained = rows().any(|r| r.constraint.is_some());
        if greedy && !constrained {
            let ids = self.backend.step_greedy(plan)?;
            if ids.len() != want {
                return Err(EngineError::Logits { got: ids.len(), want });
            }
            return Ok(ids.into_iter().map(Some).collect());
        }
        let rows: HashMap<SeqId, usize> =
            plan.chunks.iter().filter(|c| c.want_logits).enumerate().map(|(i, c)| (c.seq, i)).collect();
        if greedy {
            return self.step_greedy_masked(plan, &rows, want);
        }
        let logits = if constrained { self.step_with_masks(plan, &rows)? } else { self.backend.step(plan)? };
        if logits.len() != want {
            return Err(EngineError::Logits { got: logits.len(), want });
        }
        let mut tokens = vec![None; want];
        use rayon::prelude::*;
        let mut work: Vec<(usize, &mut RequestState)> =
            self.requests.iter_mut().filter_map(|(id, r)| rows.get(id).map(|&i| (i, r))).collect();
        let picked: Vec<(usize, u32)> = work
            .par_iter_mut()
            .map(|(i, r)| (*i, r.sampler.sample_masked(&logits[*i], r.constraint.as_ref().and_then(|c| c.mask()))))
            .collect();
        for (i, t) in picked {
            tokens[i] = Some(t);
        }
        Ok(tokens)
    }

    /// A greedy step with constrained requests: the backend runs the step while the masks are
    /// computed (in parallel over the requests) and written into its mask rows, then picks each
    /// row's masked arg-max: on the device where it can (the mask bits go up, no logits come
    /// down). Unconstrained rows of a mixed step get no mask: the plain arg-max.
    fn step_greedy_masked(
        &mut self,
        plan: &StepPlan,
        rows: &HashMap<SeqId, usize>,
        want: usize,
    ) -> Result<Vec<Option<u32>>, EngineError> {
        let mut cons: Vec<(usize, &mut SeqConstraint)> =
            self.requests.iter_mut().filter_map(|(id, r)| Some((*rows.get(id)?, r.constraint.as_mut()?))).collect();
        let mut times: Vec<Duration> = Vec::new();
        let mut fill = |m: &mut crate::backend::masks::MaskRows<'_>| {
            times = fill_masks(&mut cons, m)?;
            Ok(())
        };
        let got = self.backend.step_greedy_masked(plan, &mut fill)?;
        self.metrics.constraint.mask_wait_seconds += got.mask_wait.as_secs_f64();
        times.iter().for_each(|&t| self.mask_times.record(t));
        if got.ids.len() != want {
            return Err(EngineError::Logits { got: got.ids.len(), want });
        }
        Ok(got.ids.into_iter().map(Some).collect())
    }

    /// Runs the backend step while worker threads compute the masks of the constrained requests
    /// in it (the step does not wait for them: they are needed only to sample from its logits).
    /// NOTE: a mask depends only on the tokens committed so far, which include the token this
    /// step runs, so it can be computed before the step's logits exist.
    fn step_with_masks(&mut self, plan: &StepPlan, rows: &HashMap<SeqId, usize>) -> Result<Vec<Vec<f32>>, EngineError> {
        use rayon::prelude::*;
        let mut cons: Vec<&mut SeqConstraint> = self
            .requests
            .iter_mut()
            .filter(|(id, _)| rows.contains_key(id))
            .filter_map(|(_, r)| r.constraint.as_mut())
            .collect();
        let mut times: Vec<Duration> = Vec::new();
        let (cons_ref, times_ref, backend) = (&mut cons, &mut times, &mut self.backend);
        let (logits, step_done) = rayon::in_place_scope(|s| {
            s.spawn(move |_| *times_ref = cons_ref.par_iter_mut().map(|c| c.compute_mask()).collect());
            let logits = backend.step(plan);
            (logits, Instant::now())
        });
        self.metrics.constraint.mask_wait_seconds += step_done.elapsed().as_secs_f64();
        times.iter().for_each(|&t| self.mask_times.record(t));
        Ok(logits?)
    }

    /// Advances the grammars of the constrained requests over their sampled tokens, in
    /// parallel; returns the tokens each grammar forces next.
    fn commit_constrained(&mut self, plan: &StepPlan, tokens: &[Option<u32>]) -> HashMap<SeqId, Vec<u32>> {
        use rayon::prelude::*;
        let picked: HashMap<SeqId, u32> = plan
            .chunks
            .iter()
            .filter(|c| c.want_logits)
            .zip(tokens)
            .filter_map(|(c, t)| t.map(|t| (c.seq, t)))
            .collect();
        let t = Instant::now();
        let mut work: Vec<(SeqId, u32, &mut SeqConstraint)> = self
            .requests
            .iter_mut()
            .filter_map(|(id, r)| {
                let tok = *picked.get(id)?;
                let c = r.constraint.as_mut()?;
                (!r.stop_ids.contains(&tok)).then_some((*id, tok, c))
            })
            .collect();
        if work.is_empty() {
            return HashMap::new();
        }
        let forced = work.par_iter_mut().map(|(id, tok, c)| (*id, c.commit(*tok))).collect();
        self.metrics.constraint.commit_seconds += t.elapsed().as_secs_f64();
        forced
    }

    /// Hybrid models: the step's recurrent-state slots and orders (`state_pool`): sequences
    /// admitted on a prefix hit continue from the snapshot taken after that prefix; sequences
    /// that reach the end of a shared prefix are snapshotted after the step (the least recently
    /// used snapshot goes first when the pool is full: an evicted prefix is no longer a state
    /// point, so the next prompt that shares it computes it again).
    fn plan_states(&mut self, plan: &mut StepPlan) -> Result<(), EngineError> {
        let Some(states) = &mut self.states else { return Ok(()) };
        let mut err = None;
        for (seq, hash, pos) in self.sched.take_restores() {
            // NOTE: every restore is recorded before an error ends the step.
            if let Err(e) = states.restore(seq, hash, pos) {
                err = err.or(Some(e));
            }
        }
        if let Some(e) = err {
            return Err(state_error(e));
        }
        let sched = &self.sched;
        let (state, evicted) = states.plan(&plan.chunks, |c| sched.snapshot_after(c)).map_err(state_error)?;
        for old in evicted {
            self.sched.set_state_point(old, false);
        }
        plan.state = state;
        Ok(())
    }

    fn postprocess(
        &mut self,
        plan: &StepPlan,
        tokens: Vec<Option<u32>>,
        events: &mut Vec<Event>,
    ) -> Result<(), EngineError> {
        self.sched.on_step_done(plan)?;
        for hash in self.states.as_mut().map(|s| s.step_done(plan)).unwrap_or_default() {
            self.sched.set_state_point(hash, true);
        }
        let mut forced = self.commit_constrained(plan, &tokens);
        for (chunk, token) in plan.chunks.iter().filter(|c| c.want_logits).zip(tokens) {
            let id = chunk.seq;
            let r = self.requests.get_mut(&id).ok_or(SchedulerError::NotRunning(id))?;
            let token = token.ok_or(SchedulerError::NotRunning(id))?;
            let mut extra = forced.remove(&id).unwrap_or_default();
            let finish = if r.stop_ids.contains(&token) {
                Some(FinishReason::Stop)
            } else {
                r.generated.push(token);
                events.push(Event::Token { id, index: r.generated.len() - 1, token });
                let room = r.max_tokens.saturating_sub(r.generated.len());
                let cut = extra.len() > room;
                extra.truncate(room);
                for &t in &extra {
                    r.generated.push(t);
                    events.push(Event::Token { id, index: r.generated.len() - 1, token: t });
                }
                self.metrics.generated_tokens += 1 + extra.len() as u64;
                self.metrics.constraint.forced_tokens += extra.len() as u64;
                let grammar = r.constraint.as_ref().map_or((false, false), |c| (!cut && c.ended(), c.failed()));
                self.metrics.constraint.grammar_errors += u64::from(grammar.1);
                if grammar.0 || grammar.1 {
                    Some(FinishReason::Stop)
                } else {
                    (r.generated.len() >= r.max_tokens).then_some(FinishReason::Length)
                }
            };
            match finish {
                Some(reason) => {
                    let seq = self.sched.finish(id)?;
                    if let Some(states) = &mut self.states {
                        states.release(id);
                    }
                    if let Some(r) = self.requests.remove(&id) {
                        self.metrics.requests_finished += 1;
                        events.push(Event::Finished(Completion {
                            id,
                            prompt_tokens: r.prompt_tokens,
                            token_ids: r.generated,
                            finish_reason: reason,
                            cached_prompt_tokens: seq.cached_tokens,
                        }));
                    }
                }
                None => {
                    for t in std::iter::once(token).chain(extra) {
                        self.sched.append_token(id, t)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Steps until every queued request has finished; completions in finishing order.
    pub fn run_to_completion(&mut self) -> Result<Vec<Completion>, EngineError> {
        let mut done = Vec::new();
        while self.has_work() {
            for e in self.step()? {
                if let Event::Finished(c) = e {
                    done.push(c);
                }
            }
        }
        Ok(done)
    }

    pub fn metrics(&self) -> EngineMetrics {
        let st = self.sched.stats();
        let kv = self.sched.kv();
        let avg_running = if st.steps == 0 { 0.0 } else { st.seq_steps as f64 / st.steps as f64 };
        let mut constraint = self.metrics.constraint.clone();
        constraint.set_mask_times(&self.mask_times);
        EngineMetrics {
            prompt_tokens_computed: st.prompt_tokens_computed,
            prompt_tokens_cached: st.cached_tokens,
            recomputed_tokens: st.recomputed_tokens,
            steps: st.steps,
            avg_running,
            slot_occupancy: avg_running / self.cfg.slots as f64,
            kv_blocks_used: kv.num_used(),
            kv_blocks_peak: kv.peak_used(),
            kv_evictions: kv.evictions(),
            preemptions: st.preemptions,
            prefix_waits: st.prefix_waits,
            constraint,
            peak_device_bytes: self.backend.peak_memory_bytes(),
            ..self.metrics.clone()
        }
    }
}

/// A state-pool refusal as the engine reports it: a pool of live states smaller than the
/// sequences running is out of device memory (the engine then runs fewer at once, as when the
/// backend runs out); a missing snapshot is a plan the backend cannot run.
fn state_error(e: StateError) -> EngineError {
    let what = e.to_string();
    EngineError::Backend(match e {
        StateError::Full { .. } => BackendError::OutOfMemory { what, source: None },
        StateError::NoSnapshot { .. } => BackendError::Plan(what),
    })
}
