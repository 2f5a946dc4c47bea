//! N rank engines of one tensor-parallel model, each built and run on its own thread (a CUDA
//! backend's state is not `Send`), driven in lockstep: every call goes to all ranks, which meet
//! in their all-reduces during a step; rank 0's answer is the group's. The GPU ranks
//! (`cuda::tp::group`) and the CPU ranks (`cpu::tensor_parallel`) both run on it, so its
//! threads and channels are tested without a GPU (tests/tp.rs).
//!
//! No hang on failure: a rank that fails to build (an error or a panic) makes the group's
//! construction fail, naming it, before any rank joins a collective; a rank that stops answers
//! with an error, not silence.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Barrier};

use crate::backend::{Backend, BackendError, StateSlots};
use crate::engine::plan::StepPlan;
use crate::model::config::ModelConfig;

/// What a rank engine does in a group beyond [`Backend`].
pub trait RankEngine: Backend {
    /// Rank 0: the step's logits.
    fn rank_logits(&mut self, plan: &StepPlan) -> Result<Vec<Vec<f32>>, BackendError> {
        self.step(plan)
    }
    /// Rank 0: the step's greedy choices.
    fn rank_greedy(&mut self, plan: &StepPlan) -> Result<Vec<u32>, BackendError> {
        self.step_greedy(plan)
    }
    /// Ranks above 0: the step's layers (they meet rank 0 in the all-reduces), no logits.
    fn rank_step(&mut self, plan: &StepPlan) -> Result<(), BackendError>;
    /// After this rank failed a job: releases the ranks that wait for it in a host-side
    /// all-reduce (they then fail the step too, instead of waiting forever).
    fn abort_collective(&mut self) {}
}

enum Job {
    Step(Arc<StepPlan>, bool),
    Prepare,
    Peak,
}

enum Out {
    Logits(Vec<Vec<f32>>),
    Ids(Vec<u32>),
    Bytes(Option<u64>),
    Unit,
}

/// What a rank tells the group once its engine is built.
struct Info {
    describe: String,
    block_size: usize,
    num_blocks: usize,
    prefill_chunk: usize,
    max_seq_positions: usize,
    decode_bytes: u64,
    kv_bytes: u64,
    state_slots: StateSlots,
}

struct Worker {
    jobs: Option<Sender<Job>>,
    replies: Receiver<Result<Out, BackendError>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// N rank engines that together run one model.
pub struct RankGroup {
    cfg: ModelConfig,
    workers: Vec<Worker>,
    info: Vec<Info>,
    /// Bytes of the (replicated) output head, which only rank 0 reads.
    head_bytes: u64,
    /// How the ranks sum their outputs (`NCCL`, `host`), for `describe`.
    reduction: String,
}

/// The text of a panic's payload.
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

impl RankGroup {
    /// Starts `n` rank threads. Each calls `build(rank)`; once all have built, each calls
    /// `join(rank, engine)` (where ranks join a collective that blocks until all join); only
    /// then does the group exist. `cfg`: the whole model's configuration; `head_bytes`: the
    /// replicated output head's size.
    pub fn start<B, F, J>(
        cfg: &ModelConfig,
        n: usize,
        head_bytes: u64,
        reduction: &str,
        build: F,
        join: J,
    ) -> Result<Self, BackendError>
    where
        B: RankEngine + 'static,
        F: Fn(usize) -> Result<B, BackendError> + Send + Sync + 'static,
        J: Fn(usize, &mut B) -> Result<(), BackendError> + Send + Sync + 'static,
    {
        let steps = Arc::new((build, join));
        let built = Arc::new(Barrier::new(n));
        let failed = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = channel::<(usize, Result<Info, BackendError>)>();
        let mut workers = Vec::with_capacity(n);
        for rank in 0..n {
            let (jobs, job_rx) = channel::<Job>();
            let (reply_tx, replies) = channel();
            let (steps, built, failed, ready) = (steps.clone(), built.clone(), failed.clone(), ready_tx.clone());
            let thread = std::thread::Builder::new()
                .name(format!("tp-rank-{rank}"))
                .spawn(move || {
                    // A panic while building is this rank's failure, not a hang of the others.
                    let b = catch_unwind(AssertUnwindSafe(|| (steps.0)(rank))).unwrap_or_else(|p| {
                        Err(BackendError::Device(format!("panicked while loading: {}", panic_text(&*p)).into()))
                    });
                    if b.is_err() {
                        failed.store(true, Ordering::SeqCst);
                    }
                    built.wait();
                    let b = b.and_then(|mut b| {
                        if failed.load(Ordering::SeqCst) {
                            return Err(BackendError::Plan("another rank failed to load".into()));
                        }
                        (steps.1)(rank, &mut b).map(|_| b)
                    });
                    let b = match b {
                        Err(e) => {
                            let _ = ready.send((rank, Err(e)));
                            return;
                        }
                        Ok(b) => b,
                    };
                    let info = Info {
                        describe: b.describe(),
                        block_size: b.block_size(),
                        num_blocks: b.num_blocks(),
                        prefill_chunk: b.prefill_chunk(),
                        max_seq_positions: b.max_seq_positions(),
                        decode_bytes: b.decode_weight_bytes(),
                        kv_bytes: b.kv_bytes_per_position(),
                        state_slots: b.state_slots(),
                    };
                    let _ = ready.send((rank, Ok(info)));
                    // NOTE: the sender must go before serving: the group counts replies, and a
                    // live sender would keep a waiting receiver open forever.
                    drop(ready);
                    serve(b, rank, job_rx, reply_tx);
                })
                .map_err(|e| BackendError::Device(format!("starting tensor-parallel rank {rank}: {e}").into()))?;
            workers.push(Worker { jobs: Some(jobs), replies, thread: Some(thread) });
        }
        drop(ready_tx);
        let mut info: Vec<Option<Info>> = (0..n).map(|_| None).collect();
        let mut first_err = None;
        for _ in 0..n {
            match ready_rx.recv() {
                Ok((rank, Ok(i))) => info[rank] = Some(i),
                Ok((rank, Err(e))) => {
                    // The rank whose own build failed comes first; "another rank failed" after.
                    let own = !matches!(&e, BackendError::Plan(m) if m == "another rank failed to load");
                    if first_err.is_none() || (own && first_err.as_ref().is_some_and(|(_, o, _)| !o)) {
                        first_err = Some((rank, own, e));
                    }
                }
                Err(_) => break, // every rank thread has ended
            }
        }
        let mut group =
            RankGroup { cfg: cfg.clone(), workers, info: Vec::new(), head_bytes, reduction: reduction.to_string() };
        if let Some((rank, _, e)) = first_err {
            drop(group); // stops the ranks that did load
            return Err(BackendError::Device(format!("tensor-parallel rank {rank}: {e}").into()));
        }
        match info.into_iter().collect::<Option<Vec<_>>>() {
            Some(i) => group.info = i,
            None => return Err(BackendError::Device("a tensor-parallel rank ended while loading".into())),
        }
        Ok(group)
    }

    pub fn ranks(&self) -> usize {
        self.workers.len()
    }

    /// The same job to every rank; every rank's reply, in rank order (the first error wins).
    fn all(&self, job: impl Fn() -> Job) -> Result<Vec<Out>, BackendError> {
        let stopped = |r: usize| BackendError::Device(format!("tensor-parallel rank {r} has stopped").into());
        let mut sent = vec![false; self.workers.len()];
        for (r, w) in self.workers.iter().enumerate() {
            sent[r] = w.jobs.as_ref().is_some_and(|j| j.send(job()).is_ok());
        }
        let mut outs = Vec::with_capacity(self.workers.len());
        let mut err = None;
        for (r, w) in self.workers.iter().enumerate() {
            if !sent[r] {
                err = err.or(Some(stopped(r)));
                continue;
            }
            match w.replies.recv() {
                Ok(Ok(o)) => outs.push(o),
                Ok(Err(e)) => err = err.or(Some(e)),
                Err(_) => err = err.or(Some(stopped(r))),
            }
        }
        err.map_or(Ok(outs), Err)
    }

    fn step_with(&mut self, plan: &StepPlan, greedy: bool) -> Result<Out, BackendError> {
        let plan = Arc::new(plan.clone());
        Ok(self.all(|| Job::Step(plan.clone(), greedy))?.swap_remove(0))
    }
}

/// A rank's loop: runs the group's jobs on its engine until the group is dropped.
fn serve<B: RankEngine>(mut b: B, rank: usize, jobs: Receiver<Job>, replies: Sender<Result<Out, BackendError>>) {
    for job in jobs {
        let out = catch_unwind(AssertUnwindSafe(|| match job {
            Job::Step(plan, greedy) => match (rank, greedy) {
                (0, false) => b.rank_logits(&plan).map(Out::Logits),
                (0, true) => b.rank_greedy(&plan).map(Out::Ids),
                _ => b.rank_step(&plan).map(|_| Out::Unit),
            },
            Job::Prepare => b.prepare().map(|_| Out::Unit),
            Job::Peak => Ok(Out::Bytes(b.peak_memory_bytes())),
        }));
        let (out, panicked) = match out {
            Ok(o) => (o, false),
            Err(p) => (Err(BackendError::Device(format!("rank {rank} panicked: {}", panic_text(&*p)).into())), true),
        };
        if out.is_err() {
            b.abort_collective();
        }
        if replies.send(out).is_err() || panicked {
            return; // the group is gone, or this engine's state can no longer be trusted
        }
    }
}

impl Drop for RankGroup {
    fn drop(&mut self) {
        // Closing the job channels ends the ranks' loops; each engine is dropped on its thread.
        self.workers.iter_mut().for_each(|w| drop(w.jobs.take()));
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Backend for RankGroup {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    fn block_size(&self) -> usize {
        self.info[0].block_size
    }
    fn num_blocks(&self) -> usize {
        self.info[0].num_blocks
    }
    fn step(&mut self, plan: &StepPlan) -> Result<Vec<Vec<f32>>, BackendError> {
        match self.step_with(plan, false)? {
            Out::Logits(l) => Ok(l),
            _ => Err(BackendError::Plan("tensor parallel: rank 0 answered a step without logits".into())),
        }
    }
    fn step_greedy(&mut self, plan: &StepPlan) -> Result<Vec<u32>, BackendError> {
        match self.step_with(plan, true)? {
            Out::Ids(i) => Ok(i),
            _ => Err(BackendError::Plan("tensor parallel: rank 0 answered a greedy step without ids".into())),
        }
    }
    /// Rank 0's slots: every rank holds the same slots (each the state of its own heads) and
    /// runs the plan's state orders on them.
    fn state_slots(&self) -> StateSlots {
        self.info[0].state_slots
    }
    fn prepare(&mut self) -> Result<(), BackendError> {
        self.all(|| Job::Prepare).map(|_| ())
    }
    fn prefill_chunk(&self) -> usize {
        self.info.iter().map(|i| i.prefill_chunk).min().unwrap_or(1)
    }
    fn max_seq_positions(&self) -> usize {
        self.info.iter().map(|i| i.max_seq_positions).min().unwrap_or(usize::MAX)
    }
    fn describe(&self) -> String {
        let ranks: Vec<&str> = self.info.iter().map(|i| i.describe.as_str()).collect();
        format!("{} x tensor parallel ({} all-reduce): {}", self.info.len(), self.reduction, ranks.join(" | "))
    }
    /// Every rank reads its shard and one embedding row; only rank 0 reads the output head.
    fn decode_weight_bytes(&self) -> u64 {
        let all: u64 = self.info.iter().map(|i| i.decode_bytes).sum();
        all.saturating_sub((self.info.len() as u64 - 1) * self.head_bytes)
    }
    fn kv_bytes_per_position(&self) -> u64 {
        self.info.iter().map(|i| i.kv_bytes).sum()
    }
    /// The most any one rank's device holds (ranks sharing a GPU each see all of its use).
    fn peak_memory_bytes(&self) -> Option<u64> {
        let outs = self.all(|| Job::Peak).ok()?;
        outs.into_iter().filter_map(|o| if let Out::Bytes(b) = o { b } else { None }).max()
    }
}
