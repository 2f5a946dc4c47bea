//! The layer as the unit: every decoder model is a list of layers, each a norm, a token mixer,
//! a norm and an FFN, with a residual add after the mixer and after the FFN. The kinds of mixer
//! and FFN are defined here once:
//!
//! - [`LayerKind`]: what a layer is, without weights. `ModelConfig::layer_kinds` derives the list
//!   from the configuration; the memory plan, `doctor`, `run --dry-run` and the tensor-parallel
//!   planner read it instead of asking which optional parts a config has.
//! - [`Layer`]: a layer's weights, typed by kind (a view of `weights::LayerWeights`, see
//!   `LayerWeights::typed`): a backend matches on the mixer and on the FFN, one arm per kind.

use super::hybrid::DeltaNetWeights;
use super::moe::MoeWeights;
use super::weights::Tensor;

/// How a layer mixes tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixerKind {
    /// Softmax attention over the paged KV cache (llama, Qwen2/3, Qwen3-MoE; the full-attention
    /// layers of hybrid models without an output gate).
    Attention,
    /// Attention whose query projection also yields a per-head output gate, `out * sigmoid(gate)`
    /// (the full-attention layers of Qwen3.5 / Qwen3-Next).
    GatedAttention,
    /// Gated DeltaNet linear attention: a fixed-size recurrent state per sequence, no KV cache.
    DeltaNet,
}

/// What a layer's FFN is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnKind {
    /// One SwiGLU of width `ffn_dim`.
    Dense,
    /// A routed mixture of SwiGLU experts, plus an always-on gated shared expert when `shared`.
    Moe { shared: bool },
}

/// One layer's kind: its mixer and its FFN (the two norms and residual adds every layer has).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerKind {
    pub mixer: MixerKind,
    pub ffn: FfnKind,
}

impl LayerKind {
    /// Keeps K/V in the paged cache (every mixer but the recurrent one).
    pub fn has_kv(self) -> bool {
        self.mixer != MixerKind::DeltaNet
    }
    /// Keeps a recurrent state per sequence instead.
    pub fn is_recurrent(self) -> bool {
        self.mixer == MixerKind::DeltaNet
    }
    /// Its mixer is one of a hybrid model's (linear or gated attention), not plain attention.
    pub fn has_hybrid_mixer(self) -> bool {
        self.mixer != MixerKind::Attention
    }
    /// Its FFN is a mixture of experts.
    pub fn is_sparse(self) -> bool {
        matches!(self.ffn, FfnKind::Moe { .. })
    }
    /// Its FFN has a shared expert beside the routed ones.
    pub fn has_shared_expert(self) -> bool {
        self.ffn == (FfnKind::Moe { shared: true })
    }
}

/// What a list of layer kinds holds, for the messages that name a model's kind
/// (`"hybrid (linear-attention)"`, `"mixture-of-experts"`), or `None` for plain dense attention.
pub fn describe(kinds: &[LayerKind]) -> Option<&'static str> {
    if kinds.iter().any(|k| k.has_hybrid_mixer()) {
        Some("hybrid (linear-attention)")
    } else if kinds.iter().any(|k| k.is_sparse()) {
        Some("mixture-of-experts")
    } else {
        None
    }
}

/// The attention projections of a layer. Matrices are `[out, in]`.
#[derive(Clone, Copy, Debug)]
pub struct AttentionWeights<'a> {
    /// `[q_dim, dim]`, or `[2 q_dim, dim]` for gated attention (per head `[query, gate]` rows).
    pub wq: &'a Tensor,
    pub wk: &'a Tensor, // [kv_dim, dim]
    pub wv: &'a Tensor, // [kv_dim, dim]
    pub wo: &'a Tensor, // [dim, q_dim]
    /// Q/K/V biases (Qwen2): `[q_dim]`, `[kv_dim]`, `[kv_dim]`.
    pub bq: Option<&'a [f32]>,
    pub bk: Option<&'a [f32]>,
    pub bv: Option<&'a [f32]>,
    /// Per-head RMSNorm on Q and K before RoPE (Qwen3, the hybrids): `[head_dim]`.
    pub q_norm: Option<&'a [f32]>,
    pub k_norm: Option<&'a [f32]>,
}

impl<'a> AttentionWeights<'a> {
    /// The four projection matrices (q, k, v, o).
    pub fn matrices(&self) -> [&'a Tensor; 4] {
        [self.wq, self.wk, self.wv, self.wo]
    }
}

/// A layer's token mixer with its weights.
#[derive(Clone, Copy, Debug)]
pub enum Mixer<'a> {
    Attention(AttentionWeights<'a>),
    GatedAttention(AttentionWeights<'a>),
    DeltaNet(&'a DeltaNetWeights),
}

impl<'a> Mixer<'a> {
    pub fn kind(&self) -> MixerKind {
        match self {
            Mixer::Attention(_) => MixerKind::Attention,
            Mixer::GatedAttention(_) => MixerKind::GatedAttention,
            Mixer::DeltaNet(_) => MixerKind::DeltaNet,
        }
    }
    /// Every matrix of the mixer.
    pub fn matrices(&self) -> Vec<&'a Tensor> {
        match self {
            Mixer::Attention(a) | Mixer::GatedAttention(a) => a.matrices().to_vec(),
            Mixer::DeltaNet(d) => vec![&d.w_qkv, &d.w_z, &d.w_b, &d.w_a, &d.w_out],
        }
    }
}

/// The dense SwiGLU: `down(silu(gate x) * up x)`.
#[derive(Clone, Copy, Debug)]
pub struct DenseFfn<'a> {
    pub gate: &'a Tensor, // [ffn_dim, dim]
    pub up: &'a Tensor,   // [ffn_dim, dim]
    pub down: &'a Tensor, // [dim, ffn_dim]
}

/// A layer's FFN with its weights.
#[derive(Clone, Copy, Debug)]
pub enum Ffn<'a> {
    Dense(DenseFfn<'a>),
    /// Router, experts and the shared expert when the layer has one (`MoeWeights::shared`).
    Moe(&'a MoeWeights),
}

impl<'a> Ffn<'a> {
    pub fn kind(&self) -> FfnKind {
        match self {
            Ffn::Dense(_) => FfnKind::Dense,
            Ffn::Moe(m) => FfnKind::Moe { shared: m.shared.is_some() },
        }
    }
    /// The router and experts of a sparse FFN.
    pub fn experts(&self) -> Option<&'a MoeWeights> {
        match self {
            Ffn::Moe(m) => Some(m),
            Ffn::Dense(_) => None,
        }
    }
}

/// One layer's weights, typed: `x += mixer(norm(x, attn_norm)); x += ffn(norm(x, ffn_norm))`.
#[derive(Clone, Copy, Debug)]
pub struct Layer<'a> {
    pub attn_norm: &'a [f32], // [dim]
    pub mixer: Mixer<'a>,
    pub ffn_norm: &'a [f32], // [dim]
    pub ffn: Ffn<'a>,
}

impl Layer<'_> {
    pub fn kind(&self) -> LayerKind {
        LayerKind { mixer: self.mixer.kind(), ffn: self.ffn.kind() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_say_what_a_layer_keeps() {
        let dn = LayerKind { mixer: MixerKind::DeltaNet, ffn: FfnKind::Moe { shared: true } };
        assert!(!dn.has_kv() && dn.is_recurrent() && dn.is_sparse() && dn.has_shared_expert());
        let att = LayerKind { mixer: MixerKind::Attention, ffn: FfnKind::Moe { shared: false } };
        assert!(att.has_kv() && att.is_sparse() && !att.has_shared_expert());
        let dense = LayerKind { mixer: MixerKind::GatedAttention, ffn: FfnKind::Dense };
        assert!(dense.has_kv() && !dense.is_sparse());
        assert_eq!(describe(&[att, dense]), Some("hybrid (linear-attention)"));
        assert_eq!(describe(&[att]), Some("mixture-of-experts"));
        assert_eq!(describe(&[LayerKind { mixer: MixerKind::Attention, ffn: FfnKind::Dense }]), None);
    }
}
