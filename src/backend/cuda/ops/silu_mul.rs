//! Launcher of `kernels/silu_mul.cu`: `silu(gate) * up` of a gate/up product.

use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::kernels::Kernels;
use super::super::CudaError;
use super::launch::{blocks_for, i32_of, launch, need, Dev};

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
