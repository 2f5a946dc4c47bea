//! Launchers of `kernels/kv_cache.cu`: K/V stores into the paged cache (F16, or 8-bit with
//! `kv_scales`: `--kv-cache q8`, quantized as it is written), alone or fused
//! with the per-head norms and RoPE that precede them (`qkv_post_f32`: everything between the
//! QKV product and attention in one launch, since launch gaps, not bytes, limit a
//! memory-bound step at batch 1).

use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::kernels::Kernels;
use super::super::CudaError;
use super::launch::{blocks_for, check, extent, grid_yz, i32_of, launch, need, need_kv, Dev, KvScales};
use crate::backend::kv_type::Q8_GROUP;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct KvStoreParams {
    qkv: u64,
    k_cache: u64,
    v_cache: u64,
    kv_rows: u64,
    k_scale: u64,
    v_scale: u64,
    n_tok: i32,
    kv_dim: i32,
    stride: i32,
    k_off: i32,
    v_off: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for KvStoreParams {}

/// Stores K (`qkv[t, k_off..k_off + kv_dim]`) and V (at `v_off`) of each token into the F16
/// cache `[cache_rows, kv_dim]` at `kv_rows[t] < cache_rows` (checked on the host).
pub struct KvStore {
    pub qkv: Dev<f32>,
    pub k_cache: Dev<u16>,
    pub v_cache: Dev<u16>,
    /// The 8-bit cache's scales; `None`: an F16 cache.
    pub kv_scales: Option<KvScales>,
    pub kv_rows: Dev<i32>,
    pub cache_rows: usize,
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
        check(K, self.kv_scales.is_none() || self.kv_dim.is_multiple_of(Q8_GROUP), || {
            format!("rows of {} values in an 8-bit cache (a multiple of {Q8_GROUP})", self.kv_dim)
        })?;
        let (k_scale, v_scale) =
            need_kv(K, (self.k_cache, self.v_cache), self.kv_scales, self.cache_rows * self.kv_dim)?;
        need(K, "cache rows", self.kv_rows, self.n_tok)?;
        let total = self.n_tok * self.kv_dim;
        if total == 0 {
            return Ok(());
        }
        let p = KvStoreParams {
            qkv: self.qkv.ptr,
            k_cache: self.k_cache.ptr,
            v_cache: self.v_cache.ptr,
            kv_rows: self.kv_rows.ptr,
            k_scale,
            v_scale,
            n_tok: i32_of(K, self.n_tok)?,
            kv_dim: i32_of(K, self.kv_dim)?,
            stride: i32_of(K, self.stride)?,
            k_off: i32_of(K, self.k_off)?,
            v_off: i32_of(K, self.v_off)?,
        };
        launch(k, s, K, (blocks_for(K, total, 256)?, 1, 1), 256, 0, &p)
    }
}

/// The inputs both QK-norm + RoPE + cache-store kernels take, one member of their params
/// structs (`RopeStorePtrs` in kernels/common.cuh); made by [`RopeStore::check`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(in crate::backend::cuda) struct RopeStorePtrs {
    q_norm: u64,
    k_norm: u64,
    pos: u64,
    cos_t: u64,
    sin_t: u64,
    k_cache: u64,
    v_cache: u64,
    kv_rows: u64,
    k_scale: u64,
    v_scale: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct QkvPostParams {
    qkv: u64,
    rs: RopeStorePtrs,
    n_tok: i32,
    n_heads: i32,
    n_kv: i32,
    head_dim: i32,
    stride: i32,
    style: i32,
    eps: f32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for QkvPostParams {}

/// What both QK-norm + RoPE + cache-store kernels take beside their projection rows
/// (`qkv_post_f32` here, `hyb_qkv_post_f32` in hybrid_attn.rs): per-head norm weights
/// `[head_dim]` (`None`: no norm), positions `pos` and each token's cache row `kv_rows` (both
/// `[n_tok]`), RoPE tables `[max_pos, rotated dims / 2]`, the layer's F16 caches
/// `[cache_rows, n_kv * head_dim]` (or 8-bit ones with their scales).
#[derive(Clone, Copy, Debug)]
pub struct RopeStore {
    pub q_norm: Option<Dev<f32>>,
    pub k_norm: Option<Dev<f32>>,
    pub pos: Dev<i32>,
    pub cos: Dev<f32>,
    pub sin: Dev<f32>,
    pub max_pos: usize,
    pub k_cache: Dev<u16>,
    pub v_cache: Dev<u16>,
    /// The 8-bit cache's scales; `None`: an F16 cache.
    pub kv_scales: Option<KvScales>,
    pub kv_rows: Dev<i32>,
    pub cache_rows: usize,
}

impl RopeStore {
    /// The checks of these inputs for `n_tok` tokens (at most 65535: one grid row each) of
    /// `n_kv` KV heads of `head_dim`, `rot` dims rotated, and their pointers as the kernels
    /// take them.
    pub(in crate::backend::cuda) fn check(
        &self,
        kernel: &'static str,
        n_tok: usize,
        (n_kv, head_dim, rot): (usize, usize, usize),
    ) -> Result<RopeStorePtrs, CudaError> {
        for (what, n) in [("q norm", self.q_norm), ("k norm", self.k_norm)] {
            if let Some(n) = n {
                need(kernel, what, n, head_dim)?;
            }
        }
        let (table_len, cache_len) = (self.max_pos * rot / 2, self.cache_rows * n_kv * head_dim);
        need(kernel, "positions", self.pos, n_tok)?;
        need(kernel, "cos table", self.cos, table_len)?;
        need(kernel, "sin table", self.sin, table_len)?;
        check(kernel, self.kv_scales.is_none() || head_dim.is_multiple_of(Q8_GROUP), || {
            format!("head size {head_dim} with an 8-bit cache (a multiple of {Q8_GROUP})")
        })?;
        let (k_scale, v_scale) = need_kv(kernel, (self.k_cache, self.v_cache), self.kv_scales, cache_len)?;
        need(kernel, "cache rows", self.kv_rows, n_tok)?;
        grid_yz(kernel, n_tok, "tokens")?;
        Ok(RopeStorePtrs {
            q_norm: self.q_norm.map_or(0, |d| d.ptr),
            k_norm: self.k_norm.map_or(0, |d| d.ptr),
            pos: self.pos.ptr,
            cos_t: self.cos.ptr,
            sin_t: self.sin.ptr,
            k_cache: self.k_cache.ptr,
            v_cache: self.v_cache.ptr,
            kv_rows: self.kv_rows.ptr,
            k_scale,
            v_scale,
        })
    }
}

/// Everything between the QKV matmul and attention, in one launch: per-head RMSNorm of q and k
/// (when the weights are given), RoPE of q and k in place, K and V stored to the F16 cache at
/// `kv_rows[t]` (`store`; every dim rotated). `qkv` `[n_tok, stride]` holds q heads, k heads,
/// v heads (`head_dim` each).
pub struct QkvPost {
    pub qkv: Dev<f32>,
    pub store: RopeStore,
    pub n_tok: usize,
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub stride: usize,
    pub halves: bool,
    pub eps: f32,
}

impl QkvPost {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "qkv_post_f32";
        let hd = self.head_dim;
        let heads = self.n_heads + 2 * self.n_kv;
        check(K, hd.is_multiple_of(2) && hd <= 1024, || format!("head size {hd} (even, at most 1024)"))?;
        check(K, heads * hd <= self.stride, || "heads overlap the row stride".into())?;
        need(K, "qkv", self.qkv, extent(self.n_tok, self.stride, heads * hd))?;
        let rs = self.store.check(K, self.n_tok, (self.n_kv, hd, hd))?;
        if self.n_tok == 0 {
            return Ok(());
        }
        let p = QkvPostParams {
            qkv: self.qkv.ptr,
            rs,
            n_tok: i32_of(K, self.n_tok)?,
            n_heads: i32_of(K, self.n_heads)?,
            n_kv: i32_of(K, self.n_kv)?,
            head_dim: i32_of(K, hd)?,
            stride: i32_of(K, self.stride)?,
            style: i32::from(self.halves),
            eps: self.eps,
        };
        // The block size rmsnorm_f32 would use for rows of head_dim (identical sums).
        let block = (hd.div_ceil(32) * 32).clamp(32, 256) as u32;
        let grid = (i32_of(K, heads)? as u32, self.n_tok as u32, 1);
        launch(k, s, K, grid, block, (hd * 4) as u32, &p)
    }
}
