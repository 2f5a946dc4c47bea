//! Mixture-of-experts layers (Qwen3-MoE): the configuration (from GGUF metadata or HF
//! `config.json`) and the weights of one sparse layer (router + experts).
//!
//! A sparse layer replaces the dense SwiGLU FFN by `n_experts` SwiGLU experts of width
//! `expert_ffn_dim` and a router `[n_experts, dim]`: per token, softmax over the router logits,
//! the `n_used` largest chosen, their probabilities renormalised to sum 1 when
//! `norm_topk_prob`, and the experts' outputs summed with those weights. The maths lives in
//! the CPU reference (`backend::cpu::moe`).

use serde_json::Value as Json;

use super::config::ConfigError;
use super::gguf::{GgufError, GgufFile};
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

impl MoeConfig {
    pub fn is_sparse(&self, layer: usize) -> bool {
        self.sparse_layers.get(layer).copied().unwrap_or(false)
    }

    fn check(&self) -> Result<(), String> {
        if self.n_experts == 0 || self.n_used == 0 || self.n_used > self.n_experts {
            return Err(format!("{} experts with {} used per token", self.n_experts, self.n_used));
        }
        if self.expert_ffn_dim == 0 {
            return Err("expert FFN width 0".into());
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
        // Older files lack the expert width: the first sparse layer's gate tensor has it.
        let expert_ffn_dim = match g.get_u64(&format!("{a}.expert_feed_forward_length"))? {
            Some(v) => v as usize,
            None => match sparse_layers.iter().position(|&s| s) {
                Some(i) => {
                    g.require_tensor(&format!("blk.{i}.ffn_gate_exps.weight"))?.dims.get(1).map_or(0, |&d| d as usize)
                }
                None => 0,
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
        m.check().map_err(shape_err)?;
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
        m.check().map_err(|r| bad("num_experts_per_tok", &r))?;
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
}

impl MoeWeights {
    /// Packed bytes of the router and of one average expert (what a token reads per expert).
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
        Ok(MoeWeights { router, experts, n_used: m.n_used, norm_topk_prob: m.norm_topk_prob })
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
}
