//! Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2 attention (biases on Q, K and V, no
//! Q/K norm) and, in each sparse layer, a mixture of SwiGLU experts (softmax top-k, not
//! renormalised unless `norm_topk_prob`) plus a shared expert of its own width
//! (`shared_expert_intermediate_size`) gated per token by `sigmoid(shared_expert_gate . x)`.
//! `decoder_sparse_step` and `mlp_only_layers` leave some layers dense. The transformers
//! defaults (60 experts, 4 used, width 1408) are not Qwen3-MoE's, so an HF config must give
//! the sizes; llama.cpp never renormalises this family's top-k weights.

use super::family::{AttentionSpec, Family, FfnSpec, MixerSpec, MoeSpec, NormTopk, RopeStyle};
use super::Arch;

pub const FAMILY: Family = Family {
    arch: Arch::Qwen2Moe,
    gguf_name: "qwen2moe",
    hf_classes: &["Qwen2MoeForCausalLM"],
    hf_vl_classes: &[],
    gguf_rope_style: RopeStyle::Halves,
    attention: AttentionSpec { qk_norm: false, qkv_bias: true },
    mixers: MixerSpec::Attention,
    gguf_ffn_norm: "ffn_norm.weight",
    gguf_rope_sections: false,
    ffn: FfnSpec::Moe(MoeSpec {
        shared: true,
        hf_sizes_required: true,
        // `Qwen2MoeConfig.intermediate_size`, for the layers `mlp_only_layers` leaves dense.
        hf_dense_width_default: 5632,
        hf_norm_topk: NormTopk::Config,
        gguf_norm_topk: false,
    }),
    tiny_hf: None,
};
