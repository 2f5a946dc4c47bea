//! What a model family is, as data: its names in GGUF files and Hugging Face configs, how its
//! attention is built, which layer kinds it has, the rules its hyper-parameters follow and its
//! tiny synthetic form. The loaders (`gguf_config`, `gguf_bind`, `hf`, `hf_bind`), the tensor
//! plan and the random-model builders read a family's description instead of matching on the
//! architecture; each family is one file of this folder.

use super::Arch;

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): llama GGUFs, whose Q/K rows were permuted at conversion.
    Adjacent,
    /// Halves (i, i + d/2): Hugging Face layout, Qwen GGUFs ("neox" in llama.cpp).
    Halves,
}

/// Which key head a value head of a Gated DeltaNet layer reads when there are more value heads
/// than key heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadGrouping {
    /// Value head `h` reads key head `h / (n_v / n_k)` (Hugging Face checkpoints:
    /// `repeat_interleave` of q and k).
    Interleaved,
    /// Value head `h` reads key head `h % n_k` (value heads reordered, as the `qwen35` GGUF
    /// converter stores them).
    Tiled,
}

impl HeadGrouping {
    pub fn key_head(self, v_head: usize, n_k: usize, n_v: usize) -> usize {
        match self {
            HeadGrouping::Interleaved => v_head / (n_v / n_k),
            HeadGrouping::Tiled => v_head % n_k,
        }
    }
}

/// The attention layers' projections beyond q, k, v, o.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionSpec {
    /// Per-head RMSNorm on Q and K before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// Biases on the Q, K and V projections in every file of the family (Qwen2); other
    /// families have them when their HF config says `attention_bias`.
    pub qkv_bias: bool,
}

/// The token mixers of a family's layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixerSpec {
    /// Every layer is attention.
    Attention,
    /// Gated DeltaNet layers between (gated) full-attention layers, as the configuration lists
    /// them; `gguf_grouping` is the value-head order of the family's GGUF files.
    Hybrid { gguf_grouping: HeadGrouping },
}

/// How `norm_topk_prob` is decided for a family's HF configs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormTopk {
    /// The config's key, false when missing (transformers' `Qwen3MoeConfig`).
    Config,
    /// The config's key, true when missing (`Qwen3NextConfig`).
    ConfigDefaultTrue,
    /// Always renormalised; the config has no such key (Qwen3.5-MoE).
    Always,
}

/// A family's mixture-of-experts FFNs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeSpec {
    /// A gated shared expert beside the routed ones in every sparse layer; its width is
    /// `MoeConfig::shared_ffn_dim` (HF `shared_expert_intermediate_size`, GGUF
    /// `expert_shared_feed_forward_length`).
    pub shared: bool,
    /// HF configs must give `num_experts`, `num_experts_per_tok` and `moe_intermediate_size`
    /// (the transformers defaults are Qwen3-MoE's, wrong for the family).
    pub hf_sizes_required: bool,
    /// The dense width when an HF config has no `intermediate_size` (used only by layers left
    /// dense: 6144 is `Qwen3MoeConfig`'s default; 0 for families without dense layers).
    pub hf_dense_width_default: usize,
    pub hf_norm_topk: NormTopk,
    /// Whether llama.cpp renormalises the chosen experts' weights for the family, which a
    /// GGUF file's `expert_weights_norm` overrides when present (true for `qwen3moe` and the
    /// hybrids, false for `qwen2moe`).
    pub gguf_norm_topk: bool,
}

/// The FFNs of a family's layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnSpec {
    /// Every layer a dense SwiGLU.
    Dense,
    /// Sparse layers (as the configuration lists them) are mixtures of experts, the others dense.
    Moe(MoeSpec),
}

/// The pre-tokenizer of a family's tiny synthetic HF directory (`hf_synth`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// SmolLM2's: digits isolated, then GPT-2's byte-level regex.
    Smollm,
    /// Qwen2's regex, then byte level.
    Qwen2,
}

/// How `hf_synth` writes a tiny random model of the family.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TinyHf {
    /// `model_type` of its config.json.
    pub model_type: &'static str,
    pub rope_theta: f64,
    /// Tied embeddings (one family is untied so that both head layouts are tested).
    pub tied: bool,
    pub pre_tokenizer: PreTokenizer,
}

/// One model family.
#[derive(Debug)]
pub struct Family {
    pub arch: Arch,
    /// `general.architecture` of its GGUF files (and the prefix of their keys).
    pub gguf_name: &'static str,
    /// The HF `architectures` classes it loads; the first is the one `hf_synth` writes.
    pub hf_classes: &'static [&'static str],
    /// Vision-language HF classes whose nested `text_config` is this family's text model,
    /// loaded as `hf_classes[0]`.
    pub hf_vl_classes: &'static [&'static str],
    /// RoPE pairing of its GGUF files (an HF directory is always `Halves`).
    pub gguf_rope_style: RopeStyle,
    pub attention: AttentionSpec,
    pub mixers: MixerSpec,
    /// Its GGUF name of the norm before the FFN (`blk.N.{this}`): `ffn_norm.weight`, or
    /// `post_attention_norm.weight` in the hybrid families' files.
    pub gguf_ffn_norm: &'static str,
    /// Its GGUF files carry `{arch}.rope.dimension_sections` (the multimodal RoPE sections of
    /// the Qwen3.5 configs, `mrope_section` padded to 4; text-only input rotates them alike).
    pub gguf_rope_sections: bool,
    pub ffn: FfnSpec,
    /// Its tiny synthetic HF form, where `hf_synth` writes one.
    pub tiny_hf: Option<TinyHf>,
}

impl Family {
    pub fn is_hybrid(&self) -> bool {
        matches!(self.mixers, MixerSpec::Hybrid { .. })
    }
    pub fn moe(&self) -> Option<&MoeSpec> {
        match &self.ffn {
            FfnSpec::Moe(m) => Some(m),
            FfnSpec::Dense => None,
        }
    }
    /// Rows of its llama GGUF Q/K projections are stored permuted for adjacent-pair RoPE.
    pub fn gguf_permutes_qk(&self) -> bool {
        self.gguf_rope_style == RopeStyle::Adjacent
    }
}
