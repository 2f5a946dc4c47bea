//! Launcher of `kernels/rope.cu`: RoPE in place on f32 heads, from precomputed cos/sin
//! tables `[max_pos, head_dim / 2]`.

use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::kernels::Kernels;
use super::super::CudaError;
use super::launch::{blocks_for, check, extent, i32_of, launch, need, Dev};

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
