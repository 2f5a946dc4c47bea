//! Tensor parallel on GPUs (`--tensor-parallel N`): N rank engines, each a [`CudaBackend`]
//! holding its shard (`model::tensor_parallel`: 1/N of the heads, of the KV cache and of the FFN
//! columns; embedding, norms and head replicated), each on its own thread (CUDA state is not
//! `Send`), driven in lockstep: every step goes to all ranks, which meet in an all-reduce after
//! each block's two output projections (`tp_rank.rs`); rank 0 computes the logits.
//!
//! The all-reduce is NCCL when the ranks sit on distinct GPUs (and for one rank, a real NCCL call
//! that sums one buffer), host-staged when ranks share a GPU (NCCL refuses that), or as
//! `DUSTOFF_TP_ALLREDUCE` says (`nccl`, `host`). Decode steps are not replayed as CUDA graphs
//! under tensor parallel (a host-staged reduction cannot be captured).
//!
//! For N > 1 the GPU path splits dense models only: the mixture-of-experts and hybrid layers
//! add their outputs into the residual in several fused launches, which the rank-0-adds rule
//! does not cover yet (the CPU backend splits MoE models; see [`gpu_refusal`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Barrier};

use super::model::{CudaBackend, CudaOptions};
use super::nccl::{unique_id, NcclComm};
use super::tp_rank::{CudaRank, Reduce};
use super::CudaError;
use crate::backend::allreduce::HostAllReduce;
use crate::backend::{Backend, BackendError};
use crate::engine::plan::{SeqId, StepPlan};
use crate::model::config::ModelConfig;
use crate::model::tensor_parallel::{shard, Rank};
use crate::model::weights::ModelWeights;

/// `nccl`, `host` or `auto` (the default: NCCL for ranks on distinct GPUs, host-staged for
/// ranks sharing one, and for one rank NCCL when it loads, else host).
pub const ALLREDUCE_ENV: &str = "DUSTOFF_TP_ALLREDUCE";

/// Why the GPU path cannot split this model `n` ways (beyond `tensor_parallel::check`), if so.
pub fn gpu_refusal(cfg: &ModelConfig, n: usize) -> Option<String> {
    let what = if cfg.hybrid.is_some() {
        "hybrid (linear-attention)"
    } else if cfg.moe.is_some() {
        "mixture-of-experts"
    } else {
        return None;
    };
    (n > 1).then(|| {
        format!(
            "--tensor-parallel {n} on a GPU: {what} models ({}) are not split on the GPU yet (their fused expert \
             and mixer launches add into the residual in place); use --tensor-parallel 1, or --device cpu, which \
             splits mixture-of-experts models",
            cfg.arch.name()
        )
    })
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Nccl,
    Host,
}

/// The reduction `ordinals` (one GPU per rank) get, as [`ALLREDUCE_ENV`] and the machine allow.
fn choose(ordinals: &[usize], setting: Option<&str>) -> Result<Kind, CudaError> {
    let shared = (1..ordinals.len()).any(|i| ordinals[..i].contains(&ordinals[i]));
    match setting.map(str::trim) {
        Some("host") => Ok(Kind::Host),
        Some("nccl") if shared => Err(CudaError::Nccl(format!(
            "{ALLREDUCE_ENV}=nccl, but ranks share a GPU ({ordinals:?}): NCCL needs one GPU per rank; use host"
        ))),
        Some("nccl") => super::nccl::nccl_version().map(|_| Kind::Nccl),
        None | Some("") | Some("auto") => match (shared, ordinals.len()) {
            (true, _) => Ok(Kind::Host),
            (false, 1) => Ok(if super::nccl::nccl_version().is_ok() { Kind::Nccl } else { Kind::Host }),
            (false, _) => super::nccl::nccl_version().map(|_| Kind::Nccl),
        },
        Some(v) => Err(CudaError::Nccl(format!("{ALLREDUCE_ENV}={v}: give nccl, host or auto"))),
    }
}

enum Job {
    Step(Arc<StepPlan>, bool),
    Release(SeqId),
    Save(SeqId, [u8; 32]),
    Restore(SeqId, [u8; 32], usize),
    Drop([u8; 32]),
    Prepare,
    Peak,
}

enum Out {
    Logits(Vec<Vec<f32>>),
    Ids(Vec<u32>),
    Flag(bool),
    Bytes(Option<u64>),
    Unit,
}

/// What a rank tells the group once its engine is built.
struct Info {
    describe: String,
    block_size: usize,
    num_blocks: usize,
    prefill_chunk: usize,
    decode_bytes: u64,
    kv_bytes: u64,
    snapshots: usize,
}

struct Worker {
    jobs: Sender<Job>,
    replies: Receiver<Result<Out, BackendError>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// N GPU rank engines that together run one model.
pub struct TpCudaBackend {
    cfg: ModelConfig,
    workers: Vec<Worker>,
    info: Vec<Info>,
    kind: Kind,
    /// Bytes of the (replicated) output head, which only rank 0 reads.
    head_bytes: u64,
}

impl CudaBackend {
    /// A rank other than 0: the layers only (no head, no logits to read back).
    fn rank_step(&mut self, plan: &StepPlan) -> Result<(), BackendError> {
        let f = self.flatten(plan)?;
        if f.n_tok > 0 {
            let mut w = std::mem::take(&mut self.work);
            let r = self.run_step(&mut w, &f);
            self.work = w;
            r?;
        }
        if let Some(h) = &mut self.hybrid {
            h.end_step(plan);
        }
        Ok(())
    }
}

impl TpCudaBackend {
    /// Places rank `r`'s shard on GPU `ordinals[r]` (repeats allowed: ranks sharing a GPU),
    /// `opts` as for one GPU (each rank plans its own memory: weights / N plus the replicated
    /// parts, KV / N, its own workspace).
    pub fn new(
        cfg: &ModelConfig,
        w: &ModelWeights,
        ordinals: &[usize],
        opts: &CudaOptions,
    ) -> Result<Self, BackendError> {
        Self::with_reduction(cfg, w, ordinals, opts, crate::sys::env::get(ALLREDUCE_ENV).as_deref())
    }

    /// As [`TpCudaBackend::new`], the reduction given as [`ALLREDUCE_ENV`] takes it (`nccl`,
    /// `host`, `auto`; `None`: auto).
    pub fn with_reduction(
        cfg: &ModelConfig,
        w: &ModelWeights,
        ordinals: &[usize],
        opts: &CudaOptions,
        reduction: Option<&str>,
    ) -> Result<Self, BackendError> {
        let n = ordinals.len();
        crate::model::tensor_parallel::check(cfg, n).map_err(|e| BackendError::Plan(e.to_string()))?;
        if let Some(why) = gpu_refusal(cfg, n) {
            return Err(BackendError::Plan(why));
        }
        let kind = choose(ordinals, reduction)?;
        let id = if kind == Kind::Nccl { Some(unique_id()?) } else { None };
        let host = (kind == Kind::Host).then(|| Arc::new(HostAllReduce::new(n)));
        let model = Arc::new((cfg.clone(), w.clone()));
        // All ranks build, then all check that all built before any joins NCCL (a join blocks
        // until every rank joins).
        let built = Arc::new(Barrier::new(n));
        let failed = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = channel::<(usize, Result<Info, BackendError>)>();
        let mut workers = Vec::with_capacity(n);
        for (rank, &ordinal) in ordinals.iter().enumerate() {
            let (jobs, job_rx) = channel::<Job>();
            let (reply_tx, replies) = channel();
            let (model, built, failed, ready, host) =
                (model.clone(), built.clone(), failed.clone(), ready_tx.clone(), host.clone());
            let opts = CudaOptions { ordinal, ..opts.clone() };
            let thread = std::thread::Builder::new()
                .name(format!("tp-rank-{rank}"))
                .spawn(move || {
                    let b = (|| {
                        let (sc, sw) = shard(&model.0, &model.1, Rank { rank, n })
                            .map_err(|e| BackendError::Plan(e.to_string()))?;
                        Ok::<_, BackendError>(CudaBackend::new(sc, &sw, &opts)?)
                    })();
                    if b.is_err() {
                        failed.store(true, Ordering::SeqCst);
                    }
                    built.wait();
                    let b = b.and_then(|mut b| {
                        if failed.load(Ordering::SeqCst) {
                            return Err(BackendError::Plan(format!("rank {rank}: another rank failed to load")));
                        }
                        let reduce = match (&host, id) {
                            (Some(h), _) => Reduce::Host(h.clone()),
                            (None, Some(id)) => {
                                b.dev.ctx.bind_to_thread().map_err(CudaError::driver("binding the context"))?;
                                Reduce::Nccl(NcclComm::join(id, rank, n)?)
                            }
                            (None, None) => unreachable!("NCCL ranks have an id"),
                        };
                        b.tp = Some(CudaRank::new(rank, n, reduce));
                        Ok(b)
                    });
                    match b {
                        Err(e) => {
                            let _ = ready.send((rank, Err(e)));
                        }
                        Ok(b) => {
                            let info = Info {
                                describe: b.describe(),
                                block_size: b.block_size(),
                                num_blocks: b.num_blocks(),
                                prefill_chunk: b.prefill_chunk(),
                                decode_bytes: b.decode_weight_bytes(),
                                kv_bytes: b.kv_bytes_per_position(),
                                snapshots: b.state_snapshot_capacity(),
                            };
                            let _ = ready.send((rank, Ok(info)));
                            serve(b, rank, job_rx, reply_tx, host);
                        }
                    }
                })
                .map_err(|e| BackendError::Device(format!("starting tensor-parallel rank {rank}: {e}").into()))?;
            workers.push(Worker { jobs, replies, thread: Some(thread) });
        }
        drop(ready_tx);
        let mut info: Vec<Option<Info>> = (0..n).map(|_| None).collect();
        let mut first_err = None;
        for (rank, r) in ready_rx.iter() {
            match r {
                Ok(i) => info[rank] = Some(i),
                Err(e) if first_err.is_none() => first_err = Some((rank, e)),
                Err(_) => {}
            }
        }
        let head_bytes = w.output.bytes().len() as u64;
        let mut me = TpCudaBackend { cfg: cfg.clone(), workers, info: Vec::new(), kind, head_bytes };
        if let Some((rank, e)) = first_err {
            drop(me); // stops the ranks that did load
            return Err(BackendError::Device(
                format!("tensor-parallel rank {rank} on cuda:{}: {e}", ordinals[rank]).into(),
            ));
        }
        me.info = info.into_iter().map(|i| i.expect("every rank reported")).collect();
        Ok(me)
    }

    /// The same job to every rank; every rank's reply, in rank order.
    fn all(&self, job: impl Fn() -> Job) -> Result<Vec<Out>, BackendError> {
        for (r, w) in self.workers.iter().enumerate() {
            w.jobs
                .send(job())
                .map_err(|_| BackendError::Device(format!("tensor-parallel rank {r} has stopped").into()))?;
        }
        let mut outs = Vec::with_capacity(self.workers.len());
        let mut err = None;
        for (r, w) in self.workers.iter().enumerate() {
            match w.replies.recv() {
                Ok(Ok(o)) => outs.push(o),
                Ok(Err(e)) => err = err.or(Some(e)),
                Err(_) => err = err.or(Some(BackendError::Device(format!("tensor-parallel rank {r} stopped").into()))),
            }
        }
        err.map_or(Ok(outs), Err)
    }

    fn step_with(&mut self, plan: &StepPlan, greedy: bool) -> Result<Out, BackendError> {
        let plan = Arc::new(plan.clone());
        Ok(self.all(|| Job::Step(plan.clone(), greedy))?.swap_remove(0))
    }

    /// `NCCL` or `host-staged`.
    pub fn reduction(&self) -> &'static str {
        match self.kind {
            Kind::Nccl => "NCCL",
            Kind::Host => "host-staged",
        }
    }
}

/// A rank's loop: runs the group's jobs on its engine until the group is dropped.
fn serve(
    mut b: CudaBackend,
    rank: usize,
    jobs: Receiver<Job>,
    replies: Sender<Result<Out, BackendError>>,
    host: Option<Arc<HostAllReduce>>,
) {
    for job in jobs {
        let out = match job {
            Job::Step(plan, greedy) => match (rank, greedy) {
                (0, false) => b.step(&plan).map(Out::Logits),
                (0, true) => b.step_greedy(&plan).map(Out::Ids),
                _ => b.rank_step(&plan).map(|_| Out::Unit),
            },
            Job::Release(s) => Ok(Out::Unit).inspect(|_| b.release(s)),
            Job::Save(s, k) => b.save_state(s, &k).map(|_| Out::Unit),
            Job::Restore(s, k, p) => Ok(Out::Flag(b.restore_state(s, &k, p))),
            Job::Drop(k) => Ok(Out::Unit).inspect(|_| b.drop_state(&k)),
            Job::Prepare => b.prepare().map(|_| Out::Unit),
            Job::Peak => Ok(Out::Bytes(b.peak_memory_bytes())),
        };
        if out.is_err() {
            // The other ranks may be waiting for this one in a host-staged all-reduce.
            if let Some(h) = &host {
                h.abort();
            }
        }
        if replies.send(out).is_err() {
            return;
        }
    }
}

impl Drop for TpCudaBackend {
    fn drop(&mut self) {
        for w in &mut self.workers {
            // Closing the job channel ends the rank's loop; its engine is dropped on its thread.
            let (closed, _) = channel();
            drop(std::mem::replace(&mut w.jobs, closed));
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Backend for TpCudaBackend {
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
            _ => unreachable!("rank 0 answers a step with logits"),
        }
    }
    fn step_greedy(&mut self, plan: &StepPlan) -> Result<Vec<u32>, BackendError> {
        match self.step_with(plan, true)? {
            Out::Ids(i) => Ok(i),
            _ => unreachable!("rank 0 answers a greedy step with ids"),
        }
    }
    fn release(&mut self, seq: SeqId) {
        let _ = self.all(|| Job::Release(seq));
    }
    fn save_state(&mut self, seq: SeqId, key: &[u8; 32]) -> Result<(), BackendError> {
        self.all(|| Job::Save(seq, *key)).map(|_| ())
    }
    fn restore_state(&mut self, seq: SeqId, key: &[u8; 32], pos: usize) -> bool {
        self.all(|| Job::Restore(seq, *key, pos)).is_ok_and(|o| o.iter().all(|x| matches!(x, Out::Flag(true))))
    }
    fn drop_state(&mut self, key: &[u8; 32]) {
        let _ = self.all(|| Job::Drop(*key));
    }
    fn state_snapshot_capacity(&self) -> usize {
        self.info[0].snapshots
    }
    fn prepare(&mut self) -> Result<(), BackendError> {
        self.all(|| Job::Prepare).map(|_| ())
    }
    fn prefill_chunk(&self) -> usize {
        self.info.iter().map(|i| i.prefill_chunk).min().unwrap_or(1)
    }
    fn describe(&self) -> String {
        let ranks: Vec<&str> = self.info.iter().map(|i| i.describe.as_str()).collect();
        format!("{} x tensor parallel ({} all-reduce): {}", self.info.len(), self.reduction(), ranks.join(" | "))
    }
    /// Every rank reads its shard and one embedding row; only rank 0 reads the output head.
    fn decode_weight_bytes(&self) -> u64 {
        let all: u64 = self.info.iter().map(|i| i.decode_bytes).sum();
        all.saturating_sub((self.info.len() as u64 - 1) * self.head_bytes)
    }
    fn kv_bytes_per_position(&self) -> u64 {
        self.info.iter().map(|i| i.kv_bytes).sum()
    }
    /// The most any one GPU holds (ranks sharing a GPU each see all of its use).
    fn peak_memory_bytes(&self) -> Option<u64> {
        let outs = self.all(|| Job::Peak).ok()?;
        outs.into_iter().filter_map(|o| if let Out::Bytes(b) = o { b } else { None }).max()
    }
}
