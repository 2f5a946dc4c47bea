//! Qwen2 / Qwen2.5: the llama block with biases on the Q, K and V projections; GGUF files keep
//! the HF row order (halves RoPE).

use super::family::{AttentionSpec, Family, FfnSpec, MixerSpec, PreTokenizer, RopeStyle, TinyHf};
use super::Arch;

pub const FAMILY: Family = Family {
    arch: Arch::Qwen2,
    gguf_name: "qwen2",
    hf_classes: &["Qwen2ForCausalLM"],
    hf_vl_classes: &[],
    gguf_rope_style: RopeStyle::Halves,
    attention: AttentionSpec { qk_norm: false, qkv_bias: true },
    mixers: MixerSpec::Attention,
    gguf_ffn_norm: "ffn_norm.weight",
    gguf_rope_sections: false,
    ffn: FfnSpec::Dense,
    // The untied family of the tiny models: both head layouts get tested.
    tiny_hf: Some(TinyHf {
        model_type: "qwen2",
        rope_theta: 1_000_000.0,
        tied: false,
        pre_tokenizer: PreTokenizer::Qwen2,
    }),
};
