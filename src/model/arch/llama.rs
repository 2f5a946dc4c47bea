//! Llama (also SmolLM2 and Mistral-style models without sliding windows): attention and a dense
//! SwiGLU in every layer; llama.cpp's converter permutes the Q/K rows for adjacent-pair RoPE.

use super::family::{AttentionSpec, Family, FfnSpec, MixerSpec, PreTokenizer, RopeStyle, TinyHf};
use super::Arch;

pub const FAMILY: Family = Family {
    arch: Arch::Llama,
    gguf_name: "llama",
    hf_classes: &["LlamaForCausalLM"],
    hf_vl_classes: &[],
    gguf_rope_style: RopeStyle::Adjacent,
    attention: AttentionSpec { qk_norm: false, qkv_bias: false },
    mixers: MixerSpec::Attention,
    gguf_ffn_norm: "ffn_norm.weight",
    gguf_rope_sections: false,
    ffn: FfnSpec::Dense,
    tiny_hf: Some(TinyHf {
        model_type: "llama",
        rope_theta: 10_000.0,
        tied: true,
        pre_tokenizer: PreTokenizer::Smollm,
    }),
};
