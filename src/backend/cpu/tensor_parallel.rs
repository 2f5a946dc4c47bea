//! Tensor parallel on the CPU (`--tensor-parallel N --device cpu`): N rank backends, each a
//! [`CpuBackend`] holding its shard (`model::tensor_parallel`: 1/N of the heads, of the KV cache
//! and of the FFN columns), run every step in N threads. After each block's attention output
//! projection and FFN down projection the ranks sum their partial outputs in host memory
//! (`allreduce::HostAllReduce`, rank order) and add the residual; rank 0 computes the logits.
//!
//! The rank threads are plain threads, not rayon workers: a rank waits at the all-reduce, and a
//! waiting rayon worker could starve the pool (three ranks on a two-thread pool would deadlock).
//! Their matrix products still run on the rayon pool.

use std::sync::Arc;

use super::CpuBackend;
use crate::backend::allreduce::{HostAllReduce, RankGuard};
use crate::backend::{Backend, BackendError};
use crate::engine::plan::{SeqId, StepPlan};
use crate::model::config::ModelConfig;
use crate::model::tensor_parallel::{shard, Rank, TpError};
use crate::model::weights::ModelWeights;

/// A rank's place in its group and the all-reduce the group shares.
pub struct RankLink {
    pub rank: usize,
    pub reduce: Arc<HostAllReduce>,
}

/// The residual add after an output projection: `x += o`; for a tensor-parallel rank,
/// `x = sum over ranks of (x + o on rank 0, o on the others)`, i.e. the residual plus the full
/// product. (Every rank holds the same `x`; only rank 0 adds it, so it is counted once.)
pub(super) fn residual(rank: &Option<RankLink>, x: &mut [f32], o: &[f32]) {
    let Some(r) = rank else {
        return super::ops::add_inplace(x, o);
    };
    if r.rank == 0 {
        super::ops::add_inplace(x, o);
    } else {
        x.copy_from_slice(o);
    }
    // The CPU forward pass has no error path: a failed peer ends this rank's thread too, and
    // the group's step reports it (`TpCpuBackend::step`).
    if let Err(e) = r.reduce.reduce(r.rank, x) {
        panic!("rank {}: {e}", r.rank);
    }
}

impl CpuBackend {
    /// One rank's step on the calling thread (not inside the rayon pool: see the module note).
    fn step_rank(&mut self, plan: &StepPlan) -> Result<Vec<Vec<f32>>, BackendError> {
        self.check_plan(plan)?;
        if let Some(h) = &mut self.hybrid {
            h.begin_step(plan)?;
        }
        let logits = self.forward(plan);
        if let Some(h) = &mut self.hybrid {
            h.end_step(plan);
        }
        Ok(logits)
    }
}

impl crate::backend::rank_group::RankEngine for CpuBackend {
    // Not `step`: it runs the forward pass on a rayon worker, which must never wait at the
    // all-reduce (see the module note).
    fn rank_logits(&mut self, plan: &StepPlan) -> Result<Vec<Vec<f32>>, BackendError> {
        self.step_rank(plan)
    }
    fn rank_greedy(&mut self, plan: &StepPlan) -> Result<Vec<u32>, BackendError> {
        Ok(self.step_rank(plan)?.iter().map(|l| crate::engine::sampler::argmax(l)).collect())
    }
    fn rank_step(&mut self, plan: &StepPlan) -> Result<(), BackendError> {
        self.step_rank(plan).map(|_| ())
    }
    fn abort_collective(&mut self) {
        if let Some(r) = &self.rank {
            r.reduce.abort();
        }
    }
}

/// Rank `rank` of `n` as a CPU backend of its shard, joined to `reduce` (for a
/// [`crate::backend::rank_group::RankGroup`] of CPU ranks: the group's threads tested without
/// a GPU).
pub fn rank_backend(
    cfg: &ModelConfig,
    w: &ModelWeights,
    rank: usize,
    reduce: Arc<HostAllReduce>,
    num_blocks: usize,
    block_size: usize,
) -> Result<CpuBackend, TpError> {
    let (sc, sw) = shard(cfg, w, Rank { rank, n: reduce.ranks() })?;
    let mut b = CpuBackend::new(sc, sw, num_blocks, block_size);
    b.rank = Some(RankLink { rank, reduce });
    Ok(b)
}

/// N CPU rank backends that together run one model.
pub struct TpCpuBackend {
    cfg: ModelConfig,
    ranks: Vec<CpuBackend>,
    reduce: Arc<HostAllReduce>,
}

impl TpCpuBackend {
    /// Splits the model `n` ways (errors name what does not split) and places each shard with a
    /// KV cache of `num_blocks` blocks of its own KV heads.
    pub fn new(
        cfg: &ModelConfig,
        w: &ModelWeights,
        n: usize,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self, TpError> {
        let reduce = Arc::new(HostAllReduce::new(n.max(1)));
        let mut ranks = Vec::with_capacity(n);
        for rank in 0..n {
            let (sc, sw) = shard(cfg, w, Rank { rank, n })?;
            let mut b = CpuBackend::new(sc, sw, num_blocks, block_size);
            b.rank = Some(RankLink { rank, reduce: reduce.clone() });
            ranks.push(b);
        }
        if ranks.is_empty() {
            return Err(TpError::Zero);
        }
        Ok(TpCpuBackend { cfg: cfg.clone(), ranks, reduce })
    }

    pub fn ranks(&self) -> usize {
        self.ranks.len()
    }

    /// Runs `plan` on every rank, one thread each; rank 0's logits.
    fn run(&mut self, plan: &StepPlan) -> Result<Vec<Vec<f32>>, BackendError> {
        if self.reduce.is_aborted() {
            return Err(BackendError::Plan("tensor parallel: a rank failed in an earlier step".into()));
        }
        let reduce = &*self.reduce;
        let results: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = self
                .ranks
                .iter_mut()
                .map(|b| {
                    s.spawn(move || {
                        let _guard = RankGuard(reduce);
                        let r = b.step_rank(plan);
                        if r.is_err() {
                            reduce.abort();
                        }
                        r
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join()).collect()
        });
        let mut first = None;
        for (rank, r) in results.into_iter().enumerate() {
            let r = r.unwrap_or_else(|p| {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Err(BackendError::Device(format!("tensor-parallel rank {rank} failed: {msg}").into()))
            });
            match (rank, r) {
                (_, Err(e)) => return Err(e),
                (0, Ok(l)) => first = Some(l),
                _ => {}
            }
        }
        Ok(first.unwrap_or_default())
    }
}

impl Backend for TpCpuBackend {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    fn block_size(&self) -> usize {
        self.ranks[0].block_size
    }
    fn num_blocks(&self) -> usize {
        self.ranks[0].num_blocks
    }
    fn step(&mut self, plan: &StepPlan) -> Result<Vec<Vec<f32>>, BackendError> {
        self.run(plan)
    }
    fn release(&mut self, seq: SeqId) {
        self.ranks.iter_mut().for_each(|b| b.release(seq));
    }
    fn save_state(&mut self, seq: SeqId, key: &[u8; 32]) -> Result<(), BackendError> {
        self.ranks.iter_mut().try_for_each(|b| b.save_state(seq, key))
    }
    fn restore_state(&mut self, seq: SeqId, key: &[u8; 32], pos: usize) -> bool {
        // Every rank keeps the same snapshots (hybrid models run with one rank only).
        // Every rank restores (no short circuit), then all must have found the snapshot.
        let found: Vec<bool> = self.ranks.iter_mut().map(|b| b.restore_state(seq, key, pos)).collect();
        found.into_iter().all(|f| f)
    }
    fn drop_state(&mut self, key: &[u8; 32]) {
        self.ranks.iter_mut().for_each(|b| b.drop_state(key));
    }
    fn state_snapshot_capacity(&self) -> usize {
        self.ranks[0].state_snapshot_capacity()
    }
    fn describe(&self) -> String {
        format!("{} x tensor parallel, {}", self.ranks.len(), self.ranks[0].describe())
    }
    /// Every rank reads its shard and one embedding row; only rank 0 reads the output head.
    fn decode_weight_bytes(&self) -> u64 {
        let head = self.ranks[0].w.output.bytes().len() as u64;
        let all: u64 = self.ranks.iter().map(|b| b.decode_weight_bytes()).sum();
        all - (self.ranks.len() as u64 - 1) * head
    }
    fn kv_bytes_per_position(&self) -> u64 {
        self.ranks.iter().map(|b| b.kv_bytes_per_position()).sum()
    }
}
