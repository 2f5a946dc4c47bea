//! Mixture-of-experts layers on the GPU (Qwen3-MoE): the experts of a sparse layer as three
//! slabs in their file format, the router in f32, and the launchers of kernels/moe.cu.
//!
//! A step's FFN of a sparse layer (`moe_ffn`), for `n` tokens and `k` experts per token:
//! 1. `moe_router_logits_f32` (a warp per expert and token; 32 x 32 tiles with
//!    `DUSTOFF_ROUTER_TILED=1`), then `moe_route_f32` (a warp
//!    per token): softmax, top-k (ties to the lower expert index, as the CPU's `route`),
//!    renormalisation: expert ids `[n, k]` and weights `[n, k]` stay on the device, so a
//!    captured CUDA graph replays whatever the tokens choose;
//! 2. few tokens (`pair_mode`): gate/up + SwiGLU for every (token, rank) pair in one launch
//!    (grid over pairs and row tiles, the weight rows at slab + id * stride found on the
//!    device), then down in one launch, into per-pair rows;
//!    more tokens: `moe_group` sorts the pairs by expert (count, prefix sum, stable fill), and
//!    the same two kernels run over experts instead of pairs, each decoding its weight rows
//!    once per 8 of its tokens (experts nobody chose exit at once);
//! 3. `moe_combine_f32`: the weighted sum of each token's k rows into the residual, rank 0
//!    first: a fixed order, the CPU reference's (no float atomics).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::compile::entries::{self, MoeProduct};
use super::compile::kernels::Kernels;
use super::device::{up, zeros};
use super::dmat::DevMat;
use super::ops::launch::{allocated, blocks_for, check, grid_yz, i32_of, launch, need, Dev};
use super::ops::moe_gemm;
pub use super::ops::moe_slab::slab_bytes;
pub use super::ops::moe_slab::MoeDownSum;
use super::ops::moe_slab::{slab_view, RowWalk};
use super::step::norm::NormIn;
use super::CudaError;
use crate::model::config::ModelConfig;
use crate::model::moe::{MoeConfig, MoeWeights};
use crate::model::quant::GgmlType;
use crate::model::weights::Tensor;

/// Whether one-stream steps (pair mode) take the fused kernels (router + top-k in one launch,
/// down + weighted sum in one: three launches a layer) or the five of the grouped walk
/// (`DUSTOFF_MOE_FUSED=0`, for comparisons).
pub fn fused_enabled() -> bool {
    super::tuning::tuning().moe_fused
}

/// Most tokens of a step that take the pair-mode kernels (grid over (token, rank) pairs);
/// larger steps group by expert. `DUSTOFF_MOE_PAIR_MAX_TOKENS` overrides the default of 8.
pub fn pair_max_tokens() -> usize {
    super::tuning::tuning().moe_pair_max_tokens
}

/// The experts of one sparse layer on the device.
pub struct MoeLayerW {
    pub router: CudaSlice<f32>, // [n_experts, dim] f32
    pub gate: DevMat,           // [n_experts * ffn, dim]: expert e's rows e * ffn ..
    pub up: DevMat,             // [n_experts * ffn, dim]
    pub down: DevMat,           // [n_experts * dim, ffn]
    pub n_experts: usize,
    pub n_used: usize,
    /// Width of one expert (`expert_ffn_dim`).
    pub ffn: usize,
    pub dim: usize,
    pub norm_topk_prob: bool,
    /// Qwen3.5-MoE / Qwen3-Next: the gated shared expert (`shared_expert.rs`), run after the
    /// routed experts by the caller of `moe_ffn`.
    pub shared: Option<super::ops::shared_expert::SharedExpertW>,
}

/// Checks that `w`'s experts can be put on the GPU (shapes, formats, the kernels' row rules)
/// before anything is allocated; the error names the tensor.
pub fn check_layer(w: &MoeWeights) -> Result<(), CudaError> {
    let first = w.experts.first().ok_or_else(|| CudaError::Weights(format!("{}: no experts", w.router.name)))?;
    if w.n_used == 0 || w.n_used > 32 || w.n_used > w.experts.len() {
        return Err(CudaError::Weights(format!(
            "{}: {} experts used of {} (the GPU router takes 1..=32)",
            w.router.name,
            w.n_used,
            w.experts.len()
        )));
    }
    if w.experts.len() > 1024 || !w.router.cols.is_multiple_of(4) {
        return Err(CudaError::Weights(format!(
            "{}: {} experts of width {} (the GPU router takes up to 1024 experts, a width divisible by 4)",
            w.router.name,
            w.experts.len(),
            w.router.cols
        )));
    }
    if let Some(sh) = &w.shared {
        super::ops::shared_expert::SharedExpertW::check(sh)?;
    }
    for e in &w.experts {
        for (t, like) in [(&e.gate, &first.gate), (&e.up, &first.gate), (&e.down, &first.down)] {
            super::qformat::check_tensor(t)?;
            if (t.rows, t.cols, t.dtype) != (like.rows, like.cols, like.dtype) {
                return Err(CudaError::Weights(format!(
                    "expert tensor {} [{}, {}] {} differs from {} [{}, {}] {}: one slab needs one shape and format",
                    t.name, t.rows, t.cols, t.dtype, like.name, like.rows, like.cols, like.dtype
                )));
            }
        }
    }
    Ok(())
}

/// Device bytes of one sparse layer's router (f32), three slabs and shared expert.
pub fn layer_bytes(w: &MoeWeights, to_f16: bool) -> u64 {
    let n = w.experts.len();
    let shared = w.shared.as_ref().map_or(0, |sh| super::ops::shared_expert::shared_bytes(sh, to_f16));
    let router = (w.router.rows * w.router.cols * 4) as u64 + shared;
    let Some(e) = w.experts.first() else { return router };
    router
        + slab_bytes(e.gate.dtype, n * e.gate.rows, e.gate.cols, to_f16)
        + slab_bytes(e.up.dtype, n * e.up.rows, e.up.cols, to_f16)
        + slab_bytes(e.down.dtype, n * e.down.rows, e.down.cols, to_f16)
}

/// Step buffers of the MoE kernels for `cap_tok` tokens (bytes), for the memory plan.
pub fn workspace_bytes(cap_tok: usize, dim: usize, m: &MoeConfig) -> u64 {
    let pairs = cap_tok * m.n_used;
    // f32 activations and outputs, ids / weights / entries / positions, then the grouped
    // GEMM's F16 gathered inputs and activations (moe_gemm.rs).
    let f32_rows = pairs * (m.expert_ffn_dim + dim + 4) * 4;
    let f16_rows = pairs * (m.expert_ffn_dim + dim) * 2;
    (f32_rows + f16_rows + (cap_tok + 1) * (m.n_experts + 1) * 4) as u64
}

fn stack<'a>(w: &'a MoeWeights, f: impl Fn(&'a crate::model::moe::Expert) -> &'a Tensor) -> Vec<&'a Tensor> {
    w.experts.iter().map(f).collect()
}

impl MoeLayerW {
    /// Uploads a checked (`check_layer`) sparse layer: each slab packed as in the file (or F16
    /// with `to_f16`). Returns the layer and the count of values clamped to the F16 range.
    pub fn upload(s: &Arc<CudaStream>, w: &MoeWeights, to_f16: bool, what: &str) -> Result<(Self, u64), CudaError> {
        let router = up(s, &w.router.to_f32_vec(), &format!("{what} router"))?;
        let (gate, c1) = DevMat::upload(s, &stack(w, |e| &e.gate), to_f16, &format!("{what} expert gate slab"))?;
        let (upm, c2) = DevMat::upload(s, &stack(w, |e| &e.up), to_f16, &format!("{what} expert up slab"))?;
        let (down, c3) = DevMat::upload(s, &stack(w, |e| &e.down), to_f16, &format!("{what} expert down slab"))?;
        let ffn = w.experts[0].gate.rows;
        let (shared, c4) = match &w.shared {
            Some(sh) => {
                let (x, c) =
                    super::ops::shared_expert::SharedExpertW::upload(s, sh, to_f16, &format!("{what} shared expert"))?;
                (Some(x), c)
            }
            None => (None, 0),
        };
        let l = MoeLayerW {
            router,
            gate,
            up: upm,
            down,
            n_experts: w.experts.len(),
            n_used: w.n_used,
            ffn,
            dim: w.router.cols,
            norm_topk_prob: w.norm_topk_prob,
            shared,
        };
        Ok((l, c1 + c2 + c3 + c4))
    }

    /// A sparse layer of random weights made on the GPU (`DevMat::synthetic` slabs: gate and up
    /// in `gate_up`, down in `down`) and a random f32 router uniform in +-sqrt(3 / dim), so that
    /// the router logits of normed inputs spread over the experts as in real use.
    #[allow(clippy::too_many_arguments)]
    pub fn synthetic(
        s: &Arc<CudaStream>,
        k: &mut Kernels,
        c: &ModelConfig,
        m: &MoeConfig,
        gate_up: GgmlType,
        down: GgmlType,
        seed: u64,
        what: &str,
    ) -> Result<Self, CudaError> {
        let (e, f, d) = (m.n_experts, m.expert_ffn_dim, c.dim);
        let mut rng = StdRng::seed_from_u64(seed);
        let a = (3.0 / d as f32).sqrt();
        let r: Vec<f32> = (0..e * d).map(|_| rng.random_range(-a..a)).collect();
        let router = up(s, &r, &format!("{what} router"))?;
        let gate = DevMat::synthetic(s, k, gate_up, e * f, d, seed ^ 1, &format!("{what} expert gate slab"))?;
        let upm = DevMat::synthetic(s, k, gate_up, e * f, d, seed ^ 2, &format!("{what} expert up slab"))?;
        let down = DevMat::synthetic(s, k, down, e * d, f, seed ^ 3, &format!("{what} expert down slab"))?;
        Ok(MoeLayerW {
            router,
            gate,
            up: upm,
            down,
            n_experts: e,
            n_used: m.n_used,
            ffn: f,
            dim: d,
            norm_topk_prob: m.norm_topk_prob,
            shared: None,
        })
    }

    /// Device bytes of the layer (router and every expert).
    pub fn bytes(&self) -> u64 {
        (self.router.len() * 4) as u64 + self.gate.bytes() + self.up.bytes() + self.down.bytes() + self.shared_bytes()
    }

    /// Device bytes of the shared expert (0 without one), all read by every token.
    fn shared_bytes(&self) -> u64 {
        self.shared.as_ref().map_or(0, |s| s.bytes())
    }

    /// Bytes one token reads: the router and its `n_used` experts.
    pub fn active_bytes(&self) -> u64 {
        let experts = self.gate.bytes() + self.up.bytes() + self.down.bytes();
        (self.router.len() * 4) as u64
            + experts * self.n_used as u64 / self.n_experts.max(1) as u64
            + self.shared_bytes()
    }

    /// Bytes a step whose tokens chose `experts` distinct experts reads: the router, those
    /// experts and the shared expert.
    pub fn touched_bytes(&self, experts: usize) -> u64 {
        let all = self.gate.bytes() + self.up.bytes() + self.down.bytes();
        (self.router.len() * 4) as u64
            + all * experts.min(self.n_experts) as u64 / self.n_experts.max(1) as u64
            + self.shared_bytes()
    }

    /// The three slabs (for the format census).
    pub fn slabs(&self) -> [&DevMat; 3] {
        [&self.gate, &self.up, &self.down]
    }
}

/// Buffers of the MoE kernels, sized for `cap_pairs` (token, rank) pairs.
#[derive(Default)]
pub struct MoeWork {
    pub cap_pairs: usize,
    pub logits: Option<CudaSlice<f32>>,      // [tokens, n_experts] router logits
    pub ids: Option<CudaSlice<i32>>,         // [pairs] chosen experts
    pub wts: Option<CudaSlice<f32>>,         // [pairs] their weights
    pub offsets: Option<CudaSlice<i32>>,     // [n_experts + 1]
    pub entries: Option<CudaSlice<i32>>,     // [pairs] pair at each grouped position
    pub position: Option<CudaSlice<i32>>,    // [pairs] grouped position of each pair
    pub act: Option<CudaSlice<f32>>,         // [pairs, expert ffn] SwiGLU activations
    pub y: Option<CudaSlice<f32>>,           // [pairs, dim] expert outputs
    pub x16: Option<CudaSlice<u16>>,         // [pairs, dim] F16 inputs by grouped position (GEMM)
    pub act16: Option<CudaSlice<u16>>,       // [pairs, expert ffn] F16 SwiGLU activations (GEMM)
    pub route_count: Option<CudaSlice<u32>>, // [tokens] blocks done (fused router; 0 between launches)
}

impl MoeWork {
    /// Grows the buffers to `cap_tok` tokens of the sparse layer `m` (every sparse layer of a
    /// model has its shape); returns whether any was reallocated.
    pub fn grow(&mut self, s: &Arc<CudaStream>, cap_tok: usize, m: &MoeLayerW) -> Result<bool, CudaError> {
        let (pairs, dim) = (cap_tok * m.n_used, m.dim);
        if pairs <= self.cap_pairs {
            return Ok(false);
        }
        *self = MoeWork::default(); // free first
        self.logits = Some(zeros(s, cap_tok * m.n_experts, "MoE router logits")?);
        self.ids = Some(zeros(s, pairs, "MoE expert ids")?);
        self.wts = Some(zeros(s, pairs, "MoE expert weights")?);
        self.offsets = Some(zeros(s, m.n_experts + 1, "MoE group offsets")?);
        self.entries = Some(zeros(s, pairs, "MoE group entries")?);
        self.position = Some(zeros(s, pairs, "MoE group positions")?);
        self.act = Some(zeros(s, pairs * m.ffn, "MoE activations")?);
        self.y = Some(zeros(s, pairs * dim, "MoE expert outputs")?);
        self.x16 = Some(zeros(s, pairs * dim, "MoE gathered F16 inputs")?);
        self.act16 = Some(zeros(s, pairs * m.ffn, "MoE F16 activations")?);
        self.route_count = Some(zeros(s, cap_tok, "MoE router counts")?);
        self.cap_pairs = pairs;
        Ok(true)
    }
}

fn dev<T>(b: &Option<CudaSlice<T>>, s: &CudaStream) -> Result<Dev<T>, CudaError> {
    allocated(b, s, "moe", "MoE work buffers")
}

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
        let logits = if super::tuning::tuning().router_tiled { RouterLogits::Tiled } else { RouterLogits::WarpPerPair };
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
        need(K, "input", self.x, super::ops::launch::extent(in_rows, self.x_stride, cols))?;
        need(K, "output", self.out, super::ops::launch::extent(self.n_pairs + sh_rows, self.out_stride, rows))?;
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

/// The FFN of a sparse layer for `n_tok` tokens: `x[t] += moe(h[t])` (`h`, `x` `[n_tok, dim]`).
pub fn moe_ffn(
    kn: &mut Kernels,
    s: &CudaStream,
    w: &MoeLayerW,
    work: &MoeWork,
    h: Dev<f32>,
    x: Dev<f32>,
    n_tok: usize,
) -> Result<(), CudaError> {
    let (k, dim) = (w.n_used, w.dim);
    let pairs = n_tok * k;
    check("moe", pairs <= work.cap_pairs, || format!("{pairs} pairs, buffers for {}", work.cap_pairs))?;
    let (ids, wts) = (dev(&work.ids, s)?, dev(&work.wts, s)?);
    let (router, logits) = (Dev::of(&w.router, s), dev(&work.logits, s)?);
    let norm = w.norm_topk_prob;
    let route = MoeRoute { x: h, w: router, logits, ids, wts, n_tok, dim, n_experts: w.n_experts, k, norm };
    if let Some(path) = pair_path(w, n_tok) {
        return pair_ffn(kn, s, w, work, h, x, n_tok, path, None, None);
    }
    route.launch(kn, s)?;
    let (walk, position) = if n_tok <= pair_max_tokens() {
        (Walk::Pairs { ids }, None)
    } else {
        let (offsets, entries, position) = (dev(&work.offsets, s)?, dev(&work.entries, s)?, dev(&work.position, s)?);
        MoeGroup { ids, offsets, entries, position, n_pairs: pairs, n_experts: w.n_experts }.launch(kn, s)?;
        if moe_gemm::gemm_enabled() && moe_gemm::gemm_fits(&w.gate, &w.up, &w.down, w.ffn, w.dim) {
            return grouped_gemm(kn, s, w, work, h, x, n_tok, Some(position));
        }
        (Walk::Grouped { offsets, entries, n_experts: w.n_experts }, Some(position))
    };
    expert_walk(kn, s, w, work, h, x, n_tok, walk, position)
}

/// [`moe_ffn`] by the grouped expert walk at any step size (no one-stream launches, no F16
/// GEMM), for a calibration tap: afterwards `work` holds the grouping (`offsets`, `entries`)
/// and each grouped position's f32 SwiGLU activations (`act` `[pairs, ffn]`, the down
/// products' inputs).
pub fn moe_ffn_grouped(
    kn: &mut Kernels,
    s: &CudaStream,
    w: &MoeLayerW,
    work: &MoeWork,
    h: Dev<f32>,
    x: Dev<f32>,
    n_tok: usize,
) -> Result<(), CudaError> {
    let (k, dim) = (w.n_used, w.dim);
    let pairs = n_tok * k;
    check("moe", pairs <= work.cap_pairs, || format!("{pairs} pairs, buffers for {}", work.cap_pairs))?;
    let (ids, wts) = (dev(&work.ids, s)?, dev(&work.wts, s)?);
    let (router, logits) = (Dev::of(&w.router, s), dev(&work.logits, s)?);
    let norm = w.norm_topk_prob;
    MoeRoute { x: h, w: router, logits, ids, wts, n_tok, dim, n_experts: w.n_experts, k, norm }.launch(kn, s)?;
    let (offsets, entries, position) = (dev(&work.offsets, s)?, dev(&work.entries, s)?, dev(&work.position, s)?);
    MoeGroup { ids, offsets, entries, position, n_pairs: pairs, n_experts: w.n_experts }.launch(kn, s)?;
    let walk = Walk::Grouped { offsets, entries, n_experts: w.n_experts };
    expert_walk(kn, s, w, work, h, x, n_tok, walk, Some(position))
}

/// The routed experts of a step whose routing (`work.ids`, `work.wts`) is done: gate/up +
/// SwiGLU into `work.act` `[pairs, ffn]`, down into `work.y` `[pairs, dim]` (by pairs or by
/// the expert groups of `walk`), then each token's weighted sum added into `x` `[n_tok, dim]`.
#[allow(clippy::too_many_arguments)]
fn expert_walk(
    kn: &mut Kernels,
    s: &CudaStream,
    w: &MoeLayerW,
    work: &MoeWork,
    h: Dev<f32>,
    x: Dev<f32>,
    n_tok: usize,
    walk: Walk,
    position: Option<Dev<i32>>,
) -> Result<(), CudaError> {
    let (k, dim) = (w.n_used, w.dim);
    let pairs = n_tok * k;
    let (wts, act, y) = (dev(&work.wts, s)?, dev(&work.act, s)?, dev(&work.y, s)?);
    let mat = |slab, up, x, out, x_stride, out_stride, x_by_token| MoeMat {
        slab,
        up,
        n_experts: w.n_experts,
        x,
        out,
        walk,
        n_pairs: pairs,
        k,
        x_stride,
        out_stride,
        x_by_token,
    };
    mat(&w.gate, Some(&w.up), h, act, dim, w.ffn, true).launch(kn, s)?;
    mat(&w.down, None, act, y, w.ffn, dim, false).launch(kn, s)?;
    MoeCombine { y, wts, position, x, n_tok, dim, k }.launch(kn, s)
}

/// The RMSNorm before a sparse layer and the layer: `h = rmsnorm(x) * norm_w` (`[n_tok, dim]`,
/// as `rmsnorm::RmsNorm`), then `x[t] += moe(h[t])`. A one-stream step on the one-launch kernel
/// computes the norm inside it (one launch less a layer); other steps launch the norm first.
#[allow(clippy::too_many_arguments)]
pub fn moe_ffn_normed(
    kn: &mut Kernels,
    s: &CudaStream,
    w: &MoeLayerW,
    work: &MoeWork,
    x: Dev<f32>,
    norm_w: Dev<f32>,
    eps: f32,
    h: Dev<f32>,
    n_tok: usize,
) -> Result<(), CudaError> {
    if let Some(path) = pair_path(w, n_tok) {
        return pair_ffn(kn, s, w, work, h, x, n_tok, path, Some((norm_w, eps)), None);
    }
    NormIn { x, w: norm_w, h, n: n_tok, dim: w.dim, eps }.plain().launch(kn, s)?;
    moe_ffn(kn, s, w, work, h, x, n_tok)
}

/// Dynamic shared memory of kernels/moe.cu `block_top_k` for `n` experts, `k` ranks (bytes).
pub fn top_k_smem(n: usize, k: usize) -> u32 {
    (8 * n + 8 * k + 128) as u32
}

/// The path of a step of `n_tok` tokens through the fused one-stream kernels, if it takes them.
pub(super) fn pair_path(w: &MoeLayerW, n_tok: usize) -> Option<PairPath> {
    let k = w.n_used;
    if n_tok > pair_max_tokens() || !fused_enabled() || k > 8 {
        return None;
    }
    let q8 = super::ops::moe_q8::q8_enabled() && super::ops::moe_q8::fits(&w.gate, &w.down, k);
    Some(match () {
        _ if q8 => PairPath::Int8,
        _ => PairPath::Three,
    })
}

/// How a one-stream step (pair mode, `k <= 8`) runs its sparse layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PairPath {
    /// Fused router, gate/up per pair, down + weighted sum.
    Three,
    /// The three launches on int8 activations (moe_q8.rs).
    Int8,
}

/// The FFN of a sparse layer for a step of few tokens (`k <= 8`, the fused launches), by `path`:
/// `x[t] += moe(h[t])`; with `rms` = (norm weight, eps) first `h = rmsnorm(x)` (`rmsnorm_f32`);
/// with `sh` (path `Three` only) the shared expert inside the same three launches
/// (moe_shexp.rs).
#[allow(clippy::too_many_arguments)]
pub fn pair_ffn(
    kn: &mut Kernels,
    s: &CudaStream,
    w: &MoeLayerW,
    work: &MoeWork,
    h: Dev<f32>,
    x: Dev<f32>,
    n_tok: usize,
    path: PairPath,
    rms: Option<(Dev<f32>, f32)>,
    sh: Option<&ShexpPairs>,
) -> Result<(), CudaError> {
    let (k, dim) = (w.n_used, w.dim);
    let pairs = n_tok * k;
    let rows = pairs + sh.map_or(0, |_| n_tok);
    check("moe", rows <= work.cap_pairs && (sh.is_none() || path == PairPath::Three), || {
        format!("{rows} pairs, buffers for {} (a shared expert: the f32 path only)", work.cap_pairs)
    })?;
    let (ids, wts, act) = (dev(&work.ids, s)?, dev(&work.wts, s)?, dev(&work.act, s)?);
    let (router, logits) = (Dev::of(&w.router, s), dev(&work.logits, s)?);
    let norm = w.norm_topk_prob;
    if let Some((norm_w, eps)) = rms {
        NormIn { x, w: norm_w, h, n: n_tok, dim, eps }.plain().launch(kn, s)?;
    }
    let route = MoeRoute { x: h, w: router, logits, ids, wts, n_tok, dim, n_experts: w.n_experts, k, norm };
    MoeRouteFused { route, count: dev(&work.route_count, s)? }.launch_sh(kn, s, sh)?;
    if path == PairPath::Int8 {
        let (ne, n_pairs) = (w.n_experts, pairs);
        super::ops::moe_q8::MoeGateUpQ8 { gate: &w.gate, up: &w.up, n_experts: ne, h, ids, act, n_pairs, k }
            .launch(kn, s)?;
        return MoeDownSum { down: &w.down, n_experts: ne, act, ids, wts, x, n_tok, k }.launch_q8(kn, s);
    }
    MoeMat {
        slab: &w.gate,
        up: Some(&w.up),
        n_experts: w.n_experts,
        x: h,
        out: act,
        walk: Walk::Pairs { ids },
        n_pairs: pairs,
        k,
        x_stride: dim,
        out_stride: w.ffn,
        x_by_token: true,
    }
    .launch_sh(kn, s, sh)?;
    MoeDownSum { down: &w.down, n_experts: w.n_experts, act, ids, wts, x, n_tok, k }.launch_sh(kn, s, sh)
}

/// Gather, tensor-core gate/up + SwiGLU, down and the weighted sum of a grouped step
/// (`moe_gemm.rs`), after `MoeRoute` and `MoeGroup` filled `work`.
#[allow(clippy::too_many_arguments)]
fn grouped_gemm(
    kn: &mut Kernels,
    s: &CudaStream,
    w: &MoeLayerW,
    work: &MoeWork,
    h: Dev<f32>,
    x: Dev<f32>,
    n_tok: usize,
    position: Option<Dev<i32>>,
) -> Result<(), CudaError> {
    use moe_gemm::{GemmOut, MoeGather, MoeGemm, Tile};
    let (k, dim, pairs) = (w.n_used, w.dim, n_tok * w.n_used);
    let (offsets, entries, wts, y) =
        (dev(&work.offsets, s)?, dev(&work.entries, s)?, dev(&work.wts, s)?, dev(&work.y, s)?);
    let (x16, act16) = (dev(&work.x16, s)?, dev(&work.act16, s)?);
    MoeGather { h, entries, x16, n_pairs: pairs, dim, k }.launch(kn, s)?;
    let wide = super::tuning::tuning().moe_wide_tile;
    let tile = |gate_up| match Tile::for_step(pairs, w.n_experts, gate_up) {
        Tile::W48 if !wide => Tile::T64,
        t => t,
    };
    let gemm = |slab, x, out, tile| MoeGemm { slab, n_experts: w.n_experts, x, offsets, out, n_pairs: pairs, tile };
    gemm(&w.gate, x16, GemmOut::GateUp { up: &w.up, act: act16 }, tile(true)).launch(kn, s)?;
    gemm(&w.down, act16, GemmOut::Down { y }, tile(false)).launch(kn, s)?;
    MoeCombine { y, wts, position, x, n_tok, dim, k }.launch(kn, s)
}

/// A shared expert's device views for the pair-mode kernels.
#[derive(Clone, Copy, Debug)]
pub struct ShexpPairs {
    /// Gate rows (qs, aux), then up rows (qs, aux): the halves of the `[2 f, dim]` gate/up.
    pub(super) gu: [u64; 4],
    /// Down rows (qs, aux) of the `[dim, f]` down matrix.
    pub(super) down: [u64; 2],
    /// The gate row `[dim]` f32.
    pub(super) gate: Dev<f32>,
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
    pub(super) fn check_gate_up(
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
    pub(super) fn check_down(
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
