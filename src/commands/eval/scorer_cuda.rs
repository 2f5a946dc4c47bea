//! The CUDA backend as a [`HeadSource`]: a head-only tap (`backend::cuda::tap`) downloads the
//! final-normed hidden state of every token of a step (`[n_tok, dim]` f32); no layer's input
//! leaves the device.

use std::path::PathBuf;

use super::windows::{chunk_tokens, HeadInput, HeadSource};
use crate::backend::cuda::{CudaBackend, CudaTap};
use crate::backend::kv_type::KvType;
use crate::backend::Backend;
use crate::commands::backend_setup::place_cuda;
use crate::commands::placement::Placement;
use crate::engine::batch::BLOCK_SIZE;
use crate::model::loader::LoadedModel;

pub struct CudaHead {
    backend: CudaBackend,
    head: String,
}

impl CudaHead {
    /// `m` on GPU `ordinal` with KV room for `batch` windows of `ctx` tokens (cache type `kv`),
    /// `batch` sequences at once, and workspace for steps of `batch` chunks
    /// ([`chunk_tokens`]); the memory plan is checked before anything is placed.
    pub fn new(
        m: &LoadedModel,
        (ordinal, ptx_dir): (usize, Option<PathBuf>),
        ctx: usize,
        batch: usize,
        kv: KvType,
    ) -> anyhow::Result<Self> {
        let per = ctx.div_ceil(BLOCK_SIZE);
        let place = Placement { ptx_dir, kv_type: kv, max_seq_positions: Some(per * BLOCK_SIZE), ..Default::default() };
        let step = batch * chunk_tokens(batch).min(ctx);
        let backend = place_cuda(&m.config, &m.weights, ordinal, batch * per, (step, batch), &place)?;
        Ok(CudaHead { backend, head: m.weights.output.name.clone() })
    }
}

impl HeadSource for CudaHead {
    fn backend(&mut self) -> &mut dyn Backend {
        &mut self.backend
    }
    fn arm(&mut self) {
        let tap = Box::new(HeadInput { head: self.head.clone(), rows: Vec::new() });
        self.backend.set_tap(CudaTap::head_only(tap, &self.head));
    }
    fn disarm(&mut self) -> Option<Vec<f32>> {
        let tap = self.backend.take_tap()?.into_inner();
        tap.into_any().downcast::<HeadInput>().ok().map(|h| h.rows)
    }
}
