//! Hybrid models (Qwen3.5 `qwen35`, Qwen3.5-MoE `qwen35moe`, Qwen3-Next `qwen3next` in GGUF):
//! Gated DeltaNet linear-attention layers interleaved with gated full-attention layers; the MoE
//! ones have a mixture of experts with a gated shared expert as FFN (`model::moe`). This file
//! holds what the loaders need: the extra configuration ([`HybridConfig`]), the per-layer
//! weights ([`HybridLayer`]) and their binding from a GGUF file or a Hugging Face checkpoint.
//! The forward pass is `backend::cpu::hybrid`.
//!
//! What differs between the two forms of one model, and how it is made equal here:
//! - RMSNorm weights: the checkpoint stores them zero-centred (`(1 + w) * x_hat`) for the input,
//!   post-attention, final and q/k norms; llama.cpp's converter writes `1 + w`. The HF loader
//!   adds 1 so that every norm is `w * x_hat` downstream. The DeltaNet output norm is not
//!   zero-centred in either form.
//! - Decay: the checkpoint has `A_log`, the GGUF `ssm_a = -exp(A_log)`; both become `neg_a`.
//! - Value-head order: the checkpoint groups the value heads by the key head they read
//!   (`repeat_interleave`); the `qwen35*` converter tiles them (the `qwen3next` one does not).
//!   The file's order is kept and [`HeadGrouping`] says which key head a value head reads.
//! - Qwen3-Next checkpoints fuse `in_proj_qkvz` and `in_proj_ba`, grouped per key head (per key
//!   head: q, k, its value heads' v, their z; and b, a); the GGUF regroups qkvz into `attn_qkv`
//!   (all q | all k | all v) and `attn_gate` but keeps `ssm_ba` grouped. Both are regrouped
//!   here into the separate projections of Qwen3.5 ([`fused_qkvz_rows`], [`fused_ba_rows`]).

use std::path::Path;

use serde_json::Value as Json;

use super::config::{ConfigError, ModelConfig};
use super::gguf::{GgufError, GgufFile};
use super::hf::HfError;
use super::moe::MoeWeights;
use super::quant::dequantize_row;
use super::safetensors::SafetensorsDir;
use super::weights::{LayerWeights, ModelWeights, Tensor};

/// Which key head a value head reads when there are more value heads than key heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadGrouping {
    /// Value head `h` reads key head `h / (n_v / n_k)` (Hugging Face checkpoints:
    /// `repeat_interleave` of q and k).
    Interleaved,
    /// Value head `h` reads key head `h % n_k` (value heads reordered, as the `qwen35` GGUF
    /// converter stores them).
    Tiled,
}

impl HeadGrouping {
    pub fn key_head(self, v_head: usize, n_k: usize, n_v: usize) -> usize {
        match self {
            HeadGrouping::Interleaved => v_head / (n_v / n_k),
            HeadGrouping::Tiled => v_head % n_k,
        }
    }
}

/// What a hybrid model adds to [`ModelConfig`]. The full-attention layers use the config's
/// head counts and head size.
#[derive(Clone, Debug, PartialEq)]
pub struct HybridConfig {
    /// Per layer: true for a Gated DeltaNet (linear-attention) layer, false for full attention.
    pub recurrent: Vec<bool>,
    /// Linear attention: key heads, value heads, key head size, value head size.
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub d_k: usize,
    pub d_v: usize,
    /// Causal conv1d kernel length (4 in every released model).
    pub conv_kernel: usize,
    pub grouping: HeadGrouping,
    /// Full attention: dims of each head that RoPE rotates (the first ones; `partial_rotary_factor`).
    pub rotary_dim: usize,
    /// Full attention: `q_proj` also yields a per-head output gate (`attn_output_gate`).
    pub attn_output_gate: bool,
}

impl HybridConfig {
    /// Channels of the q|k|v projection and of the conv1d: `2 n_k d_k + n_v d_v`.
    pub fn conv_channels(&self) -> usize {
        2 * self.n_k_heads * self.d_k + self.n_v_heads * self.d_v
    }
    /// Width of the value (and z) projection: `n_v d_v`.
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.d_v
    }
    /// f32 values of one sequence's recurrent state in one linear layer: the last `K - 1` conv
    /// inputs and one `[d_k, d_v]` matrix per value head.
    pub fn state_len_per_layer(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_channels() + self.n_v_heads * self.d_k * self.d_v
    }
    /// Bytes of one sequence's recurrent state, all linear layers (f32).
    pub fn state_bytes_per_seq(&self) -> usize {
        self.recurrent.iter().filter(|&&r| r).count() * self.state_len_per_layer() * 4
    }
    /// What a memory plan says about the recurrent state, e.g. `recurrent state 0.28 MB/sequence
    /// (3 linear layers x (conv window 3 x 256 + 4 delta-rule matrices 32 x 32), f32)`.
    pub fn state_summary(&self) -> String {
        let n = self.recurrent.iter().filter(|&&r| r).count();
        format!(
            "recurrent state {:.2} MB/sequence ({n} linear layers x (conv window {} x {} + {} delta-rule matrices {} x {}), f32)",
            self.state_bytes_per_seq() as f64 / 1e6,
            self.conv_kernel - 1,
            self.conv_channels(),
            self.n_v_heads,
            self.d_k,
            self.d_v
        )
    }
    /// RoPE inverse frequencies over the rotated dims: `[rotary_dim / 2]`.
    pub fn rope_inv_freq(&self, theta: f32) -> Vec<f32> {
        let r = self.rotary_dim;
        (0..r / 2).map(|i| (theta as f64).powf(-(2.0 * i as f64) / r as f64) as f32).collect()
    }

    fn check(&self, head_dim: usize) -> Result<(), String> {
        let (nk, nv) = (self.n_k_heads, self.n_v_heads);
        if nk == 0 || nv == 0 || !nv.is_multiple_of(nk) {
            return Err(format!("{nv} linear value heads must be a multiple of {nk} key heads"));
        }
        if self.d_k == 0 || self.d_v == 0 || self.conv_kernel < 2 {
            return Err(format!(
                "linear head sizes {} / {} and conv kernel {} must be positive (kernel at least 2)",
                self.d_k, self.d_v, self.conv_kernel
            ));
        }
        if self.rotary_dim == 0 || !self.rotary_dim.is_multiple_of(2) || self.rotary_dim > head_dim {
            return Err(format!("{} rotary dims of a {head_dim}-wide head", self.rotary_dim));
        }
        Ok(())
    }

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
                .ok_or_else(|| shape_err("attention.recurrent_layers must be a list of booleans".into()))?,
            None => by_interval(c.n_layers, req("full_attention_interval")?),
        };
        if recurrent.len() != c.n_layers {
            return Err(shape_err(format!("{} recurrent-layer flags for {} layers", recurrent.len(), c.n_layers)));
        }
        let (d_k, n_k, n_v, inner) =
            (req("ssm.state_size")?, req("ssm.group_count")?, req("ssm.time_step_rank")?, req("ssm.inner_size")?);
        if n_v == 0 || !inner.is_multiple_of(n_v) {
            return Err(shape_err(format!("ssm.inner_size {inner} is not a multiple of {n_v} value heads")));
        }
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
            d_v: inner / n_v,
            conv_kernel: req("ssm.conv_kernel")?,
            // llama.cpp's qwen35 / qwen35moe converter tiles the value heads; qwen3next keeps
            // the checkpoint's grouped order.
            grouping: if arch == "qwen3next" { HeadGrouping::Interleaved } else { HeadGrouping::Tiled },
            rotary_dim: g.get_u64(&format!("{arch}.rope.dimension_count"))?.map_or(c.head_dim, |v| v as usize),
            attn_output_gate: gated,
        };
        h.check(c.head_dim).map_err(shape_err)?;
        Ok(h)
    }

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
        let factor =
            [j.get("partial_rotary_factor"), j.get("rope_parameters").and_then(|r| r.get("partial_rotary_factor"))]
                .into_iter()
                .flatten()
                .find_map(Json::as_f64)
                .unwrap_or(1.0);
        let h = HybridConfig {
            recurrent,
            n_k_heads: usize_of("linear_num_key_heads", None)?,
            n_v_heads: usize_of("linear_num_value_heads", None)?,
            d_k: usize_of("linear_key_head_dim", None)?,
            d_v: usize_of("linear_value_head_dim", None)?,
            conv_kernel: usize_of("linear_conv_kernel_dim", Some(4))?,
            grouping: HeadGrouping::Interleaved,
            rotary_dim: (c.head_dim as f64 * factor) as usize,
            attn_output_gate: j.get("attn_output_gate").and_then(Json::as_bool).unwrap_or(true),
        };
        h.check(c.head_dim).map_err(|reason| err("linear_num_value_heads", reason))?;
        Ok(h)
    }
}

/// Rows of Qwen3-Next's fused `in_proj_qkvz` `[nk (2 d_k + 2 r d_v), dim]` (`r = n_v / n_k`;
/// per key head: q, k, the v of its `r` value heads, their z) that make up the separate
/// projections: `(q|k|v rows [C], z rows [V])`, value heads in grouped order.
pub fn fused_qkvz_rows(h: &HybridConfig) -> (Vec<usize>, Vec<usize>) {
    let (nk, dk, dv) = (h.n_k_heads, h.d_k, h.d_v);
    let rv = h.n_v_heads / nk * dv;
    let block = 2 * dk + 2 * rv;
    let part = |off: usize, len: usize| (0..nk).flat_map(move |k| k * block + off..k * block + off + len);
    let qkv = part(0, dk).chain(part(dk, dk)).chain(part(2 * dk, rv)).collect();
    (qkv, part(2 * dk + rv, rv).collect())
}

/// Rows of Qwen3-Next's fused `in_proj_ba` / GGUF `ssm_ba` `[2 n_v, dim]` (per key head: the b
/// then the a of its `r` value heads): `(b rows [n_v], a rows [n_v])`.
pub fn fused_ba_rows(h: &HybridConfig) -> (Vec<usize>, Vec<usize>) {
    let (nk, r) = (h.n_k_heads, h.n_v_heads / h.n_k_heads);
    let part = |off: usize| (0..nk).flat_map(move |k| k * 2 * r + off..k * 2 * r + off + r).collect();
    (part(0), part(r))
}

/// Layer `i` is full attention when `(i + 1) % interval == 0` (Qwen3-Next, Qwen3.5).
fn by_interval(n_layers: usize, interval: usize) -> Vec<bool> {
    (0..n_layers).map(|i| interval == 0 || !(i + 1).is_multiple_of(interval)).collect()
}

/// The weights of one Gated DeltaNet layer (`C` = q|k|v channels, `V` = `n_v d_v`).
#[derive(Clone, Debug)]
pub struct DeltaNetWeights {
    pub w_qkv: Tensor,     // [C, dim]: all q heads, all k heads, all v heads
    pub w_z: Tensor,       // [V, dim]: the output gate
    pub w_b: Tensor,       // [n_v, dim]: beta logits
    pub w_a: Tensor,       // [n_v, dim]: decay input
    pub conv: Vec<f32>,    // [C, K]
    pub neg_a: Vec<f32>,   // [n_v]: -exp(A_log)
    pub dt_bias: Vec<f32>, // [n_v]
    pub norm: Vec<f32>,    // [d_v]: output RMSNorm (not zero-centred)
    pub w_out: Tensor,     // [dim, V]
}

/// What a layer of a hybrid model mixes tokens with; the rest of [`LayerWeights`] (norms, FFN)
/// is shared with plain models.
#[derive(Clone, Debug)]
pub enum HybridLayer {
    /// Gated DeltaNet. The layer's `wq`, `wk`, `wv`, `wo` are absent (0 rows).
    Linear(Box<DeltaNetWeights>),
    /// Full attention with partial RoPE; with the output gate, `wq` is `[2 q_dim, dim]` and each
    /// head's rows are `[query (head_dim), gate (head_dim)]`.
    Attention,
}

impl HybridLayer {
    /// Bytes of the matrices a decode step reads that the plain fields do not hold.
    pub fn extra_matrix_bytes(&self) -> usize {
        self.extra_matrices().iter().map(|t| t.bytes().len()).sum()
    }

    /// Those matrices (a linear layer's projections; none for attention).
    pub fn extra_matrices(&self) -> Vec<&Tensor> {
        match self {
            HybridLayer::Linear(d) => vec![&d.w_qkv, &d.w_z, &d.w_b, &d.w_a, &d.w_out],
            HybridLayer::Attention => Vec::new(),
        }
    }
}

/// Binds layer `i` of a `qwen35` GGUF file.
pub fn gguf_layer(g: &GgufFile, c: &ModelConfig, h: &HybridConfig, i: usize) -> Result<LayerWeights, GgufError> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let m = |s: &str, rows, cols| Tensor::from_gguf(g, &n(s), rows, cols);
    let vec = |s: &str, len: usize| Tensor::from_gguf(g, &n(s), 1, len).map(|t| t.to_f32_vec());
    let (dim, qd, kvd) = (c.dim, c.q_dim(), c.kv_dim());
    let mixer = if h.recurrent[i] {
        let (ch, vd, nv) = (h.conv_channels(), h.value_dim(), h.n_v_heads);
        let (w_b, w_a) = if g.tensor_info(&n("ssm_ba.weight")).is_some() {
            // qwen3next: b and a fused, grouped per key head.
            let ba = m("ssm_ba.weight", 2 * nv, dim)?;
            let (b_rows, a_rows) = fused_ba_rows(h);
            let split = |rows: &[usize], what: &str| {
                ba.gather_rows(format!("{} ({what} rows)", ba.name), rows).ok_or_else(|| GgufError::Invalid {
                    path: g.path.clone(),
                    what: format!("tensor '{}'", ba.name),
                    reason: format!("fewer than {} rows", 2 * nv),
                })
            };
            (split(&b_rows, "b")?, split(&a_rows, "a")?)
        } else {
            (m("ssm_beta.weight", nv, dim)?, m("ssm_alpha.weight", nv, dim)?)
        };
        let d = DeltaNetWeights {
            w_qkv: m("attn_qkv.weight", ch, dim)?,
            w_z: m("attn_gate.weight", vd, dim)?,
            w_b,
            w_a,
            conv: Tensor::from_gguf(g, &n("ssm_conv1d.weight"), ch, h.conv_kernel)?.to_f32_vec(),
            neg_a: vec("ssm_a", nv)?,
            dt_bias: vec("ssm_dt.bias", nv)?,
            norm: vec("ssm_norm.weight", h.d_v)?,
            w_out: m("ssm_out.weight", dim, vd)?,
        };
        let absent = |s: &str, cols| Tensor::absent(n(s), cols);
        let (a, b, cc, dd) =
            (absent("attn_q", dim), absent("attn_k", dim), absent("attn_v", dim), absent("attn_output", qd));
        (HybridLayer::Linear(Box::new(d)), a, b, cc, dd, None, None)
    } else {
        let q_rows = if h.attn_output_gate { 2 * qd } else { qd };
        (
            HybridLayer::Attention,
            m("attn_q.weight", q_rows, dim)?,
            m("attn_k.weight", kvd, dim)?,
            m("attn_v.weight", kvd, dim)?,
            m("attn_output.weight", dim, qd)?,
            Some(vec("attn_q_norm.weight", c.head_dim)?),
            Some(vec("attn_k_norm.weight", c.head_dim)?),
        )
    };
    let ffn = ffn_parts(
        c,
        i,
        |mc| MoeWeights::from_gguf(g, i, dim, mc),
        || {
            Ok((
                m("ffn_gate.weight", c.ffn_dim, dim)?,
                m("ffn_up.weight", c.ffn_dim, dim)?,
                m("ffn_down.weight", dim, c.ffn_dim)?,
            ))
        },
    )?;
    Ok(hybrid_layer(vec("attn_norm.weight", dim)?, vec("post_attention_norm.weight", dim)?, mixer, ffn))
}

/// A hybrid layer's token mixer as its loaders read it: the mixer, wq, wk, wv, wo (absent in
/// a linear layer) and the q/k head norms (attention layers only).
type Mixer = (HybridLayer, Tensor, Tensor, Tensor, Tensor, Option<Vec<f32>>, Option<Vec<f32>>);
/// Its FFN: dense gate/up/down (empty in a sparse layer) and the experts of a sparse one.
type Ffn = (Tensor, Tensor, Tensor, Option<MoeWeights>);

/// Layer `i`'s FFN: the experts (`sparse`) where the MoE config makes it sparse, else the dense
/// matrices (`dense`).
fn ffn_parts<E>(
    c: &ModelConfig,
    i: usize,
    sparse: impl FnOnce(&super::moe::MoeConfig) -> Result<MoeWeights, E>,
    dense: impl FnOnce() -> Result<(Tensor, Tensor, Tensor), E>,
) -> Result<Ffn, E> {
    Ok(match &c.moe {
        Some(mc) if mc.is_sparse(i) => {
            let (a, b, d) = LayerWeights::empty_dense_ffn(i, c);
            (a, b, d, Some(sparse(mc)?))
        }
        _ => {
            let (a, b, d) = dense()?;
            (a, b, d, None)
        }
    })
}

/// One hybrid layer from its loaded parts; no q/k/v biases (no hybrid family has them).
fn hybrid_layer(
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    (mix, wq, wk, wv, wo, q_norm, k_norm): Mixer,
    (w_gate, w_up, w_down, moe): Ffn,
) -> LayerWeights {
    LayerWeights {
        attn_norm,
        wq,
        wk,
        wv,
        wo,
        bq: None,
        bk: None,
        bv: None,
        q_norm,
        k_norm,
        ffn_norm,
        w_gate,
        w_up,
        w_down,
        moe,
        hybrid: Some(mix),
    }
}

/// Reads tensors of an HF checkpoint, shape-checked.
pub(super) struct StReader<'a> {
    pub(super) st: &'a SafetensorsDir,
}

impl StReader<'_> {
    fn shape_err(&self, name: &str, expected: Vec<usize>, found: &[usize]) -> HfError {
        HfError::Shape { path: self.st.path_of(name), tensor: name.to_string(), expected, found: found.to_vec() }
    }

    /// The stored shape of `name`.
    pub(super) fn shape(&self, name: &str) -> Result<Vec<usize>, HfError> {
        Ok(self.st.read(name)?.1.to_vec())
    }

    /// A 3-D tensor `[d0, d1, d2]` (fused experts) as the matrix `[d0 d1, d2]`, in the map.
    pub(super) fn stacked(&self, name: &str, dims: [usize; 3]) -> Result<Tensor, HfError> {
        let (ty, shape, bytes) = self.st.read(name)?;
        if shape != dims {
            return Err(self.shape_err(name, dims.to_vec(), shape));
        }
        let (file, info) = self.st.get(name)?;
        Tensor::from_mapped(name, ty, dims[0] * dims[1], dims[2], file.mmap().clone(), info.start, bytes.len())
            .ok_or_else(|| self.shape_err(name, dims.to_vec(), shape))
    }

    /// Regroups the rows of `t` (read from `name`) into a new tensor (see `Tensor::gather_rows`).
    fn regroup(&self, t: &Tensor, name: &str, what: &str, rows: &[usize]) -> Result<Tensor, HfError> {
        t.gather_rows(format!("{name} ({what} rows)"), rows).ok_or_else(|| {
            self.shape_err(name, vec![rows.iter().max().map_or(0, |m| m + 1), t.cols], &[t.rows, t.cols])
        })
    }

    /// A matrix, left in the memory map in its stored type.
    pub(super) fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Tensor, HfError> {
        let (ty, shape, bytes) = self.st.read(name)?;
        if shape != [rows, cols] {
            return Err(self.shape_err(name, vec![rows, cols], shape));
        }
        let (file, info) = self.st.get(name)?;
        Tensor::from_mapped(name, ty, rows, cols, file.mmap().clone(), info.start, bytes.len())
            .ok_or_else(|| self.shape_err(name, vec![rows, cols], shape))
    }

    /// Any tensor of `expected` shape, widened to f32 (norms, conv weights, per-head scalars).
    pub(super) fn values(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>, HfError> {
        let (ty, shape, bytes) = self.st.read(name)?;
        if shape != expected {
            return Err(self.shape_err(name, expected.to_vec(), shape));
        }
        let mut out = vec![0f32; expected.iter().product()];
        dequantize_row(ty, bytes, &mut out);
        Ok(out)
    }

    /// A zero-centred RMSNorm weight, returned as `1 + w` (the form the GGUF stores and the
    /// forward pass uses).
    fn centred_norm(&self, name: &str, n: usize) -> Result<Vec<f32>, HfError> {
        Ok(self.values(name, &[n])?.into_iter().map(|w| 1.0 + w).collect())
    }
}

/// The tensor-name prefix of the text model: `model.` for the text-only classes,
/// `model.language_model.` for the vision-language checkpoints of the official releases.
fn text_prefix(st: &SafetensorsDir) -> &'static str {
    if st.contains("model.language_model.embed_tokens.weight") {
        "model.language_model."
    } else {
        "model."
    }
}

/// Binds the weights of a Qwen3.5, Qwen3.5-MoE or Qwen3-Next HF checkpoint (text-only or
/// vision-language layout; experts one tensor each or fused). Vision
/// towers (`model.visual.*`) and multi-token-prediction layers (`mtp.*`) are not loaded; the
/// log says how many tensors were skipped.
pub fn load_hf_weights(st: &SafetensorsDir, c: &ModelConfig, h: &HybridConfig) -> Result<ModelWeights, HfError> {
    let r = StReader { st };
    let p = text_prefix(st);
    let (dim, qd, kvd) = (c.dim, c.q_dim(), c.kv_dim());
    let mut layers = Vec::with_capacity(c.n_layers);
    for i in 0..c.n_layers {
        let n = |s: &str| format!("{p}layers.{i}.{s}");
        let mixer = if h.recurrent[i] {
            let (ch, vd, nv, k) = (h.conv_channels(), h.value_dim(), h.n_v_heads, h.conv_kernel);
            let a_log = r.values(&n("linear_attn.A_log"), &[nv])?;
            let (qkvz, ba) = (n("linear_attn.in_proj_qkvz.weight"), n("linear_attn.in_proj_ba.weight"));
            let (w_qkv, w_z, w_b, w_a) = if st.contains(&qkvz) {
                // Qwen3-Next: fused and grouped per key head.
                let (fq, fb) = (r.matrix(&qkvz, ch + vd, dim)?, r.matrix(&ba, 2 * nv, dim)?);
                let ((qkv_rows, z_rows), (b_rows, a_rows)) = (fused_qkvz_rows(h), fused_ba_rows(h));
                (
                    r.regroup(&fq, &qkvz, "q|k|v", &qkv_rows)?,
                    r.regroup(&fq, &qkvz, "z", &z_rows)?,
                    r.regroup(&fb, &ba, "b", &b_rows)?,
                    r.regroup(&fb, &ba, "a", &a_rows)?,
                )
            } else {
                (
                    r.matrix(&n("linear_attn.in_proj_qkv.weight"), ch, dim)?,
                    r.matrix(&n("linear_attn.in_proj_z.weight"), vd, dim)?,
                    r.matrix(&n("linear_attn.in_proj_b.weight"), nv, dim)?,
                    r.matrix(&n("linear_attn.in_proj_a.weight"), nv, dim)?,
                )
            };
            let d = DeltaNetWeights {
                w_qkv,
                w_z,
                w_b,
                w_a,
                conv: r.values(&n("linear_attn.conv1d.weight"), &[ch, 1, k])?,
                neg_a: a_log.iter().map(|v| -v.exp()).collect(),
                dt_bias: r.values(&n("linear_attn.dt_bias"), &[nv])?,
                norm: r.values(&n("linear_attn.norm.weight"), &[h.d_v])?,
                w_out: r.matrix(&n("linear_attn.out_proj.weight"), dim, vd)?,
            };
            let absent = |s: &str, cols| Tensor::absent(n(s), cols);
            let (a, b, cc, dd) = (
                absent("self_attn.q_proj", dim),
                absent("self_attn.k_proj", dim),
                absent("self_attn.v_proj", dim),
                absent("self_attn.o_proj", qd),
            );
            (HybridLayer::Linear(Box::new(d)), a, b, cc, dd, None, None)
        } else {
            let q_rows = if h.attn_output_gate { 2 * qd } else { qd };
            (
                HybridLayer::Attention,
                r.matrix(&n("self_attn.q_proj.weight"), q_rows, dim)?,
                r.matrix(&n("self_attn.k_proj.weight"), kvd, dim)?,
                r.matrix(&n("self_attn.v_proj.weight"), kvd, dim)?,
                r.matrix(&n("self_attn.o_proj.weight"), dim, qd)?,
                Some(r.centred_norm(&n("self_attn.q_norm.weight"), c.head_dim)?),
                Some(r.centred_norm(&n("self_attn.k_norm.weight"), c.head_dim)?),
            )
        };
        let ffn = ffn_parts(
            c,
            i,
            |mc| MoeWeights::from_hf(&r, &n("mlp."), dim, mc),
            || {
                Ok((
                    r.matrix(&n("mlp.gate_proj.weight"), c.ffn_dim, dim)?,
                    r.matrix(&n("mlp.up_proj.weight"), c.ffn_dim, dim)?,
                    r.matrix(&n("mlp.down_proj.weight"), dim, c.ffn_dim)?,
                ))
            },
        )?;
        let norms = (
            r.centred_norm(&n("input_layernorm.weight"), dim)?,
            r.centred_norm(&n("post_attention_layernorm.weight"), dim)?,
        );
        layers.push(hybrid_layer(norms.0, norms.1, mixer, ffn));
    }
    let token_embd = r.matrix(&format!("{p}embed_tokens.weight"), c.vocab_size, dim)?;
    let output = if c.tied_embeddings { token_embd.clone() } else { r.matrix("lm_head.weight", c.vocab_size, dim)? };
    let skipped: Vec<&str> = st
        .names()
        .into_iter()
        .filter(|t| t.starts_with("model.visual.") || t.starts_with("mtp.") || t.starts_with(&format!("{p}mtp.")))
        .collect();
    if !skipped.is_empty() {
        let vis = skipped.iter().filter(|t| t.starts_with("model.visual.")).count();
        eprintln!(
            "model: {}: skipped {} vision-tower tensors (model.visual.*) and {} multi-token-prediction tensors (mtp.*); \
             the text model is loaded",
            st.dir.display(),
            vis,
            skipped.len() - vis
        );
    }
    Ok(ModelWeights {
        token_embd,
        layers,
        output_norm: r.centred_norm(&format!("{p}norm.weight"), dim)?,
        output,
        rope_freq_factors: None,
    })
}

/// The text-model part of a Qwen3.5 vision-language `config.json`
/// (`Qwen3_5(Moe)ForConditionalGeneration` with a nested `text_config`), as a text-only config:
/// `architectures` set to the text class, `tie_word_embeddings` taken from the top level when
/// the nested config lacks it. `None` for any other config.
pub fn vl_text_config(j: &Json) -> Option<Json> {
    let arch = j.get("architectures")?.as_array()?.first()?.as_str()?;
    let text_arch = match arch {
        "Qwen3_5ForConditionalGeneration" => "Qwen3_5ForCausalLM",
        "Qwen3_5MoeForConditionalGeneration" => "Qwen3_5MoeForCausalLM",
        _ => return None,
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

    #[test]
    fn interval_puts_full_attention_last_in_each_group() {
        assert_eq!(by_interval(6, 3), [true, true, false, true, true, false]);
        assert_eq!(by_interval(4, 4), [true, true, true, false]);
    }

    #[test]
    fn fused_qwen3_next_rows() {
        // 2 key heads of 2, 4 value heads of 1 (r = 2): per key head q[2] k[2] v[2] z[2].
        let h = HybridConfig {
            recurrent: vec![true],
            n_k_heads: 2,
            n_v_heads: 4,
            d_k: 2,
            d_v: 1,
            conv_kernel: 4,
            grouping: HeadGrouping::Interleaved,
            rotary_dim: 2,
            attn_output_gate: true,
        };
        let (qkv, z) = fused_qkvz_rows(&h);
        assert_eq!(qkv, [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13]);
        assert_eq!(z, [6, 7, 14, 15]);
        assert_eq!(fused_ba_rows(&h), (vec![0, 1, 4, 5], vec![2, 3, 6, 7]));
    }

    #[test]
    fn head_grouping() {
        // 2 key heads, 4 value heads.
        let inter: Vec<_> = (0..4).map(|h| HeadGrouping::Interleaved.key_head(h, 2, 4)).collect();
        let tiled: Vec<_> = (0..4).map(|h| HeadGrouping::Tiled.key_head(h, 2, 4)).collect();
        assert_eq!(inter, [0, 0, 1, 1]);
        assert_eq!(tiled, [0, 1, 0, 1]);
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
