//! Qwen3-Next (Qwen3-Next-80B-A3B): hybrid layers as Qwen3.5 (its checkpoints fuse
//! `in_proj_qkvz` / `in_proj_ba`, regrouped at binding), MoE with a gated shared expert.
//! Its GGUF files keep the checkpoint's grouped value-head order; `norm_topk_prob` defaults to
//! true (`Qwen3NextConfig`).

use super::family::{AttentionSpec, Family, FfnSpec, HeadGrouping, MixerSpec, MoeSpec, NormTopk, RopeStyle};
use super::Arch;

pub const FAMILY: Family = Family {
    arch: Arch::Qwen3Next,
    gguf_name: "qwen3next",
    hf_classes: &["Qwen3NextForCausalLM"],
    hf_vl_classes: &[],
    gguf_rope_style: RopeStyle::Halves,
    attention: AttentionSpec { qk_norm: true, qkv_bias: false },
    mixers: MixerSpec::Hybrid { gguf_grouping: HeadGrouping::Interleaved },
    gguf_ffn_norm: "post_attention_norm.weight",
    gguf_rope_sections: false,
    ffn: FfnSpec::Moe(MoeSpec {
        shared: true,
        hf_sizes_required: true,
        hf_dense_width_default: 0,
        hf_norm_topk: NormTopk::ConfigDefaultTrue,
        gguf_norm_topk: true,
    }),
    tiny_hf: None,
};
