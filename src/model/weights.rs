//! The per-layer weight set of a decoder model (bound by `gguf_bind`, `hf_bind`, or made by
//! `synth`); `LayerWeights::typed` gives a layer typed by kind (`model::layer`).

use super::config::ModelConfig;
use super::hybrid::HybridLayer;
use super::layer::{AttentionWeights, DenseFfn, Ffn, Layer, Mixer};
use super::moe::MoeWeights;
pub use super::tensor::Tensor;

/// One transformer block. Matrices are `[out, in]`.
///
/// A sparse (mixture-of-experts) layer has `moe` set; its dense `w_gate`, `w_up`, `w_down` are
/// then empty (`[0, dim]`, `[0, dim]`, `[0, ffn_dim]`) and must not be used.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,      // [dim]
    pub wq: Tensor,               // [q_dim, dim]
    pub wk: Tensor,               // [kv_dim, dim]
    pub wv: Tensor,               // [kv_dim, dim]
    pub wo: Tensor,               // [dim, q_dim]
    pub bq: Option<Vec<f32>>,     // [q_dim] (qwen2)
    pub bk: Option<Vec<f32>>,     // [kv_dim]
    pub bv: Option<Vec<f32>>,     // [kv_dim]
    pub q_norm: Option<Vec<f32>>, // [head_dim] (qwen3)
    pub k_norm: Option<Vec<f32>>, // [head_dim]
    pub ffn_norm: Vec<f32>,       // [dim]
    pub w_gate: Tensor,           // [ffn_dim, dim]
    pub w_up: Tensor,             // [ffn_dim, dim]
    pub w_down: Tensor,           // [dim, ffn_dim]
    pub moe: Option<MoeWeights>,  // sparse layers: router and experts
    /// Hybrid models: the layer's token mixer (Gated DeltaNet or gated attention).
    pub hybrid: Option<HybridLayer>,
}

impl LayerWeights {
    /// The layer typed by kind (see `model::layer`): its mixer and FFN with their weights.
    pub fn typed(&self) -> Layer<'_> {
        let attention = || AttentionWeights {
            wq: &self.wq,
            wk: &self.wk,
            wv: &self.wv,
            wo: &self.wo,
            bq: self.bq.as_deref(),
            bk: self.bk.as_deref(),
            bv: self.bv.as_deref(),
            q_norm: self.q_norm.as_deref(),
            k_norm: self.k_norm.as_deref(),
        };
        let mixer = match &self.hybrid {
            Some(HybridLayer::Linear(d)) => Mixer::DeltaNet(d),
            // The output gate doubles the query rows: `wq` [2 q_dim, dim], `wo` [dim, q_dim].
            Some(HybridLayer::Attention) if self.wq.rows == 2 * self.wo.cols => Mixer::GatedAttention(attention()),
            _ => Mixer::Attention(attention()),
        };
        let ffn = match &self.moe {
            Some(m) => Ffn::Moe(m),
            None => Ffn::Dense(DenseFfn { gate: &self.w_gate, up: &self.w_up, down: &self.w_down }),
        };
        Layer { attn_norm: &self.attn_norm, mixer, ffn_norm: &self.ffn_norm, ffn }
    }

    /// The dense FFN matrices, empty for a sparse layer (see above).
    pub fn empty_dense_ffn(layer: usize, c: &ModelConfig) -> (Tensor, Tensor, Tensor) {
        let n = |s: &str| format!("blk.{layer}.{s} (sparse layer: none)");
        (
            Tensor::empty(n("ffn_gate"), c.dim),
            Tensor::empty(n("ffn_up"), c.dim),
            Tensor::empty(n("ffn_down"), c.ffn_dim),
        )
    }
}

#[derive(Clone, Debug)]
pub struct ModelWeights {
    pub token_embd: Tensor, // [vocab, dim]
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>, // [dim]
    /// The output head `[vocab, dim]`; the embedding table itself when tied.
    pub output: Tensor,
    /// Per-pair RoPE frequency divisors (`rope_freqs.weight`, Llama 3 scaling): `[head_dim / 2]`.
    pub rope_freq_factors: Option<Vec<f32>>,
}
