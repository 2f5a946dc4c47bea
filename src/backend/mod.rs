//! Backends execute a `StepPlan` and return logits. `cpu` is the reference; `cuda` the fast one.

pub mod allreduce;
pub mod cpu;
pub mod cuda;
pub mod fault;
pub mod kv_type;
pub mod masks;
pub mod rank_group;
pub mod state_slots;

use crate::engine::plan::StepPlan;
use crate::model::config::ModelConfig;
pub use state_slots::StateSlots;

/// The cause kept inside a [`BackendError`] (a driver or cuBLAS error, ...).
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A failed backend call, by kind: the engine recovers from [`BackendError::OutOfMemory`]
/// inside a step (preempt, smaller batch, retry); the others end the job with their cause.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("invalid step plan: {0}")]
    Plan(String),
    /// Device memory ran out (an allocation in a step, cuBLAS workspace, or the memory plan).
    #[error("out of device memory: {what}")]
    OutOfMemory {
        what: String,
        #[source]
        source: Option<Cause>,
    },
    /// A kernel failed at or after launch (illegal address, too many resources, timeout...).
    #[error("kernel launch failed: {what}")]
    Launch {
        what: String,
        #[source]
        source: Cause,
    },
    /// A kernel file did not compile; `log` is NVRTC's.
    #[error("compiling kernel file {file}.cu for {arch} failed; NVRTC log:\n{log}")]
    Compile { file: String, arch: String, log: String },
    /// Any other driver or library failure, with its cause.
    #[error("device: {what}")]
    Driver {
        what: String,
        #[source]
        source: Cause,
    },
    /// Any other device failure (a library that could not be loaded, a PTX or kernel-cache
    /// file, weights the device cannot take, a graph), the backend's own error kept as is.
    #[error(transparent)]
    Device(Cause),
}

/// A plan the backend cannot run: the text names the sequence and the broken bound.
impl From<crate::engine::plan::PlanError> for BackendError {
    fn from(e: crate::engine::plan::PlanError) -> Self {
        BackendError::Plan(e.to_string())
    }
}

impl BackendError {
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, BackendError::OutOfMemory { .. })
    }
}

/// Prefill chunk length: bounds activation memory for long prompts (the default of
/// `Backend::prefill_chunk`; a backend may take longer chunks).
pub const PREFILL_CHUNK: usize = 512;

/// A model placed on a device, with its paged KV cache.
pub trait Backend {
    fn config(&self) -> &ModelConfig;
    /// Tokens per KV block.
    fn block_size(&self) -> usize;
    /// KV blocks in the cache (the block pool's capacity).
    fn num_blocks(&self) -> usize;
    /// Most positions one sequence may reach: a GPU sizes its RoPE tables, block-table rows and
    /// attention partials by the job's longest sequence, not by the whole pool; the engine
    /// refuses a request that needs more.
    fn max_seq_positions(&self) -> usize {
        usize::MAX
    }
    /// Runs one step; returns the logits (`[vocab]`, f32) of every chunk with `want_logits`,
    /// in plan order.
    fn step(&mut self, plan: &StepPlan) -> Result<Vec<Vec<f32>>, BackendError>;
    /// Runs one step and returns the greedy choice of every chunk with `want_logits`, in plan
    /// order: `sampler::argmax` of its logits (largest value, lowest id among equals, never
    /// NaN). A device backend may choose on the device and skip the logits download.
    fn step_greedy(&mut self, plan: &StepPlan) -> Result<Vec<u32>, BackendError> {
        Ok(self.step(plan)?.iter().map(|l| crate::engine::sampler::argmax(l)).collect())
    }
    /// Runs one step and returns the greedy choice of every chunk with `want_logits` among the
    /// tokens its mask allows (`sampler::masked_argmax`; rows given no mask: `argmax`). `fill`
    /// writes the masks (`masks::MaskRows`) once, while the step runs: the model does not wait
    /// for it. A device backend uploads the mask bits and chooses on the device (no logits
    /// download); the default is the same rule on the host (`masks::host_step_greedy_masked`).
    fn step_greedy_masked(
        &mut self,
        plan: &StepPlan,
        fill: &mut masks::FillMasks<'_>,
    ) -> Result<masks::MaskedGreedy, BackendError> {
        masks::host_step_greedy_masked(self, plan, fill)
    }
    /// Hybrid models: the recurrent-state slots this backend holds buffers for (none for other
    /// models). NOTE: the one state query left on the trait: the engine's state pool decides
    /// which slot holds what (`engine::state_pool`) and puts slots and copies in the plan, but
    /// the buffers were sized by the backend's memory plan (a GPU allocates them once), so only
    /// the backend knows how many there are.
    fn state_slots(&self) -> StateSlots {
        StateSlots::default()
    }
    /// Compiles or loads everything a step may need (kernels), so that it stays out of
    /// timings; steps do it lazily otherwise.
    fn prepare(&mut self) -> Result<(), BackendError> {
        Ok(())
    }
    /// Most tokens of one step when a single sequence's prompt is fed in chunks
    /// (`engine::single::SingleSeq::feed`).
    fn prefill_chunk(&self) -> usize {
        PREFILL_CHUNK
    }
    /// A short name for logs ("cpu (2 threads)", "cuda:0 NVIDIA H200").
    fn describe(&self) -> String;
    /// Bytes of weights one decode step reads: every matrix in full, one embedding row.
    fn decode_weight_bytes(&self) -> u64;
    /// Bytes of KV cache per cached position (all layers, K and V), as stored.
    fn kv_bytes_per_position(&self) -> u64;
    /// Peak device memory in use so far, where the backend can tell.
    fn peak_memory_bytes(&self) -> Option<u64> {
        None
    }
    /// Bytes of weights the last step (of `n_tok` tokens) read, where the backend tells them
    /// apart from [`Backend::decode_weight_bytes`]: a mixture-of-experts step reads the experts
    /// its tokens chose (the CUDA backend counts them from its routing output). `None`: every
    /// matrix once, as `decode_weight_bytes` counts.
    fn last_step_weight_bytes(&self, _n_tok: usize) -> Option<u64> {
        None
    }
    /// Dense F16 tensor-core arithmetic of the device (FLOP/s), where known: the FLOP side of a
    /// step's bound.
    fn tensor_flops(&self) -> Option<f64> {
        None
    }
    /// Measures the device's copy bandwidth (bytes read + written per second), where it can.
    fn measure_copy_bandwidth(&mut self) -> Option<f64> {
        None
    }
}

/// A boxed backend is a backend (the CLI picks the device at run time).
impl<T: Backend + ?Sized> Backend for Box<T> {
    fn config(&self) -> &ModelConfig {
        (**self).config()
    }
    fn block_size(&self) -> usize {
        (**self).block_size()
    }
    fn num_blocks(&self) -> usize {
        (**self).num_blocks()
    }
    fn step(&mut self, plan: &StepPlan) -> Result<Vec<Vec<f32>>, BackendError> {
        (**self).step(plan)
    }
    fn step_greedy(&mut self, plan: &StepPlan) -> Result<Vec<u32>, BackendError> {
        (**self).step_greedy(plan)
    }
    fn step_greedy_masked(
        &mut self,
        plan: &StepPlan,
        fill: &mut masks::FillMasks<'_>,
    ) -> Result<masks::MaskedGreedy, BackendError> {
        (**self).step_greedy_masked(plan, fill)
    }
    fn prepare(&mut self) -> Result<(), BackendError> {
        (**self).prepare()
    }
    fn state_slots(&self) -> StateSlots {
        (**self).state_slots()
    }
    fn prefill_chunk(&self) -> usize {
        (**self).prefill_chunk()
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn max_seq_positions(&self) -> usize {
        (**self).max_seq_positions()
    }
    fn decode_weight_bytes(&self) -> u64 {
        (**self).decode_weight_bytes()
    }
    fn kv_bytes_per_position(&self) -> u64 {
        (**self).kv_bytes_per_position()
    }
    fn peak_memory_bytes(&self) -> Option<u64> {
        (**self).peak_memory_bytes()
    }
    fn last_step_weight_bytes(&self, n_tok: usize) -> Option<u64> {
        (**self).last_step_weight_bytes(n_tok)
    }
    fn tensor_flops(&self) -> Option<f64> {
        (**self).tensor_flops()
    }
    fn measure_copy_bandwidth(&mut self) -> Option<f64> {
        (**self).measure_copy_bandwidth()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::CudaError;
    use cudarc::driver::result::DriverError;
    use cudarc::driver::sys::CUresult;

    fn driver(code: CUresult) -> BackendError {
        CudaError::Driver { what: "launching rmsnorm".into(), source: DriverError(code) }.into()
    }

    #[test]
    fn device_errors_keep_their_kind_and_cause() {
        let e = driver(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        assert!(e.is_out_of_memory(), "{e}");
        assert!(std::error::Error::source(&e).is_some(), "the driver error is kept as the cause");
        assert!(matches!(driver(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS), BackendError::Launch { .. }));
        assert!(matches!(driver(CUresult::CUDA_ERROR_INVALID_VALUE), BackendError::Driver { .. }));
        let plan: BackendError = CudaError::OutOfMemory("weights 9 GB + KV 2 GB > 8 GB".into()).into();
        assert!(plan.is_out_of_memory() && plan.to_string().contains("weights 9 GB"), "{plan}");
        let c: BackendError = CudaError::Compile {
            file: "rope".into(),
            arch: "compute_70".into(),
            log: "rope.cu(3): error: identifier \"x\" is undefined".into(),
        }
        .into();
        assert!(matches!(c, BackendError::Compile { .. }));
        assert!(c.to_string().contains("NVRTC log") && c.to_string().contains("identifier \"x\""), "{c}");
        let s: BackendError = CudaError::Shape { kernel: "gemv", reason: "rows 3 != 4".into() }.into();
        assert!(matches!(s, BackendError::Plan(_)), "{s}");
        // The rest keep the CUDA error itself: a caller can still tell a missing library.
        let d: BackendError = CudaError::NvrtcMissing.into();
        let BackendError::Device(cause) = &d else { panic!("{d:?}") };
        assert!(matches!(cause.downcast_ref::<CudaError>(), Some(CudaError::NvrtcMissing)), "{d}");
        assert!(d.to_string().contains("no NVRTC library could be loaded"), "{d}");
    }
}
