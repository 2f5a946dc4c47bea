//! Hugging Face model directories: `config.json` -> [`ModelConfig`] (the family by its class,
//! see `model::arch`; the mixture-of-experts and hybrid keys as the family has them), and the
//! tensor plan: which tensors a model of a plain-attention family holds, under its HF and GGUF
//! names (read by `hf_bind`, `convert`, `synth_gguf` and `hf_synth`). The weights are bound by
//! `hf_bind`. HF checkpoints keep Q/K rows in the
//! "rotate half" order, so every HF directory runs with [`RopeStyle::Halves`] (llama GGUFs differ:
//! their converter permuted the rows for adjacent pairs; see `gguf_writer`).

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use super::arch::{by_hf_class, NormTopk};
use super::config::{attention_shape, AttnField, ModelConfig, RopeScaling, RopeStyle};
use super::hybrid::{by_interval, HeadGrouping, HybridConfig, HybridField};
use super::moe::{MoeConfig, MoeField};
use super::quant::GgmlType;
use super::rules::{layer_count, positive_finite};
use super::safetensors::{SafetensorsDir, SafetensorsError};

pub const CONFIG_FILE: &str = "config.json";

#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: invalid JSON: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("{path}: '{key}' {reason}")]
    Config { path: PathBuf, key: String, reason: String },
    #[error("{path}: architecture {arch} is not supported ({known} are)", known = super::arch::hf_class_names())]
    UnsupportedArch { path: PathBuf, arch: String },
    #[error(transparent)]
    Safetensors(#[from] SafetensorsError),
    #[error("{path}: tensor '{tensor}' has shape {found:?}, the config implies {expected:?}")]
    Shape { path: PathBuf, tensor: String, expected: Vec<usize>, found: Vec<usize> },
}

/// What `config.json` says beyond [`ModelConfig`].
#[derive(Clone, Debug, PartialEq)]
pub struct HfExtras {
    /// The HF class name (`Qwen2ForCausalLM`...).
    pub hf_arch: String,
    /// Q/K/V projections carry a bias (always for Qwen2; `attention_bias` for the others).
    pub qkv_bias: bool,
}

/// One tensor the model needs: its HF name, GGUF name and shape (`[n]` or `[rows, cols]`).
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedTensor {
    pub hf: String,
    pub gguf: String,
    pub shape: Vec<usize>,
    /// For llama Q/K (weights and biases): the number of heads whose rows a llama GGUF stores
    /// permuted for adjacent-pair RoPE.
    pub permute_heads: Option<usize>,
    /// An expert's matrix: slab `e` of the stacked GGUF tensor `gguf` (`ffn_*_exps`).
    pub expert: Option<usize>,
}

impl PlannedTensor {
    pub fn is_vector(&self) -> bool {
        self.shape.len() == 1
    }
}

pub(crate) fn read_json(path: &Path) -> Result<Json, HfError> {
    let text = std::fs::read_to_string(path).map_err(|source| HfError::Io { path: path.to_path_buf(), source })?;
    serde_json::from_str(&text).map_err(|source| HfError::Json { path: path.to_path_buf(), source })
}

/// Reads `dir/config.json`. The vocabulary size is checked against the embedding table later.
pub fn read_config(dir: &Path) -> Result<(ModelConfig, HfExtras), HfError> {
    let path = dir.join(CONFIG_FILE);
    let j = read_json(&path)?;
    config_from_json(&j, &path)
}

pub fn config_from_json(j: &Json, path: &Path) -> Result<(ModelConfig, HfExtras), HfError> {
    let err =
        |key: &str, reason: &str| HfError::Config { path: path.to_path_buf(), key: key.into(), reason: reason.into() };
    if !j.is_object() {
        return Err(err("(top level)", "must be a JSON object"));
    }
    if let Some(text) = vl_text_config(j) {
        return config_from_json(&text, path);
    }
    let opt_usize = |key: &str| -> Result<Option<usize>, HfError> {
        match j.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(v) => v.as_u64().map(|v| Some(v as usize)).ok_or_else(|| err(key, "must be a non-negative integer")),
        }
    };
    let req_usize = |key: &str| opt_usize(key)?.ok_or_else(|| err(key, "is missing"));
    let opt_f64 = |key: &str| -> Result<Option<f64>, HfError> {
        match j.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| err(key, "must be a number")),
        }
    };
    let opt_bool = |key: &str| -> Result<Option<bool>, HfError> {
        match j.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| err(key, "must be true or false")),
        }
    };
    let hf_arch = match j.get("architectures").and_then(Json::as_array).map(|a| a.as_slice()) {
        Some([Json::String(s)]) => s.clone(),
        _ => return Err(err("architectures", "must be a list of one class name")),
    };
    // A vision-language class without a `text_config` (unwrapped above when present) is refused.
    let arch = match by_hf_class(&hf_arch) {
        Some((arch, false)) => arch,
        _ => return Err(HfError::UnsupportedArch { path: path.to_path_buf(), arch: hf_arch }),
    };
    let family = arch.family();
    let dim = req_usize("hidden_size")?;
    let n_heads = req_usize("num_attention_heads")?;
    let n_kv_heads = opt_usize("num_key_value_heads")?.unwrap_or(n_heads);
    let field = |f: AttnField| {
        match f {
            AttnField::Dim => "hidden_size",
            AttnField::Heads => "num_attention_heads",
            AttnField::KvHeads => "num_key_value_heads",
            AttnField::HeadDim => "head_dim",
        }
        .to_string()
    };
    let head_dim = attention_shape(dim, n_heads, n_kv_heads, opt_usize("head_dim")?, &field)
        .map_err(|e| err(&field(e.field), &e.reason))?;
    if opt_bool("mlp_bias")? == Some(true) {
        return Err(err("mlp_bias", "true is not supported"));
    }
    if opt_bool("use_sliding_window")? == Some(true) {
        return Err(err("use_sliding_window", "true is not supported (sliding-window attention)"));
    }
    if let Some(act) = j.get("hidden_act").and_then(Json::as_str) {
        if act != "silu" {
            return Err(err("hidden_act", &format!("'{act}' is not supported (silu is)")));
        }
    }
    // transformers 5 writes `rope_parameters` (theta and scaling in one object); older files
    // `rope_theta` and `rope_scaling`. Either spelling is read; the older keys win.
    let rope_params = j.get("rope_parameters").filter(|v| v.is_object());
    let rope_scaling = match (j.get("rope_scaling"), rope_params) {
        (None | Some(Json::Null), None) => RopeScaling::None,
        (None | Some(Json::Null), Some(rp)) => rope_scaling(rp).map_err(|reason| err("rope_parameters", &reason))?,
        (Some(rs), _) => rope_scaling(rs).map_err(|reason| err("rope_scaling", &reason))?,
    };
    let rope_theta = match opt_f64("rope_theta")? {
        Some(t) => t,
        None => match rope_params.and_then(|rp| rp.get("rope_theta")) {
            None | Some(Json::Null) => 10_000.0,
            Some(v) => v.as_f64().ok_or_else(|| err("rope_parameters", "'rope_theta' must be a number"))?,
        },
    };
    let n_layers = req_usize("num_hidden_layers")?;
    layer_count(n_layers).map_err(|r| err("num_hidden_layers", &r))?;
    // A scale the forward pass divides by or raises to a power: a finite number above 0.
    positive_finite(rope_theta).map_err(|r| err("rope_theta", &r))?;
    let rms_eps = opt_f64("rms_norm_eps")?.unwrap_or(1e-6);
    positive_finite(rms_eps).map_err(|r| err("rms_norm_eps", &r))?;
    let max_context = opt_usize("max_position_embeddings")?.unwrap_or(4096);
    if max_context == 0 {
        return Err(err("max_position_embeddings", "0 must be positive"));
    }
    let moe = if let Some(spec) = family.moe() {
        if spec.hf_sizes_required {
            // Families whose defaults differ from Qwen3-MoE's (the fallbacks of
            // `MoeConfig::from_hf_json`): their sizes must be given.
            for key in ["num_experts", "num_experts_per_tok", "moe_intermediate_size"] {
                req_usize(key)?;
            }
        }
        let mut m = MoeConfig::from_hf_json(j, n_layers).map_err(|(key, reason)| err(&key, &reason))?;
        match spec.hf_norm_topk {
            NormTopk::Config => {}
            NormTopk::Always => m.norm_topk_prob = true,
            NormTopk::ConfigDefaultTrue if j.get("norm_topk_prob").is_none_or(Json::is_null) => m.norm_topk_prob = true,
            NormTopk::ConfigDefaultTrue => {}
        }
        // A shared expert as wide as the routed ones when the config does not say (the
        // hybrids' released configs); the binder checks the width against the tensors.
        m.shared_ffn_dim = spec.shared.then(|| m.shared_ffn_dim.unwrap_or(m.expert_ffn_dim));
        Some(m)
    } else {
        None
    };
    // The family's default dense width (used only by layers left dense: Qwen3MoeConfig's;
    // Qwen3.5-MoE has no dense layers and no such key).
    let ffn_dim = match (family.moe(), opt_usize("intermediate_size")?) {
        (_, Some(f)) => f,
        (Some(spec), None) => spec.hf_dense_width_default,
        (None, None) => return Err(err("intermediate_size", "is missing")),
    };
    let cfg = ModelConfig {
        arch,
        n_layers,
        dim,
        ffn_dim,
        n_heads,
        n_kv_heads,
        head_dim,
        vocab_size: req_usize("vocab_size")?,
        rms_eps: rms_eps as f32,
        rope_theta: rope_theta as f32,
        rope_style: RopeStyle::Halves,
        rope_scaling,
        max_context,
        tied_embeddings: opt_bool("tie_word_embeddings")?.unwrap_or(false),
        moe,
        hybrid: None,
    };
    let mut cfg = cfg;
    if family.is_hybrid() {
        cfg.hybrid = Some(HybridConfig::from_hf_json(j, path, &cfg)?);
    }
    // `qkv_bias` (Qwen2MoeConfig, true by default) can turn a family's biases off.
    let qkv_bias = (family.attention.qkv_bias || opt_bool("attention_bias")?.unwrap_or(false))
        && opt_bool("qkv_bias")? != Some(false);
    Ok((cfg, HfExtras { hf_arch, qkv_bias }))
}

fn rope_scaling(rs: &Json) -> Result<RopeScaling, String> {
    let ty = rs.get("rope_type").or_else(|| rs.get("type")).and_then(Json::as_str).unwrap_or("default");
    let num = |k: &str| {
        let v = rs.get(k).and_then(Json::as_f64).ok_or_else(|| format!("'{k}' is missing"))?;
        positive_finite(v).map_err(|r| format!("'{k}' {r}"))?;
        Ok::<f32, String>(v as f32)
    };
    Ok(match ty {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: num("factor")? },
        "llama3" => RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_context: num("original_max_position_embeddings")?,
        },
        other => return Err(format!("type '{other}' is not supported (linear, llama3 are)")),
    })
}

/// Every tensor the model reads, in GGUF order (embedding, output, then blocks).
pub fn tensor_plan(c: &ModelConfig, x: &HfExtras) -> Vec<PlannedTensor> {
    let family = c.arch.family();
    let llama = family.gguf_permutes_qk();
    let t = |hf: String, gguf: String, shape: Vec<usize>, permute: Option<usize>| PlannedTensor {
        hf,
        gguf,
        shape,
        permute_heads: if llama { permute } else { None },
        expert: None,
    };
    let mut v =
        vec![t("model.embed_tokens.weight".into(), "token_embd.weight".into(), vec![c.vocab_size, c.dim], None)];
    v.push(t("model.norm.weight".into(), "output_norm.weight".into(), vec![c.dim], None));
    if !c.tied_embeddings {
        v.push(t("lm_head.weight".into(), "output.weight".into(), vec![c.vocab_size, c.dim], None));
    }
    let (qd, kvd) = (c.q_dim(), c.kv_dim());
    for i in 0..c.n_layers {
        let mut add = |hf: &str, gguf: &str, shape: Vec<usize>, permute: Option<usize>| {
            v.push(t(format!("model.layers.{i}.{hf}"), format!("blk.{i}.{gguf}"), shape, permute));
        };
        add("input_layernorm.weight", "attn_norm.weight", vec![c.dim], None);
        add("self_attn.q_proj.weight", "attn_q.weight", vec![qd, c.dim], Some(c.n_heads));
        add("self_attn.k_proj.weight", "attn_k.weight", vec![kvd, c.dim], Some(c.n_kv_heads));
        add("self_attn.v_proj.weight", "attn_v.weight", vec![kvd, c.dim], None);
        if x.qkv_bias {
            add("self_attn.q_proj.bias", "attn_q.bias", vec![qd], Some(c.n_heads));
            add("self_attn.k_proj.bias", "attn_k.bias", vec![kvd], Some(c.n_kv_heads));
            add("self_attn.v_proj.bias", "attn_v.bias", vec![kvd], None);
        }
        if family.attention.qk_norm {
            add("self_attn.q_norm.weight", "attn_q_norm.weight", vec![c.head_dim], None);
            add("self_attn.k_norm.weight", "attn_k_norm.weight", vec![c.head_dim], None);
        }
        add("self_attn.o_proj.weight", "attn_output.weight", vec![c.dim, qd], None);
        add("post_attention_layernorm.weight", "ffn_norm.weight", vec![c.dim], None);
        match &c.moe {
            Some(m) if m.is_sparse(i) => {
                add("mlp.gate.weight", "ffn_gate_inp.weight", vec![m.n_experts, c.dim], None);
                let f = m.expert_ffn_dim;
                for e in 0..m.n_experts {
                    for (proj, gguf, shape) in [
                        ("gate_proj", "ffn_gate_exps.weight", vec![f, c.dim]),
                        ("up_proj", "ffn_up_exps.weight", vec![f, c.dim]),
                        ("down_proj", "ffn_down_exps.weight", vec![c.dim, f]),
                    ] {
                        let mut p = t(
                            format!("model.layers.{i}.mlp.experts.{e}.{proj}.weight"),
                            format!("blk.{i}.{gguf}"),
                            shape,
                            None,
                        );
                        p.expert = Some(e);
                        v.push(p);
                    }
                }
                // The shared expert (Qwen2-MoE: plain attention layers), its gate a [1, dim] row.
                if let Some(sf) = m.shared_ffn_dim {
                    for (hf, gguf, shape) in [
                        ("shared_expert.gate_proj", "ffn_gate_shexp", vec![sf, c.dim]),
                        ("shared_expert.up_proj", "ffn_up_shexp", vec![sf, c.dim]),
                        ("shared_expert.down_proj", "ffn_down_shexp", vec![c.dim, sf]),
                        ("shared_expert_gate", "ffn_gate_inp_shexp", vec![1, c.dim]),
                    ] {
                        v.push(t(
                            format!("model.layers.{i}.mlp.{hf}.weight"),
                            format!("blk.{i}.{gguf}.weight"),
                            shape,
                            None,
                        ));
                    }
                }
            }
            _ => {
                add("mlp.gate_proj.weight", "ffn_gate.weight", vec![c.ffn_dim, c.dim], None);
                add("mlp.up_proj.weight", "ffn_up.weight", vec![c.ffn_dim, c.dim], None);
                add("mlp.down_proj.weight", "ffn_down.weight", vec![c.dim, c.ffn_dim], None);
            }
        }
    }
    v
}

/// The GGML element type a float tensor of an HF checkpoint is stored in.
pub fn stored_type(st: &SafetensorsDir, name: &str) -> Result<GgmlType, HfError> {
    Ok(st.read(name)?.0)
}

impl MoeConfig {
    /// Reads a `Qwen3MoeForCausalLM` config. Missing keys take transformers' `Qwen3MoeConfig`
    /// defaults, which differ from the released models' files in one place that matters:
    /// `norm_topk_prob` defaults to false (Qwen3-30B-A3B's config sets it true).
    /// `num_experts` and `num_local_experts` (transformers 5) are both accepted.
    /// Returns the configuration or `(key, reason)`.
    pub fn from_hf_json(j: &Json, n_layers: usize) -> Result<Self, (String, String)> {
        let bad = |k: &str, r: &str| (k.to_string(), r.to_string());
        let num = |k: &str| -> Result<Option<usize>, (String, String)> {
            match j.get(k) {
                None | Some(Json::Null) => Ok(None),
                Some(v) => v.as_u64().map(|v| Some(v as usize)).ok_or_else(|| bad(k, "must be a non-negative integer")),
            }
        };
        let n_experts = match (num("num_experts")?, num("num_local_experts")?) {
            (Some(a), Some(b)) if a != b => {
                return Err(bad("num_local_experts", &format!("{b} disagrees with num_experts {a}")));
            }
            (a, b) => a.or(b).unwrap_or(128),
        };
        let n_used = num("num_experts_per_tok")?.unwrap_or(8);
        let expert_ffn_dim = num("moe_intermediate_size")?.unwrap_or(768);
        let norm_topk_prob = match j.get("norm_topk_prob") {
            None | Some(Json::Null) => false,
            Some(v) => v.as_bool().ok_or_else(|| bad("norm_topk_prob", "must be true or false"))?,
        };
        // Meant for the families with a shared expert (the caller drops it for the others).
        let shared_ffn_dim = num("shared_expert_intermediate_size")?;
        let step = num("decoder_sparse_step")?.unwrap_or(1);
        if step == 0 {
            return Err(bad("decoder_sparse_step", "must be at least 1"));
        }
        let mut dense = vec![false; n_layers];
        match j.get("mlp_only_layers") {
            None | Some(Json::Null) => {}
            Some(Json::Array(list)) => {
                for v in list {
                    match v.as_u64().map(|i| i as usize) {
                        Some(i) if i < n_layers => dense[i] = true,
                        _ => return Err(bad("mlp_only_layers", &format!("{v} is not a layer of {n_layers}"))),
                    }
                }
            }
            Some(_) => return Err(bad("mlp_only_layers", "must be a list of layer indices")),
        }
        // transformers: sparse iff not listed, experts exist, and (layer + 1) % step == 0.
        let sparse_layers = (0..n_layers).map(|i| !dense[i] && n_experts > 0 && (i + 1) % step == 0).collect();
        let m = MoeConfig { n_experts, n_used, expert_ffn_dim, norm_topk_prob, shared_ffn_dim, sparse_layers };
        let unset = |k: &str| j.get(k).is_none_or(Json::is_null);
        // The expert count is named as the file spells it.
        let experts =
            if unset("num_experts") && !unset("num_local_experts") { "num_local_experts" } else { "num_experts" };
        let field = |f: MoeField| {
            match f {
                MoeField::Experts => experts,
                MoeField::Used => "num_experts_per_tok",
                MoeField::ExpertFfnDim => "moe_intermediate_size",
                MoeField::SharedFfnDim => "shared_expert_intermediate_size",
            }
            .to_string()
        };
        m.check(&field).map_err(|e| {
            let k = field(e.field);
            // A value the file leaves out is transformers' default: say so, or the message
            // would quote a number the file does not have.
            let default = if unset(&k) { " (not set: the default)" } else { "" };
            (k, format!("{}{default}", e.reason))
        })?;
        Ok(m)
    }
}

impl HybridConfig {
    /// From a Qwen3.5 text `config.json` (`layer_types` or `full_attention_interval`, the
    /// `linear_*` sizes, `partial_rotary_factor` at the top level or in `rope_parameters`).
    pub fn from_hf_json(j: &Json, path: &Path, c: &ModelConfig) -> Result<Self, HfError> {
        let err = |key: &str, reason: String| HfError::Config { path: path.to_path_buf(), key: key.into(), reason };
        let usize_of = |key: &str, default: Option<usize>| -> Result<usize, HfError> {
            match j.get(key) {
                None | Some(Json::Null) => default.ok_or_else(|| err(key, "is missing".into())),
                Some(v) => {
                    v.as_u64().map(|v| v as usize).ok_or_else(|| err(key, "must be a non-negative integer".into()))
                }
            }
        };
        let recurrent = match j.get("layer_types") {
            Some(Json::Array(list)) => list
                .iter()
                .map(|v| match v.as_str() {
                    Some("linear_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(err("layer_types", format!("entry {v} is neither linear_attention nor full_attention"))),
                })
                .collect::<Result<Vec<bool>, HfError>>()?,
            None | Some(Json::Null) => by_interval(c.n_layers, usize_of("full_attention_interval", Some(4))?),
            Some(_) => return Err(err("layer_types", "must be a list".into())),
        };
        if recurrent.len() != c.n_layers {
            return Err(err("layer_types", format!("has {} entries for {} layers", recurrent.len(), c.n_layers)));
        }
        // (where the factor was found, the factor). A value of another type is an error, not
        // the default: a full rotation where the checkpoint rotates a quarter of each head would
        // load and write noise.
        let mut factor_found = None;
        for (k, v) in [
            ("partial_rotary_factor", j.get("partial_rotary_factor")),
            (
                "rope_parameters.partial_rotary_factor",
                j.get("rope_parameters").and_then(|r| r.get("partial_rotary_factor")),
            ),
        ] {
            match v {
                None | Some(Json::Null) => {}
                Some(v) => {
                    let f = v.as_f64().ok_or_else(|| err(k, format!("{v} must be a number")))?;
                    factor_found.get_or_insert((k, f));
                }
            }
        }
        let (factor_key, factor) = factor_found.unwrap_or(("partial_rotary_factor", 1.0));
        let attn_output_gate = match j.get("attn_output_gate") {
            None | Some(Json::Null) => true,
            Some(v) => v.as_bool().ok_or_else(|| err("attn_output_gate", format!("{v} must be true or false")))?,
        };
        let h = HybridConfig {
            recurrent,
            n_k_heads: usize_of("linear_num_key_heads", None)?,
            n_v_heads: usize_of("linear_num_value_heads", None)?,
            d_k: usize_of("linear_key_head_dim", None)?,
            d_v: usize_of("linear_value_head_dim", None)?,
            conv_kernel: usize_of("linear_conv_kernel_dim", Some(4))?,
            grouping: HeadGrouping::Interleaved,
            rotary_dim: (c.head_dim as f64 * factor) as usize,
            attn_output_gate,
        };
        let field = |f: HybridField| {
            match f {
                HybridField::KeyHeads => "linear_num_key_heads",
                HybridField::ValueHeads => "linear_num_value_heads",
                HybridField::KeyHeadDim => "linear_key_head_dim",
                HybridField::ValueHeadDim => "linear_value_head_dim",
                HybridField::ConvKernel => "linear_conv_kernel_dim",
                HybridField::RotaryDim => factor_key,
            }
            .to_string()
        };
        h.check(c.head_dim, &field).map_err(|e| match e.field {
            // The file gives a fraction of the head, not the dims the rule is about.
            HybridField::RotaryDim => err(factor_key, format!("{factor} x head size {} = {}", c.head_dim, e.reason)),
            f => err(&field(f), e.reason),
        })?;
        Ok(h)
    }
}

/// The text-model part of a vision-language `config.json` (a family's `hf_vl_classes`, e.g.
/// `Qwen3_5(Moe)ForConditionalGeneration`, with a nested `text_config`), as a text-only config:
/// `architectures` set to the text class, `tie_word_embeddings` taken from the top level when
/// the nested config lacks it. `None` for any other config.
pub fn vl_text_config(j: &Json) -> Option<Json> {
    let class = j.get("architectures")?.as_array()?.first()?.as_str()?;
    let text_arch = match by_hf_class(class)? {
        (arch, true) => *arch.family().hf_classes.first()?,
        (_, false) => return None,
    };
    let mut text = j.get("text_config")?.as_object()?.clone();
    text.insert("architectures".into(), Json::from(vec![text_arch]));
    if !text.contains_key("tie_word_embeddings") {
        if let Some(t) = j.get("tie_word_embeddings") {
            text.insert("tie_word_embeddings".into(), t.clone());
        }
    }
    Some(Json::Object(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: Json) -> Result<(ModelConfig, HfExtras), HfError> {
        let mut j = serde_json::json!({
            "architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 2, "intermediate_size": 128,
            "vocab_size": 100, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": true
        });
        if let (Some(o), Some(e)) = (j.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        config_from_json(&j, Path::new("x/config.json"))
    }

    #[test]
    fn parses_qwen3_and_rope_scaling() {
        let (c, x) = cfg(serde_json::json!({})).unwrap();
        assert_eq!((c.arch.name(), c.head_dim, c.n_kv_heads, c.tied_embeddings), ("qwen3", 32, 2, true));
        assert!(!x.qkv_bias);
        assert_eq!(c.rope_style, RopeStyle::Halves);
        let (c, _) = cfg(serde_json::json!({"rope_scaling": {"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}))
        .unwrap();
        assert!(matches!(c.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
        let (c, _) = cfg(serde_json::json!({"rope_scaling": {"type": "linear", "factor": 2.0}})).unwrap();
        assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 2.0 });
        let e = cfg(serde_json::json!({"rope_scaling": {"type": "yarn", "factor": 2.0}})).unwrap_err().to_string();
        assert!(e.contains("config.json") && e.contains("rope_scaling") && e.contains("yarn"), "{e}");
    }

    #[test]
    fn transformers5_rope_parameters_and_qwen3_moe() {
        // transformers 5 spelling: no rope_theta, theta (and scaling) in rope_parameters.
        let mut j = serde_json::json!({
            "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 100,
            "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}, "num_local_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 16, "norm_topk_prob": true
        });
        let (c, _) = config_from_json(&j, Path::new("x/config.json")).unwrap();
        assert_eq!((c.arch.name(), c.rope_theta, c.rope_scaling), ("qwen3moe", 5e5, RopeScaling::None));
        // No intermediate_size: Qwen3MoeConfig's default for the (here absent) dense layers.
        assert_eq!(c.ffn_dim, 6144);
        let m = c.moe.as_ref().unwrap();
        assert_eq!((m.n_experts, m.n_used, m.expert_ffn_dim, m.norm_topk_prob), (4, 2, 16, true));
        let plan = tensor_plan(&c, &HfExtras { hf_arch: "Qwen3MoeForCausalLM".into(), qkv_bias: false });
        let e3 = plan.iter().find(|p| p.hf == "model.layers.1.mlp.experts.3.down_proj.weight").unwrap();
        assert_eq!((e3.gguf.as_str(), e3.expert, &e3.shape), ("blk.1.ffn_down_exps.weight", Some(3), &vec![64, 16]));
        assert!(plan.iter().any(|p| p.hf == "model.layers.0.self_attn.k_norm.weight"));
        assert!(!plan.iter().any(|p| p.hf.contains("mlp.gate_proj")), "no dense FFN in sparse layers");
        j["rope_parameters"] = serde_json::json!({"rope_theta": 5e5, "rope_type": "linear", "factor": 4.0});
        let (c, _) = config_from_json(&j, Path::new("x/config.json")).unwrap();
        assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 4.0 });
        j["num_experts"] = serde_json::json!(8);
        let e = config_from_json(&j, Path::new("x/config.json")).unwrap_err().to_string();
        assert!(e.contains("config.json") && e.contains("num_local_experts"), "{e}");
    }

    #[test]
    fn qwen2_moe_reads_its_shared_expert_width_and_needs_its_sizes() {
        let moe = serde_json::json!({"architectures": ["Qwen2MoeForCausalLM"], "num_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 48,
            "mlp_only_layers": [1]});
        let (c, x) = cfg(moe.clone()).unwrap();
        let m = c.moe.as_ref().unwrap();
        assert_eq!((c.arch.name(), x.qkv_bias, m.norm_topk_prob), ("qwen2moe", true, false));
        assert_eq!((m.shared_ffn_dim, &m.sparse_layers), (Some(48), &vec![true, false]));
        let plan = tensor_plan(&c, &x);
        let gate = plan.iter().find(|p| p.hf == "model.layers.0.mlp.shared_expert_gate.weight").unwrap();
        assert_eq!((gate.gguf.as_str(), &gate.shape), ("blk.0.ffn_gate_inp_shexp.weight", &vec![1, 64]));
        let down = plan.iter().find(|p| p.hf == "model.layers.0.mlp.shared_expert.down_proj.weight").unwrap();
        assert_eq!((down.gguf.as_str(), &down.shape), ("blk.0.ffn_down_shexp.weight", &vec![64, 48]));
        assert!(!plan.iter().any(|p| p.hf.starts_with("model.layers.1.mlp.shared")), "layer 1 is dense");
        // The transformers defaults (60 experts, 4 used) are not the fallbacks: the sizes must be given.
        let mut j = moe.clone();
        j.as_object_mut().unwrap().remove("num_experts");
        let e = cfg(j).unwrap_err().to_string();
        assert!(e.contains("'num_experts' is missing"), "{e}");
        // `qkv_bias: false` turns the family's biases off; Qwen3-MoE has no shared expert.
        let (_, x) = cfg(serde_json::json!({"architectures": ["Qwen2MoeForCausalLM"], "num_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 16, "qkv_bias": false}))
        .unwrap();
        assert!(!x.qkv_bias);
        let (c, _) = cfg(serde_json::json!({"architectures": ["Qwen3MoeForCausalLM"],
            "shared_expert_intermediate_size": 48}))
        .unwrap();
        assert_eq!(c.moe.unwrap().shared_ffn_dim, None);
    }

    #[test]
    fn malformed_configs_name_the_key() {
        let e = cfg(serde_json::json!({"hidden_size": "big"})).unwrap_err().to_string();
        assert!(e.contains("'hidden_size'"), "{e}");
        let e = cfg(serde_json::json!({"num_key_value_heads": 3})).unwrap_err().to_string();
        assert!(e.contains("num_key_value_heads"), "{e}");
        assert!(e.contains("'num_key_value_heads' 3 must divide num_attention_heads 4"), "{e}");
        let e = cfg(serde_json::json!({"head_dim": null, "hidden_size": 66})).unwrap_err().to_string();
        assert!(
            e.contains("'head_dim' is missing and hidden_size 66 is not a multiple of num_attention_heads 4"),
            "{e}"
        );
        // The MoE and linear-attention rules name the field that breaks them, with its value.
        let e = cfg(serde_json::json!({"architectures": ["Qwen3MoeForCausalLM"], "moe_intermediate_size": 0}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("x/config.json: 'moe_intermediate_size' 0 must be positive"), "{e}");
        let e = cfg(serde_json::json!({"architectures": ["Qwen3_5ForCausalLM"], "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
            "linear_conv_kernel_dim": 1}))
        .unwrap_err()
        .to_string();
        assert!(e.contains("x/config.json: 'linear_conv_kernel_dim' 1 must be at least 2"), "{e}");
        let e = cfg(serde_json::json!({"architectures": ["GPT2LMHeadModel"]})).unwrap_err().to_string();
        assert!(e.contains("GPT2LMHeadModel"), "{e}");
    }

    #[test]
    fn out_of_range_scalars_are_refused_before_anything_is_sized_from_them() {
        for (extra, says) in [
            (serde_json::json!({"num_hidden_layers": 0}), "'num_hidden_layers' 0 must be between 1 and 1024"),
            (
                serde_json::json!({"num_hidden_layers": 1u64 << 40}),
                "'num_hidden_layers' 1099511627776 must be between 1 and 1024",
            ),
            (serde_json::json!({"rms_norm_eps": -1.0}), "'rms_norm_eps' -1 must be a finite number above 0"),
            (serde_json::json!({"rope_theta": 0.0}), "'rope_theta' 0 must be a finite number above 0"),
            (
                serde_json::json!({"rope_scaling": {"rope_type": "linear", "factor": 0.0}}),
                "'rope_scaling' 'factor' 0 must be a finite number above 0",
            ),
            (serde_json::json!({"max_position_embeddings": 0}), "'max_position_embeddings' 0 must be positive"),
            (serde_json::json!({"head_dim": 1u64 << 62}), "'head_dim' 4611686018427387904 must be at most 4096"),
            (
                serde_json::json!({"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 1u64 << 40}),
                "'num_experts' 1099511627776 is more than the 16384 this reader accepts",
            ),
        ] {
            let e = cfg(extra.clone()).unwrap_err().to_string();
            assert!(e.contains("x/config.json") && e.contains(says), "{extra}: {e}");
        }
    }

    fn hf(extra: Json) -> Result<MoeConfig, (String, String)> {
        MoeConfig::from_hf_json(&extra, 4)
    }

    #[test]
    fn hf_defaults_aliases_and_dense_layers() {
        // transformers' defaults: 128 experts, 8 used, width 768, no renormalisation.
        let m = hf(serde_json::json!({})).unwrap();
        assert_eq!((m.n_experts, m.n_used, m.expert_ffn_dim, m.norm_topk_prob), (128, 8, 768, false));
        assert_eq!(m.sparse_layers, vec![true; 4]);
        let m = hf(serde_json::json!({"num_local_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": true,
                                      "moe_intermediate_size": 64, "mlp_only_layers": [0], "decoder_sparse_step": 2}))
        .unwrap();
        assert_eq!((m.n_experts, m.n_used, m.expert_ffn_dim, m.norm_topk_prob), (8, 2, 64, true));
        // Layer 0 listed dense; of the rest only (i + 1) % 2 == 0, i.e. layers 1 and 3.
        assert_eq!(m.sparse_layers, vec![false, true, false, true]);
    }

    #[test]
    fn hf_rejects_inconsistent_values_naming_the_key() {
        let cases = [
            (serde_json::json!({"num_experts": 8, "num_local_experts": 4}), "num_local_experts"),
            (serde_json::json!({"decoder_sparse_step": 0}), "decoder_sparse_step"),
            (serde_json::json!({"mlp_only_layers": [9]}), "mlp_only_layers"),
            (serde_json::json!({"num_experts": 4, "num_experts_per_tok": 5}), "num_experts_per_tok"),
            (serde_json::json!({"norm_topk_prob": "yes"}), "norm_topk_prob"),
        ];
        for (j, key) in cases {
            let (k, reason) = hf(j.clone()).unwrap_err();
            assert_eq!(k, key, "{j}: {reason}");
        }
    }

    #[test]
    fn moe_hf_shape_rules_name_the_field_that_fails() {
        let cases = [
            (serde_json::json!({"num_experts": 0}), "num_experts", "0 must be positive"),
            (serde_json::json!({"num_local_experts": 0}), "num_local_experts", "0 must be positive"),
            (
                serde_json::json!({"num_experts": 4, "num_experts_per_tok": 0}),
                "num_experts_per_tok",
                "0 must be between 1 and num_experts 4",
            ),
            (
                serde_json::json!({"num_local_experts": 4, "num_experts_per_tok": 5}),
                "num_experts_per_tok",
                "5 must be between 1 and num_local_experts 4",
            ),
            // Left out, the default 8 is what breaks the rule.
            (
                serde_json::json!({"num_experts": 4}),
                "num_experts_per_tok",
                "8 must be between 1 and num_experts 4 (not set: the default)",
            ),
            (serde_json::json!({"moe_intermediate_size": 0}), "moe_intermediate_size", "0 must be positive"),
        ];
        for (j, key, says) in cases {
            assert_eq!(hf(j.clone()).unwrap_err(), (key.to_string(), says.to_string()), "{j}");
        }
    }

    #[test]
    fn hybrid_hf_shape_rules_name_the_field_that_fails() {
        let c = super::super::shapes::shape("qwen3.5-9b").unwrap();
        let base = serde_json::json!({"linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128, "partial_rotary_factor": 0.25});
        let load = |extra: Json| {
            let mut j = base.clone();
            if let (Some(o), Some(e)) = (j.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            HybridConfig::from_hf_json(&j, Path::new("x/config.json"), &c)
        };
        let h = load(serde_json::json!({})).unwrap();
        assert_eq!((h.n_k_heads, h.n_v_heads, h.d_k, h.d_v, h.conv_kernel, h.rotary_dim), (16, 32, 128, 128, 4, 64));
        let rule = "must be even, positive and at most the head size 256";
        for (extra, says) in [
            (serde_json::json!({"linear_num_key_heads": 0}), "'linear_num_key_heads' 0 must be positive".to_string()),
            (
                serde_json::json!({"linear_num_value_heads": 24}),
                "'linear_num_value_heads' 24 must be a positive multiple of linear_num_key_heads 16".into(),
            ),
            (serde_json::json!({"linear_num_value_heads": 0}), "'linear_num_value_heads' 0 must be a positive".into()),
            (serde_json::json!({"linear_key_head_dim": 0}), "'linear_key_head_dim' 0 must be positive".into()),
            (serde_json::json!({"linear_value_head_dim": 0}), "'linear_value_head_dim' 0 must be positive".into()),
            (serde_json::json!({"linear_conv_kernel_dim": 1}), "'linear_conv_kernel_dim' 1 must be at least 2".into()),
            (
                serde_json::json!({"partial_rotary_factor": 1.5}),
                format!("'partial_rotary_factor' 1.5 x head size 256 = 384 {rule}"),
            ),
            (
                serde_json::json!({"partial_rotary_factor": null, "rope_parameters": {"partial_rotary_factor": 0.0}}),
                format!("'rope_parameters.partial_rotary_factor' 0 x head size 256 = 0 {rule}"),
            ),
            (
                serde_json::json!({"partial_rotary_factor": "0.25"}),
                "'partial_rotary_factor' \"0.25\" must be a number".into(),
            ),
            (
                serde_json::json!({"rope_parameters": {"partial_rotary_factor": true}}),
                "'rope_parameters.partial_rotary_factor' true must be a number".into(),
            ),
            (serde_json::json!({"attn_output_gate": "yes"}), "'attn_output_gate' \"yes\" must be true or false".into()),
        ] {
            let e = load(extra.clone()).unwrap_err().to_string();
            assert!(e.contains("x/config.json") && e.contains(&says), "{extra}: {e}");
        }
    }

    #[test]
    fn vision_language_config_yields_its_text_model() {
        let j = serde_json::json!({
            "architectures": ["Qwen3_5ForConditionalGeneration"], "tie_word_embeddings": true,
            "text_config": {"model_type": "qwen3_5_text", "hidden_size": 8}, "vision_config": {"depth": 2}
        });
        let t = vl_text_config(&j).unwrap();
        assert_eq!(t["architectures"][0], "Qwen3_5ForCausalLM");
        assert_eq!((t["hidden_size"].as_u64(), t["tie_word_embeddings"].as_bool()), (Some(8), Some(true)));
        assert!(t.get("vision_config").is_none());
        assert!(vl_text_config(&serde_json::json!({"architectures": ["Qwen3ForCausalLM"]})).is_none());
    }
}
