//! Launchers of `kernels/add.cu`: bias add in place and the saturating f32 -> F16 cast.

use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::kernels::Kernels;
use super::super::CudaError;
use super::launch::{blocks_for, check, extent, i32_of, launch, need, Dev};

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
