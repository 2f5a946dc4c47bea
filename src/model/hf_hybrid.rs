//! The GGUF tensors of a hybrid model (`qwen35`, `qwen35moe`, `qwen3next`) as llama.cpp's
//! converter writes them, and where each comes from in a Hugging Face checkpoint: read by
//! `dustoff convert` (HF -> GGUF) and `dustoff synth` (the names, shapes and F32 tensors only).
//!
//! What the converter changes (see `model::hybrid` for why the loaders agree with it):
//! - every RMSNorm weight but the DeltaNet output norm (`ssm_norm`) is written `1 + w`;
//! - `A_log` becomes `ssm_a = -exp(A_log)`, `dt_bias` `ssm_dt.bias`, `conv1d.weight`
//!   `[C, 1, K]` is written `[C, K]` (F32, as are the router, `ffn_gate_inp_shexp`, `ssm_a`,
//!   `ssm_dt.bias` and every vector);
//! - `qwen35*`: `in_proj_qkv` -> `attn_qkv`, `in_proj_z` -> `attn_gate`, `in_proj_b` ->
//!   `ssm_beta`, `in_proj_a` -> `ssm_alpha`, and the value heads go from grouped order (head
//!   `k r + j` for key head `k`, `j < r = n_v / n_k`) to tiled order (`j n_k + k`) in the v
//!   rows of `attn_qkv`, the rows of `attn_gate`, `ssm_beta`, `ssm_alpha`, the entries of
//!   `ssm_a`, `ssm_dt.bias`, the v channels of `ssm_conv1d` and the columns of `ssm_out`;
//! - `qwen3next`: the fused `in_proj_qkvz` (grouped per key head) regrouped into `attn_qkv`
//!   (all q | all k | all v) and `attn_gate`; `in_proj_ba` kept whole as `ssm_ba`;
//! - the gated `q_proj` stays whole as `attn_q` (per head `[query, gate]` rows); experts are
//!   stacked into `ffn_{gate,up,down}_exps` (fused `gate_up_proj` `[E, 2I, H]` split into
//!   gate and up); the shared expert is `ffn_{gate,up,down}_shexp` and `ffn_gate_inp_shexp`.

use super::config::ModelConfig;
use super::convert::{OutTensor, Transform};
use super::hybrid::{fused_qkvz_rows, HeadGrouping, HybridConfig};
use super::quant::GgmlType;
use super::safetensors::SafetensorsDir;

/// How a hybrid checkpoint lays out its tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct HfLayout {
    /// Prefix of the text model's tensors: `model.` (text-only classes) or
    /// `model.language_model.` (the official vision-language checkpoints).
    pub prefix: String,
    /// Qwen3-Next's fused `in_proj_qkvz` / `in_proj_ba`.
    pub fused_qkvz: bool,
    /// Experts fused as `experts.gate_up_proj` / `experts.down_proj` (Qwen3.5-MoE), else one
    /// tensor per expert and projection.
    pub fused_experts: bool,
    /// Width of the shared expert, when the layers have one.
    pub shared_ffn: Option<usize>,
}

impl HfLayout {
    /// The layout of the checkpoint `st` of a model of configuration `c`.
    pub fn of(st: &SafetensorsDir, c: &ModelConfig) -> Self {
        let prefix =
            if st.contains("model.language_model.embed_tokens.weight") { "model.language_model." } else { "model." }
                .to_string();
        let first_sparse = c.moe.as_ref().and_then(|m| (0..c.n_layers).find(|&i| m.is_sparse(i)));
        let shared_ffn = first_sparse.and_then(|i| {
            let name = format!("{prefix}layers.{i}.mlp.shared_expert.gate_proj.weight");
            st.read(&name).ok().and_then(|(_, shape, _)| shape.first().copied())
        });
        let fused_experts =
            first_sparse.is_some_and(|i| st.contains(&format!("{prefix}layers.{i}.mlp.experts.gate_up_proj")));
        let first_linear = c.hybrid.as_ref().and_then(|h| h.recurrent.iter().position(|&r| r));
        let fused_qkvz =
            first_linear.is_some_and(|i| st.contains(&format!("{prefix}layers.{i}.linear_attn.in_proj_qkvz.weight")));
        HfLayout { prefix, fused_qkvz, fused_experts, shared_ffn }
    }

    /// The layout a family's own checkpoints have (for `synth`, which has no checkpoint):
    /// Qwen3-Next fuses qkvz, Qwen3.5-MoE fuses its experts; the shared expert as wide as the
    /// configuration says.
    pub fn native(c: &ModelConfig) -> Self {
        let family = c.arch.family();
        let grouped =
            matches!(family.mixers, super::arch::MixerSpec::Hybrid { gguf_grouping: HeadGrouping::Interleaved });
        HfLayout {
            prefix: "model.".into(),
            fused_qkvz: grouped,
            fused_experts: !grouped && family.moe().is_some(),
            shared_ffn: c.moe.as_ref().and_then(|m| m.shared_ffn_dim),
        }
    }
}

/// The value-head permutation of the `qwen35*` converter: output head `h` (tiled order) is
/// source head `perm[h]` (grouped order).
fn tiled_heads(h: &HybridConfig) -> Vec<usize> {
    let (nk, r) = (h.n_k_heads, h.n_v_heads / h.n_k_heads);
    (0..h.n_v_heads).map(|o| (o % nk) * r + o / nk).collect()
}

/// Rows of a tensor of `heads.len()` heads of `per_head` rows, heads taken in `heads` order,
/// after `offset` rows kept in place.
fn head_rows(offset: usize, heads: &[usize], per_head: usize) -> Vec<usize> {
    (0..offset).chain(heads.iter().flat_map(|&s| offset + s * per_head..offset + (s + 1) * per_head)).collect()
}

/// Every tensor of the GGUF file of hybrid model `c` (in llama.cpp's converter's names,
/// shapes and types: F16 matrices, F32 vectors and small tensors), with its sources in a
/// checkpoint of layout `l`. `c.hybrid` must be set.
pub fn hybrid_outputs(c: &ModelConfig, l: &HfLayout) -> Vec<OutTensor> {
    let Some(h) = c.hybrid.as_ref() else { return Vec::new() };
    let p = &l.prefix;
    let tiled = matches!(c.arch.family().mixers, super::arch::MixerSpec::Hybrid { gguf_grouping: HeadGrouping::Tiled });
    let (dim, qd, kvd, hd) = (c.dim, c.q_dim(), c.kv_dim(), c.head_dim);
    let (ch, vd, nv, nk, dk, dv, kk) =
        (h.conv_channels(), h.value_dim(), h.n_v_heads, h.n_k_heads, h.d_k, h.d_v, h.conv_kernel);
    let (f16, f32) = (GgmlType::F16, GgmlType::F32);
    let heads = if tiled { tiled_heads(h) } else { (0..nv).collect() };
    let reorder = |rows: Vec<usize>, row_len: usize| -> Vec<Transform> {
        if tiled {
            vec![Transform::Rows { rows, row_len }]
        } else {
            Vec::new()
        }
    };
    let with = |mut t: OutTensor, src: Option<Vec<usize>>, tr: Vec<Transform>| {
        t.source_shape = src;
        t.transforms = tr;
        t
    };
    let norm = |src: String, name: String, n: usize| {
        with(OutTensor::plain(&src, &name, f32, vec![n]), None, vec![Transform::AddOne])
    };

    let mut v =
        vec![OutTensor::plain(&format!("{p}embed_tokens.weight"), "token_embd.weight", f16, vec![c.vocab_size, dim])];
    if !c.tied_embeddings {
        v.push(OutTensor::plain("lm_head.weight", "output.weight", f16, vec![c.vocab_size, dim]));
    }
    for i in 0..c.n_layers {
        let s = |x: &str| format!("{p}layers.{i}.{x}");
        let g = |x: &str| format!("blk.{i}.{x}");
        v.push(norm(s("input_layernorm.weight"), g("attn_norm.weight"), dim));
        if h.recurrent[i] {
            let la = |x: &str| s(&format!("linear_attn.{x}"));
            let conv_rows = head_rows(2 * nk * dk, &heads, dv);
            v.push(with(OutTensor::plain(&la("A_log"), &g("ssm_a"), f32, vec![nv]), None, {
                let mut t = reorder(heads.clone(), 1);
                t.push(Transform::NegExp);
                t
            }));
            v.push(with(
                OutTensor::plain(&la("conv1d.weight"), &g("ssm_conv1d.weight"), f32, vec![ch, kk]),
                Some(vec![ch, 1, kk]),
                reorder(conv_rows.clone(), kk),
            ));
            v.push(with(
                OutTensor::plain(&la("dt_bias"), &g("ssm_dt.bias"), f32, vec![nv]),
                None,
                reorder(heads.clone(), 1),
            ));
            if l.fused_qkvz {
                let (qkv_rows, z_rows) = fused_qkvz_rows(h);
                let fused = vec![ch + vd, dim];
                v.push(OutTensor::plain(&la("in_proj_ba.weight"), &g("ssm_ba.weight"), f16, vec![2 * nv, dim]));
                let rows = |r: Vec<usize>| vec![Transform::Rows { rows: r, row_len: dim }];
                v.push(with(
                    OutTensor::plain(&la("in_proj_qkvz.weight"), &g("attn_qkv.weight"), f16, vec![ch, dim]),
                    Some(fused.clone()),
                    rows(qkv_rows),
                ));
                v.push(with(
                    OutTensor::plain(&la("in_proj_qkvz.weight"), &g("attn_gate.weight"), f16, vec![vd, dim]),
                    Some(fused),
                    rows(z_rows),
                ));
            } else {
                v.push(with(
                    OutTensor::plain(&la("in_proj_a.weight"), &g("ssm_alpha.weight"), f16, vec![nv, dim]),
                    None,
                    reorder(heads.clone(), dim),
                ));
                v.push(with(
                    OutTensor::plain(&la("in_proj_b.weight"), &g("ssm_beta.weight"), f16, vec![nv, dim]),
                    None,
                    reorder(heads.clone(), dim),
                ));
                v.push(with(
                    OutTensor::plain(&la("in_proj_qkv.weight"), &g("attn_qkv.weight"), f16, vec![ch, dim]),
                    None,
                    reorder(conv_rows, dim),
                ));
                v.push(with(
                    OutTensor::plain(&la("in_proj_z.weight"), &g("attn_gate.weight"), f16, vec![vd, dim]),
                    None,
                    reorder(head_rows(0, &heads, dv), dim),
                ));
            }
            v.push(OutTensor::plain(&la("norm.weight"), &g("ssm_norm.weight"), f32, vec![dv]));
            let cols: Vec<usize> = head_rows(0, &heads, dv);
            let out_tr = if tiled { vec![Transform::Cols(cols)] } else { Vec::new() };
            v.push(with(
                OutTensor::plain(&la("out_proj.weight"), &g("ssm_out.weight"), f16, vec![dim, vd]),
                None,
                out_tr,
            ));
        } else {
            let q_rows = if h.attn_output_gate { 2 * qd } else { qd };
            let sa = |x: &str| s(&format!("self_attn.{x}"));
            v.push(norm(sa("k_norm.weight"), g("attn_k_norm.weight"), hd));
            v.push(OutTensor::plain(&sa("k_proj.weight"), &g("attn_k.weight"), f16, vec![kvd, dim]));
            v.push(OutTensor::plain(&sa("o_proj.weight"), &g("attn_output.weight"), f16, vec![dim, qd]));
            v.push(norm(sa("q_norm.weight"), g("attn_q_norm.weight"), hd));
            v.push(OutTensor::plain(&sa("q_proj.weight"), &g("attn_q.weight"), f16, vec![q_rows, dim]));
            v.push(OutTensor::plain(&sa("v_proj.weight"), &g("attn_v.weight"), f16, vec![kvd, dim]));
        }
        match &c.moe {
            Some(m) if m.is_sparse(i) => {
                let (ne, f) = (m.n_experts, m.expert_ffn_dim);
                let mlp = |x: &str| s(&format!("mlp.{x}"));
                if l.fused_experts {
                    let gu = mlp("experts.gate_up_proj");
                    let part =
                        |off: usize| (0..ne).flat_map(|e| 2 * f * e + off..2 * f * e + off + f).collect::<Vec<_>>();
                    let split = |rows| vec![Transform::Rows { rows, row_len: dim }];
                    v.push(OutTensor::plain(
                        &mlp("experts.down_proj"),
                        &g("ffn_down_exps.weight"),
                        f16,
                        vec![ne, dim, f],
                    ));
                    v.push(with(
                        OutTensor::plain(&gu, &g("ffn_gate_exps.weight"), f16, vec![ne, f, dim]),
                        Some(vec![ne, 2 * f, dim]),
                        split(part(0)),
                    ));
                    v.push(with(
                        OutTensor::plain(&gu, &g("ffn_up_exps.weight"), f16, vec![ne, f, dim]),
                        Some(vec![ne, 2 * f, dim]),
                        split(part(f)),
                    ));
                } else {
                    for (proj, name, shape) in [
                        ("down_proj", "ffn_down_exps.weight", [dim, f]),
                        ("gate_proj", "ffn_gate_exps.weight", [f, dim]),
                        ("up_proj", "ffn_up_exps.weight", [f, dim]),
                    ] {
                        let srcs: Vec<String> = (0..ne).map(|e| mlp(&format!("experts.{e}.{proj}.weight"))).collect();
                        let mut t = OutTensor::plain(&srcs[0], &g(name), f16, vec![ne, shape[0], shape[1]]);
                        t.stacked = srcs;
                        v.push(t);
                    }
                }
                v.push(OutTensor::plain(&mlp("gate.weight"), &g("ffn_gate_inp.weight"), f32, vec![ne, dim]));
                if let Some(sf) = l.shared_ffn {
                    v.push(OutTensor::plain(
                        &mlp("shared_expert.down_proj.weight"),
                        &g("ffn_down_shexp.weight"),
                        f16,
                        vec![dim, sf],
                    ));
                    v.push(OutTensor::plain(
                        &mlp("shared_expert.gate_proj.weight"),
                        &g("ffn_gate_shexp.weight"),
                        f16,
                        vec![sf, dim],
                    ));
                    v.push(OutTensor::plain(
                        &mlp("shared_expert.up_proj.weight"),
                        &g("ffn_up_shexp.weight"),
                        f16,
                        vec![sf, dim],
                    ));
                    v.push(OutTensor::plain(
                        &mlp("shared_expert_gate.weight"),
                        &g("ffn_gate_inp_shexp.weight"),
                        f32,
                        vec![1, dim],
                    ));
                }
            }
            _ => {
                let f = c.ffn_dim;
                v.push(OutTensor::plain(&s("mlp.down_proj.weight"), &g("ffn_down.weight"), f16, vec![dim, f]));
                v.push(OutTensor::plain(&s("mlp.gate_proj.weight"), &g("ffn_gate.weight"), f16, vec![f, dim]));
                v.push(OutTensor::plain(&s("mlp.up_proj.weight"), &g("ffn_up.weight"), f16, vec![f, dim]));
            }
        }
        v.push(norm(s("post_attention_layernorm.weight"), g("post_attention_norm.weight"), dim));
    }
    v.push(norm(format!("{p}norm.weight"), "output_norm.weight".into(), dim));
    v
}

/// The checkpoint tensors a hybrid conversion leaves out: the vision tower (`model.visual.*`)
/// and the multi-token-prediction layers (`mtp.*`), as `(vision, mtp)` counts.
pub fn skipped_tensors(st: &SafetensorsDir, l: &HfLayout) -> (usize, usize) {
    let names = st.names();
    let vis = names.iter().filter(|t| t.starts_with("model.visual.")).count();
    let mtp = names.iter().filter(|t| t.starts_with("mtp.") || t.starts_with(&format!("{}mtp.", l.prefix))).count();
    (vis, mtp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiled_order_of_two_value_heads_per_key_head() {
        // 2 key heads, 4 value heads: tiled head j n_k + k is grouped head k r + j.
        let h = HybridConfig {
            recurrent: vec![true],
            n_k_heads: 2,
            n_v_heads: 4,
            d_k: 2,
            d_v: 1,
            conv_kernel: 4,
            grouping: HeadGrouping::Tiled,
            rotary_dim: 2,
            attn_output_gate: true,
        };
        assert_eq!(tiled_heads(&h), [0, 2, 1, 3]);
        assert_eq!(head_rows(1, &[1, 0], 2), [0, 3, 4, 1, 2]);
    }
}
