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

use super::config::{ConfigError, ModelConfig, ShapeError};
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

/// A quantity of the hybrid configuration, as [`HybridConfig`]'s rules blame it: each loader
/// maps it to its own file's name for the value (a GGUF key, a `config.json` field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HybridField {
    /// Linear-attention key heads.
    KeyHeads,
    /// Linear-attention value heads.
    ValueHeads,
    /// Size of one key head.
    KeyHeadDim,
    /// Size of one value head.
    ValueHeadDim,
    /// Causal conv1d kernel length.
    ConvKernel,
    /// Dims of a full-attention head that RoPE rotates.
    RotaryDim,
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

    /// The linear-attention rules, written once for every loader (GGUF metadata, `config.json`):
    /// whole value heads per key head, positive head sizes, a conv kernel that spans a previous
    /// input, and an even number of rotated dims (RoPE rotates pairs) within the `head_dim`-wide
    /// head. `name` spells a quantity as the caller's file does, for the reasons that name a
    /// second one.
    fn check(&self, head_dim: usize, name: &dyn Fn(HybridField) -> String) -> Result<(), ShapeError<HybridField>> {
        let fail = |field, reason| Err(ShapeError { field, reason });
        let (nk, nv) = (self.n_k_heads, self.n_v_heads);
        if nk == 0 {
            return fail(HybridField::KeyHeads, "0 must be positive".into());
        }
        if nv == 0 || !nv.is_multiple_of(nk) {
            let k = name(HybridField::KeyHeads);
            return fail(HybridField::ValueHeads, format!("{nv} must be a positive multiple of {k} {nk}"));
        }
        if self.d_k == 0 {
            return fail(HybridField::KeyHeadDim, "0 must be positive".into());
        }
        if self.d_v == 0 {
            return fail(HybridField::ValueHeadDim, "0 must be positive".into());
        }
        if self.conv_kernel < 2 {
            return fail(HybridField::ConvKernel, format!("{} must be at least 2", self.conv_kernel));
        }
        let r = self.rotary_dim;
        if r == 0 || !r.is_multiple_of(2) || r > head_dim {
            return fail(
                HybridField::RotaryDim,
                format!("{r} must be even, positive and at most the head size {head_dim}"),
            );
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
            // llama.cpp's qwen35 / qwen35moe converter tiles the value heads; qwen3next keeps
            // the checkpoint's grouped order.
            grouping: if arch == "qwen3next" { HeadGrouping::Interleaved } else { HeadGrouping::Tiled },
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
    fn hf_shape_rules_name_the_field_that_fails() {
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
    fn gguf_shape_rules_name_the_key_that_fails() {
        use super::super::gguf::Value;
        use super::super::gguf_writer::{header_only_with, model_kv};
        let dir = std::env::temp_dir().join(format!("dustoff-hybrid-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = super::super::shapes::shape("qwen3.5-9b").unwrap();
        let mut kv = model_kv(&c, "t");
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
