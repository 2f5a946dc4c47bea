//! The launchers of kernels/moe.cu: router, grouping by expert, the per-pair and per-expert
//! products, the weighted sum, the fused one-stream kernels (`#[repr(C)]` params mirrors).

use cudarc::driver::{CudaStream, DeviceRepr};

use super::weights::MoeLayerW;
use crate::backend::cuda::compile::entries::{self, MoeProduct};
use crate::backend::cuda::compile::kernels::Kernels;
use crate::backend::cuda::dmat::DevMat;
use crate::backend::cuda::ops::launch::{blocks_for, check, grid_yz, i32_of, launch, need, Dev};
use crate::backend::cuda::ops::moe_slab::MoeDownSum;
use crate::backend::cuda::ops::moe_slab::{slab_view, RowWalk};
use crate::backend::cuda::CudaError;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct RouteParams {
    x: u64,
    w: u64,
    logits: u64,
    ids: u64,
    wts: u64,
    n_tok: i32,
    dim: i32,
    n_experts: i32,
    k: i32,
    norm: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for RouteParams {}

/// Router of `n_tok` tokens: `x` `[n_tok, dim]`, `w` `[n_experts, dim]` f32; writes the
/// `logits` `[n_tok, n_experts]`, then `ids` and `wts` `[n_tok, k]` (best first; ties to the
/// lower index; weights renormalised when `norm`).
pub struct MoeRoute {
    pub x: Dev<f32>,
    pub w: Dev<f32>,
    pub logits: Dev<f32>,
    pub ids: Dev<i32>,
    pub wts: Dev<f32>,
    pub n_tok: usize,
    pub dim: usize,
    pub n_experts: usize,
    pub k: usize,
    pub norm: bool,
}

/// The router-logits kernel of steps above 8 tokens: 32 x 32 tiles (the router read once per 32
/// tokens; `DUSTOFF_ROUTER_TILED=1`) or a warp per (expert, token) (the default: the tiles
/// measured slower below 768 tokens, see `Tuning::router_tiled`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterLogits {
    Tiled,
    WarpPerPair,
}

impl MoeRoute {
    /// The checks of the router's inputs and outputs that both router kernels make.
    fn check(&self, kernel: &'static str) -> Result<(), CudaError> {
        check(kernel, self.k >= 1 && self.k <= 32 && self.k <= self.n_experts, || {
            format!("{} experts used of {} (1..=32)", self.k, self.n_experts)
        })?;
        check(kernel, self.n_experts <= 1024 && self.dim.is_multiple_of(4), || {
            format!("{} experts, width {}: at most 1024, a multiple of 4", self.n_experts, self.dim)
        })?;
        check(kernel, self.x.ptr.is_multiple_of(16) && self.w.ptr.is_multiple_of(16), || {
            "16-byte aligned inputs".into()
        })?;
        need(kernel, "input", self.x, self.n_tok * self.dim)?;
        need(kernel, "router", self.w, self.n_experts * self.dim)?;
        need(kernel, "logits", self.logits, self.n_tok * self.n_experts)?;
        need(kernel, "ids", self.ids, self.n_tok * self.k)?;
        need(kernel, "weights", self.wts, self.n_tok * self.k)
    }

    /// The params of the router kernels (`moe_route_fused_f32`'s begin with them); after
    /// [`MoeRoute::check`].
    fn params(&self, kernel: &'static str) -> Result<RouteParams, CudaError> {
        Ok(RouteParams {
            x: self.x.ptr,
            w: self.w.ptr,
            logits: self.logits.ptr,
            ids: self.ids.ptr,
            wts: self.wts.ptr,
            n_tok: i32_of(kernel, self.n_tok)?,
            dim: i32_of(kernel, self.dim)?,
            n_experts: self.n_experts as i32,
            k: self.k as i32,
            norm: i32::from(self.norm),
        })
    }

    pub fn launch(&self, kn: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        let logits = if crate::backend::cuda::tuning::tuning().router_tiled {
            RouterLogits::Tiled
        } else {
            RouterLogits::WarpPerPair
        };
        self.launch_with(kn, s, logits)
    }

    /// [`MoeRoute::launch`] with the kernel of the logits of steps above 8 tokens named (the
    /// parity test runs both).
    pub fn launch_with(&self, kn: &mut Kernels, s: &CudaStream, logits: RouterLogits) -> Result<(), CudaError> {
        const K: &str = "moe_route_f32";
        self.check(K)?;
        if self.n_tok == 0 {
            return Ok(());
        }
        let p = self.params(K)?;
        grid_yz(K, self.n_tok, "tokens")?;
        // Few tokens: a block per (expert, token) (every load of a row in flight at once); more:
        // 32 x 32 tiles (the router read once per 32 tokens), or a warp per pair, 8 experts a
        // block (the token's input read once per 8 experts).
        if self.n_tok <= 8 {
            launch(kn, s, "moe_router_logits_blk_f32", (self.n_experts as u32, self.n_tok as u32, 1), 128, 0, &p)?;
        } else if logits == RouterLogits::Tiled {
            let grid = (blocks_for(K, self.n_experts, 32)?, blocks_for(K, self.n_tok, 32)?, 1);
            launch(kn, s, "moe_router_logits_tile_f32", grid, 256, 0, &p)?;
        } else {
            let grid = (blocks_for(K, self.n_experts, 8)?, self.n_tok as u32, 1);
            launch(kn, s, "moe_router_logits_f32", grid, 256, 0, &p)?;
        }
        launch(kn, s, K, (blocks_for(K, self.n_tok, 1)?, 1, 1), 128, top_k_smem(self.n_experts, self.k), &p)
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct GroupParams {
    ids: u64,
    offsets: u64,
    entries: u64,
    position: u64,
    n_pairs: i32,
    n_experts: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for GroupParams {}

/// Groups `n_pairs` expert ids by expert, as the CPU's `group`: `offsets` `[n_experts + 1]`,
/// `entries` (pairs by expert, ascending within one) and its inverse `position`.
pub struct MoeGroup {
    pub ids: Dev<i32>,
    pub offsets: Dev<i32>,
    pub entries: Dev<i32>,
    pub position: Dev<i32>,
    pub n_pairs: usize,
    pub n_experts: usize,
}

impl MoeGroup {
    pub fn launch(&self, kn: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "moe_group";
        check(K, (1..=1024).contains(&self.n_experts), || format!("{} experts (1..=1024)", self.n_experts))?;
        need(K, "ids", self.ids, self.n_pairs)?;
        need(K, "offsets", self.offsets, self.n_experts + 1)?;
        need(K, "entries", self.entries, self.n_pairs)?;
        need(K, "positions", self.position, self.n_pairs)?;
        let p = GroupParams {
            ids: self.ids.ptr,
            offsets: self.offsets.ptr,
            entries: self.entries.ptr,
            position: self.position.ptr,
            n_pairs: i32_of(K, self.n_pairs)?,
            n_experts: self.n_experts as i32,
        };
        // Warps: up to 32, fewer for many experts (their counts must fit 48 KB of shared memory).
        let nw = (11_000 / self.n_experts).clamp(1, 32);
        let smem = ((nw + 1) * self.n_experts * 4) as u32;
        launch(kn, s, K, (1, 1, 1), 32 * nw as u32, smem, &p)
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct MatParams {
    qs: u64,
    aux: u64,
    qs2: u64,
    aux2: u64,
    x: u64,
    out: u64,
    ids: u64,
    offsets: u64,
    entries: u64,
    rows: i32,
    cols: i32,
    n_pairs: i32,
    k: i32,
    x_stride: i32,
    out_stride: i32,
    qs_row: i32,
    aux_row: i32,
    lpr: i32,
    x_by_token: i32,
    sh_qs: u64,
    sh_aux: u64,
    sh_qs2: u64,
    sh_aux2: u64,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for MatParams {}

/// How the pairs of a step are walked (see the module docs).
#[derive(Clone, Copy, Debug)]
pub enum Walk {
    /// One block row per pair; the expert of pair p is `ids[p]`; rows of x/out by pair.
    Pairs { ids: Dev<i32> },
    /// One block row per expert over its grouped positions (`MoeGroup`'s output).
    Grouped { offsets: Dev<i32>, entries: Dev<i32>, n_experts: usize },
}

/// Gate/up + SwiGLU (`up` given: `out = silu(slab x) * (up x)`) or a plain product of an
/// expert slab for every pair of a step. `x` rows: the token's (`x_by_token`, row pair / k) or
/// the item's; `out` rows: the item's (pair, or grouped position).
pub struct MoeMat<'a> {
    pub slab: &'a DevMat,
    pub up: Option<&'a DevMat>,
    /// Experts in the slab (its rows are `n_experts x rows`).
    pub n_experts: usize,
    pub x: Dev<f32>,
    pub out: Dev<f32>,
    pub walk: Walk,
    pub n_pairs: usize,
    pub k: usize,
    pub x_stride: usize,
    pub out_stride: usize,
    pub x_by_token: bool,
}

impl MoeMat<'_> {
    pub fn launch(&self, kn: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        self.launch_sh(kn, s, None)
    }

    /// [`MoeMat::launch`]; with `sh` (pair-mode gate/up only) also the shared expert of each
    /// token `t` as block row `n_pairs + t`, into output row `n_pairs + t`.
    pub fn launch_sh(&self, kn: &mut Kernels, s: &CudaStream, sh: Option<&ShexpPairs>) -> Result<(), CudaError> {
        const K: &str = "moe_mat";
        let (fi, qs, aux, qs_row, aux_row, unit) = slab_view(self.slab, s)?;
        let cols = self.slab.cols;
        check(K, self.n_experts > 0 && self.slab.rows.is_multiple_of(self.n_experts), || {
            format!("{} slab rows for {} experts", self.slab.rows, self.n_experts)
        })?;
        let rows = self.slab.rows / self.n_experts;
        let (qs2, aux2) = match self.up {
            Some(u) => {
                let (f2, q2, a2, _, _, _) = slab_view(u, s)?;
                check(K, f2 == fi && (u.rows, u.cols) == (self.slab.rows, cols), || {
                    "the up slab must match the gate slab's format and shape".into()
                })?;
                (q2, a2)
            }
            None => (0, 0),
        };
        check(K, self.k >= 1 && self.n_pairs.is_multiple_of(self.k), || {
            format!("{} pairs of {}", self.n_pairs, self.k)
        })?;
        check(K, self.x_stride.is_multiple_of(4) && self.x.ptr.is_multiple_of(16) && cols <= self.x_stride, || {
            format!("input stride {} (a multiple of 4, at least {cols}), 16-byte aligned", self.x_stride)
        })?;
        check(K, rows <= self.out_stride, || "output rows overlap their stride".into())?;
        let in_rows = if self.x_by_token { self.n_pairs / self.k } else { self.n_pairs };
        let sh_rows = sh.map_or(0, |_| self.n_pairs / self.k);
        if let Some(sh) = sh {
            sh.check_gate_up(K, fi, (rows, cols), (qs_row, aux_row), self.up.is_some() && self.x_by_token)?;
        }
        need(K, "input", self.x, crate::backend::cuda::ops::launch::extent(in_rows, self.x_stride, cols))?;
        need(
            K,
            "output",
            self.out,
            crate::backend::cuda::ops::launch::extent(self.n_pairs + sh_rows, self.out_stride, rows),
        )?;
        let (variant_base, grid_y, ids, offsets, entries) = match self.walk {
            Walk::Pairs { ids } => {
                need(K, "ids", ids, self.n_pairs)?;
                (0, self.n_pairs + sh_rows, ids.ptr, 0, 0)
            }
            Walk::Grouped { offsets, entries, n_experts } => {
                check(K, n_experts == self.n_experts && sh.is_none(), || {
                    "grouping of another expert count (or a shared expert: pair mode only)".into()
                })?;
                need(K, "offsets", offsets, n_experts + 1)?;
                need(K, "entries", entries, self.n_pairs)?;
                (1, n_experts, 0, offsets.ptr, entries.ptr)
            }
        };
        if self.n_pairs == 0 || rows == 0 {
            return Ok(());
        }
        let units = cols / unit;
        let lpr = units.div_ceil(2).next_power_of_two().clamp(1, 32);
        // Output rows per row group (kernels/moe.cu, per entry).
        let grouped = variant_base == 1;
        let rg = match (self.up.is_some(), grouped) {
            (true, false) => 2,
            (true, true) => 1,
            (false, false) => 4,
            (false, true) => 2,
        };
        let per_block = 4 * (32 / lpr) * rg;
        let entry = entries::moe_mat(fi, MoeProduct { gate_up: self.up.is_some(), grouped });
        let p = MatParams {
            qs,
            aux,
            qs2,
            aux2,
            x: self.x.ptr,
            out: self.out.ptr,
            ids,
            offsets,
            entries,
            rows: i32_of(K, rows)?,
            cols: i32_of(K, cols)?,
            n_pairs: i32_of(K, self.n_pairs)?,
            k: i32_of(K, self.k)?,
            x_stride: i32_of(K, self.x_stride)?,
            out_stride: i32_of(K, self.out_stride)?,
            qs_row: i32_of(K, qs_row)?,
            aux_row: i32_of(K, aux_row)?,
            lpr: lpr as i32,
            x_by_token: i32::from(self.x_by_token),
            sh_qs: sh.map_or(0, |h| h.gu[0]),
            sh_aux: sh.map_or(0, |h| h.gu[1]),
            sh_qs2: sh.map_or(0, |h| h.gu[2]),
            sh_aux2: sh.map_or(0, |h| h.gu[3]),
        };
        let grid = (blocks_for(K, rows, per_block)?, grid_yz(K, grid_y, "block rows")?, 1);
        launch(kn, s, entry, grid, 128, 0, &p)
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct CombineParams {
    y: u64,
    wts: u64,
    position: u64,
    x: u64,
    n_tok: i32,
    dim: i32,
    k: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for CombineParams {}

/// `x[t] += sum_j wts[t, j] * y[row(t, j)]`, rank 0 first; `row = position[t k + j]` when
/// grouped, else `t k + j`.
pub struct MoeCombine {
    pub y: Dev<f32>,
    pub wts: Dev<f32>,
    pub position: Option<Dev<i32>>,
    pub x: Dev<f32>,
    pub n_tok: usize,
    pub dim: usize,
    pub k: usize,
}

impl MoeCombine {
    pub fn launch(&self, kn: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "moe_combine_f32";
        let pairs = self.n_tok * self.k;
        need(K, "expert outputs", self.y, pairs * self.dim)?;
        need(K, "weights", self.wts, pairs)?;
        need(K, "residual", self.x, self.n_tok * self.dim)?;
        if let Some(p) = self.position {
            need(K, "positions", p, pairs)?;
        }
        if pairs == 0 || self.dim == 0 {
            return Ok(());
        }
        let p = CombineParams {
            y: self.y.ptr,
            wts: self.wts.ptr,
            position: self.position.map_or(0, |p| p.ptr),
            x: self.x.ptr,
            n_tok: i32_of(K, self.n_tok)?,
            dim: i32_of(K, self.dim)?,
            k: i32_of(K, self.k)?,
        };
        grid_yz(K, self.n_tok, "tokens")?;
        launch(kn, s, K, (blocks_for(K, self.dim, 256)?, self.n_tok as u32, 1), 256, 0, &p)
    }
}

/// moe.cu's `RouteFusedParams` lists the fields of `RouteParams` first, in its order: as C
/// lays it out, they and the padding after `norm` are this `route` (the 8-aligned `count` then
/// starts at byte 64 either way).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct RouteFusedParams {
    route: RouteParams,
    count: u64,
    sh_gate: u64,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct (padding included).
unsafe impl DeviceRepr for RouteFusedParams {}
const _: () = assert!(std::mem::offset_of!(RouteFusedParams, count) == 64);

/// [`MoeRoute`] in one launch (`moe_route_fused_f32`): the last block of each token to finish
/// its logits runs the top-k. `count` `[n_tok]` must be zero before the first launch (each
/// launch leaves it zero).
pub struct MoeRouteFused {
    pub route: MoeRoute,
    pub count: Dev<u32>,
}

impl MoeRouteFused {
    pub fn launch(&self, kn: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        self.launch_sh(kn, s, None)
    }

    /// [`MoeRouteFused::launch`]; with `sh` also each token's shared-expert gate
    /// `sigmoid(gate . x[t])` into `wts[n_tok k + t]` (one more block per token).
    pub fn launch_sh(&self, kn: &mut Kernels, s: &CudaStream, sh: Option<&ShexpPairs>) -> Result<(), CudaError> {
        const K: &str = "moe_route_fused_f32";
        let r = &self.route;
        r.check(K)?;
        if let Some(sh) = sh {
            need(K, "shared-expert gate", sh.gate, r.dim)?;
            check(K, sh.gate.ptr.is_multiple_of(16), || "16-byte aligned gate row".into())?;
            need(K, "weights", r.wts, r.n_tok * (r.k + 1))?;
        }
        need(K, "counts", self.count, r.n_tok)?;
        grid_yz(K, r.n_tok, "tokens")?;
        if r.n_tok == 0 {
            return Ok(());
        }
        let p = RouteFusedParams { route: r.params(K)?, count: self.count.ptr, sh_gate: sh.map_or(0, |h| h.gate.ptr) };
        let grid = (r.n_experts as u32 + u32::from(sh.is_some()), r.n_tok as u32, 1);
        launch(kn, s, K, grid, 128, top_k_smem(r.n_experts, r.k), &p)
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct DownSumParams {
    qs: u64,
    aux: u64,
    act: u64,
    ids: u64,
    wts: u64,
    x: u64,
    walk: RowWalk,
    sh_qs: u64,
    sh_aux: u64,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for DownSumParams {}

/// Down and the weighted sum of pair mode in one launch (`moe_down_sum_<fmt>`; the int8 twin:
/// `launch_q8` in moe_q8.rs).
impl MoeDownSum<'_> {
    pub fn launch(&self, kn: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        self.launch_sh(kn, s, None)
    }

    /// [`MoeDownSum::launch`]; with `sh` also each token's shared expert as rank `k` (warp
    /// `k`: act row `n_tok k + t`, weight `wts[n_tok k + t]`), added last.
    pub fn launch_sh(&self, kn: &mut Kernels, s: &CudaStream, sh: Option<&ShexpPairs>) -> Result<(), CudaError> {
        const K: &str = "moe_down_sum";
        let (fi, qs, aux, qs_row, aux_row, unit) = slab_view(self.down, s)?;
        let (rows, cols) = self.expert_shape(K)?;
        let pairs = self.check_pairs(K, rows, cols)?;
        if let Some(sh) = sh {
            sh.check_down(K, fi, (rows, cols), (qs_row, aux_row))?;
            need(K, "activations", self.act, (pairs + self.n_tok) * cols)?;
            need(K, "weights", self.wts, pairs + self.n_tok)?;
        }
        if pairs == 0 || rows == 0 {
            return Ok(());
        }
        let lpr = (cols / unit).div_ceil(2).next_power_of_two().clamp(1, 32);
        let per_block = (32 / lpr) * 4;
        let p = DownSumParams {
            qs,
            aux,
            act: self.act.ptr,
            ids: self.ids.ptr,
            wts: self.wts.ptr,
            x: self.x.ptr,
            walk: RowWalk::new(K, (rows, cols), self.k, (qs_row, aux_row), lpr)?,
            sh_qs: sh.map_or(0, |h| h.down[0]),
            sh_aux: sh.map_or(0, |h| h.down[1]),
        };
        let grid = (blocks_for(K, rows, per_block)?, self.n_tok as u32, 1);
        let warps = self.k + usize::from(sh.is_some());
        launch(kn, s, entries::moe_down_sum(fi), grid, 32 * warps as u32, 0, &p)
    }
}

/// Dynamic shared memory of kernels/moe.cu `block_top_k` for `n` experts, `k` ranks (bytes).
pub fn top_k_smem(n: usize, k: usize) -> u32 {
    (8 * n + 8 * k + 128) as u32
}

/// A shared expert's device views for the pair-mode kernels.
#[derive(Clone, Copy, Debug)]
pub struct ShexpPairs {
    /// Gate rows (qs, aux), then up rows (qs, aux): the halves of the `[2 f, dim]` gate/up.
    pub(in crate::backend::cuda) gu: [u64; 4],
    /// Down rows (qs, aux) of the `[dim, f]` down matrix.
    pub(in crate::backend::cuda) down: [u64; 2],
    /// The gate row `[dim]` f32.
    pub(in crate::backend::cuda) gate: Dev<f32>,
    /// Format index and (qs, aux) row bytes of gate/up and of down.
    fmt: (usize, usize),
    gu_row: (usize, usize),
    down_row: (usize, usize),
    /// (ffn, dim).
    shape: (usize, usize),
}

impl ShexpPairs {
    /// The views of `w`'s shared expert where it matches the routed experts' width and
    /// formats and its gate/up is one matrix; else `None`.
    pub fn of(w: &MoeLayerW, s: &CudaStream) -> Option<Self> {
        let sh = w.shared.as_ref()?;
        let ([gu], [dn]) = (&sh.gu.parts[..], &sh.down.parts[..]) else { return None };
        let (f, dim) = (w.ffn, w.dim);
        if sh.ffn != f || (gu.rows, gu.cols) != (2 * f, dim) || (dn.rows, dn.cols) != (dim, f) {
            return None;
        }
        let (fg, qs, aux, qr, ar, _) = slab_view(gu, s).ok()?;
        let (fd, dqs, daux, dqr, dar, _) = slab_view(dn, s).ok()?;
        let (rg, _, _, _, _, _) = slab_view(&w.gate, s).ok()?;
        let (rd, _, _, _, _, _) = slab_view(&w.down, s).ok()?;
        if (fg, fd) != (rg, rd) {
            return None;
        }
        let up = (qs + (f * qr) as u64, aux + (f * ar) as u64);
        Some(ShexpPairs {
            gu: [qs, aux, up.0, up.1],
            down: [dqs, daux],
            gate: Dev::of(&sh.gate, s),
            fmt: (fg, fd),
            gu_row: (qr, ar),
            down_row: (dqr, dar),
            shape: (f, dim),
        })
    }

    /// The gate/up launch's experts (`(rows, cols)` each, format `fi`, row bytes) are these.
    pub(in crate::backend::cuda) fn check_gate_up(
        &self,
        kernel: &'static str,
        fi: usize,
        shape: (usize, usize),
        row: (usize, usize),
        gate_up_by_token: bool,
    ) -> Result<(), CudaError> {
        check(kernel, gate_up_by_token && (fi, shape, row) == (self.fmt.0, self.shape, self.gu_row), || {
            format!(
                "a shared expert of format {} {:?} for gate/up experts of format {fi} {shape:?}",
                self.fmt.0, self.shape
            )
        })
    }

    /// The down launch's experts are of this shape, format and row bytes.
    pub(in crate::backend::cuda) fn check_down(
        &self,
        kernel: &'static str,
        fi: usize,
        shape: (usize, usize),
        row: (usize, usize),
    ) -> Result<(), CudaError> {
        let want = (self.shape.1, self.shape.0);
        check(kernel, (fi, shape, row) == (self.fmt.1, want, self.down_row), || {
            format!("a shared expert's down of format {} {want:?} for experts of format {fi} {shape:?}", self.fmt.1)
        })
    }
}
