//! Model hyper-parameters, read from GGUF metadata (or, for Hugging Face directories, from
//! `config.json` by the safetensors loader).

use super::gguf::{GgufError, GgufFile};
use super::hybrid::HybridConfig;
use super::layer::{FfnKind, LayerKind, MixerKind};
pub use super::moe::MoeConfig;

/// Architectures dustoff runs. They differ only in small ways on top of the llama block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama family (also SmolLM2, Mistral-style models without sliding windows).
    Llama,
    /// Qwen2 / Qwen2.5: bias on the Q, K and V projections.
    Qwen2,
    /// Qwen3: per-head RMSNorm on Q and K before RoPE, no QKV bias.
    Qwen3,
    /// Qwen3-MoE (Qwen3-30B-A3B...): Qwen3 attention; the FFN of each sparse layer is a
    /// mixture of SwiGLU experts (see [`MoeConfig`]).
    Qwen3Moe,
    /// Qwen3.5 dense: Gated DeltaNet layers between gated full-attention layers (`hybrid`).
    Qwen35,
    /// Qwen3.5 / 3.6 MoE (Qwen3.5-35B-A3B...): the Qwen3.5 hybrid layers with a mixture of
    /// experts plus a gated shared expert as every layer's FFN.
    Qwen35Moe,
    /// Qwen3-Next (Qwen3-Next-80B-A3B): hybrid layers as Qwen3.5 (fused `in_proj_qkvz` /
    /// `in_proj_ba` in its checkpoints), MoE with a gated shared expert.
    Qwen3Next,
}

impl Arch {
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "qwen3moe" => Some(Arch::Qwen3Moe),
            "qwen35" => Some(Arch::Qwen35),
            "qwen35moe" => Some(Arch::Qwen35Moe),
            "qwen3next" => Some(Arch::Qwen3Next),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen35Moe => "qwen35moe",
            Arch::Qwen3Next => "qwen3next",
        }
    }
    /// Gated DeltaNet layers between full-attention ones (see `model::hybrid`).
    pub fn is_hybrid(self) -> bool {
        matches!(self, Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next)
    }
    /// Mixture-of-experts FFNs (see [`MoeConfig`]).
    pub fn is_moe(self) -> bool {
        matches!(self, Arch::Qwen3Moe | Arch::Qwen35Moe | Arch::Qwen3Next)
    }
    /// How a GGUF file of this architecture pairs RoPE dimensions: llama.cpp's converter
    /// permutes llama Q/K rows to adjacent pairs and leaves the others in halves (a Hugging Face
    /// directory is always `Halves`).
    pub fn gguf_rope_style(self) -> RopeStyle {
        match self {
            Arch::Llama => RopeStyle::Adjacent,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next => {
                RopeStyle::Halves
            }
        }
    }
    /// A gated shared expert beside the routed ones in every sparse layer.
    pub fn has_shared_expert(self) -> bool {
        matches!(self, Arch::Qwen35Moe | Arch::Qwen3Next)
    }
    /// Per-head RMSNorm on Q and K before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub fn has_qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Qwen3Moe)
    }
}

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): llama GGUFs, whose Q/K rows were permuted at conversion.
    Adjacent,
    /// Halves (i, i + d/2): Hugging Face layout, Qwen GGUFs ("neox" in llama.cpp).
    Halves,
}

/// RoPE frequency scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// Llama 3 style: low frequencies scaled by `factor`, high kept, smooth in between.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_context: f32,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layers: usize,
    /// Width of the residual stream.
    pub dim: usize,
    pub ffn_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    pub rope_style: RopeStyle,
    pub rope_scaling: RopeScaling,
    /// Context length the model was trained for.
    pub max_context: usize,
    /// The output head shares the embedding table.
    pub tied_embeddings: bool,
    /// Mixture-of-experts layers (qwen3moe, qwen35moe, qwen3next); `None` for dense models.
    /// `ffn_dim` is then the width of the layers left dense (0 when the file gives none).
    pub moe: Option<MoeConfig>,
    /// Linear-attention layers and their sizes (hybrid models: Qwen3.5, Qwen3.5-MoE, Qwen3-Next).
    pub hybrid: Option<HybridConfig>,
}

/// A quantity of the attention shape, as [`attention_shape`] blames it: each loader maps it to
/// its own file's name for the value (a GGUF key, a `config.json` field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnField {
    /// Width of the residual stream.
    Dim,
    /// Query heads.
    Heads,
    /// Key/value heads.
    KvHeads,
    /// Size of one head.
    HeadDim,
}

/// A shape rule that a model's values break: the quantity to blame (`F`: [`AttnField`],
/// [`MoeField`](super::moe::MoeField), [`HybridField`](super::hybrid::HybridField)) and why.
/// The reason leaves the quantity's own name to the caller, so it reads after it (mostly from
/// the value on): each loader names the quantity as its own file does, the rule is written once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeError<F> {
    pub field: F,
    pub reason: String,
}

impl<F: Copy> ShapeError<F> {
    /// `'name' reason`, the quantity named by `name` (how the GGUF loader reports it).
    pub fn named(&self, name: impl Fn(F) -> String) -> String {
        format!("'{}' {}", name(self.field), self.reason)
    }
}

/// An attention shape rule that a model's values break (see [`attention_shape`]).
pub type AttnShapeError = ShapeError<AttnField>;

/// The attention shape rules, written once for every loader (GGUF metadata, `config.json`):
/// whole query heads per KV head, and an even, positive head size (RoPE rotates pairs).
/// `head_dim` is the file's explicit head size; without one it is `dim / n_heads`, which must
/// then be exact. `name` spells a quantity as the caller's file does, for the reasons that name
/// a second one. Returns the head size.
pub fn attention_shape(
    dim: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: Option<usize>,
    name: &dyn Fn(AttnField) -> String,
) -> Result<usize, AttnShapeError> {
    let fail = |field, reason| Err(AttnShapeError { field, reason });
    if n_heads == 0 {
        return fail(AttnField::Heads, "must be positive".into());
    }
    if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
        return fail(AttnField::KvHeads, format!("{n_kv_heads} must divide {} {n_heads}", name(AttnField::Heads)));
    }
    let even = |h: usize| h > 0 && h.is_multiple_of(2);
    match head_dim {
        Some(h) if even(h) => Ok(h),
        Some(h) => fail(AttnField::HeadDim, format!("{h} must be even and positive")),
        None => {
            let (d, h) = (name(AttnField::Dim), name(AttnField::Heads));
            if !dim.is_multiple_of(n_heads) {
                return fail(
                    AttnField::HeadDim,
                    format!("is missing and {d} {dim} is not a multiple of {h} {n_heads}"),
                );
            }
            let derived = dim / n_heads;
            if !even(derived) {
                let why = format!("is missing and {d} {dim} / {h} {n_heads} = {derived} must be even and positive");
                return fail(AttnField::HeadDim, why);
            }
            Ok(derived)
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{path}: architecture '{arch}' is not supported (llama, qwen2, qwen3, qwen3moe, qwen35, qwen35moe, qwen3next are)")]
    UnsupportedArch { path: String, arch: String },
    #[error("{path}: inconsistent model shape: {reason}")]
    Shape { path: String, reason: String },
}

impl ModelConfig {
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    /// The kind of layer `l` (see `model::layer`), derived from the configuration.
    pub fn layer_kind(&self, l: usize) -> LayerKind {
        let mixer = match &self.hybrid {
            Some(h) if h.recurrent.get(l).copied().unwrap_or(false) => MixerKind::DeltaNet,
            Some(h) if h.attn_output_gate => MixerKind::GatedAttention,
            _ => MixerKind::Attention,
        };
        let ffn = match &self.moe {
            Some(m) if m.is_sparse(l) => FfnKind::Moe { shared: self.arch.has_shared_expert() },
            _ => FfnKind::Dense,
        };
        LayerKind { mixer, ffn }
    }
    /// Every layer's kind, in order: what the memory plan, `doctor`, `run --dry-run` and the
    /// tensor-parallel planner read.
    pub fn layer_kinds(&self) -> Vec<LayerKind> {
        (0..self.n_layers).map(|l| self.layer_kind(l)).collect()
    }
    /// Whether layer `l` keeps K/V in the paged cache (every layer but a hybrid model's
    /// linear-attention ones).
    pub fn has_kv(&self, l: usize) -> bool {
        self.layer_kind(l).has_kv()
    }
    /// Bytes of one sequence's recurrent state: the Gated DeltaNet layers' (f32); 0 for a model
    /// without any.
    pub fn state_bytes_per_seq(&self) -> usize {
        let recurrent = self.layer_kinds().iter().filter(|k| k.is_recurrent()).count();
        self.hybrid.as_ref().map_or(0, |h| recurrent * h.state_len_per_layer() * 4)
    }
    /// What a memory plan says about the recurrent state (see `HybridConfig::state_summary`);
    /// `None` for a model without recurrent layers.
    pub fn state_summary(&self) -> Option<String> {
        let recurrent = self.layer_kinds().iter().any(|k| k.is_recurrent());
        self.hybrid.as_ref().filter(|_| recurrent).map(|h| h.state_summary())
    }
    /// Layers that keep K/V in the paged cache.
    pub fn n_kv_layers(&self) -> usize {
        (0..self.n_layers).filter(|&l| self.has_kv(l)).count()
    }

    /// Reads the configuration from GGUF metadata; the tensor list decides tied embeddings.
    pub fn from_gguf(g: &GgufFile) -> Result<Self, ConfigError> {
        let path = g.path.display().to_string();
        let arch_name = g
            .get_str("general.architecture")?
            .ok_or_else(|| GgufError::MissingKey { path: g.path.clone(), key: "general.architecture".into() })?;
        let arch = Arch::from_name(arch_name)
            .ok_or_else(|| ConfigError::UnsupportedArch { path: path.clone(), arch: arch_name.to_string() })?;
        let a = arch_name;
        let req = |k: &str| -> Result<usize, GgufError> {
            let key = format!("{a}.{k}");
            g.get_u64(&key)?.map(|v| v as usize).ok_or(GgufError::MissingKey { path: g.path.clone(), key })
        };
        let n_layers = req("block_count")?;
        let dim = req("embedding_length")?;
        // Qwen3.5-MoE files have no dense FFN and no `feed_forward_length`.
        let ffn_dim = match g.get_u64(&format!("{a}.feed_forward_length"))? {
            Some(v) => v as usize,
            None if arch.is_moe() => 0,
            None => req("feed_forward_length")?,
        };
        let n_heads = req("attention.head_count")?;
        let n_kv_heads = g.get_u64(&format!("{a}.attention.head_count_kv"))?.map(|v| v as usize).unwrap_or(n_heads);
        let shape_err = |reason: String| ConfigError::Shape { path: path.clone(), reason };
        let key_length = g.get_u64(&format!("{a}.attention.key_length"))?.map(|v| v as usize);
        let key = |f: AttnField| {
            let k = match f {
                AttnField::Dim => "embedding_length",
                AttnField::Heads => "attention.head_count",
                AttnField::KvHeads => "attention.head_count_kv",
                AttnField::HeadDim => "attention.key_length",
            };
            format!("{a}.{k}")
        };
        let head_dim =
            attention_shape(dim, n_heads, n_kv_heads, key_length, &key).map_err(|e| shape_err(e.named(key)))?;
        let rms_eps = g.get_f64(&format!("{a}.attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5) as f32;
        let rope_theta = g.get_f64(&format!("{a}.rope.freq_base"))?.unwrap_or(10_000.0) as f32;
        let max_context = g.get_u64(&format!("{a}.context_length"))?.unwrap_or(4096) as usize;
        let rope_scaling = match g.get_str(&format!("{a}.rope.scaling.type"))? {
            None | Some("none") => RopeScaling::None,
            Some("linear") => {
                RopeScaling::Linear { factor: g.get_f64(&format!("{a}.rope.scaling.factor"))?.unwrap_or(1.0) as f32 }
            }
            Some(other) => return Err(shape_err(format!("RoPE scaling '{other}' is not supported"))),
        };
        let embd = g.require_tensor("token_embd.weight")?;
        let vocab_size = embd.n_rows();
        if embd.row_len() != dim {
            return Err(shape_err(format!("token_embd.weight rows are {} wide, the model is {dim}", embd.row_len())));
        }
        let tied_embeddings = g.tensor_info("output.weight").is_none();
        let rope_style = arch.gguf_rope_style();
        let moe = if arch.is_moe() { Some(MoeConfig::from_gguf(g, n_layers)?) } else { None };
        let mut cfg = ModelConfig {
            arch,
            n_layers,
            dim,
            ffn_dim,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab_size,
            rms_eps,
            rope_theta,
            rope_style,
            rope_scaling,
            max_context,
            tied_embeddings,
            moe,
            hybrid: None,
        };
        if arch.is_hybrid() {
            cfg.hybrid = Some(HybridConfig::from_gguf(g, arch_name, &cfg)?);
        }
        Ok(cfg)
    }

    /// Inverse frequency of each rotated pair of a head: `[head_dim / 2]`.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let half = self.head_dim / 2;
        (0..half)
            .map(|i| {
                let base = (self.rope_theta as f64).powf(-(2.0 * i as f64) / self.head_dim as f64);
                let f = match self.rope_scaling {
                    RopeScaling::None => base,
                    RopeScaling::Linear { factor } => base / factor as f64,
                    RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_context } => {
                        let wavelen = 2.0 * std::f64::consts::PI / base;
                        let low_wavelen = original_context as f64 / low_freq_factor as f64;
                        let high_wavelen = original_context as f64 / high_freq_factor as f64;
                        if wavelen < high_wavelen {
                            base
                        } else if wavelen > low_wavelen {
                            base / factor as f64
                        } else {
                            let smooth = (original_context as f64 / wavelen - low_freq_factor as f64)
                                / (high_freq_factor as f64 - low_freq_factor as f64);
                            (1.0 - smooth) * base / factor as f64 + smooth * base
                        }
                    }
                };
                f as f32
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hf_name(f: AttnField) -> String {
        format!("{f:?}").to_lowercase()
    }

    #[test]
    fn attention_shape_blames_the_quantity_that_breaks_a_rule() {
        let check = |dim, heads, kv, hd| attention_shape(dim, heads, kv, hd, &hf_name);
        assert_eq!(check(64, 4, 2, None), Ok(16));
        assert_eq!(check(64, 4, 2, Some(32)), Ok(32), "an explicit head size need not be dim / heads");
        let e = check(64, 4, 3, None).unwrap_err();
        assert_eq!(e.field, AttnField::KvHeads);
        assert_eq!(e.reason, "3 must divide heads 4");
        assert_eq!(check(64, 4, 0, None).unwrap_err().field, AttnField::KvHeads);
        assert_eq!(check(64, 0, 0, None).unwrap_err().field, AttnField::Heads);
        let e = check(64, 4, 2, Some(15)).unwrap_err();
        assert_eq!((e.field, e.reason.as_str()), (AttnField::HeadDim, "15 must be even and positive"));
        assert_eq!(check(64, 4, 2, Some(0)).unwrap_err().field, AttnField::HeadDim);
        let e = check(66, 4, 2, None).unwrap_err();
        assert_eq!(
            (e.field, e.reason.as_str()),
            (AttnField::HeadDim, "is missing and dim 66 is not a multiple of heads 4")
        );
        let e = check(60, 4, 2, None).unwrap_err();
        assert!(e.field == AttnField::HeadDim && e.reason.contains("= 15 must be even"), "{e:?}");
    }

    #[test]
    fn gguf_shape_errors_name_the_file_and_the_key() {
        use super::super::gguf::Value;
        use super::super::gguf_writer::{header_only_with, model_kv};
        let dir = std::env::temp_dir().join(format!("dustoff-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let base = super::super::shapes::shape("smollm2-135m").unwrap();
        // (key, value, what the message says): header-only files, as the rules run before any
        // tensor is read.
        for (key, v, says) in [
            (
                "llama.attention.head_count_kv",
                4,
                "'llama.attention.head_count_kv' 4 must divide llama.attention.head_count 9",
            ),
            ("llama.attention.key_length", 63, "'llama.attention.key_length' 63 must be even and positive"),
        ] {
            let g = header_only_with(&dir.join("t.gguf"), model_kv(&base, "t"), key, Some(Value::U32(v)));
            let e = ModelConfig::from_gguf(&g).unwrap_err().to_string();
            assert!(e.contains("t.gguf") && e.contains(says), "{e}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
