//! The mixture-of-experts FFN on the CPU (Qwen3-MoE): the reference the GPU MoE kernels are
//! tested against. Each step runs the same stages a GPU batch does:
//!
//! 1. router logits `[n, n_experts]` = x . router^T (f32 accumulation);
//! 2. per token, in f32: softmax over all experts, the `k` largest chosen (see [`route`] for
//!    ties), their probabilities renormalised to sum 1 when `norm_topk_prob`;
//! 3. the `n * k` (token, rank) pairs grouped by expert (count, prefix sum, fill: ascending
//!    token within an expert), their rows of x gathered into one `[n * k, dim]` buffer;
//! 4. per expert that has tokens, one matrix product over its group: `down(silu(gate x) * up x)`,
//!    so each chosen expert's matrices are read once per step however many tokens chose it
//!    (one token: the gate/up products of all its experts fused into one);
//! 5. per token, the weighted sum over its ranks in rank order (rank 0 first), a fixed order
//!    independent of how tokens were grouped or batched;
//! 6. Qwen3-Next / Qwen3.5-MoE: plus the shared expert times `sigmoid(shared_gate . x)`.

use super::matmul::{matmul, matmul_fused};
use super::ops;
use super::take;
use crate::model::moe::{MoeWeights, SharedExpert};
use crate::model::weights::Tensor;

/// The experts each token of a step uses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Routing {
    /// Experts per token.
    pub k: usize,
    /// `[n, k]`: chosen experts, by descending router logit (ties: lower index first).
    pub experts: Vec<u32>,
    /// `[n, k]`: their weights (the softmax probabilities, renormalised when asked).
    pub weights: Vec<f32>,
}

/// Routes `n` tokens from router logits `[n, n_experts]`: softmax over all experts in f32,
/// the `k` largest logits chosen (softmax is monotone, so these are the `k` largest
/// probabilities). NOTE: ties are broken towards the lower expert index: a tie at the k-th
/// place chooses the lowest-numbered of the tied experts. `k <= n_experts` (the configs are
/// checked at load).
pub fn route(logits: &[f32], n_experts: usize, k: usize, norm_topk_prob: bool, out: &mut Routing) {
    let n = logits.len().checked_div(n_experts).unwrap_or(0);
    let k = k.min(n_experts);
    out.k = k;
    out.experts.clear();
    out.weights.clear();
    let mut chosen = vec![false; n_experts];
    for row in logits.chunks_exact(n_experts).take(n) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let total: f32 = row.iter().map(|&l| (l - max).exp()).sum();
        chosen.iter_mut().for_each(|c| *c = false);
        let first = out.weights.len();
        for _ in 0..k {
            // Strictly greater: the first (lowest-index) of equal logits stays the best.
            let mut best: Option<usize> = None;
            for (e, &l) in row.iter().enumerate() {
                if !chosen[e] && best.is_none_or(|b| l > row[b]) {
                    best = Some(e);
                }
            }
            let Some(b) = best else { break };
            chosen[b] = true;
            out.experts.push(b as u32);
            out.weights.push((row[b] - max).exp());
        }
        let denom = if norm_topk_prob { out.weights[first..].iter().sum::<f32>() } else { total };
        out.weights[first..].iter_mut().for_each(|w| *w /= denom);
    }
}

/// The (token, rank) pairs of a routing grouped by expert: `entries[offsets[e]..offsets[e + 1]]`
/// are the pairs (as `token * k + rank`) that chose expert `e`, in ascending token order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Groups {
    /// `[n_experts + 1]`: prefix sums of the per-expert counts.
    pub offsets: Vec<usize>,
    /// `[n * k]`.
    pub entries: Vec<u32>,
    /// `[n * k]`: the inverse, `position[token * k + rank]` = index into `entries`.
    pub position: Vec<u32>,
}

/// Groups a routing by expert (a counting sort: stable, so tokens stay in order).
pub fn group(r: &Routing, n_experts: usize, g: &mut Groups) {
    g.offsets.clear();
    g.offsets.resize(n_experts + 1, 0);
    for &e in &r.experts {
        g.offsets[e as usize + 1] += 1;
    }
    for e in 0..n_experts {
        g.offsets[e + 1] += g.offsets[e];
    }
    let mut fill = g.offsets.clone();
    g.entries.clear();
    g.entries.resize(r.experts.len(), 0);
    g.position.clear();
    g.position.resize(r.experts.len(), 0);
    for (pair, &e) in r.experts.iter().enumerate() {
        let p = fill[e as usize];
        fill[e as usize] += 1;
        g.entries[p] = pair as u32;
        g.position[pair] = p as u32;
    }
}

/// Buffers of [`moe_ffn`] kept across steps (grown on demand).
#[derive(Default)]
pub struct MoeScratch {
    logits: Vec<f32>, // [n, n_experts]
    pub routing: Routing,
    pub groups: Groups,
    xg: Vec<f32>,           // [n * k, dim] gathered inputs, grouped by expert
    gate: Vec<f32>,         // [n * k, expert_ffn]
    up: Vec<f32>,           // [n * k, expert_ffn]
    yg: Vec<f32>,           // [n * k, dim] expert outputs, grouped like xg; then [n, dim] shared expert
    shared_logit: Vec<f32>, // [n] shared-expert gate logits
}

/// `out[t] = sum over the k experts e chosen by token t of weight(t, e) * expert_e(x[t])` for the
/// `n` rows of `x` (`[n, dim]`); `out` is `[n, dim]`. The routing and grouping of the step are
/// left in `s` (tests and the GPU parity suite read them).
pub fn moe_ffn(w: &MoeWeights, x: &[f32], n: usize, out: &mut [f32], s: &mut MoeScratch) {
    moe_ffn_observed(w, x, n, out, s, &mut |_, _, _| {});
}

/// What [`moe_ffn_observed`] reports: `(matrices, input [rows, cols], rows)` for every product
/// it computes but the router's (the caller sees that input).
pub type Observer<'a> = dyn FnMut(&[&Tensor], &[f32], usize) + 'a;

/// [`moe_ffn`], reporting the input of every expert product to `observe`: each routed
/// expert's gate/up input (the rows of the tokens routed to it) and down input, the shared
/// expert's gate/up/gate-logit input (every token) and down input. The calibration tap reads
/// them; the result is the same bits as without an observer.
pub fn moe_ffn_observed(
    w: &MoeWeights,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    s: &mut MoeScratch,
    observe: &mut Observer,
) {
    let n_experts = w.experts.len();
    let dim = w.router.cols;
    let f = w.experts.first().map_or(0, |e| e.gate.rows);
    let out = &mut out[..n * dim];
    out.fill(0.0);
    if n == 0 || n_experts == 0 {
        return;
    }
    let x = &x[..n * dim];
    let logits = take(&mut s.logits, n * n_experts);
    matmul(&w.router, x, n, logits);
    route(logits, n_experts, w.n_used, w.norm_topk_prob, &mut s.routing);
    let k = s.routing.k;
    group(&s.routing, n_experts, &mut s.groups);
    if super::route_stats::enabled() {
        super::route_stats::report(&super::route_stats::RouteSpread::of(x, n, dim, &s.groups.offsets));
    }

    let pairs = n * k;
    let xg = take(&mut s.xg, pairs * dim);
    for (p, &pair) in s.groups.entries.iter().enumerate() {
        let t = pair as usize / k;
        xg[p * dim..(p + 1) * dim].copy_from_slice(&x[t * dim..(t + 1) * dim]);
    }
    let gate = take(&mut s.gate, pairs * f);
    let up = take(&mut s.up, pairs * f);
    let yg = take(&mut s.yg, pairs * dim);
    let active = || (0..n_experts).filter(|&e| s.groups.offsets[e + 1] > s.groups.offsets[e]);
    if n == 1 {
        // One token: all its experts read the same input, so their gate and up matrices go
        // through one fused product (one parallel region, not k). Pair p is the p-th chosen
        // expert in index order. Bitwise the same as the grouped path: every row's dot product
        // is computed alike whatever it is fused with (see `gemv`).
        let ws: Vec<&Tensor> = active().flat_map(|e| [&w.experts[e].gate, &w.experts[e].up]).collect();
        let mut outs: Vec<&mut [f32]> =
            gate.chunks_exact_mut(f).zip(up.chunks_exact_mut(f)).flat_map(|(g, u)| [g, u]).collect();
        matmul_fused(&ws, x, 1, &mut outs);
        ops::silu_mul_inplace(gate, up);
    }
    for e in active() {
        let (p0, p1) = (s.groups.offsets[e], s.groups.offsets[e + 1]);
        let (m, ex) = (p1 - p0, &w.experts[e]);
        let (g, u) = (&mut gate[p0 * f..p1 * f], &mut up[p0 * f..p1 * f]);
        observe(&[&ex.gate, &ex.up], &xg[p0 * dim..p1 * dim], m);
        if n > 1 {
            matmul_fused(&[&ex.gate, &ex.up], &xg[p0 * dim..p1 * dim], m, &mut [&mut *g, &mut *u]);
            ops::silu_mul_inplace(g, u);
        }
        observe(&[&ex.down], g, m);
        matmul(&ex.down, g, m, &mut yg[p0 * dim..p1 * dim]);
    }

    for t in 0..n {
        let o = &mut out[t * dim..(t + 1) * dim];
        for j in 0..k {
            let wt = s.routing.weights[t * k + j];
            let p = s.groups.position[t * k + j] as usize;
            o.iter_mut().zip(&yg[p * dim..(p + 1) * dim]).for_each(|(a, &y)| *a += wt * y);
        }
    }
    if let Some(sh) = &w.shared {
        shared_expert(sh, x, n, out, s, observe);
    }
}

/// Adds the shared expert to `out` (`[n, dim]`, the routed sum): per token
/// `sigmoid(gate . x) * down(silu(gate_proj x) * up_proj x)`, after the routed experts (the
/// order of transformers' `Qwen3NextSparseMoeBlock`).
fn shared_expert(sh: &SharedExpert, x: &[f32], n: usize, out: &mut [f32], s: &mut MoeScratch, observe: &mut Observer) {
    let (dim, f) = (sh.gate.cols, sh.expert.gate.rows);
    let logit = take(&mut s.shared_logit, n);
    let g = take(&mut s.gate, n * f);
    let u = take(&mut s.up, n * f);
    observe(&[&sh.gate, &sh.expert.gate, &sh.expert.up], x, n);
    matmul_fused(&[&sh.gate, &sh.expert.gate, &sh.expert.up], x, n, &mut [&mut *logit, &mut *g, &mut *u]);
    ops::silu_mul_inplace(g, u);
    observe(&[&sh.expert.down], g, n);
    let y = take(&mut s.yg, n * dim);
    matmul(&sh.expert.down, g, n, y);
    for t in 0..n {
        let scale = 1.0 / (1.0 + (-logit[t]).exp());
        let o = &mut out[t * dim..(t + 1) * dim];
        o.iter_mut().zip(&y[t * dim..(t + 1) * dim]).for_each(|(a, &v)| *a += scale * v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_picks_the_largest_and_breaks_ties_towards_the_lower_index() {
        let mut r = Routing::default();
        // Token 0: clear winners 3 then 1. Token 1: all equal. Token 2: a tie at the k-th place
        // between experts 2 and 0 behind expert 1.
        let logits = [0.0, 1.0, -1.0, 2.0, 0.5, 0.5, 0.5, 0.5, 0.2, 0.7, 0.2, -3.0];
        route(&logits, 4, 2, true, &mut r);
        assert_eq!(r.experts, vec![3, 1, 0, 1, 1, 0]);
        let (a, b) = ((2.0f32 - 2.0).exp(), (1.0f32 - 2.0).exp());
        assert!((r.weights[0] - a / (a + b)).abs() < 1e-6 && (r.weights[1] - b / (a + b)).abs() < 1e-6);
        assert_eq!(&r.weights[2..4], &[0.5, 0.5]);
        // Without renormalisation the weights are the softmax probabilities themselves.
        route(&logits, 4, 2, false, &mut r);
        assert_eq!(&r.weights[2..4], &[0.25, 0.25]);
        let z: f32 = [0.2f32, 0.7, 0.2, -3.0].iter().map(|l| (l - 0.7).exp()).sum();
        assert!((r.weights[4] - 1.0 / z).abs() < 1e-6 && (r.weights[5] - (0.2f32 - 0.7).exp() / z).abs() < 1e-6);
    }

    #[test]
    fn groups_are_a_stable_partition_by_expert() {
        let r = Routing { k: 2, experts: vec![3, 1, 1, 0, 3, 1], weights: vec![0.5; 6] };
        let mut g = Groups::default();
        group(&r, 5, &mut g);
        assert_eq!(g.offsets, vec![0, 1, 4, 4, 6, 6]);
        // Expert 0: pair 3 (token 1); expert 1: pairs 1, 2, 5; expert 3: pairs 0, 4.
        assert_eq!(g.entries, vec![3, 1, 2, 5, 0, 4]);
        for (p, &pair) in g.entries.iter().enumerate() {
            assert_eq!(g.position[pair as usize] as usize, p);
        }
    }
}
