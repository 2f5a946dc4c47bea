//! The sparse layer of a one-stream step in one launch (kernels/moe.cu `moe_one_<fmt>_<fmt>`):
//! router + top-k, gate/up + SwiGLU of every (token, slot) pair and down + weighted sum as the
//! tiles of one grid, each phase waiting on device counters for the one before (the kernel's
//! comment says why that cannot deadlock). The three launches it replaces (`moe::pair_ffn`
//! `PairPath::Three`) pay a graph node's start and drain each; here the down tiles also ask
//! the L2 for their expert rows while the gate/up tiles still run. The same device functions
//! compute the same values in the same order, so both paths agree bit for bit.

use std::sync::OnceLock;

use cudarc::driver::{CudaStream, DeviceRepr};

use super::dmat::DevMat;
use super::kernels::Kernels;
use super::launch::{check, i32_of, launch, need, Dev};
use super::CudaError;

/// The format pairs with a one-launch kernel (kernels.rs): (gate/up format index, down format
/// index, entry).
pub use super::kernels::MOE_ONE_ENTRIES as ONE_ENTRIES;

/// Threads of a block (every tile kind).
const THREADS: usize = 256;
/// Rows per row group of the gate/up tiles (moe_mat_rows RG) and of the down tiles (DS_RG).
const GU_RG: usize = 2;
const DS_RG: usize = 4;
/// Whether one-stream steps take the one-launch kernel where the slab formats have one
/// (`DUSTOFF_MOE_ONE=1`). Off by default: measured slower than the RMSNorm and three fused
/// launches (61.2 against 38.4 us a layer, H200, docs/BENCHMARKS.md session 6).
pub fn one_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| crate::sys::env::get("DUSTOFF_MOE_ONE").is_some_and(|v| v == "1"))
}

/// A slab's kernel view (`moe_slab::slab_view`): (format index, qs, aux, qs row bytes, aux row bytes,
/// elements per unit).
pub type SlabView = (usize, u64, u64, usize, usize, usize);

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct OneParams {
    h: u64,
    router: u64,
    logits: u64,
    ids: u64,
    wts: u64,
    g_qs: u64,
    g_aux: u64,
    u_qs: u64,
    u_aux: u64,
    d_qs: u64,
    d_aux: u64,
    act: u64,
    x: u64,
    sync: u64,
    norm_w: u64,
    eps: f32,
    n_tok: i32,
    dim: i32,
    n_experts: i32,
    k: i32,
    ffn: i32,
    norm: i32,
    g_qs_row: i32,
    g_aux_row: i32,
    g_lpr: i32,
    d_qs_row: i32,
    d_aux_row: i32,
    d_lpr: i32,
    gu_tiles: i32,
    down_tiles: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for OneParams {}

/// `x[t] += moe(h[t])` (after `h = rmsnorm(x)` with `rms`) for the `n_tok` tokens of a step in one launch. Writes `logits` `[n_tok,
/// n_experts]`, `ids` / `wts` `[n_tok k]` and `act` `[n_tok k, ffn]` on the way, as the three
/// launches do; `sync` `[4 + n_tok k]` must be zero before the first launch (each leaves it zero).
pub struct MoeOne<'a> {
    pub h: Dev<f32>,
    pub router: Dev<f32>,
    pub logits: Dev<f32>,
    pub ids: Dev<i32>,
    pub wts: Dev<f32>,
    /// gate `[n_experts * ffn, dim]`, up (same), down `[n_experts * dim, ffn]`.
    pub slabs: [&'a DevMat; 3],
    /// Their `moe_slab::slab_view`s.
    pub views: [SlabView; 3],
    pub act: Dev<f32>,
    pub x: Dev<f32>,
    pub sync: Dev<u32>,
    pub n_tok: usize,
    pub n_experts: usize,
    pub k: usize,
    /// Renormalise the chosen experts' weights (`norm_topk_prob`).
    pub norm: bool,
    /// (RMSNorm weight `[dim]`, eps): `h = rmsnorm(x)` is computed in the launch (and written
    /// to `h`, as `rmsnorm_f32` would), else `h` is the given input.
    pub rms: Option<(Dev<f32>, f32)>,
}

/// Dynamic shared memory of kernels/moe.cu `block_top_k` for `n` experts, `k` slots (bytes).
pub fn top_k_smem(n: usize, k: usize) -> u32 {
    (8 * n + 8 * k + 128) as u32
}

/// Lanes per row of a product over `units` units (as `moe::MoeMat`): a power of two up to 32.
fn lanes_per_row(units: usize) -> usize {
    units.div_ceil(2).next_power_of_two().clamp(1, 32)
}

impl MoeOne<'_> {
    /// The kernel for these slab formats, if there is one.
    pub fn entry(&self) -> Option<&'static str> {
        let (g, u, d) = (self.views[0].0, self.views[1].0, self.views[2].0);
        (g == u).then_some(())?;
        ONE_ENTRIES.iter().find(|e| e.0 == g && e.1 == d).map(|e| e.2)
    }

    pub fn launch(&self, kn: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "moe_one";
        let entry = self.entry().ok_or_else(|| CudaError::Shape {
            kernel: K,
            reason: "no one-launch kernel for these slab formats".into(),
        })?;
        let [gate, up, down] = self.slabs;
        let (n, k, t) = (self.n_experts, self.k, self.n_tok);
        check(K, n > 0 && gate.rows.is_multiple_of(n) && down.rows.is_multiple_of(n), || {
            format!("slabs of {} / {} rows for {n} experts", gate.rows, down.rows)
        })?;
        let (ffn, dim) = (gate.rows / n, gate.cols);
        check(K, (up.rows, up.cols) == (gate.rows, dim) && (down.rows, down.cols) == (n * dim, ffn), || {
            format!(
                "gate [{}, {}], up [{}, {}], down [{}, {}]: not one expert shape",
                gate.rows, gate.cols, up.rows, up.cols, down.rows, down.cols
            )
        })?;
        // k <= 8: a warp per slot in the down tiles.
        check(K, t >= 1 && (1..=8).contains(&k) && k <= n && n <= 1024, || {
            format!("{t} tokens, {k} of {n} experts (1..=8 of up to 1024 experts)")
        })?;
        check(K, dim.is_multiple_of(4) && self.h.ptr.is_multiple_of(16) && self.router.ptr.is_multiple_of(16), || {
            format!("width {dim} (a multiple of 4), 16-byte aligned inputs")
        })?;
        check(K, self.act.ptr.is_multiple_of(16) && ffn.is_multiple_of(4), || "16-byte aligned activations".into())?;
        let pairs = t * k;
        need(K, "input", self.h, t * dim)?;
        need(K, "router", self.router, n * dim)?;
        need(K, "logits", self.logits, t * n)?;
        need(K, "ids", self.ids, pairs)?;
        need(K, "weights", self.wts, pairs)?;
        need(K, "activations", self.act, pairs * ffn)?;
        need(K, "residual", self.x, t * dim)?;
        need(K, "counters", self.sync, 4 + pairs)?;
        if let Some((nw, _)) = self.rms {
            need(K, "norm weight", nw, dim)?;
            check(K, nw.ptr.is_multiple_of(16) && self.x.ptr.is_multiple_of(16), || {
                "16-byte aligned norm rows".into()
            })?;
        }
        let [(_, g_qs, g_aux, g_qs_row, g_aux_row, g_unit), (_, u_qs, u_aux, _, _, _), dv] = self.views;
        let (_, d_qs, d_aux, d_qs_row, d_aux_row, d_unit) = dv;
        let g_lpr = lanes_per_row(dim / g_unit);
        let d_lpr = lanes_per_row(ffn / d_unit);
        let gu_tiles = ffn.div_ceil((THREADS / 32) * (32 / g_lpr) * GU_RG);
        let down_tiles = dim.div_ceil((32 / d_lpr) * DS_RG);
        let blocks = n + pairs * gu_tiles + t * down_tiles;
        let p = OneParams {
            h: self.h.ptr,
            router: self.router.ptr,
            logits: self.logits.ptr,
            ids: self.ids.ptr,
            wts: self.wts.ptr,
            g_qs,
            g_aux,
            u_qs,
            u_aux,
            d_qs,
            d_aux,
            act: self.act.ptr,
            x: self.x.ptr,
            sync: self.sync.ptr,
            norm_w: self.rms.map_or(0, |r| r.0.ptr),
            eps: self.rms.map_or(0.0, |r| r.1),
            n_tok: t as i32,
            dim: i32_of(K, dim)?,
            n_experts: n as i32,
            k: k as i32,
            ffn: i32_of(K, ffn)?,
            norm: i32::from(self.norm),
            g_qs_row: i32_of(K, g_qs_row)?,
            g_aux_row: i32_of(K, g_aux_row)?,
            g_lpr: g_lpr as i32,
            d_qs_row: i32_of(K, d_qs_row)?,
            d_aux_row: i32_of(K, d_aux_row)?,
            d_lpr: d_lpr as i32,
            gu_tiles: i32_of(K, gu_tiles)?,
            down_tiles: i32_of(K, down_tiles)?,
        };
        let grid = u32::try_from(blocks)
            .map_err(|_| CudaError::Shape { kernel: K, reason: format!("{blocks} tiles exceed the grid") })?;
        launch(kn, s, entry, (grid, 1, 1), THREADS as u32, top_k_smem(n, k), &p)
    }
}
