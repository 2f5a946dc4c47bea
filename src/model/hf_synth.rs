//! Tiny random-weight Hugging Face model directories (llama, qwen2, qwen3, qwen3-moe; BF16 safetensors,
//! one file or shards), so the HF, conversion and Qwen paths run in CI without downloads.
//!
//! The tokenizer is the vocabulary of a GGUF model (the sample model): `tokenizer.json` is built
//! from its `tokenizer.ggml.*` metadata. Llama directories get SmolLM2's own pre-tokenizer
//! (digits isolated, then GPT-2's regex); Qwen directories get the Qwen2 regex, so both
//! pre-tokenizer styles reach the GGUF writer.

use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value as Json};

use super::arch::{Arch, PreTokenizer};
use super::config::ModelConfig;
use super::gguf::{GgufError, GgufFile};
use super::hf::{tensor_plan, HfError, HfExtras};
use super::quant::{quantize_row, GgmlType};
use super::safetensors::{write_checkpoint, SafetensorsError, StMeta, StWriteTensor};

/// Qwen2's pre-tokenizer regex as its `tokenizer.json` writes it.
const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("cannot write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Safetensors(#[from] SafetensorsError),
    #[error(transparent)]
    Hf(#[from] HfError),
    #[error("{path}: {reason}")]
    Vocab { path: PathBuf, reason: String },
    #[error("synthetic HF directories of {0} are not supported")]
    Unsupported(String),
}

/// The shape of a synthetic model.
#[derive(Clone, Debug)]
pub struct SynthSpec {
    pub arch: Arch,
    pub n_layers: usize,
    pub dim: usize,
    pub ffn_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub tied: bool,
    /// Number of safetensors files (1: `model.safetensors`; more: shards plus an index).
    pub shards: usize,
    pub seed: u64,
    /// Written as `rope_scaling` in config.json when set.
    pub rope_scaling: Option<Json>,
    /// Mixture-of-experts keys of config.json (for a mixture-of-experts family).
    pub moe: Option<SynthMoe>,
}

/// The MoE part of a synthetic Qwen3-MoE config.json.
#[derive(Clone, Debug)]
pub struct SynthMoe {
    pub n_experts: usize,
    pub n_used: usize,
    pub expert_ffn_dim: usize,
    /// `None` leaves the key out (transformers' default, false, applies).
    pub norm_topk_prob: Option<bool>,
    pub mlp_only_layers: Vec<usize>,
    pub decoder_sparse_step: usize,
}

impl SynthSpec {
    /// 2 layers, width 64, grouped-query attention (4 query heads, 2 KV heads). Qwen3 gets a
    /// head size (32) that is not width / heads, as real Qwen3 models have.
    pub fn tiny(arch: Arch, seed: u64) -> Self {
        let family = arch.family();
        SynthSpec {
            arch,
            n_layers: 2,
            dim: 64,
            ffn_dim: 128,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: if family.attention.qk_norm { 32 } else { 16 },
            tied: family.tiny_hf.is_none_or(|t| t.tied),
            shards: 1,
            seed,
            rope_scaling: None,
            moe: family.moe().map(|_| SynthMoe {
                n_experts: 4,
                n_used: 2,
                expert_ffn_dim: 32,
                norm_topk_prob: Some(true),
                mlp_only_layers: Vec::new(),
                decoder_sparse_step: 1,
            }),
        }
    }
}

/// The `tokenizer.ggml.*` data of a GGUF file, as tokenizer.json needs it.
struct Vocab {
    tokens: Vec<String>,
    types: Vec<i64>,
    merges: Vec<String>,
    bos: Option<u32>,
    eos: Option<u32>,
    template: Option<String>,
}

fn read_vocab(g: &GgufFile) -> Result<Vocab, SynthError> {
    let bad = |reason: &str| SynthError::Vocab { path: g.path.clone(), reason: reason.to_string() };
    let tokens: Vec<String> = g
        .get_str_array("tokenizer.ggml.tokens")?
        .ok_or_else(|| bad("no tokenizer.ggml.tokens"))?
        .into_iter()
        .map(str::to_string)
        .collect();
    let types = g.get_i64_array("tokenizer.ggml.token_type")?.unwrap_or_else(|| vec![1; tokens.len()]);
    if types.len() != tokens.len() {
        return Err(bad("token_type and tokens differ in length"));
    }
    let merges = g.get_str_array("tokenizer.ggml.merges")?.ok_or_else(|| bad("no merges"))?;
    let id = |k: &str| -> Result<Option<u32>, GgufError> { Ok(g.get_u64(k)?.map(|v| v as u32)) };
    Ok(Vocab {
        merges: merges.into_iter().map(str::to_string).collect(),
        bos: id("tokenizer.ggml.bos_token_id")?,
        eos: id("tokenizer.ggml.eos_token_id")?,
        template: g.get_str("tokenizer.chat_template")?.map(str::to_string),
        tokens,
        types,
    })
}

fn tokenizer_json(v: &Vocab, pre: PreTokenizer) -> Json {
    let vocab: serde_json::Map<String, Json> =
        v.tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
    // GGUF types 3 (control) and 4 (user-defined) are HF added tokens, special or not.
    let added: Vec<Json> = v
        .types
        .iter()
        .enumerate()
        .filter(|(_, &t)| t == 3 || t == 4)
        .map(|(i, &t)| {
            json!({"id": i, "content": v.tokens[i], "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": t == 3})
        })
        .collect();
    let pre = match pre {
        PreTokenizer::Smollm => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]}),
        PreTokenizer::Qwen2 => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]}),
    };
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": pre, "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": v.merges}
    })
}

fn write_json(path: &Path, j: &Json) -> Result<(), SynthError> {
    std::fs::write(path, serde_json::to_string_pretty(j).unwrap_or_default())
        .map_err(|source| SynthError::Io { path: path.to_path_buf(), source })
}

/// Writes a random BF16 model of shape `spec` into `dir` (created if needed) with the
/// vocabulary of the GGUF file `vocab_from`. `edit(hf_name, values)` may change any tensor's
/// f32 values before they are rounded to BF16 (to plant values). Returns the configuration as
/// `hf::read_config` reads it back.
pub fn write_hf_dir(
    dir: &Path,
    spec: &SynthSpec,
    vocab_from: &Path,
    edit: &mut dyn FnMut(&str, &mut [f32]),
) -> Result<(ModelConfig, HfExtras), SynthError> {
    std::fs::create_dir_all(dir).map_err(|source| SynthError::Io { path: dir.to_path_buf(), source })?;
    let g = GgufFile::open(vocab_from)?;
    let v = read_vocab(&g)?;
    // The family's tiny form (none for the hybrid families: their random checkpoints come
    // from transformers, see tests/data).
    let family = spec.arch.family();
    let (Some(tiny), Some(hf_arch)) = (family.tiny_hf, family.hf_classes.first()) else {
        return Err(SynthError::Unsupported(format!("{} models", family.gguf_name)));
    };
    let (model_type, theta) = (tiny.model_type, tiny.rope_theta);
    let mut config = json!({
        "architectures": [hf_arch], "model_type": model_type, "hidden_size": spec.dim,
        "intermediate_size": spec.ffn_dim, "num_attention_heads": spec.n_heads,
        "num_key_value_heads": spec.n_kv_heads, "head_dim": spec.head_dim,
        "num_hidden_layers": spec.n_layers, "vocab_size": v.tokens.len(), "rms_norm_eps": 1e-6,
        "rope_theta": theta, "max_position_embeddings": 2048, "tie_word_embeddings": spec.tied,
        "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": false,
        "bos_token_id": v.bos, "eos_token_id": v.eos,
    });
    if let (Some(rs), Some(o)) = (&spec.rope_scaling, config.as_object_mut()) {
        o.insert("rope_scaling".into(), rs.clone());
    }
    if let (Some(m), Some(o)) = (&spec.moe, config.as_object_mut()) {
        o.insert("num_experts".into(), json!(m.n_experts));
        o.insert("num_experts_per_tok".into(), json!(m.n_used));
        o.insert("moe_intermediate_size".into(), json!(m.expert_ffn_dim));
        o.insert("mlp_only_layers".into(), json!(m.mlp_only_layers));
        o.insert("decoder_sparse_step".into(), json!(m.decoder_sparse_step));
        if let Some(norm) = m.norm_topk_prob {
            o.insert("norm_topk_prob".into(), json!(norm));
        }
    }
    write_json(&dir.join("config.json"), &config)?;
    write_json(&dir.join("tokenizer.json"), &tokenizer_json(&v, tiny.pre_tokenizer))?;
    let name = |id: Option<u32>| id.and_then(|i| v.tokens.get(i as usize)).cloned();
    let mut tcfg = json!({"bos_token": name(v.bos), "eos_token": name(v.eos), "pad_token": name(v.eos),
                          "add_bos_token": false,
                          "model_max_length": 2048});
    if let (Some(t), Some(o)) = (&v.template, tcfg.as_object_mut()) {
        o.insert("chat_template".into(), json!(t));
    }
    write_json(&dir.join("tokenizer_config.json"), &tcfg)?;
    write_json(&dir.join("generation_config.json"), &json!({"bos_token_id": v.bos, "eos_token_id": v.eos}))?;

    let (cfg, extras) = super::hf::read_config(dir)?;
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let mut tensors = Vec::new();
    for p in tensor_plan(&cfg, &extras) {
        let n: usize = p.shape.iter().product();
        let mut vals: Vec<f32> = if p.is_vector() {
            // Norm gains near 1 and small biases: far enough from the trivial values that a
            // reference which skipped them would disagree.
            let is_bias = p.hf.ends_with(".bias");
            (0..n).map(|_| if is_bias { rng.random_range(-0.1..0.1) } else { rng.random_range(0.8..1.2) }).collect()
        } else {
            // Uniform in +-sqrt(3/cols): unit-variance outputs for unit-variance inputs.
            let a = (3.0 / p.shape[1] as f32).sqrt();
            (0..n).map(|_| rng.random_range(-a..a)).collect()
        };
        edit(&p.hf, &mut vals);
        tensors.push(StWriteTensor {
            meta: StMeta { name: p.hf.clone(), dtype: "BF16", shape: p.shape.clone() },
            data: quantize_row(GgmlType::BF16, &vals).into(),
        });
    }
    write_checkpoint(dir, &tensors, spec.shards)?;
    Ok((cfg, extras))
}
