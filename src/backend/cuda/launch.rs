//! Kernel launchers. Each op is a struct of its arguments (device pointers with their lengths,
//! shapes); `launch` checks the shapes against the buffers, picks the grid and launches. The
//! `#[repr(C)]` params structs mirror the ones in `kernels/*.cu` field for field (pointers as
//! u64 first, then 32-bit scalars), and are passed by value as the kernel's one argument.

use std::marker::PhantomData;

use cudarc::cublas::sys as cublas_sys;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};

use super::kernels::Kernels;
use super::CudaError;

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

/// Extent of a strided matrix: the last row starts at (rows - 1) * stride and is `width` long.
pub(crate) fn extent(rows: usize, stride: usize, width: usize) -> usize {
    if rows == 0 {
        0
    } else {
        (rows - 1) * stride + width
    }
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
    // SAFETY: `params` mirrors the kernel's params struct (see the #[repr(C)] definitions below);
    // every pointer in it was shape-checked by the caller against the buffer it points into.
    unsafe { stream.launch_builder(f).arg(params).launch(cfg) }
        .map(|_| ())
        .map_err(CudaError::driver(format!("launching {entry}")))
}

pub(crate) fn blocks_for(kernel: &'static str, n: usize, per_block: usize) -> Result<u32, CudaError> {
    u32::try_from(n.div_ceil(per_block).max(1))
        .map_err(|_| CudaError::Shape { kernel, reason: format!("{n} elements exceed the grid") })
}

// ---------------------------------------------------------------- rmsnorm.cu
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct RmsNormParams {
    x: u64,
    w: u64,
    out: u64,
    rows: u64,
    n_outer: i32,
    n_inner: i32,
    dim: i32,
    in_stride: i32,
    out_stride: i32,
    eps: f32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for RmsNormParams {}

/// RMSNorm of `n_outer x n_inner` rows of width `dim`; row (o, i) starts at
/// `src(o) * in_stride + i * dim` where `src(o) = rows[o]` when `rows` is given (a gather of
/// `n_src_rows` candidate rows) else `o`. Output rows at `o * out_stride + i * dim`.
pub struct RmsNorm {
    pub x: Dev<f32>,
    pub w: Dev<f32>,
    pub out: Dev<f32>,
    pub rows: Option<Dev<i32>>,
    pub n_src_rows: usize,
    pub n_outer: usize,
    pub n_inner: usize,
    pub dim: usize,
    pub in_stride: usize,
    pub out_stride: usize,
    pub eps: f32,
}

impl RmsNorm {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "rmsnorm_f32";
        let width = self.n_inner * self.dim;
        check(K, width <= self.in_stride && width <= self.out_stride, || "rows overlap their stride".into())?;
        need(K, "weight", self.w, self.dim)?;
        let src_rows = if self.rows.is_some() { self.n_src_rows } else { self.n_outer };
        need(K, "input", self.x, extent(src_rows, self.in_stride, width))?;
        need(K, "output", self.out, extent(self.n_outer, self.out_stride, width))?;
        if let Some(r) = self.rows {
            need(K, "row list", r, self.n_outer)?;
        }
        let n_rows = self.n_outer * self.n_inner;
        if n_rows == 0 {
            return Ok(());
        }
        let p = RmsNormParams {
            x: self.x.ptr,
            w: self.w.ptr,
            out: self.out.ptr,
            rows: self.rows.map_or(0, |r| r.ptr),
            n_outer: i32_of(K, self.n_outer)?,
            n_inner: i32_of(K, self.n_inner)?,
            dim: i32_of(K, self.dim)?,
            in_stride: i32_of(K, self.in_stride)?,
            out_stride: i32_of(K, self.out_stride)?,
            eps: self.eps,
        };
        let block = (self.dim.div_ceil(32) * 32).clamp(32, 256) as u32;
        launch(k, s, K, (blocks_for(K, n_rows, 1)?, 1, 1), block, 0, &p)
    }
}

// ---------------------------------------------------------------- rope.cu
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct RopeParams {
    x: u64,
    pos: u64,
    cos_t: u64,
    sin_t: u64,
    n_tok: i32,
    n_heads: i32,
    head_dim: i32,
    stride: i32,
    style: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for RopeParams {}

/// In-place RoPE of `n_heads` heads per token (`x[t * stride + h * head_dim ..]`), positions
/// `pos[t] < max_pos`, tables `[max_pos, head_dim / 2]`. `halves`: pairs (i, i + d/2).
pub struct Rope {
    pub x: Dev<f32>,
    pub pos: Dev<i32>,
    pub cos: Dev<f32>,
    pub sin: Dev<f32>,
    pub max_pos: usize,
    pub n_tok: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    pub stride: usize,
    pub halves: bool,
}

impl Rope {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "rope_f32";
        check(K, self.head_dim.is_multiple_of(2), || format!("head size {} is odd", self.head_dim))?;
        check(K, self.n_heads * self.head_dim <= self.stride, || "heads overlap the row stride".into())?;
        need(K, "x", self.x, extent(self.n_tok, self.stride, self.n_heads * self.head_dim))?;
        need(K, "positions", self.pos, self.n_tok)?;
        need(K, "cos table", self.cos, self.max_pos * self.head_dim / 2)?;
        need(K, "sin table", self.sin, self.max_pos * self.head_dim / 2)?;
        let total = self.n_tok * self.n_heads * self.head_dim / 2;
        if total == 0 {
            return Ok(());
        }
        let p = RopeParams {
            x: self.x.ptr,
            pos: self.pos.ptr,
            cos_t: self.cos.ptr,
            sin_t: self.sin.ptr,
            n_tok: i32_of(K, self.n_tok)?,
            n_heads: i32_of(K, self.n_heads)?,
            head_dim: i32_of(K, self.head_dim)?,
            stride: i32_of(K, self.stride)?,
            style: i32::from(self.halves),
        };
        launch(k, s, K, (blocks_for(K, total, 256)?, 1, 1), 256, 0, &p)
    }
}

// ---------------------------------------------------------------- gemv_f16.cu
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct GemvParams {
    w: u64,
    x: u64,
    out: u64,
    bias: u64,
    rows: i32,
    cols: i32,
    n_tok: i32,
    x_stride: i32,
    out_stride: i32,
    accumulate: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for GemvParams {}

/// Most tokens one GEMV launch serves (each weight read once for all of them).
pub const GEMV_MAX_TOKENS: usize = 8;
/// Threads of a GEMV block and the rows it computes (kernels/gemv_f16.cu: GEMV_THREADS,
/// GEMV_ROWS): its 8 warps split the columns.
pub(crate) const GEMV_THREADS: usize = 256;
pub(crate) const GEMV_ROWS: usize = 2;

/// `out[t, r] (+)= sum_c w[r, c] x[t, c] (+ bias[r])` for `n_tok <= 8` tokens; `w` F16
/// `[rows, cols]`, `x` f32 `[n_tok, x_stride]`, `out` f32 `[n_tok, out_stride]`.
pub struct Gemv {
    pub w: Dev<u16>,
    pub x: Dev<f32>,
    pub out: Dev<f32>,
    pub bias: Option<Dev<f32>>,
    pub rows: usize,
    pub cols: usize,
    pub n_tok: usize,
    pub x_stride: usize,
    pub out_stride: usize,
    pub accumulate: bool,
}

impl Gemv {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "gemv_f16";
        check(K, self.n_tok >= 1 && self.n_tok <= GEMV_MAX_TOKENS, || {
            format!("{} tokens (1..=8 allowed)", self.n_tok)
        })?;
        check(K, self.cols.is_multiple_of(8) && self.x_stride.is_multiple_of(4), || {
            format!(
                "cols {} must be a multiple of 8 and the input stride {} of 4 (16-byte loads)",
                self.cols, self.x_stride
            )
        })?;
        check(K, self.w.ptr.is_multiple_of(16) && self.x.ptr.is_multiple_of(16), || {
            "weights and input must be 16-byte aligned".into()
        })?;
        check(K, self.cols <= self.x_stride && self.rows <= self.out_stride, || "rows overlap their stride".into())?;
        need(K, "weights", self.w, self.rows * self.cols)?;
        need(K, "input", self.x, extent(self.n_tok, self.x_stride, self.cols))?;
        need(K, "output", self.out, extent(self.n_tok, self.out_stride, self.rows))?;
        if let Some(b) = self.bias {
            need(K, "bias", b, self.rows)?;
        }
        // One token: 2, 4 or 8 rows a block (`DUSTOFF_GEMV_ROWS`).
        let (entry, rows_per_block) = match (self.n_tok, super::tuning::tuning().gemv_rows) {
            (1, 4) => ("gemv_f16_n1_r4", 4),
            (1, 8) => ("gemv_f16_n1_r8", 8),
            (1, _) => ("gemv_f16_n1", GEMV_ROWS),
            (2, _) => ("gemv_f16_n2", GEMV_ROWS),
            (3 | 4, _) => ("gemv_f16_n4", GEMV_ROWS),
            _ => ("gemv_f16_n8", GEMV_ROWS),
        };
        let p = GemvParams {
            w: self.w.ptr,
            x: self.x.ptr,
            out: self.out.ptr,
            bias: self.bias.map_or(0, |b| b.ptr),
            rows: i32_of(K, self.rows)?,
            cols: i32_of(K, self.cols)?,
            n_tok: self.n_tok as i32,
            x_stride: i32_of(K, self.x_stride)?,
            out_stride: i32_of(K, self.out_stride)?,
            accumulate: i32::from(self.accumulate),
        };
        launch(k, s, entry, (blocks_for(K, self.rows, rows_per_block)?, 1, 1), GEMV_THREADS as u32, 0, &p)
    }
}

// ---------------------------------------------------------------- cuBLAS GEMM (prefill)
/// `out[t, r] (+)= sum_c w[r, c] x[t, c]` through cuBLAS: `w` F16 `[rows, cols]`, `x` F16
/// `[n_tok, cols]` (contiguous), `out` f32 `[n_tok, out_stride]`; f32 accumulation.
pub struct Gemm {
    pub w: Dev<u16>,
    pub x: Dev<u16>,
    pub out: Dev<f32>,
    pub rows: usize,
    pub cols: usize,
    pub n_tok: usize,
    pub out_stride: usize,
    pub accumulate: bool,
}

impl Gemm {
    pub fn launch(&self, blas: &CudaBlas) -> Result<(), CudaError> {
        const K: &str = "cublas_gemm_f16";
        need(K, "weights", self.w, self.rows * self.cols)?;
        need(K, "input", self.x, self.n_tok * self.cols)?;
        need(K, "output", self.out, extent(self.n_tok, self.out_stride, self.rows))?;
        check(K, self.rows <= self.out_stride, || "rows overlap their stride".into())?;
        if self.n_tok == 0 || self.rows == 0 {
            return Ok(());
        }
        let (alpha, beta) = (1.0f32, if self.accumulate { 1.0f32 } else { 0.0 });
        // Column-major view: out^T [rows, n_tok] = (w^T)^T [rows, cols] x x^T [cols, n_tok].
        // SAFETY: the three pointers were checked to cover the extents cuBLAS touches (lda = ldb
        // = cols, ldc = out_stride); alpha/beta live on the host for the call's duration.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                cublas_sys::cublasOperation_t::CUBLAS_OP_T,
                cublas_sys::cublasOperation_t::CUBLAS_OP_N,
                i32_of(K, self.rows)?,
                i32_of(K, self.n_tok)?,
                i32_of(K, self.cols)?,
                &alpha as *const f32 as *const _,
                self.w.ptr as *const _,
                cublas_sys::cudaDataType_t::CUDA_R_16F,
                i32_of(K, self.cols)?,
                self.x.ptr as *const _,
                cublas_sys::cudaDataType_t::CUDA_R_16F,
                i32_of(K, self.cols)?,
                &beta as *const f32 as *const _,
                self.out.ptr as *mut _,
                cublas_sys::cudaDataType_t::CUDA_R_32F,
                i32_of(K, self.out_stride)?,
                cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|source| CudaError::Cublas {
            what: format!("GEMM [{}x{}] x [{}x{}]", self.rows, self.cols, self.cols, self.n_tok),
            source,
        })
    }
}

// ---------------------------------------------------------------- embedding.cu
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct EmbeddingParams {
    table: u64,
    ids: u64,
    out: u64,
    n_tok: i32,
    dim: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for EmbeddingParams {}

/// `out[t] = table[ids[t]]` widened to f32; ids must be `< vocab` (checked on the host).
pub struct Embedding {
    pub table: Dev<u16>,
    pub ids: Dev<u32>,
    pub out: Dev<f32>,
    pub vocab: usize,
    pub n_tok: usize,
    pub dim: usize,
}

impl Embedding {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "embedding_f16";
        need(K, "table", self.table, self.vocab * self.dim)?;
        need(K, "ids", self.ids, self.n_tok)?;
        need(K, "output", self.out, self.n_tok * self.dim)?;
        if self.n_tok == 0 {
            return Ok(());
        }
        let p = EmbeddingParams {
            table: self.table.ptr,
            ids: self.ids.ptr,
            out: self.out.ptr,
            n_tok: i32_of(K, self.n_tok)?,
            dim: i32_of(K, self.dim)?,
        };
        launch(k, s, K, (blocks_for(K, self.n_tok, 1)?, 1, 1), 256, 0, &p)
    }
}

// ---------------------------------------------------------------- silu_mul.cu
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct SiluMulParams {
    gu: u64,
    out: u64,
    n_tok: i32,
    ffn: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for SiluMulParams {}

/// `out[t, i] = silu(gu[t, i]) * gu[t, ffn + i]`; `gu` `[n_tok, 2 ffn]`, `out` `[n_tok, ffn]`.
pub struct SiluMul {
    pub gu: Dev<f32>,
    pub out: Dev<f32>,
    pub n_tok: usize,
    pub ffn: usize,
}

impl SiluMul {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "silu_mul_f32";
        need(K, "gate/up", self.gu, self.n_tok * 2 * self.ffn)?;
        need(K, "output", self.out, self.n_tok * self.ffn)?;
        let n = self.n_tok * self.ffn;
        if n == 0 {
            return Ok(());
        }
        let p = SiluMulParams {
            gu: self.gu.ptr,
            out: self.out.ptr,
            n_tok: i32_of(K, self.n_tok)?,
            ffn: i32_of(K, self.ffn)?,
        };
        launch(k, s, K, (blocks_for(K, n, 256)?, 1, 1), 256, 0, &p)
    }
}

// ---------------------------------------------------------------- add.cu
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct BiasAddParams {
    x: u64,
    b: u64,
    n_tok: i32,
    n: i32,
    stride: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for BiasAddParams {}

/// `x[t, i] += b[i]` for `i < n`, rows `stride` apart.
pub struct BiasAdd {
    pub x: Dev<f32>,
    pub b: Dev<f32>,
    pub n_tok: usize,
    pub n: usize,
    pub stride: usize,
}

impl BiasAdd {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "bias_add_f32";
        check(K, self.n <= self.stride, || "rows overlap their stride".into())?;
        need(K, "x", self.x, extent(self.n_tok, self.stride, self.n))?;
        need(K, "bias", self.b, self.n)?;
        let total = self.n_tok * self.n;
        if total == 0 {
            return Ok(());
        }
        let p = BiasAddParams {
            x: self.x.ptr,
            b: self.b.ptr,
            n_tok: i32_of(K, self.n_tok)?,
            n: i32_of(K, self.n)?,
            stride: i32_of(K, self.stride)?,
        };
        launch(k, s, K, (blocks_for(K, total, 256)?, 1, 1), 256, 0, &p)
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ArgmaxParams {
    x: u64,
    out: u64,
    rows: i32,
    n: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for ArgmaxParams {}

/// `out[r] = argmax(x[r, ..n])` for each of `rows` rows (kernels/argmax.cu; the host twin is
/// `engine::sampler::argmax`).
pub struct ArgmaxRows {
    pub x: Dev<f32>,
    pub out: Dev<i32>,
    pub rows: usize,
    pub n: usize,
}

impl ArgmaxRows {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "argmax_rows_f32";
        need(K, "logits", self.x, self.rows * self.n)?;
        need(K, "output", self.out, self.rows)?;
        if self.rows == 0 {
            return Ok(());
        }
        let rows = i32_of(K, self.rows)?;
        let p = ArgmaxParams { x: self.x.ptr, out: self.out.ptr, rows, n: i32_of(K, self.n)? };
        launch(k, s, K, (rows as u32, 1, 1), 1024, 0, &p)
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct CastParams {
    x: u64,
    out: u64,
    n: i64,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for CastParams {}

/// `out[i] = f16(x[i])`, saturated at +-65504 (the input of cuBLAS GEMMs).
pub struct CastF16 {
    pub x: Dev<f32>,
    pub out: Dev<u16>,
    pub n: usize,
}

impl CastF16 {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "cast_f32_f16";
        need(K, "input", self.x, self.n)?;
        need(K, "output", self.out, self.n)?;
        if self.n == 0 {
            return Ok(());
        }
        let p = CastParams { x: self.x.ptr, out: self.out.ptr, n: self.n as i64 };
        launch(k, s, K, (blocks_for(K, self.n, 256)?, 1, 1), 256, 0, &p)
    }
}

// ---------------------------------------------------------------- kv_cache.cu
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct KvStoreParams {
    qkv: u64,
    k_cache: u64,
    v_cache: u64,
    slots: u64,
    n_tok: i32,
    kv_dim: i32,
    stride: i32,
    k_off: i32,
    v_off: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for KvStoreParams {}

/// Stores K (`qkv[t, k_off..k_off + kv_dim]`) and V (at `v_off`) of each token into the F16
/// cache `[n_slots, kv_dim]` at `slots[t] < n_slots` (checked on the host).
pub struct KvStore {
    pub qkv: Dev<f32>,
    pub k_cache: Dev<u16>,
    pub v_cache: Dev<u16>,
    pub slots: Dev<i32>,
    pub n_slots: usize,
    pub n_tok: usize,
    pub kv_dim: usize,
    pub stride: usize,
    pub k_off: usize,
    pub v_off: usize,
}

impl KvStore {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "kv_store_f16";
        check(K, self.k_off.max(self.v_off) + self.kv_dim <= self.stride, || {
            "K/V columns beyond the row stride".into()
        })?;
        need(K, "qkv", self.qkv, extent(self.n_tok, self.stride, self.k_off.max(self.v_off) + self.kv_dim))?;
        need(K, "K cache", self.k_cache, self.n_slots * self.kv_dim)?;
        need(K, "V cache", self.v_cache, self.n_slots * self.kv_dim)?;
        need(K, "slots", self.slots, self.n_tok)?;
        let total = self.n_tok * self.kv_dim;
        if total == 0 {
            return Ok(());
        }
        let p = KvStoreParams {
            qkv: self.qkv.ptr,
            k_cache: self.k_cache.ptr,
            v_cache: self.v_cache.ptr,
            slots: self.slots.ptr,
            n_tok: i32_of(K, self.n_tok)?,
            kv_dim: i32_of(K, self.kv_dim)?,
            stride: i32_of(K, self.stride)?,
            k_off: i32_of(K, self.k_off)?,
            v_off: i32_of(K, self.v_off)?,
        };
        launch(k, s, K, (blocks_for(K, total, 256)?, 1, 1), 256, 0, &p)
    }
}

pub use super::attention::{attn_split_len, attn_splits, decode_split_len, Attention, Merge, PagedAttn, SharedPrefix};
