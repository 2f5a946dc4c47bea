//! The CUDA backend: cudarc with dynamic loading (the binary runs where no CUDA exists), kernels
//! from `kernels/` compiled at run time by NVRTC for the device's compute capability (or loaded
//! as precompiled PTX), cuBLAS for large F16 GEMMs, own kernels for the rest (GEMV and
//! tensor-core GEMM on F16 and packed block formats, attention, MoE, DeltaNet).
//!
//! Rooms: `compile/` (kernel sources to loaded modules), `ops/` (one launcher module per kernel
//! file), `layers/` (the layer walker: one file per mixer and FFN kind), `step/` (one forward
//! step: its inputs, buffers, graphs, the masked step), `plan/` (memory plan and budget),
//! `synth/` (random-weight models), `tp/` (tensor parallel); beside them the backend object
//! (`model`) and the weights (`weights`, `dmat`, `qformat`, `layer`, `moe/`, `hybrid`).
//!
//! Layers, bottom up: a module imports from its own layer or those below, never from above and
//! never in a circle (tests/module_graph.rs fails naming any import circle inside `src/`; every
//! child may use this module's shared items such as [`CudaError`]):
//! 1. `compile/`: `nvrtc` (compilation, disk cache), `kernels` (the table of kernel files with
//!    every entry name, MoE families included, and the lazy per-device registry) and `entries`
//!    (the per-format entry tables and the typed handles launchers pick them with); `device`,
//!    `qformat`, `tuning`.
//! 2. `ops/`, the launchers: one module per kernel file (`ops/gemv_f16.rs` for
//!    `kernels/gemv_f16.cu`, `gemm_tc`, `rmsnorm`, `qlaunch` for the block-format files, ...:
//!    the `#[repr(C)]` params mirror, shape checks, grid choice) over `ops/launch.rs` (what
//!    every launcher shares: `Dev`, shape checks, the one `launch` call). What two launcher modules share sits in a
//!    module below both: `dmat` (device matrices), `ops/paged_attn` (the paged-attention
//!    inputs, for `attention` and `prefill`; both launch `attention_merge`), `ops/moe_slab`
//!    (expert slabs and the pair-mode down product, for `moe`, `moe_q8`, `shared_expert`). A
//!    family's dispatch (`matmul`: which kernel a product takes; `moe::moe_ffn`) sits above its
//!    launchers, and a launcher never imports its dispatcher. `moe/` (the MoE weights, the
//!    launchers of `kernels/moe.cu` and the sparse FFN's dispatch) stays beside `ops/` for its
//!    weights.
//! 3. Step plumbing over the launchers: `step::flat` (the shape of a flattened step),
//!    `step::attn` (its attention), `step::workspace` (its buffers), `step::graph` (captured CUDA
//!    graphs), `layer` (one layer's device weights), `synth::mix` (synthetic models' formats and
//!    bytes), `hybrid` (the linear-attention layers), `plan/` (`seqs`, `memory`: the memory plan,
//!    `budget`: what a plan may use, `--max-gpu-memory`), `tp::rank` (the all-reduce).
//! 4. `model`: the `CudaBackend` struct, its construction and the `Backend` entry points.
//! 5. Modules that extend `CudaBackend` with `impl` blocks and so import `model`, which never
//!    names them: `step::inputs` (the plan flattened), `step::run` (the layers' launches, graph
//!    replay), `step::masked` (the grammar-masked greedy step), `synth::hybrid` (synthetic hybrid
//!    models), `step::weights_read` (the weights a step read, for the bench's step bound),
//!    `tp::group` (the ranks run as one backend).

pub mod compile;
pub mod device;
pub mod dmat;
pub mod hybrid;
mod layer;
mod layers;
pub mod matmul;
pub mod model;
pub mod moe;
pub mod ops;
pub mod plan;
mod profile;
pub mod qformat;
pub mod step;
pub mod synth;
pub mod tap;
pub mod tp;
mod tuning;
pub mod weights;

use std::path::PathBuf;

use crate::backend::BackendError;

pub use device::CudaDevice;
pub use model::{CudaBackend, CudaOptions};
pub use plan::memory::{plan_memory, MemoryPlan};
pub use synth::mix::WeightMix;
pub use tap::CudaTap;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no NVRTC library could be loaded (put libnvrtc on LD_LIBRARY_PATH or name it in DUSTOFF_NVRTC: NVRTC 11.x or 12.x for a V100; scripts/nvrtc12.sh fetches one; or pass --ptx-dir with precompiled PTX)")]
    NvrtcMissing,
    #[error("the CUDA driver library (libcuda.so) could not be loaded: no NVIDIA driver on this machine")]
    DriverMissing,
    #[error("the NVIDIA driver supports CUDA {}.{}; dustoff needs CUDA {}.{} or newer (update the driver; `dustoff doctor` lists what works)", have.0, have.1, need.0, need.1)]
    DriverTooOld { have: (i32, i32), need: (i32, i32) },
    #[error("NVRTC: {0}")]
    Nvrtc(String),
    #[error("PTX of kernel file {file}.cu for {arch}: {source}")]
    Isa { file: String, arch: String, source: compile::ptx_isa::IsaError },
    #[error("compiling kernel file {file}.cu for {arch}: {log}")]
    Compile { file: String, arch: String, log: String },
    #[error("PTX file {path}: {source}")]
    PtxIo { path: PathBuf, source: std::io::Error },
    #[error("kernel cache {path}: {source}")]
    CacheIo { path: PathBuf, source: std::io::Error },
    #[error("no kernel named '{0}' in kernels/")]
    UnknownKernel(String),
    #[error("CUDA driver: {what}: {source}")]
    Driver { what: String, source: cudarc::driver::DriverError },
    #[error("cuBLAS: {what}: {source}")]
    Cublas { what: String, source: cudarc::cublas::result::CublasError },
    #[error("kernel {kernel}: {reason}")]
    Shape { kernel: &'static str, reason: String },
    #[error("weights: {0}")]
    Weights(String),
    #[error("{0}")]
    OutOfMemory(String),
    #[error("CUDA graph: {0}")]
    Graph(String),
    /// NCCL missing or failing (tensor parallel).
    #[error("NCCL: {0}")]
    Nccl(String),
}

impl CudaError {
    /// Wraps a driver error with what was being done.
    pub fn driver(what: impl Into<String>) -> impl FnOnce(cudarc::driver::DriverError) -> CudaError {
        let what = what.into();
        move |source| CudaError::Driver { what, source }
    }
}

/// Keeps the kind and the cause: the engine retries an out-of-memory step with a smaller batch.
impl From<CudaError> for BackendError {
    fn from(e: CudaError) -> Self {
        use cudarc::cublas::sys::cublasStatus_t as B;
        use cudarc::driver::sys::CUresult as R;
        match e {
            CudaError::OutOfMemory(what) => BackendError::OutOfMemory { what, source: None },
            CudaError::Driver { what, source } => match source.0 {
                R::CUDA_ERROR_OUT_OF_MEMORY => BackendError::OutOfMemory { what, source: Some(Box::new(source)) },
                R::CUDA_ERROR_LAUNCH_FAILED
                | R::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
                | R::CUDA_ERROR_LAUNCH_TIMEOUT
                | R::CUDA_ERROR_ILLEGAL_ADDRESS
                | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
                | R::CUDA_ERROR_MISALIGNED_ADDRESS
                | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
                | R::CUDA_ERROR_INVALID_PC
                | R::CUDA_ERROR_HARDWARE_STACK_ERROR => BackendError::Launch { what, source: Box::new(source) },
                _ => BackendError::Driver { what, source: Box::new(source) },
            },
            CudaError::Cublas { what, source } if source.0 == B::CUBLAS_STATUS_ALLOC_FAILED => {
                BackendError::OutOfMemory { what: format!("cuBLAS: {what}"), source: Some(Box::new(source)) }
            }
            CudaError::Cublas { what, source } => {
                BackendError::Driver { what: format!("cuBLAS: {what}"), source: Box::new(source) }
            }
            CudaError::Compile { file, arch, log } => BackendError::Compile { file, arch, log },
            CudaError::Shape { kernel, reason } => BackendError::Plan(format!("kernel {kernel}: {reason}")),
            other => BackendError::Device(Box::new(other)),
        }
    }
}
