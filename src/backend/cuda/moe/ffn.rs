//! Which launches a sparse layer's step takes: the fused pair-mode kernels for a few tokens, the
//! grouped walk by expert (tensor-core GEMM of `ops::moe_gemm`) for more.

use cudarc::driver::CudaStream;

use super::launch::{MoeCombine, MoeGroup, MoeMat, MoeRoute, MoeRouteFused, ShexpPairs, Walk};
use super::weights::{dev, MoeLayerW, MoeWork};
use super::{fused_enabled, pair_max_tokens};
use crate::backend::cuda::compile::kernels::Kernels;
use crate::backend::cuda::ops::launch::{check, Dev};
use crate::backend::cuda::ops::moe_slab::MoeDownSum;
use crate::backend::cuda::ops::{moe_gemm, moe_q8};
use crate::backend::cuda::step::norm::NormIn;
use crate::backend::cuda::CudaError;

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
    let route = route(s, w, work, h, n_tok)?;
    if let Some(path) = pair_path(w, n_tok) {
        return pair_ffn(kn, s, w, work, h, x, n_tok, path, None, None);
    }
    route.launch(kn, s)?;
    let (walk, position) = if n_tok <= pair_max_tokens() {
        (Walk::Pairs { ids: route.ids }, None)
    } else {
        let (walk, position) = group(kn, s, w, work, route.ids, n_tok)?;
        if moe_gemm::gemm_enabled() && moe_gemm::gemm_fits(&w.gate, &w.up, &w.down, w.ffn, w.dim) {
            return grouped_gemm(kn, s, w, work, h, x, n_tok, Some(position));
        }
        (walk, Some(position))
    };
    expert_walk(kn, s, w, work, h, x, n_tok, walk, position)
}

/// The router of a step of `n_tok` tokens (`h` `[n_tok, dim]`) writing `work`'s expert ids and
/// weights `[n_tok, k]`; refused when the buffers hold fewer pairs.
fn route(s: &CudaStream, w: &MoeLayerW, work: &MoeWork, h: Dev<f32>, n_tok: usize) -> Result<MoeRoute, CudaError> {
    let (k, pairs) = (w.n_used, n_tok * w.n_used);
    check("moe", pairs <= work.cap_pairs, || format!("{pairs} pairs, buffers for {}", work.cap_pairs))?;
    Ok(MoeRoute {
        x: h,
        w: Dev::of(&w.router, s),
        logits: dev(&work.logits, s)?,
        ids: dev(&work.ids, s)?,
        wts: dev(&work.wts, s)?,
        n_tok,
        dim: w.dim,
        n_experts: w.n_experts,
        k,
        norm: w.norm_topk_prob,
    })
}

/// The step's (token, rank) pairs grouped by expert (`MoeGroup` from the routed `ids`): the walk
/// over the groups and each pair's grouped position.
fn group(
    kn: &mut Kernels,
    s: &CudaStream,
    w: &MoeLayerW,
    work: &MoeWork,
    ids: Dev<i32>,
    n_tok: usize,
) -> Result<(Walk, Dev<i32>), CudaError> {
    let (offsets, entries, position) = (dev(&work.offsets, s)?, dev(&work.entries, s)?, dev(&work.position, s)?);
    let n_pairs = n_tok * w.n_used;
    MoeGroup { ids, offsets, entries, position, n_pairs, n_experts: w.n_experts }.launch(kn, s)?;
    Ok((Walk::Grouped { offsets, entries, n_experts: w.n_experts }, position))
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
    let route = route(s, w, work, h, n_tok)?;
    route.launch(kn, s)?;
    let (walk, position) = group(kn, s, w, work, route.ids, n_tok)?;
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

/// The path of a step of `n_tok` tokens through the fused one-stream kernels, if it takes them.
pub(in crate::backend::cuda) fn pair_path(w: &MoeLayerW, n_tok: usize) -> Option<PairPath> {
    let k = w.n_used;
    if n_tok > pair_max_tokens() || !fused_enabled() || k > 8 {
        return None;
    }
    let q8 = moe_q8::q8_enabled() && moe_q8::fits(&w.gate, &w.down, k);
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
/// (moe/shexp.rs).
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
    let route = route(s, w, work, h, n_tok)?;
    let (ids, wts, act) = (route.ids, route.wts, dev(&work.act, s)?);
    if let Some((norm_w, eps)) = rms {
        NormIn { x, w: norm_w, h, n: n_tok, dim, eps }.plain().launch(kn, s)?;
    }
    MoeRouteFused { route, count: dev(&work.route_count, s)? }.launch_sh(kn, s, sh)?;
    if path == PairPath::Int8 {
        let (ne, n_pairs) = (w.n_experts, pairs);
        moe_q8::MoeGateUpQ8 { gate: &w.gate, up: &w.up, n_experts: ne, h, ids, act, n_pairs, k }.launch(kn, s)?;
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
    let wide = crate::backend::cuda::tuning::tuning().moe_wide_tile;
    let tile = |gate_up| match Tile::for_step(pairs, w.n_experts, gate_up) {
        Tile::W48 if !wide => Tile::T64,
        t => t,
    };
    let gemm = |slab, x, out, tile| MoeGemm { slab, n_experts: w.n_experts, x, offsets, out, n_pairs: pairs, tile };
    gemm(&w.gate, x16, GemmOut::GateUp { up: &w.up, act: act16 }, tile(true)).launch(kn, s)?;
    gemm(&w.down, act16, GemmOut::Down { y }, tile(false)).launch(kn, s)?;
    MoeCombine { y, wts, position, x, n_tok, dim, k }.launch(kn, s)
}
