//! Launchers of the fused kernels of the decode step (fewer launches per layer, since launch
//! gaps, not bytes, limit a memory-bound step at batch 1) and of the GPU weight filler.
//! Same conventions as `launch`: a struct of arguments, shape checks, `#[repr(C)]` params.

use cudarc::driver::{CudaStream, DeviceRepr};

use super::kernels::Kernels;
use super::launch::{blocks_for, check, extent, i32_of, launch, need, Dev, GEMV_MAX_TOKENS, GEMV_ROWS, GEMV_THREADS};
use super::CudaError;

// ---------------------------------------------------------------- kv_cache.cu: qkv_post_f32
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct QkvPostParams {
    qkv: u64,
    q_norm: u64,
    k_norm: u64,
    pos: u64,
    cos_t: u64,
    sin_t: u64,
    k_cache: u64,
    v_cache: u64,
    slots: u64,
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

/// Everything between the QKV matmul and attention, in one launch: per-head RMSNorm of q and k
/// (when the weights are given), RoPE of q and k in place, K and V stored to the F16 cache at
/// `slots[t]`. `qkv` `[n_tok, stride]` holds q heads, k heads, v heads (`head_dim` each);
/// caches `[n_slots, n_kv * head_dim]`; tables `[max_pos, head_dim / 2]`.
pub struct QkvPost {
    pub qkv: Dev<f32>,
    pub q_norm: Option<Dev<f32>>,
    pub k_norm: Option<Dev<f32>>,
    pub pos: Dev<i32>,
    pub cos: Dev<f32>,
    pub sin: Dev<f32>,
    pub max_pos: usize,
    pub k_cache: Dev<u16>,
    pub v_cache: Dev<u16>,
    pub slots: Dev<i32>,
    pub n_slots: usize,
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
        for (what, n) in [("q norm", self.q_norm), ("k norm", self.k_norm)] {
            if let Some(n) = n {
                need(K, what, n, hd)?;
            }
        }
        need(K, "positions", self.pos, self.n_tok)?;
        need(K, "cos table", self.cos, self.max_pos * hd / 2)?;
        need(K, "sin table", self.sin, self.max_pos * hd / 2)?;
        need(K, "K cache", self.k_cache, self.n_slots * self.n_kv * hd)?;
        need(K, "V cache", self.v_cache, self.n_slots * self.n_kv * hd)?;
        need(K, "slots", self.slots, self.n_tok)?;
        check(K, self.n_tok <= 65_535, || format!("{} tokens in one launch (at most 65535)", self.n_tok))?;
        if self.n_tok == 0 {
            return Ok(());
        }
        let p = QkvPostParams {
            qkv: self.qkv.ptr,
            q_norm: self.q_norm.map_or(0, |d| d.ptr),
            k_norm: self.k_norm.map_or(0, |d| d.ptr),
            pos: self.pos.ptr,
            cos_t: self.cos.ptr,
            sin_t: self.sin.ptr,
            k_cache: self.k_cache.ptr,
            v_cache: self.v_cache.ptr,
            slots: self.slots.ptr,
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

// ---------------------------------------------------------------- gemv_f16.cu: swiglu
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

/// `out[t, r] = silu(sum_c w[r, c] x[t, c]) * sum_c w[ffn + r, c] x[t, c]` for `r < ffn`,
/// `n_tok <= 8`: the stacked gate/up weights `[2 ffn, cols]` F16, `x` f32 `[n_tok, x_stride]`,
/// `out` f32 `[n_tok, out_stride]`.
pub struct GemvSwiglu {
    pub w: Dev<u16>,
    pub x: Dev<f32>,
    pub out: Dev<f32>,
    pub ffn: usize,
    pub cols: usize,
    pub n_tok: usize,
    pub x_stride: usize,
    pub out_stride: usize,
}

impl GemvSwiglu {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "gemv_swiglu_f16";
        check(K, self.n_tok >= 1 && self.n_tok <= GEMV_MAX_TOKENS, || {
            format!("{} tokens (1..=8 allowed)", self.n_tok)
        })?;
        check(K, self.cols.is_multiple_of(8) && self.x_stride.is_multiple_of(4), || {
            format!("cols {} must be a multiple of 8 and the input stride {} of 4", self.cols, self.x_stride)
        })?;
        check(K, self.w.ptr.is_multiple_of(16) && self.x.ptr.is_multiple_of(16), || {
            "weights and input must be 16-byte aligned".into()
        })?;
        check(K, self.cols <= self.x_stride && self.ffn <= self.out_stride, || "rows overlap their stride".into())?;
        need(K, "weights", self.w, 2 * self.ffn * self.cols)?;
        need(K, "input", self.x, extent(self.n_tok, self.x_stride, self.cols))?;
        need(K, "output", self.out, extent(self.n_tok, self.out_stride, self.ffn))?;
        let entry = match self.n_tok {
            1 => "gemv_swiglu_f16_n1",
            2 => "gemv_swiglu_f16_n2",
            3 | 4 => "gemv_swiglu_f16_n4",
            _ => "gemv_swiglu_f16_n8",
        };
        let p = GemvParams {
            w: self.w.ptr,
            x: self.x.ptr,
            out: self.out.ptr,
            bias: 0,
            rows: i32_of(K, self.ffn)?,
            cols: i32_of(K, self.cols)?,
            n_tok: self.n_tok as i32,
            x_stride: i32_of(K, self.x_stride)?,
            out_stride: i32_of(K, self.out_stride)?,
            accumulate: 0,
        };
        launch(k, s, entry, (blocks_for(K, self.ffn, GEMV_ROWS)?, 1, 1), GEMV_THREADS as u32, 0, &p)
    }
}

// ---------------------------------------------------------------- embedding.cu: fill
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
