//! Hyper-parameters from GGUF metadata: the common keys (`{arch}.block_count`,
//! `{arch}.attention.*`, RoPE), and, as the file's family has them, the mixture-of-experts keys
//! and the hybrid (Gated DeltaNet) keys. The shape rules are `rules`, `moe::MoeConfig::check` and
//! `hybrid::HybridConfig::check`; the messages name the file and the key.

use super::arch::{HeadGrouping, MixerSpec};
use super::config::{attention_shape, AttnField, ConfigError, ModelConfig, RopeScaling};
use super::gguf::{GgufError, GgufFile};
use super::hybrid::{by_interval, HybridConfig, HybridField};
use super::moe::{MoeConfig, MoeField};
use super::rules::{layer_count, positive_finite};

impl ModelConfig {
    /// Reads the configuration from GGUF metadata; the tensor list decides tied embeddings.
    pub fn from_gguf(g: &GgufFile) -> Result<Self, ConfigError> {
        let path = g.path.display().to_string();
        let arch_name = g
            .get_str("general.architecture")?
            .ok_or_else(|| GgufError::MissingKey { path: g.path.clone(), key: "general.architecture".into() })?;
        let arch = super::arch::by_gguf_name(arch_name)
            .ok_or_else(|| ConfigError::UnsupportedArch { path: path.clone(), arch: arch_name.to_string() })?;
        let (a, family) = (arch_name, arch.family());
        let req = |k: &str| -> Result<usize, GgufError> {
            let key = format!("{a}.{k}");
            g.get_u64(&key)?.map(|v| v as usize).ok_or(GgufError::MissingKey { path: g.path.clone(), key })
        };
        let n_layers = req("block_count")?;
        let shape_err = |reason: String| ConfigError::Shape { path: path.clone(), reason };
        layer_count(n_layers).map_err(|r| shape_err(format!("'{a}.block_count' {r}")))?;
        let dim = req("embedding_length")?;
        // Qwen3.5-MoE files have no dense FFN and no `feed_forward_length`.
        let ffn_dim = match g.get_u64(&format!("{a}.feed_forward_length"))? {
            Some(v) => v as usize,
            None if family.moe().is_some() => 0,
            None => req("feed_forward_length")?,
        };
        let n_heads = req("attention.head_count")?;
        let n_kv_heads = g.get_u64(&format!("{a}.attention.head_count_kv"))?.map(|v| v as usize).unwrap_or(n_heads);
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
        // A scale the forward pass divides by or raises to a power: a finite number above 0.
        let scale = |k: &str, default: f64| -> Result<f64, ConfigError> {
            let key = format!("{a}.{k}");
            let v = g.get_f64(&key)?.unwrap_or(default);
            positive_finite(v).map_err(|r| shape_err(format!("'{key}' {r}")))?;
            Ok(v)
        };
        let rms_eps = scale("attention.layer_norm_rms_epsilon", 1e-5)? as f32;
        let rope_theta = scale("rope.freq_base", 10_000.0)? as f32;
        let max_context = g.get_u64(&format!("{a}.context_length"))?.unwrap_or(4096) as usize;
        if max_context == 0 {
            return Err(shape_err(format!("'{a}.context_length' 0 must be positive")));
        }
        let rope_scaling = match g.get_str(&format!("{a}.rope.scaling.type"))? {
            None | Some("none") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear { factor: scale("rope.scaling.factor", 1.0)? as f32 },
            Some(other) => return Err(shape_err(format!("RoPE scaling '{other}' is not supported"))),
        };
        let embd = g.require_tensor("token_embd.weight")?;
        let vocab_size = embd.n_rows();
        if embd.row_len() != dim {
            return Err(shape_err(format!("token_embd.weight rows are {} wide, the model is {dim}", embd.row_len())));
        }
        let tied_embeddings = g.tensor_info("output.weight").is_none();
        let rope_style = family.gguf_rope_style;
        let moe = if family.moe().is_some() { Some(MoeConfig::from_gguf(g, n_layers)?) } else { None };
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
        if family.is_hybrid() {
            cfg.hybrid = Some(HybridConfig::from_gguf(g, arch_name, &cfg)?);
        }
        Ok(cfg)
    }
}

impl MoeConfig {
    /// Reads `{arch}.expert_count`, `expert_used_count`, `expert_feed_forward_length`; a layer is
    /// sparse when its `blk.N.ffn_gate_inp.weight` (the router) exists, dense otherwise.
    ///
    /// NOTE: llama.cpp always renormalises the top-k weights of `qwen3moe` (the released
    /// Qwen3-MoE models set `norm_topk_prob: true`) and never those of `qwen2moe` (the family's
    /// `gguf_norm_topk`); `expert_weights_norm`, when a file carries it, overrides that. The
    /// families with a shared expert read its width from `expert_shared_feed_forward_length`.
    pub fn from_gguf(g: &GgufFile, n_layers: usize) -> Result<Self, ConfigError> {
        let a = g.get_str("general.architecture")?.unwrap_or("qwen3moe").to_string();
        let req = |k: &str| -> Result<usize, GgufError> {
            let key = format!("{a}.{k}");
            g.get_u64(&key)?.map(|v| v as usize).ok_or(GgufError::MissingKey { path: g.path.clone(), key })
        };
        let shape_err = |reason: String| ConfigError::Shape { path: g.path.display().to_string(), reason };
        let n_experts = req("expert_count")?;
        let n_used = req("expert_used_count")?;
        let sparse_layers: Vec<bool> =
            (0..n_layers).map(|i| g.tensor_info(&format!("blk.{i}.ffn_gate_inp.weight")).is_some()).collect();
        // Older files lack the expert width: the first sparse layer's gate tensor has it. The
        // note tells a bad width's message where the value came from.
        let (expert_ffn_dim, width_note) = match g.get_u64(&format!("{a}.expert_feed_forward_length"))? {
            Some(v) => (v as usize, String::new()),
            None => match sparse_layers.iter().position(|&s| s) {
                Some(i) => {
                    let t = format!("blk.{i}.ffn_gate_exps.weight");
                    let w = g.require_tensor(&t)?.dims.get(1).map_or(0, |&d| d as usize);
                    (w, format!(" (the key is missing; the width is {t}'s)"))
                }
                None => (0, " (the key is missing and no layer has experts to take the width from)".into()),
            },
        };
        // llama.cpp's gating function ids: 1 softmax, 2 sigmoid.
        if let Some(f) = g.get_u64(&format!("{a}.expert_gating_func"))? {
            if f != 1 {
                return Err(shape_err(format!("expert gating function {f} is not supported (1, softmax, is)")));
            }
        }
        let spec = super::arch::by_gguf_name(&a).and_then(|arch| arch.family().moe());
        let norm_topk_prob =
            g.get_bool(&format!("{a}.expert_weights_norm"))?.unwrap_or(spec.is_none_or(|s| s.gguf_norm_topk));
        // The shared expert's width: the key, else (older files) the first sparse layer's
        // `ffn_gate_shexp` rows.
        let shared_ffn_dim = match spec.filter(|s| s.shared) {
            None => None,
            Some(_) => Some(match g.get_u64(&format!("{a}.expert_shared_feed_forward_length"))? {
                Some(v) => v as usize,
                None => sparse_layers
                    .iter()
                    .position(|&s| s)
                    .and_then(|i| g.tensor_info(&format!("blk.{i}.ffn_gate_shexp.weight")))
                    .and_then(|t| t.dims.get(1).map(|&d| d as usize))
                    .unwrap_or(0),
            }),
        };
        let m = MoeConfig { n_experts, n_used, expert_ffn_dim, norm_topk_prob, shared_ffn_dim, sparse_layers };
        let key = |f: MoeField| {
            let k = match f {
                MoeField::Experts => "expert_count",
                MoeField::Used => "expert_used_count",
                MoeField::ExpertFfnDim => "expert_feed_forward_length",
                MoeField::SharedFfnDim => "expert_shared_feed_forward_length",
            };
            format!("{a}.{k}")
        };
        m.check(&key).map_err(|e| {
            let note = if e.field == MoeField::ExpertFfnDim { width_note.as_str() } else { "" };
            shape_err(format!("{}{note}", e.named(key)))
        })?;
        Ok(m)
    }
}

impl HybridConfig {
    /// From GGUF metadata (`{arch}.ssm.*`, the recurrent-layer list or the interval).
    pub fn from_gguf(g: &GgufFile, arch: &str, c: &ModelConfig) -> Result<Self, ConfigError> {
        let path = g.path.display().to_string();
        let shape_err = |reason: String| ConfigError::Shape { path: path.clone(), reason };
        let req = |k: &str| -> Result<usize, GgufError> {
            let key = format!("{arch}.{k}");
            g.get_u64(&key)?.map(|v| v as usize).ok_or(GgufError::MissingKey { path: g.path.clone(), key })
        };
        let recurrent = match g.get_array(&format!("{arch}.attention.recurrent_layers"))? {
            Some(list) => list
                .iter()
                .map(|v| v.as_bool().or_else(|| v.as_u64().map(|x| x != 0)))
                .collect::<Option<Vec<bool>>>()
                .ok_or_else(|| shape_err(format!("'{arch}.attention.recurrent_layers' must be a list of booleans")))?,
            None => by_interval(c.n_layers, req("full_attention_interval")?),
        };
        if recurrent.len() != c.n_layers {
            return Err(shape_err(format!(
                "'{arch}.attention.recurrent_layers' has {} flags for {} layers ({arch}.block_count)",
                recurrent.len(),
                c.n_layers
            )));
        }
        let (d_k, n_k, n_v, inner) =
            (req("ssm.state_size")?, req("ssm.group_count")?, req("ssm.time_step_rank")?, req("ssm.inner_size")?);
        let key = |k: &str| format!("{arch}.{k}");
        // The gate doubles the q projection; the file has no flag for it.
        let gated = match recurrent.iter().position(|&r| !r) {
            Some(l) => g.require_tensor(&format!("blk.{l}.attn_q.weight"))?.n_rows() == 2 * c.q_dim(),
            None => true,
        };
        let h = HybridConfig {
            recurrent,
            n_k_heads: n_k,
            n_v_heads: n_v,
            d_k,
            d_v: inner.checked_div(n_v).unwrap_or(0),
            conv_kernel: req("ssm.conv_kernel")?,
            // The family's converter decides the value-head order (llama.cpp's qwen35 /
            // qwen35moe converter tiles them; qwen3next keeps the checkpoint's grouped order).
            grouping: match c.arch.family().mixers {
                MixerSpec::Hybrid { gguf_grouping } => gguf_grouping,
                MixerSpec::Attention => HeadGrouping::Interleaved,
            },
            rotary_dim: g.get_u64(&format!("{arch}.rope.dimension_count"))?.map_or(c.head_dim, |v| v as usize),
            attn_output_gate: gated,
        };
        let field_key = |f: HybridField| {
            key(match f {
                HybridField::KeyHeads => "ssm.group_count",
                HybridField::ValueHeads => "ssm.time_step_rank",
                HybridField::KeyHeadDim => "ssm.state_size",
                // The value head size is the total over the value heads here.
                HybridField::ValueHeadDim => "ssm.inner_size",
                HybridField::ConvKernel => "ssm.conv_kernel",
                HybridField::RotaryDim => "rope.dimension_count",
            })
        };
        h.check(c.head_dim, &field_key).map_err(|e| {
            let (total, heads) = (field_key(HybridField::ValueHeadDim), field_key(HybridField::ValueHeads));
            shape_err(match e.field {
                // The file gives the width of all value heads, not the size the rule is about.
                HybridField::ValueHeadDim => format!("'{total}' {inner} / {heads} {n_v} = {}", e.reason),
                _ => e.named(field_key),
            })
        })?;
        // Not a shared rule: only GGUF gives the value width as a total (the value heads are
        // known good here).
        if !inner.is_multiple_of(n_v) {
            let (total, heads) = (field_key(HybridField::ValueHeadDim), field_key(HybridField::ValueHeads));
            return Err(shape_err(format!("'{total}' {inner} must be a multiple of {heads} {n_v}")));
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn gguf_scalar_rules_name_the_key_before_anything_is_sized_from_it() {
        use super::super::gguf::Value;
        use super::super::gguf_writer::{header_only_with, model_kv};
        let dir = std::env::temp_dir().join(format!("dustoff-cfg-scalars-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let base = super::super::shapes::shape("smollm2-135m").unwrap();
        for (key, v, says) in [
            ("llama.block_count", Value::U32(0), "'llama.block_count' 0 must be between 1 and 1024"),
            // A count that sized per-layer tables would ask for terabytes.
            ("llama.block_count", Value::U64(1 << 40), "'llama.block_count' 1099511627776 must be between 1 and 1024"),
            (
                "llama.attention.layer_norm_rms_epsilon",
                Value::F32(f32::NAN),
                "'llama.attention.layer_norm_rms_epsilon' NaN must be a finite number above 0",
            ),
            (
                "llama.attention.layer_norm_rms_epsilon",
                Value::F32(-1e-5),
                "'llama.attention.layer_norm_rms_epsilon' -0.00001 must be a finite number above 0",
            ),
            ("llama.rope.freq_base", Value::F32(0.0), "'llama.rope.freq_base' 0 must be a finite number above 0"),
            ("llama.rope.freq_base", Value::F64(1e300), "'llama.rope.freq_base' 1e300 must be a finite number above 0"),
            ("llama.context_length", Value::U32(0), "'llama.context_length' 0 must be positive"),
        ] {
            let g = header_only_with(&dir.join("t.gguf"), model_kv(&base, "t"), key, Some(v));
            let e = ModelConfig::from_gguf(&g).unwrap_err().to_string();
            assert!(e.contains("t.gguf") && e.contains(says), "{e}");
        }
        // The MoE rules bound the expert count the same way.
        let moe = super::super::shapes::shape("qwen3-30b-a3b").unwrap();
        let g = header_only_with(
            &dir.join("t.gguf"),
            model_kv(&moe, "t"),
            "qwen3moe.expert_count",
            Some(Value::U64(1 << 40)),
        );
        let e = MoeConfig::from_gguf(&g, moe.n_layers).unwrap_err().to_string();
        assert!(e.contains("'qwen3moe.expert_count' 1099511627776 is more than the 16384 this reader accepts"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn moe_gguf_shape_rules_name_the_key_that_fails() {
        use super::super::gguf::Value;
        use super::super::gguf_writer::{header_only_with, model_kv};
        let dir = std::env::temp_dir().join(format!("dustoff-moe-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let base = super::super::shapes::shape("qwen3-30b-a3b").unwrap();
        // (key, its value or none, what the message says): header-only files, so no layer has
        // a router; the rules need none.
        for (key, v, says) in [
            ("qwen3moe.expert_count", Some(0), "'qwen3moe.expert_count' 0 must be positive"),
            (
                "qwen3moe.expert_used_count",
                Some(0),
                "'qwen3moe.expert_used_count' 0 must be between 1 and qwen3moe.expert_count 128",
            ),
            (
                "qwen3moe.expert_used_count",
                Some(129),
                "'qwen3moe.expert_used_count' 129 must be between 1 and qwen3moe.expert_count 128",
            ),
            (
                "qwen3moe.expert_feed_forward_length",
                Some(0),
                "'qwen3moe.expert_feed_forward_length' 0 must be positive",
            ),
            (
                "qwen3moe.expert_feed_forward_length",
                None,
                "'qwen3moe.expert_feed_forward_length' 0 must be positive (the key is missing and no layer has experts",
            ),
        ] {
            let g = header_only_with(&dir.join("t.gguf"), model_kv(&base, "t"), key, v.map(Value::U32));
            let e = MoeConfig::from_gguf(&g, base.n_layers).unwrap_err().to_string();
            assert!(e.contains("t.gguf") && e.contains(says), "{e}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn moe_gguf_defaults_follow_the_family() {
        use super::super::gguf::Value;
        use super::super::gguf_writer::{header_only_with, model_kv};
        let dir = std::env::temp_dir().join(format!("dustoff-moe-family-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Without `expert_weights_norm`, llama.cpp's choice for the family: qwen2moe never
        // renormalises, qwen3moe always.
        for (shape, key, want) in [
            ("qwen2-57b-a14b", "qwen2moe.expert_weights_norm", false),
            ("qwen3-30b-a3b", "qwen3moe.expert_weights_norm", true),
        ] {
            let c = super::super::shapes::shape(shape).unwrap();
            let g = header_only_with(&dir.join("t.gguf"), model_kv(&c, "t"), key, None);
            let m = MoeConfig::from_gguf(&g, c.n_layers).unwrap();
            assert_eq!(m.norm_topk_prob, want, "{shape}");
            assert_eq!(m.shared_ffn_dim, c.moe.as_ref().unwrap().shared_ffn_dim, "{shape}");
        }
        // The shared expert's width is read and checked (header-only: no tensor to take it from).
        let c = super::super::shapes::shape("qwen2-57b-a14b").unwrap();
        let key = "qwen2moe.expert_shared_feed_forward_length";
        let g = header_only_with(&dir.join("t.gguf"), model_kv(&c, "t"), key, Some(Value::U32(0)));
        let e = MoeConfig::from_gguf(&g, c.n_layers).unwrap_err().to_string();
        assert!(e.contains("'qwen2moe.expert_shared_feed_forward_length' 0 must be positive"), "{e}");
        let g = header_only_with(&dir.join("t.gguf"), model_kv(&c, "t"), key, None);
        assert!(MoeConfig::from_gguf(&g, c.n_layers).is_err(), "no width from the key nor a tensor");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn hybrid_gguf_shape_rules_name_the_key_that_fails() {
        use super::super::gguf::Value;
        use super::super::gguf_writer::{header_only_with, model_kv};
        let dir = std::env::temp_dir().join(format!("dustoff-hybrid-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = super::super::shapes::shape("qwen3.5-9b").unwrap();
        let mut kv = model_kv(&c, "t");
        // The hybrid keys are set below.
        kv.retain(|(k, _)| {
            !k.starts_with("qwen35.ssm.")
                && k != "qwen35.attention.recurrent_layers"
                && k != "qwen35.full_attention_interval"
        });
        // Every layer linear, so that no full-attention tensor is needed to tell the output gate.
        kv.push(("qwen35.attention.recurrent_layers".into(), Value::Array(vec![Value::Bool(true); c.n_layers])));
        for (k, v) in [("state_size", 128), ("group_count", 16), ("time_step_rank", 32), ("inner_size", 4096)] {
            kv.push((format!("qwen35.ssm.{k}"), Value::U32(v)));
        }
        kv.push(("qwen35.ssm.conv_kernel".into(), Value::U32(4)));
        let open = |key: &str, v: u32| header_only_with(&dir.join("t.gguf"), kv.clone(), key, Some(Value::U32(v)));
        let h = HybridConfig::from_gguf(&open("qwen35.rope.dimension_count", 64), "qwen35", &c).unwrap();
        assert_eq!((h.n_k_heads, h.n_v_heads, h.d_k, h.d_v, h.conv_kernel, h.rotary_dim), (16, 32, 128, 128, 4, 64));
        let rule = "must be even, positive and at most the head size 256";
        for (key, v, says) in [
            ("qwen35.ssm.group_count", 0, "'qwen35.ssm.group_count' 0 must be positive".to_string()),
            (
                "qwen35.ssm.time_step_rank",
                24,
                "'qwen35.ssm.time_step_rank' 24 must be a positive multiple of qwen35.ssm.group_count 16".into(),
            ),
            // No value heads: the heads' rule says so, not the width's.
            ("qwen35.ssm.time_step_rank", 0, "'qwen35.ssm.time_step_rank' 0 must be a positive multiple".into()),
            ("qwen35.ssm.state_size", 0, "'qwen35.ssm.state_size' 0 must be positive".into()),
            (
                "qwen35.ssm.inner_size",
                16,
                "'qwen35.ssm.inner_size' 16 / qwen35.ssm.time_step_rank 32 = 0 must be positive".into(),
            ),
            (
                "qwen35.ssm.inner_size",
                4001,
                "'qwen35.ssm.inner_size' 4001 must be a multiple of qwen35.ssm.time_step_rank 32".into(),
            ),
            ("qwen35.ssm.conv_kernel", 1, "'qwen35.ssm.conv_kernel' 1 must be at least 2".into()),
            ("qwen35.rope.dimension_count", 63, format!("'qwen35.rope.dimension_count' 63 {rule}")),
            ("qwen35.rope.dimension_count", 512, format!("'qwen35.rope.dimension_count' 512 {rule}")),
        ] {
            let e = HybridConfig::from_gguf(&open(key, v), "qwen35", &c).unwrap_err().to_string();
            assert!(e.contains("t.gguf") && e.contains(&says), "{e}");
        }
        let flags =
            |v: Value| header_only_with(&dir.join("t.gguf"), kv.clone(), "qwen35.attention.recurrent_layers", Some(v));
        for (v, says) in [
            (
                Value::Array(vec![Value::Bool(true); 3]),
                format!("'qwen35.attention.recurrent_layers' has 3 flags for {} layers", c.n_layers),
            ),
            (
                Value::Array(vec![Value::F32(0.5); c.n_layers]),
                "'qwen35.attention.recurrent_layers' must be a list of booleans".into(),
            ),
        ] {
            let e = HybridConfig::from_gguf(&flags(v), "qwen35", &c).unwrap_err().to_string();
            assert!(e.contains("t.gguf") && e.contains(&says), "{e}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
