//! Mixture-of-experts layers (Qwen3-MoE; Qwen3.5-MoE and Qwen3-Next add a shared expert): the
//! configuration (from GGUF metadata or HF `config.json`) and the weights of one sparse layer
//! (router + experts [+ shared expert]).
//!
//! A sparse layer replaces the dense SwiGLU FFN by `n_experts` SwiGLU experts of width
//! `expert_ffn_dim` and a router `[n_experts, dim]`: per token, softmax over the router logits,
//! the `n_used` largest chosen, their probabilities renormalised to sum 1 when
//! `norm_topk_prob`, and the experts' outputs summed with those weights. The maths lives in
//! the CPU reference (`backend::cpu::moe`).

use serde_json::Value as Json;

use super::config::{ConfigError, ShapeError};
use super::gguf::{GgufError, GgufFile};
use super::hf::HfError;
use super::hybrid::StReader;
use super::weights::Tensor;

/// The mixture-of-experts part of a model's configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Experts per sparse layer (`expert_count`, HF `num_experts` / `num_local_experts`).
    pub n_experts: usize,
    /// Experts each token uses (`expert_used_count`, HF `num_experts_per_tok`).
    pub n_used: usize,
    /// Intermediate width of one expert (`expert_feed_forward_length`, HF `moe_intermediate_size`).
    pub expert_ffn_dim: usize,
    /// Renormalise the chosen experts' probabilities to sum 1.
    pub norm_topk_prob: bool,
    /// `[n_layers]`: true where the layer's FFN is the mixture; the others are dense
    /// (`ffn_dim` wide: HF `mlp_only_layers`, `decoder_sparse_step`).
    pub sparse_layers: Vec<bool>,
}

/// A quantity of the MoE configuration, as [`MoeConfig`]'s rules blame it: each loader maps it
/// to its own file's name for the value (a GGUF key, a `config.json` field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeField {
    /// Experts per sparse layer.
    Experts,
    /// Experts each token uses.
    Used,
    /// Intermediate width of one expert.
    ExpertFfnDim,
}

impl MoeConfig {
    pub fn is_sparse(&self, layer: usize) -> bool {
        self.sparse_layers.get(layer).copied().unwrap_or(false)
    }

    /// The MoE rules, written once for every loader (GGUF metadata, `config.json`): experts
    /// exist, a token uses between one and all of them, and an expert has a width. `name`
    /// spells a quantity as the caller's file does, for the reasons that name a second one.
    fn check(&self, name: &dyn Fn(MoeField) -> String) -> Result<(), ShapeError<MoeField>> {
        let fail = |field, reason| Err(ShapeError { field, reason });
        if self.n_experts == 0 {
            return fail(MoeField::Experts, "0 must be positive".into());
        }
        if self.n_used == 0 || self.n_used > self.n_experts {
            let (n, e) = (self.n_used, name(MoeField::Experts));
            return fail(MoeField::Used, format!("{n} must be between 1 and {e} {}", self.n_experts));
        }
        if self.expert_ffn_dim == 0 {
            return fail(MoeField::ExpertFfnDim, "0 must be positive".into());
        }
        Ok(())
    }

    /// Reads `{arch}.expert_count`, `expert_used_count`, `expert_feed_forward_length`; a layer is
    /// sparse when its `blk.N.ffn_gate_inp.weight` (the router) exists, dense otherwise.
    ///
    /// NOTE: llama.cpp always renormalises the top-k weights of `qwen3moe` (the released
    /// Qwen3-MoE models set `norm_topk_prob: true`); `expert_weights_norm`, when a file carries
    /// it, overrides that.
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
        let norm_topk_prob = g.get_bool(&format!("{a}.expert_weights_norm"))?.unwrap_or(true);
        let m = MoeConfig { n_experts, n_used, expert_ffn_dim, norm_topk_prob, sparse_layers };
        let key = |f: MoeField| {
            let k = match f {
                MoeField::Experts => "expert_count",
                MoeField::Used => "expert_used_count",
                MoeField::ExpertFfnDim => "expert_feed_forward_length",
            };
            format!("{a}.{k}")
        };
        m.check(&key).map_err(|e| {
            let note = if e.field == MoeField::ExpertFfnDim { width_note.as_str() } else { "" };
            shape_err(format!("{}{note}", e.named(key)))
        })?;
        Ok(m)
    }

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
        let m = MoeConfig { n_experts, n_used, expert_ffn_dim, norm_topk_prob, sparse_layers };
        let unset = |k: &str| j.get(k).is_none_or(Json::is_null);
        // The expert count is named as the file spells it.
        let experts =
            if unset("num_experts") && !unset("num_local_experts") { "num_local_experts" } else { "num_experts" };
        let field = |f: MoeField| {
            match f {
                MoeField::Experts => experts,
                MoeField::Used => "num_experts_per_tok",
                MoeField::ExpertFfnDim => "moe_intermediate_size",
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

/// One SwiGLU expert: `down(silu(gate x) * up x)`.
#[derive(Clone, Debug)]
pub struct Expert {
    pub gate: Tensor, // [expert_ffn_dim, dim]
    pub up: Tensor,   // [expert_ffn_dim, dim]
    pub down: Tensor, // [dim, expert_ffn_dim]
}

/// The always-on expert of Qwen3-Next / Qwen3.5-MoE layers, added to the routed experts' sum
/// scaled per token by `sigmoid(gate . x)`.
#[derive(Clone, Debug)]
pub struct SharedExpert {
    /// SwiGLU of width `shared_expert_intermediate_size` (GGUF `ffn_*_shexp`).
    pub expert: Expert,
    /// `[1, dim]`: the per-token gate logit (`shared_expert_gate`, GGUF `ffn_gate_inp_shexp`).
    pub gate: Tensor,
}

impl SharedExpert {
    /// Checks the shapes of the four tensors against each other and `dim` (the width comes from
    /// the tensors, not the config). `Err` names the first tensor that does not fit.
    pub fn new(expert: Expert, gate: Tensor, dim: usize) -> Result<Self, String> {
        let f = expert.gate.rows;
        let bad = |t: &Tensor, want: [usize; 2]| {
            Err(format!("tensor '{}' is [{}, {}], the shared expert needs {want:?}", t.name, t.rows, t.cols))
        };
        if expert.gate.cols != dim || f == 0 {
            return bad(&expert.gate, [f.max(1), dim]);
        }
        if (expert.up.rows, expert.up.cols) != (f, dim) {
            return bad(&expert.up, [f, dim]);
        }
        if (expert.down.rows, expert.down.cols) != (dim, f) {
            return bad(&expert.down, [dim, f]);
        }
        if (gate.rows, gate.cols) != (1, dim) {
            return bad(&gate, [1, dim]);
        }
        Ok(SharedExpert { expert, gate })
    }

    /// Packed bytes a token reads (the three matrices and the gate row).
    pub fn bytes(&self) -> usize {
        let e = &self.expert;
        e.gate.bytes().len() + e.up.bytes().len() + e.down.bytes().len() + self.gate.bytes().len()
    }
}

/// The FFN of one sparse layer, with the routing rule of [`MoeConfig`] (so a layer is
/// computed from its weights alone).
#[derive(Clone, Debug)]
pub struct MoeWeights {
    /// `[n_experts, dim]`: router logits = router . x (F32 in GGUF files, BF16 in HF ones).
    pub router: Tensor,
    /// `[n_experts]`.
    pub experts: Vec<Expert>,
    /// Experts per token (`MoeConfig::n_used`).
    pub n_used: usize,
    /// `MoeConfig::norm_topk_prob`.
    pub norm_topk_prob: bool,
    /// Qwen3-Next / Qwen3.5-MoE: the shared expert (`None` for Qwen3-MoE).
    pub shared: Option<SharedExpert>,
}

impl MoeWeights {
    /// Packed bytes of the router and of one average expert (what a token reads per expert).
    /// The shared expert, which every token reads, is [`SharedExpert::bytes`].
    pub fn bytes_router_and_expert(&self) -> (usize, usize) {
        let all: usize =
            self.experts.iter().map(|e| e.gate.bytes().len() + e.up.bytes().len() + e.down.bytes().len()).sum();
        (self.router.bytes().len(), all / self.experts.len().max(1))
    }

    /// Binds `blk.{layer}.ffn_gate_inp.weight` and the stacked 3-D `ffn_{gate,up,down}_exps`
    /// tensors (GGUF dims `[dim, expert_ffn, n_experts]` and `[expert_ffn, dim, n_experts]`):
    /// expert `e` is the `e`-th contiguous slab, bound in place in the memory map.
    pub fn from_gguf(g: &GgufFile, layer: usize, dim: usize, m: &MoeConfig) -> Result<Self, GgufError> {
        let n = |s: &str| format!("blk.{layer}.{s}");
        let router = Tensor::from_gguf(g, &n("ffn_gate_inp.weight"), m.n_experts, dim)?;
        let f = m.expert_ffn_dim;
        let gate = expert_slabs(g, &n("ffn_gate_exps.weight"), m.n_experts, f, dim)?;
        let up = expert_slabs(g, &n("ffn_up_exps.weight"), m.n_experts, f, dim)?;
        let down = expert_slabs(g, &n("ffn_down_exps.weight"), m.n_experts, dim, f)?;
        let experts = gate.into_iter().zip(up).zip(down).map(|((gate, up), down)| Expert { gate, up, down }).collect();
        let shared = match g.tensor_info(&n("ffn_gate_inp_shexp.weight")) {
            None => None,
            Some(_) => {
                let sf = g.require_tensor(&n("ffn_gate_shexp.weight"))?.n_rows();
                let expert = Expert {
                    gate: Tensor::from_gguf(g, &n("ffn_gate_shexp.weight"), sf, dim)?,
                    up: Tensor::from_gguf(g, &n("ffn_up_shexp.weight"), sf, dim)?,
                    down: Tensor::from_gguf(g, &n("ffn_down_shexp.weight"), dim, sf)?,
                };
                let gate = Tensor::from_gguf(g, &n("ffn_gate_inp_shexp.weight"), 1, dim)?;
                let invalid =
                    |reason| GgufError::Invalid { path: g.path.clone(), what: format!("layer {layer}"), reason };
                Some(SharedExpert::new(expert, gate, dim).map_err(invalid)?)
            }
        };
        Ok(MoeWeights { router, experts, n_used: m.n_used, norm_topk_prob: m.norm_topk_prob, shared })
    }
}

impl MoeWeights {
    /// Binds a sparse layer of an HF checkpoint, `p` being the layer's `...layers.N.mlp.`:
    /// router `gate.weight`; experts one tensor each (`experts.E.{gate,up,down}_proj.weight`,
    /// Qwen3-Next) or fused (`experts.gate_up_proj` `[E, 2I, H]`, rows `0..I` gate and `I..2I`
    /// up, and `experts.down_proj` `[E, H, I]`: Qwen3.5-MoE), bound in place in the memory map
    /// either way; the shared expert (`shared_expert.*`, `shared_expert_gate.weight`) when the
    /// checkpoint has one.
    pub(super) fn from_hf(r: &StReader, p: &str, dim: usize, m: &MoeConfig) -> Result<Self, HfError> {
        let (ne, f) = (m.n_experts, m.expert_ffn_dim);
        let router = r.matrix(&format!("{p}gate.weight"), ne, dim)?;
        let fused = format!("{p}experts.gate_up_proj");
        let experts = if r.st.contains(&fused) {
            let gate_up = r.stacked(&fused, [ne, 2 * f, dim])?;
            let down_name = format!("{p}experts.down_proj");
            let down = r.stacked(&down_name, [ne, dim, f])?;
            let slice = |t: &Tensor, name: &str, start: usize, rows: usize| {
                // In range: the stacked shapes were checked above.
                t.row_slice(name, start, rows).ok_or_else(|| HfError::Shape {
                    path: r.st.path_of(name),
                    tensor: name.to_string(),
                    expected: vec![start + rows, t.cols],
                    found: vec![t.rows, t.cols],
                })
            };
            (0..ne)
                .map(|e| {
                    Ok(Expert {
                        gate: slice(&gate_up, &format!("{fused}[{e}].gate"), 2 * f * e, f)?,
                        up: slice(&gate_up, &format!("{fused}[{e}].up"), 2 * f * e + f, f)?,
                        down: slice(&down, &format!("{down_name}[{e}]"), dim * e, dim)?,
                    })
                })
                .collect::<Result<Vec<_>, HfError>>()?
        } else {
            (0..ne)
                .map(|e| {
                    let x = |proj: &str| format!("{p}experts.{e}.{proj}.weight");
                    Ok(Expert {
                        gate: r.matrix(&x("gate_proj"), f, dim)?,
                        up: r.matrix(&x("up_proj"), f, dim)?,
                        down: r.matrix(&x("down_proj"), dim, f)?,
                    })
                })
                .collect::<Result<Vec<_>, HfError>>()?
        };
        let gate_name = format!("{p}shared_expert_gate.weight");
        let shared = if r.st.contains(&gate_name) {
            let x = |proj: &str| format!("{p}shared_expert.{proj}.weight");
            let sf = r.shape(&x("gate_proj"))?.first().copied().unwrap_or(0);
            let expert = Expert {
                gate: r.matrix(&x("gate_proj"), sf, dim)?,
                up: r.matrix(&x("up_proj"), sf, dim)?,
                down: r.matrix(&x("down_proj"), dim, sf)?,
            };
            let gate = r.matrix(&gate_name, 1, dim)?;
            let bad =
                |reason: String| HfError::Config { path: r.st.path_of(&gate_name), key: gate_name.clone(), reason };
            Some(SharedExpert::new(expert, gate, dim).map_err(bad)?)
        } else {
            None
        };
        Ok(MoeWeights { router, experts, n_used: m.n_used, norm_topk_prob: m.norm_topk_prob, shared })
    }
}

/// The `n_experts` matrices `[rows, cols]` of a 3-D GGUF tensor with dims `[cols, rows, n_experts]`.
fn expert_slabs(
    g: &GgufFile,
    name: &str,
    n_experts: usize,
    rows: usize,
    cols: usize,
) -> Result<Vec<Tensor>, GgufError> {
    let info = g.require_tensor(name)?;
    let invalid =
        |reason: String| GgufError::Invalid { path: g.path.clone(), what: format!("tensor '{name}'"), reason };
    let want = [cols as u64, rows as u64, n_experts as u64];
    if info.dims != want {
        return Err(invalid(format!("shape {:?} (GGUF order), expected {want:?}", info.dims)));
    }
    let slab = info
        .dtype
        .row_bytes(cols)
        .map(|r| r * rows)
        .ok_or_else(|| invalid(format!("rows of {cols} do not fill whole {} blocks", info.dtype)))?;
    if slab * n_experts != info.n_bytes {
        return Err(invalid(format!("{} bytes, {n_experts} experts of {slab} expected", info.n_bytes)));
    }
    (0..n_experts)
        .map(|e| {
            Tensor::from_mapped(
                format!("{name}[{e}]"),
                info.dtype,
                rows,
                cols,
                g.mmap().clone(),
                info.offset + e * slab,
                slab,
            )
            .ok_or_else(|| invalid(format!("expert {e} lies outside the file")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn hf_shape_rules_name_the_field_that_fails() {
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
    fn gguf_shape_rules_name_the_key_that_fails() {
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
}
