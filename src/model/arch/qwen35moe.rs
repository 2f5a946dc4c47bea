//! Qwen3.5 / 3.6 MoE (Qwen3.5-35B-A3B...): the Qwen3.5 hybrid layers with a mixture of experts
//! plus a gated shared expert as every layer's FFN. The chosen experts' weights are always
//! renormalised (the config has no key for it); its sizes must be given (no defaults apply).

use super::family::{AttentionSpec, Family, FfnSpec, HeadGrouping, MixerSpec, MoeSpec, NormTopk, RopeStyle};
use super::Arch;

pub const FAMILY: Family = Family {
    arch: Arch::Qwen35Moe,
    gguf_name: "qwen35moe",
    hf_classes: &["Qwen3_5MoeForCausalLM"],
    hf_vl_classes: &["Qwen3_5MoeForConditionalGeneration"],
    gguf_rope_style: RopeStyle::Halves,
    attention: AttentionSpec { qk_norm: true, qkv_bias: false },
    mixers: MixerSpec::Hybrid { gguf_grouping: HeadGrouping::Tiled },
    gguf_ffn_norm: "post_attention_norm.weight",
    gguf_rope_sections: true,
    ffn: FfnSpec::Moe(MoeSpec {
        shared: true,
        hf_sizes_required: true,
        hf_dense_width_default: 0,
        hf_norm_topk: NormTopk::Always,
        gguf_norm_topk: true,
    }),
    tiny_hf: None,
};
