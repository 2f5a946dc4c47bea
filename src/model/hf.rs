//! Hugging Face model directories: `config.json` -> [`ModelConfig`], safetensors tensors ->
//! [`ModelWeights`].
//!
//! Architectures: `LlamaForCausalLM`, `Qwen2ForCausalLM` (Q/K/V bias), `Qwen3ForCausalLM`
//! (per-head q/k RMSNorm), `Qwen3MoeForCausalLM` (Qwen3 attention, mixture-of-experts FFN with
//! one tensor per expert, `mlp.experts.E.{gate,up,down}_proj`), tied or untied embeddings; the
//! hybrid classes (`Qwen3_5*`, `Qwen3Next*`) are bound by `model::hybrid`. HF checkpoints keep Q/K rows in the
//! "rotate half" order, so every HF directory runs with [`RopeStyle::Halves`] (llama GGUFs differ:
//! their converter permuted the rows for adjacent pairs; see `gguf_writer`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use super::config::{attention_shape, Arch, AttnField, ModelConfig, RopeScaling, RopeStyle};
use super::moe::{Expert, MoeConfig, MoeWeights};
use super::quant::{dequantize_row, GgmlType};
use super::safetensors::{SafetensorsDir, SafetensorsError};
use super::weights::{LayerWeights, ModelWeights, Tensor};

pub const CONFIG_FILE: &str = "config.json";

#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: invalid JSON: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("{path}: '{key}' {reason}")]
    Config { path: PathBuf, key: String, reason: String },
    #[error("{path}: architecture {arch} is not supported (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3NextForCausalLM are)")]
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
    if let Some(text) = super::hybrid::vl_text_config(j) {
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
    let arch = match hf_arch.as_str() {
        "LlamaForCausalLM" => Arch::Llama,
        "Qwen2ForCausalLM" => Arch::Qwen2,
        "Qwen3ForCausalLM" => Arch::Qwen3,
        "Qwen3MoeForCausalLM" => Arch::Qwen3Moe,
        "Qwen3_5ForCausalLM" => Arch::Qwen35,
        "Qwen3_5MoeForCausalLM" => Arch::Qwen35Moe,
        "Qwen3NextForCausalLM" => Arch::Qwen3Next,
        _ => return Err(HfError::UnsupportedArch { path: path.to_path_buf(), arch: hf_arch }),
    };
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
    let moe = if arch.is_moe() {
        if arch != Arch::Qwen3Moe {
            // The hybrid MoE classes' defaults differ from Qwen3-MoE's (the fallbacks of
            // `MoeConfig::from_hf_json`): their sizes must be given.
            for key in ["num_experts", "num_experts_per_tok", "moe_intermediate_size"] {
                req_usize(key)?;
            }
        }
        let mut m = MoeConfig::from_hf_json(j, n_layers).map_err(|(key, reason)| err(&key, &reason))?;
        match arch {
            // Qwen3.5-MoE always renormalises the chosen experts' weights (no config key).
            Arch::Qwen35Moe => m.norm_topk_prob = true,
            // Qwen3NextConfig's default is true.
            Arch::Qwen3Next if j.get("norm_topk_prob").is_none_or(Json::is_null) => m.norm_topk_prob = true,
            _ => {}
        }
        Some(m)
    } else {
        None
    };
    // Qwen3MoeConfig's default dense width (used only by layers left dense); Qwen3.5-MoE has
    // no dense layers and no such key.
    let ffn_dim = match (&moe, opt_usize("intermediate_size")?) {
        (_, Some(f)) => f,
        (Some(_), None) if arch == Arch::Qwen3Moe => 6144,
        (Some(_), None) => 0,
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
        rms_eps: opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
        rope_theta: rope_theta as f32,
        rope_style: RopeStyle::Halves,
        rope_scaling,
        max_context: opt_usize("max_position_embeddings")?.unwrap_or(4096),
        tied_embeddings: opt_bool("tie_word_embeddings")?.unwrap_or(false),
        moe,
        hybrid: None,
    };
    let mut cfg = cfg;
    if arch.is_hybrid() {
        cfg.hybrid = Some(super::hybrid::HybridConfig::from_hf_json(j, path, &cfg)?);
    }
    let qkv_bias = arch == Arch::Qwen2 || opt_bool("attention_bias")?.unwrap_or(false);
    Ok((cfg, HfExtras { hf_arch, qkv_bias }))
}

fn rope_scaling(rs: &Json) -> Result<RopeScaling, String> {
    let ty = rs.get("rope_type").or_else(|| rs.get("type")).and_then(Json::as_str).unwrap_or("default");
    let num = |k: &str| rs.get(k).and_then(Json::as_f64).map(|v| v as f32).ok_or_else(|| format!("'{k}' is missing"));
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
    let llama = c.arch == Arch::Llama;
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
        if c.arch.has_qk_norm() {
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

/// Reads the tensors of `plan` (shape- and dtype-checked) and binds them as model weights.
/// Matrices keep their dtype (BF16, F16 or F32: the CPU backend widens rows as it computes);
/// norms and biases are widened to f32.
pub fn load_weights(st: &SafetensorsDir, c: &ModelConfig, x: &HfExtras) -> Result<ModelWeights, HfError> {
    if let Some(h) = &c.hybrid {
        return super::hybrid::load_hf_weights(st, c, h);
    }
    let plan = tensor_plan(c, x);
    let mut mats: HashMap<&str, Tensor> = HashMap::new();
    // Expert matrices by (stacked GGUF name, expert).
    let mut expert_mats: HashMap<(String, usize), Tensor> = HashMap::new();
    let mut vecs: HashMap<&str, Vec<f32>> = HashMap::new();
    for p in &plan {
        let (ty, shape, bytes) = st.read(&p.hf)?;
        if shape != p.shape.as_slice() {
            return Err(HfError::Shape {
                path: st.path_of(&p.hf),
                tensor: p.hf.clone(),
                expected: p.shape.clone(),
                found: shape.to_vec(),
            });
        }
        if p.is_vector() {
            let mut out = vec![0f32; p.shape[0]];
            dequantize_row(ty, bytes, &mut out);
            vecs.insert(p.gguf.as_str(), out);
        } else {
            // Matrices stay in the memory map (an 8B BF16 model is not copied into RAM). The
            // byte count was checked when the file was opened; `from_mapped` checks it again.
            let (file, info) = st.get(&p.hf)?;
            let t = Tensor::from_mapped(
                p.hf.clone(),
                ty,
                p.shape[0],
                p.shape[1],
                file.mmap().clone(),
                info.start,
                bytes.len(),
            );
            let t = t.ok_or_else(|| HfError::Shape {
                path: st.path_of(&p.hf),
                tensor: p.hf.clone(),
                expected: p.shape.clone(),
                found: shape.to_vec(),
            })?;
            match p.expert {
                Some(e) => expert_mats.insert((p.gguf.clone(), e), t),
                None => mats.insert(p.gguf.as_str(), t),
            };
        }
    }
    // Every planned name was inserted above, so the lookups below cannot fail; `take` keeps
    // that a typed error rather than a panic should the plan and this list ever disagree.
    let missing = |name: &str| SafetensorsError::MissingTensor { dir: st.dir.clone(), tensor: name.to_string() };
    let mut mat = |n: &str| mats.remove(n).ok_or_else(|| missing(n));
    let token_embd = mat("token_embd.weight")?;
    let output = if c.tied_embeddings { token_embd.clone() } else { mat("output.weight")? };
    let mut layers = Vec::with_capacity(c.n_layers);
    for i in 0..c.n_layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        let mut vec = |s: &str| vecs.remove(n(s).as_str());
        let (attn_norm, ffn_norm) = (vec("attn_norm.weight"), vec("ffn_norm.weight"));
        let (bq, bk, bv) = (vec("attn_q.bias"), vec("attn_k.bias"), vec("attn_v.bias"));
        let (q_norm, k_norm) = (vec("attn_q_norm.weight"), vec("attn_k_norm.weight"));
        let moe = match &c.moe {
            Some(m) if m.is_sparse(i) => {
                let mut experts = Vec::with_capacity(m.n_experts);
                for e in 0..m.n_experts {
                    // (GGUF name, HF projection) of the expert's three matrices.
                    let mut take = |gguf: &str, proj: &str| {
                        let t = expert_mats.remove(&(n(gguf), e));
                        t.ok_or_else(|| missing(&format!("model.layers.{i}.mlp.experts.{e}.{proj}.weight")))
                    };
                    experts.push(Expert {
                        gate: take("ffn_gate_exps.weight", "gate_proj")?,
                        up: take("ffn_up_exps.weight", "up_proj")?,
                        down: take("ffn_down_exps.weight", "down_proj")?,
                    });
                }
                Some(MoeWeights {
                    router: mat(&n("ffn_gate_inp.weight"))?,
                    experts,
                    n_used: m.n_used,
                    norm_topk_prob: m.norm_topk_prob,
                    shared: None,
                })
            }
            _ => None,
        };
        let (w_gate, w_up, w_down) = match moe {
            Some(_) => LayerWeights::empty_dense_ffn(i, c),
            None => (mat(&n("ffn_gate.weight"))?, mat(&n("ffn_up.weight"))?, mat(&n("ffn_down.weight"))?),
        };
        layers.push(LayerWeights {
            attn_norm: attn_norm.ok_or_else(|| missing(&n("attn_norm.weight")))?,
            wq: mat(&n("attn_q.weight"))?,
            wk: mat(&n("attn_k.weight"))?,
            wv: mat(&n("attn_v.weight"))?,
            wo: mat(&n("attn_output.weight"))?,
            bq,
            bk,
            bv,
            q_norm,
            k_norm,
            ffn_norm: ffn_norm.ok_or_else(|| missing(&n("ffn_norm.weight")))?,
            w_gate,
            w_up,
            w_down,
            moe,
            hybrid: None,
        });
    }
    let output_norm = vecs.remove("output_norm.weight").ok_or_else(|| missing("model.norm.weight"))?;
    Ok(ModelWeights { token_embd, layers, output_norm, output, rope_freq_factors: None })
}

/// Configuration and weights of an HF directory. The config's `vocab_size` must match the
/// embedding table.
pub fn load_dir(dir: &Path) -> Result<(ModelConfig, HfExtras, ModelWeights, SafetensorsDir), HfError> {
    let (cfg, extras) = read_config(dir)?;
    let st = SafetensorsDir::open(dir)?;
    let w = load_weights(&st, &cfg, &extras)?;
    Ok((cfg, extras, w, st))
}

/// The GGML element type a float tensor of an HF checkpoint is stored in.
pub fn stored_type(st: &SafetensorsDir, name: &str) -> Result<GgmlType, HfError> {
    Ok(st.read(name)?.0)
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
        assert_eq!((c.arch, c.head_dim, c.n_kv_heads, c.tied_embeddings), (Arch::Qwen3, 32, 2, true));
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
        assert_eq!((c.arch, c.rope_theta, c.rope_scaling), (Arch::Qwen3Moe, 5e5, RopeScaling::None));
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
}
