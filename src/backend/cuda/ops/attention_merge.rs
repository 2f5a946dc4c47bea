//! Launcher of `kernels/attention_merge.cu`: the exact merge of split attention partials that
//! follows the decode kernels' splits (attention.rs) and the prefill kernel's split mode
//! (prefill.rs). Same conventions as `launch`.

use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::kernels::Kernels;
use super::super::CudaError;
use super::launch::{check, extent, grid_yz, i32_of, launch, need, Dev};

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct MergeParams {
    part_o: u64,
    part_ml: u64,
    out: u64,
    n_heads: i32,
    head_dim: i32,
    n_parts: i32,
    out_stride: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for MergeParams {}

/// `out[t, h] = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s` over the non-empty partials of
/// `part_o` `[n_tok, n_heads, n_parts, head_dim]` / `part_ml` `[n_tok, n_heads, n_parts, 2]`,
/// in partial order. The host guarantees that every partial was written and each token has a
/// non-empty one.
pub struct Merge {
    pub part_o: Dev<f32>,
    pub part_ml: Dev<f32>,
    pub out: Dev<f32>,
    pub n_tok: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    pub n_parts: usize,
    pub out_stride: usize,
}

impl Merge {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "attn_merge_f32";
        let (nh, hd) = (self.n_heads, self.head_dim);
        check(K, hd <= 256, || format!("head size {hd} (at most 256: two dimensions per thread)"))?;
        check(K, nh * hd <= self.out_stride, || "heads overlap the row stride".into())?;
        grid_yz(K, self.n_tok, "tokens")?;
        need(K, "partial outputs", self.part_o, self.n_tok * nh * self.n_parts * hd)?;
        need(K, "partial statistics", self.part_ml, self.n_tok * nh * self.n_parts * 2)?;
        need(K, "output", self.out, extent(self.n_tok, self.out_stride, nh * hd))?;
        if self.n_tok == 0 {
            return Ok(());
        }
        let p = MergeParams {
            part_o: self.part_o.ptr,
            part_ml: self.part_ml.ptr,
            out: self.out.ptr,
            n_heads: i32_of(K, nh)?,
            head_dim: i32_of(K, hd)?,
            n_parts: i32_of(K, self.n_parts)?,
            out_stride: i32_of(K, self.out_stride)?,
        };
        launch(k, s, K, (nh as u32, self.n_tok as u32, 1), 128, 0, &p)
    }
}
