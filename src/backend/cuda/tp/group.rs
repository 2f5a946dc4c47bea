//! Tensor parallel on GPUs (`--tensor-parallel N`): N rank engines, each a [`CudaBackend`]
//! holding its shard (`model::tensor_parallel`: 1/N of the heads, of the KV cache and of the FFN
//! columns; embedding, norms and head replicated), run as a `rank_group::RankGroup`: each on its
//! own thread (CUDA state is not `Send`), driven in lockstep, meeting in an all-reduce after each
//! block's two output projections (`rank.rs`); rank 0 computes the logits.
//!
//! The all-reduce is NCCL when the ranks sit on distinct GPUs, host-staged when ranks share a GPU
//! (NCCL refuses that) and for one rank (a copy), or as `DUSTOFF_TP_ALLREDUCE` says (`nccl`,
//! `host`; `nccl` with one rank is a real one-rank NCCL group). Decode steps are not replayed as CUDA graphs
//! under tensor parallel (a host-staged reduction cannot be captured).
//!
//! The all-reduce is a hook of the layer walker (`layers/`) after every block, so every layer
//! kind splits: dense and mixture-of-experts FFNs, attention, gated attention and Gated
//! DeltaNet mixers. Rank 0 adds the residual; the other ranks write their partial block output
//! alone (their output products overwrite `x`; before a sparse FFN, whose launches add into `x`
//! in place, they zero it).

use std::sync::Arc;

use super::nccl::{unique_id, NcclComm};
use super::rank::{CudaRank, Reduce};
use crate::backend::allreduce::HostAllReduce;
use crate::backend::cuda::model::{CudaBackend, CudaOptions};
use crate::backend::cuda::CudaError;
use crate::backend::rank_group::{RankEngine, RankGroup};
use crate::backend::BackendError;
use crate::engine::plan::StepPlan;
use crate::model::config::ModelConfig;
use crate::model::tensor_parallel::{shard, Rank};
use crate::model::weights::ModelWeights;

/// `nccl`, `host` or `auto` (the default: NCCL for ranks on distinct GPUs, host-staged for
/// ranks sharing one and for a single rank).
pub const ALLREDUCE_ENV: &str = "DUSTOFF_TP_ALLREDUCE";

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
            // One rank: nothing to exchange; the host path (a copy) exercises the rank rule
            // without depending on NCCL (`nccl` asks for a one-rank NCCL group).
            (false, 1) => Ok(Kind::Host),
            (false, _) => super::nccl::nccl_version().map(|_| Kind::Nccl),
        },
        Some(v) => Err(CudaError::Nccl(format!("{ALLREDUCE_ENV}={v}: give nccl, host or auto"))),
    }
}

impl RankEngine for CudaBackend {
    /// A rank other than 0: the layers only (no head, no logits to read back).
    fn rank_step(&mut self, plan: &StepPlan) -> Result<(), BackendError> {
        let f = self.flatten(plan)?;
        if f.n_tok > 0 {
            let mut w = std::mem::take(&mut self.work);
            let r = self.run_step(&mut w, &f);
            self.work = w;
            r?;
        }
        self.end_state(plan)
    }
    fn abort_collective(&mut self) {
        if let Some(CudaRank { reduce: Reduce::Host(h), .. }) = &self.tp {
            h.abort();
        }
    }
}

/// Builds GPU rank groups (a [`RankGroup`] of [`CudaBackend`] ranks).
pub struct TpCudaBackend;

impl TpCudaBackend {
    /// Places rank `r`'s shard on GPU `ordinals[r]` (repeats allowed: ranks sharing a GPU),
    /// `opts` as for one GPU (each rank plans its own memory: weights / N plus the replicated
    /// parts, KV / N, its own workspace). The reduction as [`ALLREDUCE_ENV`] says.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(
        cfg: &ModelConfig,
        w: &ModelWeights,
        ordinals: &[usize],
        opts: &CudaOptions,
    ) -> Result<RankGroup, BackendError> {
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
    ) -> Result<RankGroup, BackendError> {
        let n = ordinals.len();
        crate::model::tensor_parallel::check(cfg, n).map_err(|e| BackendError::Plan(e.to_string()))?;
        let kind = choose(ordinals, reduction)?;
        let id = if kind == Kind::Nccl { Some(unique_id()?) } else { None };
        let host = (kind == Kind::Host).then(|| Arc::new(HostAllReduce::new(n)));
        let model = Arc::new((cfg.clone(), w.clone()));
        let (ordinals, opts) = (ordinals.to_vec(), opts.clone());
        let build = move |rank: usize| {
            let (sc, sw) =
                shard(&model.0, &model.1, Rank { rank, n }).map_err(|e| BackendError::Plan(e.to_string()))?;
            let opts = CudaOptions { ordinal: ordinals[rank], ..opts.clone() };
            Ok(CudaBackend::new(sc, &sw, &opts)?)
        };
        // After every rank has built: NCCL's join blocks until all ranks join.
        let join = move |rank: usize, b: &mut CudaBackend| {
            let reduce = match (&host, id) {
                (Some(h), _) => Reduce::Host(h.clone()),
                (None, Some(id)) => {
                    b.dev.ctx.bind_to_thread().map_err(CudaError::driver("binding the context"))?;
                    Reduce::Nccl(NcclComm::join(id, rank, n)?)
                }
                (None, None) => return Err(BackendError::Plan("NCCL ranks without an id".into())),
            };
            b.tp = Some(CudaRank::new(rank, n, reduce));
            Ok(())
        };
        let name = match kind {
            Kind::Nccl => "NCCL",
            Kind::Host => "host-staged",
        };
        RankGroup::start(cfg, n, w.output.bytes().len() as u64, name, build, join)
    }
}
