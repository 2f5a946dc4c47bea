//! Model hyper-parameters: the configuration every loader produces (GGUF metadata is read by
//! `gguf_config`, a Hugging Face `config.json` by `hf`), and what is derived from it: the layer
//! kinds, K/V and recurrent-state sizes, RoPE frequencies.

use super::gguf::GgufError;
use super::hybrid::HybridConfig;
use super::layer::{FfnKind, LayerKind, MixerKind};

pub use super::arch::{Arch, RopeStyle};
pub use super::moe::MoeConfig;
pub use super::rules::{attention_shape, AttnField, AttnShapeError, ShapeError};

/// RoPE frequency scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// Llama 3 style: low frequencies scaled by `factor`, high kept, smooth in between.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_context: f32,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layers: usize,
    /// Width of the residual stream.
    pub dim: usize,
    pub ffn_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    pub rope_style: RopeStyle,
    pub rope_scaling: RopeScaling,
    /// Context length the model was trained for.
    pub max_context: usize,
    /// The output head shares the embedding table.
    pub tied_embeddings: bool,
    /// Mixture-of-experts layers (qwen3moe, qwen35moe, qwen3next); `None` for dense models.
    /// `ffn_dim` is then the width of the layers left dense (0 when the file gives none).
    pub moe: Option<MoeConfig>,
    /// Linear-attention layers and their sizes (hybrid models: Qwen3.5, Qwen3.5-MoE, Qwen3-Next).
    pub hybrid: Option<HybridConfig>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{path}: architecture '{arch}' is not supported ({known} are)", known = super::arch::gguf_names())]
    UnsupportedArch { path: String, arch: String },
    #[error("{path}: inconsistent model shape: {reason}")]
    Shape { path: String, reason: String },
}

impl ModelConfig {
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    /// The experts' configuration of layer `l` when its FFN is sparse (`None` for a dense FFN).
    pub fn sparse_ffn(&self, l: usize) -> Option<&MoeConfig> {
        self.moe.as_ref().filter(|_| self.layer_kind(l).is_sparse())
    }
    /// The kind of layer `l` (see `model::layer`), derived from the configuration.
    pub fn layer_kind(&self, l: usize) -> LayerKind {
        let mixer = match &self.hybrid {
            Some(h) if h.recurrent.get(l).copied().unwrap_or(false) => MixerKind::DeltaNet,
            Some(h) if h.attn_output_gate => MixerKind::GatedAttention,
            _ => MixerKind::Attention,
        };
        let ffn = match &self.moe {
            Some(m) if m.is_sparse(l) => FfnKind::Moe { shared: self.arch.has_shared_expert() },
            _ => FfnKind::Dense,
        };
        LayerKind { mixer, ffn }
    }
    /// The model cut to its first `n` layers (`n <= n_layers`): the per-layer patterns (sparse
    /// layers, linear-attention layers) keep their first `n` entries, every width stays.
    pub fn keep_first_layers(&mut self, n: usize) {
        self.n_layers = n.min(self.n_layers);
        if let Some(m) = self.moe.as_mut() {
            m.sparse_layers.truncate(self.n_layers);
        }
        if let Some(h) = self.hybrid.as_mut() {
            h.recurrent.truncate(self.n_layers);
        }
    }

    /// Every layer's kind, in order: what the memory plan, `doctor`, `run --dry-run` and the
    /// tensor-parallel planner read.
    pub fn layer_kinds(&self) -> Vec<LayerKind> {
        (0..self.n_layers).map(|l| self.layer_kind(l)).collect()
    }
    /// Whether layer `l` keeps K/V in the paged cache (every layer but a hybrid model's
    /// linear-attention ones).
    pub fn has_kv(&self, l: usize) -> bool {
        self.layer_kind(l).has_kv()
    }
    /// Bytes of one sequence's recurrent state: the Gated DeltaNet layers' (f32); 0 for a model
    /// without any.
    pub fn state_bytes_per_seq(&self) -> usize {
        let recurrent = self.layer_kinds().iter().filter(|k| k.is_recurrent()).count();
        self.hybrid.as_ref().map_or(0, |h| recurrent * h.state_len_per_layer() * 4)
    }
    /// What a memory plan says about the recurrent state (see `HybridConfig::state_summary`);
    /// `None` for a model without recurrent layers.
    pub fn state_summary(&self) -> Option<String> {
        let recurrent = self.layer_kinds().iter().any(|k| k.is_recurrent());
        self.hybrid.as_ref().filter(|_| recurrent).map(|h| h.state_summary())
    }
    /// The projection matrices of a mixer of kind `m`, `(rows, cols)` of `[out, in]` (q, k, v
    /// stacked as one; a gated query counts its gate rows; a DeltaNet layer's q, k, v, z, b, a
    /// projections as one): what GEMM scratch and random-model builders size from. A DeltaNet
    /// mixer of a model without a `hybrid` section has none.
    pub fn mixer_matrices(&self, m: MixerKind) -> Vec<(usize, usize)> {
        let (d, q, kv) = (self.dim, self.q_dim(), self.kv_dim());
        match m {
            MixerKind::Attention => vec![(q + 2 * kv, d), (d, q)],
            MixerKind::GatedAttention => vec![(2 * q + 2 * kv, d), (d, q)],
            MixerKind::DeltaNet => self.hybrid.as_ref().map_or_else(Vec::new, |h| {
                vec![(h.conv_channels() + h.value_dim() + 2 * h.n_v_heads, d), (d, h.value_dim())]
            }),
        }
    }
    /// Whether some layer mixes tokens other than by plain attention (a hybrid model).
    pub fn has_hybrid_mixers(&self) -> bool {
        self.layer_kinds().iter().any(|k| k.has_hybrid_mixer())
    }
    /// Layers that keep K/V in the paged cache.
    pub fn n_kv_layers(&self) -> usize {
        (0..self.n_layers).filter(|&l| self.has_kv(l)).count()
    }

    /// How the attention heads are rotated, the one description every backend builds its
    /// tables from: the inverse frequency of each rotated pair `[rotary_dim / 2]` and
    /// `rotary_dim`. Hybrid models (Qwen3.5/3.6, Qwen3-Next) rotate the first `rotary_dim` dims
    /// of each head, unscaled; the others every dim, with the configured scaling, each pair's
    /// frequency divided by the file's factor where it gives them (Llama 3 `rope_freqs`).
    pub fn rope_rotation(&self, freq_factors: Option<&[f32]>) -> (Vec<f32>, usize) {
        if let Some(h) = &self.hybrid {
            return (h.rope_inv_freq(self.rope_theta), h.rotary_dim);
        }
        let mut inv_freq = self.rope_inv_freq();
        if let Some(f) = freq_factors {
            inv_freq.iter_mut().zip(f).for_each(|(a, &b)| *a /= b);
        }
        (inv_freq, self.head_dim)
    }

    /// Inverse frequency of each rotated pair of a head: `[head_dim / 2]`.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let half = self.head_dim / 2;
        (0..half)
            .map(|i| {
                let base = (self.rope_theta as f64).powf(-(2.0 * i as f64) / self.head_dim as f64);
                let f = match self.rope_scaling {
                    RopeScaling::None => base,
                    RopeScaling::Linear { factor } => base / factor as f64,
                    RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_context } => {
                        let wavelen = 2.0 * std::f64::consts::PI / base;
                        let low_wavelen = original_context as f64 / low_freq_factor as f64;
                        let high_wavelen = original_context as f64 / high_freq_factor as f64;
                        if wavelen < high_wavelen {
                            base
                        } else if wavelen > low_wavelen {
                            base / factor as f64
                        } else {
                            let smooth = (original_context as f64 / wavelen - low_freq_factor as f64)
                                / (high_freq_factor as f64 - low_freq_factor as f64);
                            (1.0 - smooth) * base / factor as f64 + smooth * base
                        }
                    }
                };
                f as f32
            })
            .collect()
    }
}
