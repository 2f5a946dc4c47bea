//! Launchers of `kernels/argmax.cu`: the row arg-max of greedy decoding on the device and its
//! masked variant, which constrained decoding (`masked`) calls with the grammar's allow-bits.

use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::kernels::Kernels;
use super::super::CudaError;
use super::launch::{i32_of, launch, need, Dev};

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
struct MaskedArgmaxParams {
    x: u64,
    mask_of: u64,
    bits: u64,
    out: u64,
    rows: i32,
    n: i32,
    words: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for MaskedArgmaxParams {}

/// `out[r]` = the arg-max of `x[r, ..n]` over the tokens allowed by mask `mask_of[r]` of `bits`
/// (`[masks, words]`; `mask_of[r] == masks::NO_MASK`: every token), kernels/argmax.cu. The host
/// twin is `engine::sampler::masked_argmax` (and `argmax` for rows without a mask).
pub struct MaskedArgmaxRows {
    pub x: Dev<f32>,
    pub mask_of: Dev<u32>,
    pub bits: Dev<u32>,
    pub out: Dev<i32>,
    pub rows: usize,
    pub n: usize,
    pub words: usize,
}

impl MaskedArgmaxRows {
    /// `masks`: how many masks `bits` holds (mask indices must be below it; the kernel trusts them).
    pub fn launch(&self, masks: usize, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "argmax_masked_rows_f32";
        need(K, "logits", self.x, self.rows * self.n)?;
        need(K, "mask indices", self.mask_of, self.rows)?;
        need(K, "mask bits", self.bits, masks * self.words)?;
        need(K, "output", self.out, self.rows)?;
        if self.rows == 0 {
            return Ok(());
        }
        let p = MaskedArgmaxParams {
            x: self.x.ptr,
            mask_of: self.mask_of.ptr,
            bits: self.bits.ptr,
            out: self.out.ptr,
            rows: i32_of(K, self.rows)?,
            n: i32_of(K, self.n)?,
            words: i32_of(K, self.words)?,
        };
        launch(k, s, K, (self.rows as u32, 1, 1), 1024, 0, &p)
    }
}
