//! A CUDA backend's place in a tensor-parallel group (`tensor_parallel`): its rank, and the
//! all-reduce that sums the ranks' partial outputs after each block's attention output and FFN
//! down projections (the layer walker, `layers/`).
//!
//! Two reductions: NCCL on the rank's stream (ranks on distinct GPUs; or one rank alone when asked for, where
//! the sum of one is a real NCCL call that changes nothing), and host-staged (download, sum in
//! rank order in host memory, upload) for ranks that share one GPU, where NCCL refuses to run
//! (two ranks on one device): a slow path that tests the split itself on a single GPU.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::nccl::NcclComm;
use crate::backend::allreduce::HostAllReduce;
use crate::backend::cuda::ops::launch::Dev;
use crate::backend::cuda::CudaError;

pub enum Reduce {
    Nccl(NcclComm),
    Host(Arc<HostAllReduce>),
}

impl Reduce {
    pub fn name(&self) -> &'static str {
        match self {
            Reduce::Nccl(_) => "NCCL",
            Reduce::Host(_) => "host-staged",
        }
    }
}

pub struct CudaRank {
    pub rank: usize,
    pub n: usize,
    pub reduce: Reduce,
    /// Host staging of `x` for the host-staged reduction, `[n_tok, dim]`.
    host: Vec<f32>,
}

impl CudaRank {
    pub fn new(rank: usize, n: usize, reduce: Reduce) -> Self {
        CudaRank { rank, n, reduce, host: Vec::new() }
    }

    /// Whether this rank adds the residual into its partial product (rank 0: so that the sum
    /// over ranks counts the residual once; the others write their partial product alone).
    pub fn adds_residual(&self) -> bool {
        self.rank == 0
    }

    /// `x` (`[n_tok, dim]` f32, the first `len` elements) becomes the sum over the ranks.
    pub fn all_reduce(&mut self, x: Dev<f32>, len: usize, s: &CudaStream) -> Result<(), CudaError> {
        match &self.reduce {
            Reduce::Nccl(c) => c.all_reduce_sum(x.ptr, len, s),
            Reduce::Host(h) => {
                self.host.resize(len, 0.0);
                let failed = |what: &'static str| move |e| CudaError::Driver { what: what.into(), source: e };
                // SAFETY: `x` holds at least `len` f32 on this stream's device; the host buffer
                // has `len` elements and is not touched until the stream is synchronized.
                unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut self.host[..], x.ptr, s.cu_stream()) }
                    .map_err(failed("tensor parallel: downloading the partial output"))?;
                s.synchronize().map_err(failed("tensor parallel: waiting for the partial output"))?;
                h.reduce(self.rank, &mut self.host).map_err(|e| CudaError::Nccl(e.to_string()))?;
                // SAFETY: as above, the other way; synchronized before the buffer is reused.
                unsafe { cudarc::driver::result::memcpy_htod_async(x.ptr, &self.host[..], s.cu_stream()) }
                    .map_err(failed("tensor parallel: uploading the sum"))?;
                s.synchronize().map_err(failed("tensor parallel: waiting for the upload"))
            }
        }
    }
}
