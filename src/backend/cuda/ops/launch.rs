//! What every kernel launcher shares: device pointers with their lengths (`Dev`), the shape
//! checks, the grid arithmetic and the one `launch` call.
//!
//! Layout: one Rust module per kernel file (`kernels/<file>.cu` -> `cuda/ops/<file>.rs`, e.g.
//! `gemv_f16.rs` launches both kernels of `gemv_f16.cu`), listed with its entry points in
//! `kernels::KERNEL_FILES`. Each op there is a struct of its arguments (device pointers with
//! their lengths, shapes); its `launch` checks the shapes against the buffers, picks the entry
//! and the grid, and launches. The `#[repr(C)]` params struct of a kernel file is declared once,
//! in that file's module, mirroring the one in the `.cu` field for field (pointers as u64
//! first, then 32-bit scalars); it is passed by value as the kernel's one argument.

use std::marker::PhantomData;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};

use super::super::compile::kernels::Kernels;
use super::super::CudaError;

/// A device pointer and the number of `T` elements behind it.
#[derive(Debug)]
pub struct Dev<T> {
    pub ptr: u64,
    pub len: usize,
    _t: PhantomData<T>,
}

impl<T> Clone for Dev<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Dev<T> {}

impl<T> Dev<T> {
    pub fn of(s: &CudaSlice<T>, stream: &CudaStream) -> Self {
        // Event tracking is off (one stream, see device.rs), so the guard records nothing.
        let (ptr, _guard) = s.device_ptr(stream);
        Dev { ptr, len: s.len(), _t: PhantomData }
    }

    /// The same memory seen as elements of another type of the same size (i32 step inputs
    /// read as u32 token ids).
    pub fn cast<U>(self) -> Dev<U> {
        assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<U>(), "Dev::cast between sizes");
        Dev { ptr: self.ptr, len: self.len, _t: PhantomData }
    }

    /// The same memory as bytes (a scratch reused for another element type).
    pub fn bytes(self) -> Dev<u8> {
        Dev { ptr: self.ptr, len: self.len * std::mem::size_of::<T>(), _t: PhantomData }
    }

    /// The elements from `n` on (an empty pointer when `n` is past the end; the shape checks
    /// then reject it).
    pub fn offset(self, n: usize) -> Self {
        let n = n.min(self.len);
        Dev { ptr: self.ptr + (n * std::mem::size_of::<T>()) as u64, len: self.len - n, _t: PhantomData }
    }
}

/// The view of a work buffer that is allocated on first use: an error naming the kernel family
/// and the buffer (`what`) while it is not.
pub(crate) fn allocated<T>(
    b: &Option<CudaSlice<T>>,
    s: &CudaStream,
    kernel: &'static str,
    what: &str,
) -> Result<Dev<T>, CudaError> {
    b.as_ref()
        .map(|b| Dev::of(b, s))
        .ok_or_else(|| CudaError::Shape { kernel, reason: format!("{what} not allocated") })
}

pub(crate) fn need<T>(kernel: &'static str, what: &str, d: Dev<T>, n: usize) -> Result<(), CudaError> {
    if d.len < n {
        return Err(CudaError::Shape { kernel, reason: format!("{what} holds {} elements, needs {n}", d.len) });
    }
    Ok(())
}

pub(crate) fn check(kernel: &'static str, ok: bool, reason: impl FnOnce() -> String) -> Result<(), CudaError> {
    if ok {
        Ok(())
    } else {
        Err(CudaError::Shape { kernel, reason: reason() })
    }
}

/// `n` (tokens, chunks, tiles: `what`) as the y or z extent of a grid, which holds at most
/// 65535 blocks.
pub(crate) fn grid_yz(kernel: &'static str, n: usize, what: &str) -> Result<u32, CudaError> {
    check(kernel, n <= 65_535, || format!("{n} {what} in one launch (at most 65535)"))?;
    Ok(n as u32)
}

/// Extent of a strided matrix: the last row starts at (rows - 1) * stride and is `width` long.
pub(crate) fn extent(rows: usize, stride: usize, width: usize) -> usize {
    if rows == 0 {
        0
    } else {
        (rows - 1) * stride + width
    }
}

/// The checks of a matrix product's result every product launcher makes: `out` holds `n_tok`
/// rows of `rows` values `out_stride` apart, and `bias` (where given) `[rows]`.
pub(crate) fn check_product_out<T>(
    kernel: &'static str,
    (out, out_stride): (Dev<T>, usize),
    bias: Option<Dev<f32>>,
    rows: usize,
    n_tok: usize,
) -> Result<(), CudaError> {
    need(kernel, "output", out, extent(n_tok, out_stride, rows))?;
    if let Some(b) = bias {
        need(kernel, "bias", b, rows)?;
    }
    Ok(())
}

pub(crate) fn i32_of(kernel: &'static str, v: usize) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| CudaError::Shape { kernel, reason: format!("{v} does not fit a 32-bit index") })
}

pub(crate) fn launch<P: DeviceRepr>(
    k: &mut Kernels,
    stream: &CudaStream,
    entry: &'static str,
    grid: (u32, u32, u32),
    block: u32,
    smem: u32,
    params: &P,
) -> Result<(), CudaError> {
    let f = k.get(entry)?;
    let cfg = LaunchConfig { grid_dim: grid, block_dim: (block, 1, 1), shared_mem_bytes: smem };
    // SAFETY: `params` mirrors the kernel's params struct (the #[repr(C)] definition in the
    // launcher module of its kernel file); every pointer in it was shape-checked by the caller
    // against the buffer it points into.
    unsafe { stream.launch_builder(f).arg(params).launch(cfg) }
        .map(|_| ())
        .map_err(CudaError::driver(format!("launching {entry}")))
}

pub(crate) fn blocks_for(kernel: &'static str, n: usize, per_block: usize) -> Result<u32, CudaError> {
    u32::try_from(n.div_ceil(per_block).max(1))
        .map_err(|_| CudaError::Shape { kernel, reason: format!("{n} elements exceed the grid") })
}

/// Most tokens one GEMV launch serves (each weight read once for all of them): the limit of
/// every GEMV family (F16, packed block formats, the norm-fused ones).
pub const GEMV_MAX_TOKENS: usize = 8;

/// The scales of an 8-bit paged KV cache (`--kv-cache q8`, kernels/common.cuh): K's and V's,
/// `[cache_rows, kv_dim / 32]` f16 each. A cache given with them holds int8 values (its
/// `Dev<u16>` spans half as many elements as it holds values); without them, F16 values.
#[derive(Clone, Copy, Debug)]
pub struct KvScales {
    pub k: Dev<u16>,
    pub v: Dev<u16>,
}

/// Checks K and V caches that hold `values` values each, F16 (`scales` None) or 8-bit; returns
/// the scale pointers of a params struct (0, 0 for F16).
pub(crate) fn need_kv(
    kernel: &'static str,
    (k, v): (Dev<u16>, Dev<u16>),
    scales: Option<KvScales>,
    values: usize,
) -> Result<(u64, u64), CudaError> {
    let group = crate::backend::kv_type::Q8_GROUP;
    match scales {
        None => {
            need(kernel, "K cache", k, values)?;
            need(kernel, "V cache", v, values)?;
            Ok((0, 0))
        }
        Some(s) => {
            check(kernel, values.is_multiple_of(group), || {
                format!("an 8-bit cache of {values} values (groups of {group})")
            })?;
            need(kernel, "K cache (8-bit, as half pairs)", k, values / 2)?;
            need(kernel, "V cache (8-bit, as half pairs)", v, values / 2)?;
            need(kernel, "K scales", s.k, values / group)?;
            need(kernel, "V scales", s.v, values / group)?;
            Ok((s.k.ptr, s.v.ptr))
        }
    }
}

/// Lets `entry` take `bytes` of dynamic shared memory (above 48 KB needs the opt-in; legal on
/// sm_70 up to 96 KB).
pub fn allow_smem(k: &mut Kernels, entry: &'static str, bytes: usize) -> Result<(), CudaError> {
    k.get(entry)?
        .set_attribute(
            cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
        .map_err(CudaError::driver(format!("allowing {bytes} bytes of shared memory for {entry}")))?;
    Ok(())
}
