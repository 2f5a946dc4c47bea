//! The CPU backend as a [`HeadSource`]: its activation tap sees the head's input of every token.

use super::windows::{HeadInput, HeadSource};
use crate::backend::cpu::CpuBackend;
use crate::backend::kv_type::KvType;
use crate::backend::Backend;
use crate::engine::batch::BLOCK_SIZE;
use crate::model::loader::LoadedModel;
use crate::quantize::QuantizeError;

pub struct CpuHead {
    backend: CpuBackend,
    head: String,
}

impl CpuHead {
    /// `m` with KV room for `batch` windows of `ctx` tokens, its cache of type `kv`.
    pub fn new(m: &LoadedModel, ctx: usize, batch: usize, kv: KvType) -> Result<Self, QuantizeError> {
        let blocks = batch * ctx.div_ceil(BLOCK_SIZE);
        let backend = CpuBackend::new(m.config.clone(), m.weights.clone(), blocks, BLOCK_SIZE)
            .with_kv_type(kv)
            .map_err(|e| QuantizeError::Usage(format!("{}: {e}", m.path.display())))?;
        Ok(CpuHead { backend, head: m.weights.output.name.clone() })
    }
}

impl HeadSource for CpuHead {
    fn backend(&mut self) -> &mut dyn Backend {
        &mut self.backend
    }
    fn arm(&mut self) {
        self.backend.set_tap(Box::new(HeadInput { head: self.head.clone(), rows: Vec::new() }));
    }
    fn disarm(&mut self) -> Option<Vec<f32>> {
        let tap = self.backend.take_tap()?;
        tap.into_any().downcast::<HeadInput>().ok().map(|h| h.rows)
    }
}
