//! Qwen3-MoE (Qwen3-30B-A3B...): Qwen3 attention; the FFN of each sparse layer is a mixture of
//! SwiGLU experts without a shared expert. HF configs fall back on transformers'
//! `Qwen3MoeConfig` defaults (`norm_topk_prob` false, dense width 6144).

use super::family::{AttentionSpec, Family, FfnSpec, MixerSpec, MoeSpec, NormTopk, PreTokenizer, RopeStyle, TinyHf};
use super::Arch;

pub const FAMILY: Family = Family {
    arch: Arch::Qwen3Moe,
    gguf_name: "qwen3moe",
    hf_classes: &["Qwen3MoeForCausalLM"],
    hf_vl_classes: &[],
    gguf_rope_style: RopeStyle::Halves,
    attention: AttentionSpec { qk_norm: true, qkv_bias: false },
    mixers: MixerSpec::Attention,
    gguf_ffn_norm: "ffn_norm.weight",
    gguf_rope_sections: false,
    ffn: FfnSpec::Moe(MoeSpec {
        shared: false,
        hf_sizes_required: false,
        hf_dense_width_default: 6144,
        hf_norm_topk: NormTopk::Config,
        gguf_norm_topk: true,
    }),
    tiny_hf: Some(TinyHf {
        model_type: "qwen3_moe",
        rope_theta: 1_000_000.0,
        tied: true,
        pre_tokenizer: PreTokenizer::Qwen2,
    }),
};
