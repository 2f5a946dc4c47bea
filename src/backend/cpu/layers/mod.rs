//! The layer walker of the CPU backend: every layer is norm, mixer, residual add, norm, FFN,
//! residual add, whatever its kind (`model::layer`); each mixer and FFN kind is one file here.
//! What must hold for every kind is a hook of the walker ([`Hooks`]) around every block: the
//! calibration tap sees the input of every matrix a block multiplies, and a tensor-parallel
//! rank sums its partial block output over the ranks before the residual add.

mod attention;
mod dense_ffn;
mod gated_deltanet;
mod moe_ffn;

use super::hybrid::HybridCpu;
use super::ops;
use super::take;
use super::tap::ActivationTap;
use super::tensor_parallel::{self, RankLink};
use crate::engine::plan::StepPlan;
use crate::model::config::{ModelConfig, RopeStyle};
use crate::model::layer::{Ffn, Mixer};
use crate::model::weights::{LayerWeights, Tensor};

/// RoPE of the attention layers: the first `rotary_dim` dims of each head rotated (all of them
/// but in hybrid models' partial rotation), paired as `style`.
pub(super) struct Rope {
    /// `[rotary_dim / 2]`, the file's scaling applied.
    pub inv_freq: Vec<f32>,
    pub rotary_dim: usize,
    pub style: RopeStyle,
}

/// What every block of a step reads: the plan, flattened per token.
pub(super) struct StepCtx<'a> {
    pub c: &'a ModelConfig,
    pub plan: &'a StepPlan,
    /// Token `t` belongs to the sequence of block table `tables[t]`, at position `pos[t]`.
    pub tables: &'a [&'a [u32]],
    pub pos: &'a [usize],
    /// `[n, rotary_dim / 2]`: the rotation of each token's position.
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    pub rope: &'a Rope,
    pub block_size: usize,
    /// The cache type whose values the K/V caches hold (`kv_type::store_row` on every write).
    pub kv_type: crate::backend::kv_type::KvType,
    /// Cached values rounded to F16 also for the F16 type (`CpuBackend::with_rounded_f16_cache`).
    pub round_f16_cache: bool,
}

/// The hooks around every block.
pub(super) struct Hooks<'a> {
    /// Observer of matrix inputs (calibration, eval); `None` in normal runs.
    pub tap: Option<&'a mut (dyn ActivationTap + 'static)>,
    pub rank: &'a Option<RankLink>,
}

impl Hooks<'_> {
    /// `x` (`[n, cols]`) is the input of the matrices `mats` (one product, or one fused).
    pub fn input(&mut self, mats: &[&Tensor], x: &[f32], n: usize) {
        if let Some(t) = self.tap.as_deref_mut() {
            let names: Vec<&str> = mats.iter().map(|m| m.name.as_str()).collect();
            t.matmul_input(&names, x, n);
        }
    }

    /// The residual add after a block (`x += o`; a rank sums `o` over the ranks first).
    fn residual(&self, x: &mut [f32], o: &[f32]) {
        tensor_parallel::residual(self.rank, x, o);
    }
}

/// The walker's buffers, kept across steps (grown on demand, never shrunk).
#[derive(Default)]
pub(super) struct LayerScratch {
    /// `[n, dim]`: a block's normed input (after the last layer free for the caller).
    pub h: Vec<f32>,
    o: Vec<f32>, // [n, dim] a block's output
    attention: attention::Scratch,
    deltanet: gated_deltanet::Scratch,
    dense: dense_ffn::Scratch,
    moe: super::moe::MoeScratch,
}

/// The per-layer paged K/V arrays (empty for layers without K/V).
pub(super) struct KvCaches<'a> {
    pub k: &'a mut [Vec<f32>],
    pub v: &'a mut [Vec<f32>],
}

/// Runs every layer over the step's `n` tokens on the residual stream `x` (`[n, dim]`).
/// `state` holds the recurrent states of the Gated DeltaNet layers (present whenever the model
/// has such layers: `CpuBackend::new` makes it for every hybrid configuration).
pub(super) fn run(
    cx: &StepCtx,
    layers: &[LayerWeights],
    kv: KvCaches,
    mut state: Option<&mut HybridCpu>,
    s: &mut LayerScratch,
    hooks: &mut Hooks,
    x: &mut [f32],
) {
    let (n, dim, eps) = (cx.pos.len(), cx.c.dim, cx.c.rms_eps);
    let LayerScratch { h, o, attention: sa, deltanet: sd, dense: sf, moe: sm } = s;
    let h = take(h, n * dim);
    let o = take(o, n * dim);
    for (l, lw) in layers.iter().enumerate() {
        let layer = lw.typed();
        ops::rmsnorm(x, layer.attn_norm, eps, h);
        match layer.mixer {
            Mixer::Attention(a) => attention::run(cx, a, false, &mut kv.k[l], &mut kv.v[l], sa, hooks, h, o),
            Mixer::GatedAttention(a) => attention::run(cx, a, true, &mut kv.k[l], &mut kv.v[l], sa, hooks, h, o),
            Mixer::DeltaNet(d) => match state.as_deref_mut() {
                Some(st) => gated_deltanet::run(cx, l, d, st, sd, hooks, h, o),
                None => {
                    // Unreachable (see above); a zero output keeps the residual stream as is.
                    debug_assert!(false, "layer {l} is Gated DeltaNet but the backend holds no recurrent state");
                    o.fill(0.0);
                }
            },
        }
        hooks.residual(x, o);
        ops::rmsnorm(x, layer.ffn_norm, eps, h);
        match layer.ffn {
            Ffn::Dense(d) => dense_ffn::run(d, sf, hooks, h, n, o),
            Ffn::Moe(m) => moe_ffn::run(m, sm, hooks, h, n, o),
        }
        hooks.residual(x, o);
    }
}
