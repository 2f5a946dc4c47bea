//! One CUDA device: its context, the single stream every kernel runs on, its identity, and the
//! upload and allocation helpers on that stream that every part of the backend uses.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};

use super::CudaError;

/// `v` copied to a new device buffer.
pub(super) fn up<T: DeviceRepr>(s: &Arc<CudaStream>, v: &[T], what: &str) -> Result<CudaSlice<T>, CudaError> {
    s.clone_htod(v).map_err(CudaError::driver(format!("uploading {what}")))
}

/// A zeroed device buffer of `n` elements (at least one: cudarc refuses empty allocations).
pub(super) fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    s: &Arc<CudaStream>,
    n: usize,
    what: &str,
) -> Result<CudaSlice<T>, CudaError> {
    s.alloc_zeros(n.max(1)).map_err(CudaError::driver(format!("allocating {what} ({n} elements)")))
}

/// Whether the CUDA driver library can be loaded (checked once; cudarc would panic on a
/// missing one).
pub fn driver_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the candidate library names; no driver function is called.
    *PRESENT.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() })
}

/// Number of CUDA devices; 0 where there is no driver or it fails to initialize.
pub fn device_count() -> usize {
    if !driver_available() {
        return 0;
    }
    cudarc::driver::result::init()
        .and_then(|_| cudarc::driver::result::device::get_count())
        .map(|n| n.max(0) as usize)
        .unwrap_or(0)
}

/// The oldest driver dustoff runs on: CUDA 11.2 (R460). cudarc's context creation reads the
/// memory-pool attribute, which CUDA 11.2 introduced (an older driver answers "invalid value").
/// docs/COMPATIBILITY.md lists every driver entry point and the CUDA release that has it.
pub const MIN_DRIVER: (i32, i32) = (11, 2);

/// What `doctor` and the README say about drivers.
pub const SUPPORTED_DRIVERS: &str = "CUDA 11.2 (R460) or newer: the compute_70 PTX declares ISA 7.0 (CUDA 11.0); \
decode-step graph replay needs CUDA 11.4 (R470; cuGraphInstantiateWithFlags) and is off below it";

/// The driver entry point that graph replay needs beyond [`MIN_DRIVER`] (CUDA 11.4).
pub const GRAPH_ENTRY: &str = "cuGraphInstantiateWithFlags";

/// Whether the loaded driver exports `symbol`. cudarc resolves a driver function at its first
/// call and panics when the driver lacks it, so an entry point newer than [`MIN_DRIVER`] is
/// asked for here first.
pub fn driver_has(symbol: &str) -> bool {
    if !driver_available() {
        return false;
    }
    // SAFETY: the library is present (checked above); looking a symbol up runs no code.
    unsafe { cudarc::driver::sys::culib().get::<*const std::ffi::c_void>(symbol.as_bytes()).is_ok() }
}

pub struct CudaDevice {
    pub ordinal: usize,
    pub ctx: Arc<CudaContext>,
    /// The one stream everything runs on, in order. A created stream (not the legacy default
    /// stream) so that the decode step can be captured as a CUDA graph.
    pub stream: Arc<CudaStream>,
    pub name: String,
    /// Compute capability (major, minor).
    pub cc: (i32, i32),
}

/// `compute_XY` for a compute capability.
pub fn arch_for(cc: (i32, i32)) -> String {
    format!("compute_{}{}", cc.0, cc.1)
}

/// The driver's CUDA version (`(12, 8)` for 12.8), `None` without a driver.
pub fn driver_version() -> Option<(i32, i32)> {
    if !driver_available() {
        return None;
    }
    let mut v: std::ffi::c_int = 0;
    // SAFETY: the driver library is present (checked above); cuDriverGetVersion writes one int
    // and needs no initialization.
    let rc = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    (rc == cudarc::driver::sys::CUresult::CUDA_SUCCESS && v > 0).then_some((v / 1000, (v % 1000) / 10))
}

impl CudaDevice {
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        if !driver_available() {
            return Err(CudaError::DriverMissing);
        }
        if let Some(v) = driver_version().filter(|v| *v < MIN_DRIVER) {
            return Err(CudaError::DriverTooOld { have: v, need: MIN_DRIVER });
        }
        let ctx = CudaContext::new(ordinal).map_err(CudaError::driver(format!("opening device cuda:{ordinal}")))?;
        // SAFETY: one stream is used for all work, so cudarc's cross-stream event tracking is not
        // needed; disabling it before any allocation keeps kernel launches free of event records
        // (which stream capture into a graph would not accept).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(CudaError::driver("creating a stream"))?;
        let name = ctx.name().map_err(CudaError::driver("reading the device name"))?;
        let cc = ctx.compute_capability().map_err(CudaError::driver("reading the compute capability"))?;
        Ok(CudaDevice { ordinal, ctx, stream, name, cc })
    }

    /// The NVRTC architecture of this device (`compute_90` on an H200).
    pub fn arch(&self) -> String {
        arch_for(self.cc)
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), CudaError> {
        self.ctx.mem_get_info().map_err(CudaError::driver("reading free memory"))
    }

    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream.synchronize().map_err(CudaError::driver("synchronizing the stream"))
    }

    pub fn describe(&self) -> String {
        format!("cuda:{} {} (compute {}.{})", self.ordinal, self.name, self.cc.0, self.cc.1)
    }
}

impl CudaDevice {
    /// Device-to-device copy bandwidth in bytes (read + written) per second: the median of
    /// `reps` copies of `bytes`, timed with events after one warm-up copy.
    pub fn copy_bandwidth(&self, bytes: usize, reps: usize) -> Result<f64, CudaError> {
        let n = (bytes / 4).max(1);
        let src = self.stream.alloc_zeros::<u32>(n).map_err(CudaError::driver("allocating the copy source"))?;
        let mut dst = self.stream.alloc_zeros::<u32>(n).map_err(CudaError::driver("allocating the copy target"))?;
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(timing).map_err(CudaError::driver("creating an event"))?;
        let end = self.ctx.new_event(timing).map_err(CudaError::driver("creating an event"))?;
        let copy = |dst: &mut cudarc::driver::CudaSlice<u32>| {
            self.stream.memcpy_dtod(&src, dst).map_err(CudaError::driver("copying device memory"))
        };
        copy(&mut dst)?;
        let mut times = Vec::with_capacity(reps.max(1));
        for _ in 0..reps.max(1) {
            start.record(&self.stream).map_err(CudaError::driver("recording an event"))?;
            copy(&mut dst)?;
            end.record(&self.stream).map_err(CudaError::driver("recording an event"))?;
            times.push(start.elapsed_ms(&end).map_err(CudaError::driver("timing the copy"))?);
        }
        times.sort_by(f32::total_cmp);
        let median_s = times[times.len() / 2] as f64 / 1e3;
        Ok(2.0 * (n * 4) as f64 / median_s)
    }
}

/// `DUSTOFF_MEMORY_LOG=1`: one line on stderr per device allocation that goes through here
/// (step buffers, the widening scratch) and at the backend's milestones: what, its bytes, and
/// the device memory in use after it (total - free, what the bench's peak reads).
pub(super) fn log_memory(s: &CudaStream, what: &str, bytes: usize) {
    if !super::tuning::tuning().memory_log {
        return;
    }
    if let Ok((free, total)) = s.context().mem_get_info() {
        let used = total.saturating_sub(free) as f64 / 1e9;
        eprintln!("memory: {what:32} {:9.1} MB, in use {used:.3} GB", bytes as f64 / 1e6);
    }
}

/// Dense F16 tensor-core FLOP/s of a device by name and compute capability, from the vendors'
/// data sheets (no sparsity): V100 SXM2 125e12 (PCIe 112e12), A100 312e12, H100/H200 SXM
/// 989e12 (H100 PCIe 756e12); `None` for others (a bound then has no FLOP side).
pub fn tensor_flops(name: &str, cc: (i32, i32)) -> Option<f64> {
    let pcie = name.to_ascii_uppercase().contains("PCIE");
    match cc {
        (7, 0) if name.contains("V100") => Some(if pcie { 112e12 } else { 125e12 }),
        (8, 0) if name.contains("A100") => Some(312e12),
        (9, 0) if name.contains("H200") => Some(989e12),
        (9, 0) if name.contains("H100") => Some(if pcie { 756e12 } else { 989e12 }),
        _ => None,
    }
}
