//! NCCL through cudarc, loaded at run time (`dynamic-loading`): a machine without libnccl still
//! runs single-GPU; only tensor parallel over several GPUs needs it. cudarc panics when a call
//! finds no library, so every entry here probes for it first and returns
//! [`CudaError::Nccl`] instead.

use cudarc::driver::CudaStream;
use cudarc::nccl::{result, sys};

use crate::backend::cuda::CudaError;

/// Whether libnccl can be loaded, and its version (`2.21.5`) when it can.
pub fn nccl_version() -> Result<String, CudaError> {
    probe()?;
    let v = result::get_nccl_version().map_err(|e| CudaError::Nccl(format!("ncclGetVersion: {e:?} ({:?})", e.0)))?;
    // NCCL >= 2.9 encodes the version as major * 10000 + minor * 100 + patch.
    Ok(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
}

fn probe() -> Result<(), CudaError> {
    // SAFETY: only tries to dlopen cudarc's candidate names (libnccl.so, ...); later calls
    // would panic without one.
    if unsafe { sys::is_culib_present() } {
        return Ok(());
    }
    // The runtime package (libnccl2) installs only libnccl.so.2; cudarc looks for libnccl.so,
    // which comes with the development package or a link.
    // SAFETY: dlopen of NCCL's own library name; nothing from it is called.
    let runtime_only = unsafe { libloading::Library::new("libnccl.so.2") }.is_ok();
    Err(CudaError::Nccl(if runtime_only {
        "libnccl.so.2 is installed but not its libnccl.so link, the name dustoff loads: install libnccl-dev, or \
         link it (ln -s libnccl.so.2 libnccl.so in a folder on LD_LIBRARY_PATH)"
            .into()
    } else {
        "the NCCL library (libnccl.so) could not be loaded: install NCCL (libnccl2 and its libnccl.so link) \
         for tensor parallel over several GPUs"
            .into()
    }))
}

fn nccl_err(what: &str) -> impl Fn(result::NcclError) -> CudaError + '_ {
    move |e| CudaError::Nccl(format!("{what}: {:?}", e.0))
}

/// The id every rank of one group joins with (made once, by the process that starts them).
pub fn unique_id() -> Result<sys::ncclUniqueId, CudaError> {
    probe()?;
    result::get_uniqueid().map_err(nccl_err("ncclGetUniqueId"))
}

/// One rank's NCCL communicator on the CUDA context current on this thread.
pub struct NcclComm {
    comm: sys::ncclComm_t,
}

impl NcclComm {
    /// Joins group `id` as `rank` of `n`; blocks until all `n` ranks have joined (so the ranks
    /// must join from different threads at the same time).
    pub fn join(id: sys::ncclUniqueId, rank: usize, n: usize) -> Result<Self, CudaError> {
        probe()?;
        let mut comm = std::mem::MaybeUninit::uninit();
        let (n, r) = (n as i32, rank as i32);
        // SAFETY: `comm` is written by ncclCommInitRank on success and read only then.
        unsafe {
            result::comm_init_rank(comm.as_mut_ptr(), n, id, r).map_err(nccl_err("ncclCommInitRank"))?;
            Ok(NcclComm { comm: comm.assume_init() })
        }
    }

    /// In place: `len` f32 at device pointer `ptr` become the sum over the ranks, queued on
    /// `stream` (the rank's one stream, so it is ordered with the layer's kernels).
    pub fn all_reduce_sum(&self, ptr: u64, len: usize, stream: &CudaStream) -> Result<(), CudaError> {
        // SAFETY: `ptr` holds `len` f32 on this rank's device (the caller's work buffer), the
        // communicator is live, and the stream belongs to the same context.
        unsafe {
            result::all_reduce(
                ptr as *const _,
                ptr as *mut _,
                len,
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                stream.cu_stream() as _,
            )
        }
        .map(|_| ())
        .map_err(nccl_err("ncclAllReduce"))
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: the communicator was made by `join` and is destroyed once.
        let _ = unsafe { result::comm_destroy(self.comm) };
    }
}
