//! Qwen3: per-head RMSNorm on Q and K before RoPE, no Q/K/V bias, a dense SwiGLU.

use super::family::{AttentionSpec, Family, FfnSpec, MixerSpec, PreTokenizer, RopeStyle, TinyHf};
use super::Arch;

pub const FAMILY: Family = Family {
    arch: Arch::Qwen3,
    gguf_name: "qwen3",
    hf_classes: &["Qwen3ForCausalLM"],
    hf_vl_classes: &[],
    gguf_rope_style: RopeStyle::Halves,
    attention: AttentionSpec { qk_norm: true, qkv_bias: false },
    mixers: MixerSpec::Attention,
    gguf_ffn_norm: "ffn_norm.weight",
    gguf_rope_sections: false,
    ffn: FfnSpec::Dense,
    tiny_hf: Some(TinyHf {
        model_type: "qwen3",
        rope_theta: 1_000_000.0,
        tied: true,
        pre_tokenizer: PreTokenizer::Qwen2,
    }),
};
