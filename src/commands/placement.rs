//! How a command places a model on its device beyond the sizes of its KV pool and steps
//! (`Placement`), and the memory flags of `run`, `generate` and `bench`.

use std::path::{Path, PathBuf};

use crate::backend::cuda::plan::budget::MemoryCap;
use crate::backend::kv_type::{KvChoice, KvType};

/// How a command places a model on its device, beyond the sizes of its KV pool and steps.
#[derive(Clone, Debug, Default)]
pub struct Placement {
    /// Precompiled PTX folder (`--ptx-dir`); `None`: `DUSTOFF_PTX_DIR`, else NVRTC.
    pub ptx_dir: Option<PathBuf>,
    /// On a GPU, widen block-format weights to F16 at load (`bench --weights f16`).
    pub f16_weights: bool,
    /// `--max-gpu-memory`: what the process may take on each GPU (see `backend::cuda::plan::budget`).
    pub max_gpu_memory: Option<MemoryCap>,
    /// The KV cache's element type (`--kv-cache` as resolved by [`resolve_slots`]).
    pub kv_type: KvType,
    /// The longest sequence the job runs (positions): a GPU sizes its RoPE tables, block-table
    /// rows and attention partials by it; `None`: a sequence may take the whole KV pool.
    pub max_seq_positions: Option<usize>,
}

impl Placement {
    pub fn with_ptx_dir(ptx_dir: Option<&Path>) -> Self {
        Placement { ptx_dir: ptx_dir.map(Path::to_path_buf), ..Default::default() }
    }
}

/// The memory flags of `run`, `generate` and `bench`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryFlags {
    /// `--max-gpu-memory`.
    pub max_gpu_memory: Option<MemoryCap>,
    /// `--kv-cache`.
    pub kv_cache: KvChoice,
}
