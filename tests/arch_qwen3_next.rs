//! Qwen3-Next (hybrid layers L L L F, mixture of experts with a gated shared expert) on the CPU
//! backend, against the transformers float32 references in
//! `../shared/testdata/arch/qwen3_next/`: the HF directory (fused `in_proj_qkvz` / `in_proj_ba`
//! grouped per key head, one tensor per expert) and llama.cpp's F16 GGUF of the same weights
//! (`attn_qkv` + `attn_gate` regrouped, `ssm_ba` still grouped, value heads in checkpoint order).

mod common;
#[path = "hybrid_refs/mod.rs"]
mod hybrid_refs;

use dustoff::model::config::Arch;
use dustoff::model::hybrid::{HeadGrouping, HybridLayer};
use dustoff::model::loader::LoadedModel;
use hybrid_refs::*;

const FIXTURE: Fixture = Fixture { dir: "qwen3_next", gguf: "qwen3_next-f16.gguf" };

fn check_shape(m: &LoadedModel) {
    let c = &m.config;
    assert_eq!(c.arch, Arch::Qwen3Next);
    let h = c.hybrid.as_ref().expect("hybrid config");
    assert_eq!(h.recurrent, [true, true, true, false]);
    assert_eq!((h.n_k_heads, h.n_v_heads, h.d_k, h.d_v, h.conv_kernel), (2, 4, 32, 32, 4));
    // Neither form reorders the value heads.
    assert_eq!((h.rotary_dim, h.attn_output_gate, h.grouping), (16, true, HeadGrouping::Interleaved));
    let moe = c.moe.as_ref().expect("moe config");
    assert_eq!((moe.n_experts, moe.n_used, moe.expert_ffn_dim, moe.norm_topk_prob), (8, 2, 32, true));
    assert_eq!(moe.sparse_layers, [true; 4]);
    for (i, l) in m.weights.layers.iter().enumerate() {
        let sh = l.moe.as_ref().and_then(|mw| mw.shared.as_ref());
        assert_eq!(sh.map(|s| s.expert.up.rows), Some(32), "layer {i}: shared expert of width 32");
    }
    let Some(HybridLayer::Linear(d)) = &m.weights.layers[0].hybrid else { panic!("layer 0 is linear") };
    assert_eq!((d.w_qkv.rows, d.w_z.rows, d.w_b.rows, d.w_a.rows), (256, 128, 4, 4));
}

#[test]
fn hf_directory_with_fused_projections_matches_transformers() {
    let m = FIXTURE.hf();
    check_shape(&m);
    check_against_refs(&m, &FIXTURE.refs(), "hf");
}

#[test]
fn gguf_matches_transformers() {
    let m = FIXTURE.gguf();
    check_shape(&m);
    check_against_refs(&m, &FIXTURE.refs(), "gguf");
}

#[test]
fn hf_and_gguf_forms_agree() {
    forms_agree(&FIXTURE.hf(), &FIXTURE.gguf(), &FIXTURE.refs());
}

#[test]
fn engine_outputs_match_across_slots_prefix_reuse_chunking_order_and_preemption() {
    engine_equivalence(&FIXTURE.hf(), &FIXTURE.refs());
}

#[test]
fn generate_cli_runs_both_forms_and_both_tokenize_the_references() {
    FIXTURE.generate_cli_both_forms("qwen3next-generate");
    FIXTURE.both_forms_tokenize_refs();
}
