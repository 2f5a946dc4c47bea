//! Tensor parallel on the CPU (`--tensor-parallel N --device cpu`): N rank backends, each a
//! [`CpuBackend`] holding its shard (`model::tensor_parallel`: 1/N of the heads, of the KV cache
//! and of the FFN columns), run every step on their N threads of a [`RankGroup`]. After each block's attention output
//! projection and FFN down projection the ranks sum their partial outputs in host memory
//! (`allreduce::HostAllReduce`, rank order) and add the residual; rank 0 computes the logits.
//!
//! The rank threads are plain threads, not rayon workers: a rank waits at the all-reduce, and a
//! waiting rayon worker could starve the pool (three ranks on a two-thread pool would deadlock).
//! Their matrix products still run on the rayon pool.

use std::sync::Arc;

use super::CpuBackend;
use crate::backend::allreduce::HostAllReduce;
use crate::backend::rank_group::RankGroup;
use crate::backend::BackendError;
use crate::engine::plan::StepPlan;
use crate::model::config::ModelConfig;
use crate::model::tensor_parallel::{check, shard, Rank, TpError};
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
    // The CPU forward pass has no error path: a failed peer ends this rank's step too, and the
    // group reports it (`RankGroup`, which also aborts the reduction for the others).
    if let Err(e) = r.reduce.reduce(r.rank, x) {
        panic!("rank {}: {e}", r.rank);
    }
}

impl CpuBackend {
    /// One rank's step on the calling thread (not inside the rayon pool: see the module note).
    fn step_rank(&mut self, plan: &StepPlan) -> Result<Vec<Vec<f32>>, BackendError> {
        self.check_plan(plan)?;
        self.states.begin_step(plan)?;
        let logits = self.forward(plan);
        self.states.end_step(plan);
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

/// N CPU ranks that together run one model: a [`RankGroup`] of [`rank_backend`]s, the group
/// the GPU ranks run in (threads driven in lockstep, a failing or panicking rank fails the step
/// and releases the others), joined by a host all-reduce in rank order. The split is checked
/// first, so a model that does not split is refused with the reason before any thread starts.
pub fn tp_cpu_group(
    cfg: &ModelConfig,
    w: &ModelWeights,
    n: usize,
    num_blocks: usize,
    block_size: usize,
) -> Result<RankGroup, BackendError> {
    let refused = |e: TpError| BackendError::Device(e.into());
    check(cfg, n).map_err(refused)?;
    let reduce = Arc::new(HostAllReduce::new(n));
    let (c, wt) = (cfg.clone(), w.clone());
    let build = move |rank| rank_backend(&c, &wt, rank, reduce.clone(), num_blocks, block_size).map_err(refused);
    RankGroup::start(cfg, n, w.output.bytes().len() as u64, "host", build, |_, _| Ok(()))
}
