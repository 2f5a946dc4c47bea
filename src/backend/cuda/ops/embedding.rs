//! Launchers of `kernels/embedding.cu`: the F16 embedding gather and the GPU weight filler
//! (random synthetic weights made on the device).

use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::kernels::Kernels;
use super::super::CudaError;
use super::launch::{blocks_for, i32_of, launch, need, Dev};

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

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct FillParams {
    out: u64,
    n: i64,
    seed: u64,
    scale: f32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct (trailing padding included).
unsafe impl DeviceRepr for FillParams {}

/// `out[i] = f16(uniform(-scale, scale))` from a hash of `(seed, i)`: random weights made on
/// the GPU, so a synthetic 8B model needs no 16 GB host buffer.
pub struct FillUniform {
    pub out: Dev<u16>,
    pub seed: u64,
    pub scale: f32,
}

impl FillUniform {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "fill_uniform_f16";
        if self.out.len == 0 {
            return Ok(());
        }
        let p = FillParams { out: self.out.ptr, n: self.out.len as i64, seed: self.seed, scale: self.scale };
        let blocks = blocks_for(K, self.out.len, 256)?.min(65_535 * 8);
        launch(k, s, K, (blocks, 1, 1), 256, 0, &p)
    }
}
