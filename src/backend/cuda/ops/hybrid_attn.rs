//! Launchers of `kernels/hybrid_attn.cu`: the gated partial-RoPE attention layer of the hybrid
//! models around the shared paged attention kernels (the QK norms, partial RoPE and cache stores
//! before them, the output gate after). CPU twin: `backend::cpu::hybrid` (`HybridCpu::attention`).

use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::kernels::Kernels;
use super::super::CudaError;
use super::kv_cache::{RopeStore, RopeStorePtrs};
use super::launch::{blocks_for, check, extent, i32_of, launch, need, Dev};

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct HybQkvParams {
    proj: u64,
    q: u64,
    rs: RopeStorePtrs,
    n_tok: i32,
    n_heads: i32,
    n_kv: i32,
    head_dim: i32,
    rot: i32,
    stride: i32,
    gated: i32,
    eps: f32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for HybQkvParams {}

/// Between the fused projection and attention of a gated full-attention layer: per-head
/// RMSNorm of q and k, RoPE on the first `rot` dims (tables `[max_pos, rot / 2]`), queries to
/// `q` `[n_tok, n_heads * head_dim]`, K and V to the F16 caches at `kv_rows[t]`. `proj`
/// `[n_tok, stride]`: q heads (each `[query, gate]` when `gated`), k heads, v heads.
pub struct HybQkvPost {
    pub proj: Dev<f32>,
    pub stride: usize,
    pub q: Dev<f32>,
    pub store: RopeStore,
    pub n_tok: usize,
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub rot: usize,
    pub gated: bool,
    pub eps: f32,
}

impl HybQkvPost {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "hyb_qkv_post_f32";
        let (hd, rot) = (self.head_dim, self.rot);
        check(K, hd <= 1024 && rot.is_multiple_of(2) && rot > 0 && rot <= hd, || {
            format!("head size {hd} (at most 1024) with {rot} rotated dims (even, at most the head)")
        })?;
        let q_rows = self.n_heads * hd * if self.gated { 2 } else { 1 };
        let width = q_rows + 2 * self.n_kv * hd;
        check(K, width <= self.stride, || "heads overlap the row stride".into())?;
        need(K, "projection", self.proj, extent(self.n_tok, self.stride, width))?;
        need(K, "queries", self.q, self.n_tok * self.n_heads * hd)?;
        let rs = self.store.check(K, self.n_tok, (self.n_kv, hd, rot))?;
        if self.n_tok == 0 {
            return Ok(());
        }
        let p = HybQkvParams {
            proj: self.proj.ptr,
            q: self.q.ptr,
            rs,
            n_tok: self.n_tok as i32,
            n_heads: i32_of(K, self.n_heads)?,
            n_kv: i32_of(K, self.n_kv)?,
            head_dim: hd as i32,
            rot: rot as i32,
            stride: i32_of(K, self.stride)?,
            gated: i32::from(self.gated),
            eps: self.eps,
        };
        let block = (hd.div_ceil(32) * 32).clamp(32, 256) as u32;
        let grid = (i32_of(K, self.n_heads + 2 * self.n_kv)? as u32, self.n_tok as u32, 1);
        launch(k, s, K, grid, block, (hd * 4) as u32, &p)
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct GateMulParams {
    att: u64,
    proj: u64,
    n_tok: i32,
    n_heads: i32,
    head_dim: i32,
    stride: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for GateMulParams {}

/// `att[t, h, d] *= sigmoid(proj[t, (2 h + 1) head_dim + d])`: the output gate of a gated
/// attention layer (`att` `[n_tok, n_heads * head_dim]`, `proj` `[n_tok, stride]`).
pub struct GateMul {
    pub att: Dev<f32>,
    pub proj: Dev<f32>,
    pub stride: usize,
    pub n_tok: usize,
    pub n_heads: usize,
    pub head_dim: usize,
}

impl GateMul {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "hyb_gate_mul_f32";
        let qd = self.n_heads * self.head_dim;
        check(K, 2 * qd <= self.stride, || "gates beyond the row stride".into())?;
        need(K, "attention output", self.att, self.n_tok * qd)?;
        need(K, "projection", self.proj, extent(self.n_tok, self.stride, 2 * qd))?;
        if self.n_tok == 0 {
            return Ok(());
        }
        let p = GateMulParams {
            att: self.att.ptr,
            proj: self.proj.ptr,
            n_tok: i32_of(K, self.n_tok)?,
            n_heads: i32_of(K, self.n_heads)?,
            head_dim: i32_of(K, self.head_dim)?,
            stride: i32_of(K, self.stride)?,
        };
        launch(k, s, K, (blocks_for(K, self.n_tok * qd, 256)?, 1, 1), 256, 0, &p)
    }
}
