//! Mixture-of-experts layers (Qwen3-MoE; Qwen2-MoE, Qwen3.5-MoE and Qwen3-Next add a shared expert): the
//! configuration and its rules, and the weights of one sparse layer (router + experts [+ shared
//! expert]). The configuration is read by `gguf_config` and `hf`, the weights bound by
//! `gguf_bind` and `hf_bind`.
//!
//! A sparse layer replaces the dense SwiGLU FFN by `n_experts` SwiGLU experts of width
//! `expert_ffn_dim` and a router `[n_experts, dim]`: per token, softmax over the router logits,
//! the `n_used` largest chosen, their probabilities renormalised to sum 1 when
//! `norm_topk_prob`, and the experts' outputs summed with those weights. The maths lives in
//! the CPU reference (`backend::cpu::moe`).

use super::rules::{ShapeError, MAX_EXPERTS};
use super::tensor::Tensor;

/// The mixture-of-experts part of a model's configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Experts per sparse layer (`expert_count`, HF `num_experts` / `num_local_experts`).
    pub n_experts: usize,
    /// Experts each token uses (`expert_used_count`, HF `num_experts_per_tok`).
    pub n_used: usize,
    /// Intermediate width of one expert (`expert_feed_forward_length`, HF `moe_intermediate_size`).
    pub expert_ffn_dim: usize,
    /// Renormalise the chosen experts' probabilities to sum 1.
    pub norm_topk_prob: bool,
    /// Width of the gated shared expert of each sparse layer, for the families that have one
    /// (`expert_shared_feed_forward_length`, HF `shared_expert_intermediate_size`: Qwen2-MoE's
    /// differs from `expert_ffn_dim`); `None` for the others.
    pub shared_ffn_dim: Option<usize>,
    /// `[n_layers]`: true where the layer's FFN is the mixture; the others are dense
    /// (`ffn_dim` wide: HF `mlp_only_layers`, `decoder_sparse_step`).
    pub sparse_layers: Vec<bool>,
}

/// A quantity of the MoE configuration, as [`MoeConfig`]'s rules blame it: each loader maps it
/// to its own file's name for the value (a GGUF key, a `config.json` field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeField {
    /// Experts per sparse layer.
    Experts,
    /// Experts each token uses.
    Used,
    /// Intermediate width of one expert.
    ExpertFfnDim,
    /// Intermediate width of the shared expert.
    SharedFfnDim,
}

impl MoeConfig {
    pub fn is_sparse(&self, layer: usize) -> bool {
        self.sparse_layers.get(layer).copied().unwrap_or(false)
    }

    /// The MoE rules, written once for every loader (GGUF metadata, `config.json`): experts
    /// exist, a token uses between one and all of them, and an expert has a width. `name`
    /// spells a quantity as the caller's file does, for the reasons that name a second one.
    pub(super) fn check(&self, name: &dyn Fn(MoeField) -> String) -> Result<(), ShapeError<MoeField>> {
        let fail = |field, reason| Err(ShapeError { field, reason });
        if self.n_experts == 0 {
            return fail(MoeField::Experts, "0 must be positive".into());
        }
        if self.n_experts > MAX_EXPERTS {
            return fail(
                MoeField::Experts,
                format!("{} is more than the {MAX_EXPERTS} this reader accepts", self.n_experts),
            );
        }
        if self.n_used == 0 || self.n_used > self.n_experts {
            let (n, e) = (self.n_used, name(MoeField::Experts));
            return fail(MoeField::Used, format!("{n} must be between 1 and {e} {}", self.n_experts));
        }
        if self.expert_ffn_dim == 0 {
            return fail(MoeField::ExpertFfnDim, "0 must be positive".into());
        }
        if self.shared_ffn_dim == Some(0) {
            return fail(MoeField::SharedFfnDim, "0 must be positive".into());
        }
        Ok(())
    }
}

/// One SwiGLU expert: `down(silu(gate x) * up x)`.
#[derive(Clone, Debug)]
pub struct Expert {
    pub gate: Tensor, // [expert_ffn_dim, dim]
    pub up: Tensor,   // [expert_ffn_dim, dim]
    pub down: Tensor, // [dim, expert_ffn_dim]
}

/// The always-on expert of Qwen3-Next / Qwen3.5-MoE layers, added to the routed experts' sum
/// scaled per token by `sigmoid(gate . x)`.
#[derive(Clone, Debug)]
pub struct SharedExpert {
    /// SwiGLU of width `shared_expert_intermediate_size` (GGUF `ffn_*_shexp`).
    pub expert: Expert,
    /// `[1, dim]`: the per-token gate logit (`shared_expert_gate`, GGUF `ffn_gate_inp_shexp`).
    pub gate: Tensor,
}

impl SharedExpert {
    /// Checks the shapes of the four tensors against each other and `dim` (the width comes from
    /// the tensors, not the config). `Err` names the first tensor that does not fit.
    pub fn new(expert: Expert, gate: Tensor, dim: usize) -> Result<Self, String> {
        let f = expert.gate.rows;
        let bad = |t: &Tensor, want: [usize; 2]| {
            Err(format!("tensor '{}' is [{}, {}], the shared expert needs {want:?}", t.name, t.rows, t.cols))
        };
        if expert.gate.cols != dim || f == 0 {
            return bad(&expert.gate, [f.max(1), dim]);
        }
        if (expert.up.rows, expert.up.cols) != (f, dim) {
            return bad(&expert.up, [f, dim]);
        }
        if (expert.down.rows, expert.down.cols) != (dim, f) {
            return bad(&expert.down, [dim, f]);
        }
        if (gate.rows, gate.cols) != (1, dim) {
            return bad(&gate, [1, dim]);
        }
        Ok(SharedExpert { expert, gate })
    }

    /// Packed bytes a token reads (the three matrices and the gate row).
    pub fn bytes(&self) -> usize {
        let e = &self.expert;
        e.gate.bytes().len() + e.up.bytes().len() + e.down.bytes().len() + self.gate.bytes().len()
    }
}

/// The FFN of one sparse layer, with the routing rule of [`MoeConfig`] (so a layer is
/// computed from its weights alone).
#[derive(Clone, Debug)]
pub struct MoeWeights {
    /// `[n_experts, dim]`: router logits = router . x (F32 in GGUF files, BF16 in HF ones).
    pub router: Tensor,
    /// `[n_experts]`.
    pub experts: Vec<Expert>,
    /// Experts per token (`MoeConfig::n_used`).
    pub n_used: usize,
    /// `MoeConfig::norm_topk_prob`.
    pub norm_topk_prob: bool,
    /// Qwen3-Next / Qwen3.5-MoE: the shared expert (`None` for Qwen3-MoE).
    pub shared: Option<SharedExpert>,
}

impl MoeWeights {
    /// Packed bytes of the router and of one average expert (what a token reads per expert).
    /// The shared expert, which every token reads, is [`SharedExpert::bytes`].
    pub fn bytes_router_and_expert(&self) -> (usize, usize) {
        let all: usize =
            self.experts.iter().map(|e| e.gate.bytes().len() + e.up.bytes().len() + e.down.bytes().len()).sum();
        (self.router.bytes().len(), all / self.experts.len().max(1))
    }
}
