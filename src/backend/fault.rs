//! Test-only fault injection: a backend wrapper that makes a chosen step run out of device
//! memory, so that the engine's recovery (preempt, smaller batch, retry) can be tested on the
//! CPU in CI and by hand on a GPU with the real binary.
//!
//! `DUSTOFF_INJECT_OOM=STEP[,SEQS]` (read when the backend is made): the first step numbered
//! STEP or later (1-based, over all steps of this backend) that has at least SEQS sequences
//! (default 1) fails with [`BackendError::OutOfMemory`], and so does every later step with at
//! least as many sequences as that one had: the memory limit was crossed at that batch size, as
//! on a real device. Unset, the backend is returned unwrapped.

use super::{Backend, BackendError};
use crate::engine::plan::StepPlan;
use crate::model::config::ModelConfig;

/// The environment variable that turns the injector on.
pub const INJECT_OOM_ENV: &str = "DUSTOFF_INJECT_OOM";

pub struct FaultInjector<B: Backend> {
    inner: B,
    /// The first step that may fail (1-based)...
    at_step: u64,
    /// ...when it has at least this many sequences.
    min_seqs: usize,
    steps: u64,
    /// Sequences in the step that failed first: steps with this many or more fail too.
    limit: Option<usize>,
    /// Steps failed so far.
    pub injected: u64,
}

impl<B: Backend> FaultInjector<B> {
    pub fn new(inner: B, at_step: u64, min_seqs: usize) -> Self {
        FaultInjector { inner, at_step: at_step.max(1), min_seqs: min_seqs.max(1), steps: 0, limit: None, injected: 0 }
    }

    /// Whether this step fails; counts it.
    fn fails(&mut self, plan: &StepPlan) -> Result<(), BackendError> {
        self.steps += 1;
        let n = plan.chunks.len();
        if self.limit.is_none() && self.steps >= self.at_step && n >= self.min_seqs {
            self.limit = Some(n);
        }
        match self.limit {
            Some(limit) if n >= limit => {
                self.injected += 1;
                Err(BackendError::OutOfMemory {
                    what: format!(
                        "step {} with {n} sequences ({} tokens), injected by {INJECT_OOM_ENV}",
                        self.steps,
                        plan.n_tokens()
                    ),
                    source: None,
                })
            }
            _ => Ok(()),
        }
    }
}

impl FaultInjector<Box<dyn Backend>> {
    /// Wraps `b` when `DUSTOFF_INJECT_OOM` is set; an unreadable value is an error.
    pub fn wrap_from_env(b: Box<dyn Backend>) -> Result<Box<dyn Backend>, BackendError> {
        match crate::sys::env::get(INJECT_OOM_ENV) {
            None => Ok(b),
            Some(v) => {
                let bad = || BackendError::Plan(format!("{INJECT_OOM_ENV}={v}: give STEP or STEP,SEQS (numbers)"));
                let (step, seqs) = v.split_once(',').unwrap_or((&v, "1"));
                let step = step.trim().parse::<u64>().map_err(|_| bad())?;
                let seqs = seqs.trim().parse::<usize>().map_err(|_| bad())?;
                eprintln!(
                    "fault injection: the first step from step {step} with {seqs}+ sequences runs out of memory, and every later one as large"
                );
                Ok(Box::new(FaultInjector::new(b, step, seqs)))
            }
        }
    }
}

impl<B: Backend> Backend for FaultInjector<B> {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }
    fn step(&mut self, plan: &StepPlan) -> Result<Vec<Vec<f32>>, BackendError> {
        self.fails(plan)?;
        self.inner.step(plan)
    }
    fn step_greedy(&mut self, plan: &StepPlan) -> Result<Vec<u32>, BackendError> {
        self.fails(plan)?;
        self.inner.step_greedy(plan)
    }
    fn step_greedy_masked(
        &mut self,
        plan: &StepPlan,
        fill: &mut super::masks::FillMasks<'_>,
    ) -> Result<super::masks::MaskedGreedy, BackendError> {
        self.fails(plan)?;
        self.inner.step_greedy_masked(plan, fill)
    }
    fn prepare(&mut self) -> Result<(), BackendError> {
        self.inner.prepare()
    }
    fn describe(&self) -> String {
        format!("{} (with {INJECT_OOM_ENV})", self.inner.describe())
    }
    fn max_seq_positions(&self) -> usize {
        self.inner.max_seq_positions()
    }
    fn decode_weight_bytes(&self) -> u64 {
        self.inner.decode_weight_bytes()
    }
    fn kv_bytes_per_position(&self) -> u64 {
        self.inner.kv_bytes_per_position()
    }
    fn peak_memory_bytes(&self) -> Option<u64> {
        self.inner.peak_memory_bytes()
    }
    fn last_step_weight_bytes(&self, n_tok: usize) -> Option<u64> {
        self.inner.last_step_weight_bytes(n_tok)
    }
    fn tensor_flops(&self) -> Option<f64> {
        self.inner.tensor_flops()
    }
    fn measure_copy_bandwidth(&mut self) -> Option<f64> {
        self.inner.measure_copy_bandwidth()
    }
    // Hybrid models: the state slots (without it the injector would hide them).
    fn state_slots(&self) -> super::StateSlots {
        self.inner.state_slots()
    }
}
