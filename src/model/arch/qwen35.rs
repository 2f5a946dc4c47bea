//! Qwen3.5 dense: Gated DeltaNet layers between gated full-attention layers (see
//! `model::hybrid`), a dense SwiGLU in every layer. llama.cpp's converter tiles the value heads.

use super::family::{AttentionSpec, Family, FfnSpec, HeadGrouping, MixerSpec, RopeStyle};
use super::Arch;

pub const FAMILY: Family = Family {
    arch: Arch::Qwen35,
    gguf_name: "qwen35",
    hf_classes: &["Qwen3_5ForCausalLM"],
    hf_vl_classes: &["Qwen3_5ForConditionalGeneration"],
    gguf_rope_style: RopeStyle::Halves,
    attention: AttentionSpec { qk_norm: true, qkv_bias: false },
    mixers: MixerSpec::Hybrid { gguf_grouping: HeadGrouping::Tiled },
    gguf_ffn_norm: "post_attention_norm.weight",
    gguf_rope_sections: true,
    ffn: FfnSpec::Dense,
    tiny_hf: None,
};
