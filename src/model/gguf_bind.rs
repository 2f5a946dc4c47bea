//! Binds the tensors of a GGUF file as model weights, layer by layer, by the layer's kind
//! (`ModelConfig::layer_kind`): the mixer (attention, gated attention, Gated DeltaNet) and the
//! FFN (dense, mixture of experts with or without a shared expert) each have one binder here,
//! named as llama.cpp's converters name the tensors (`blk.N.attn_q.weight`...). Matrices stay in
//! the memory map; norms and biases are widened to f32.

use super::config::ModelConfig;
use super::gguf::{GgufError, GgufFile};
use super::hybrid::{fused_ba_rows, DeltaNetWeights, HybridConfig, HybridLayer};
use super::layer::{FfnKind, MixerKind};
use super::moe::{Expert, MoeConfig, MoeWeights, SharedExpert};
use super::tensor::Tensor;
use super::weights::{LayerWeights, ModelWeights};

impl ModelWeights {
    /// Binds the tensors of a GGUF file, named as the GGUF conventions define (`blk.N.attn_q.weight`...).
    pub fn from_gguf(g: &GgufFile, c: &ModelConfig) -> Result<Self, GgufError> {
        let layers = (0..c.n_layers).map(|i| layer(g, c, i)).collect::<Result<Vec<_>, _>>()?;
        let token_embd = Tensor::from_gguf(g, "token_embd.weight", c.vocab_size, c.dim)?;
        let output = if c.tied_embeddings {
            token_embd.clone()
        } else {
            Tensor::from_gguf(g, "output.weight", c.vocab_size, c.dim)?
        };
        Ok(ModelWeights {
            token_embd,
            layers,
            output_norm: vector(g, "output_norm.weight", c.dim)?,
            output,
            rope_freq_factors: opt_vector(g, "rope_freqs.weight", c.head_dim / 2)?,
        })
    }
}

/// A vector tensor `[n]` widened to f32.
fn vector(g: &GgufFile, name: &str, n: usize) -> Result<Vec<f32>, GgufError> {
    Tensor::from_gguf(g, name, 1, n).map(|t| t.to_f32_vec())
}

/// A vector tensor the file may leave out.
fn opt_vector(g: &GgufFile, name: &str, n: usize) -> Result<Option<Vec<f32>>, GgufError> {
    match g.tensor_info(name) {
        Some(_) => vector(g, name, n).map(Some),
        None => Ok(None),
    }
}

/// The mixer part of [`LayerWeights`]: q, k, v, o (absent, 0 rows, in a DeltaNet layer), the
/// Q/K/V biases, the Q/K head norms and, in a hybrid family, the hybrid mixer.
struct MixerParts {
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    bias: [Option<Vec<f32>>; 3],
    qk_norm: [Option<Vec<f32>>; 2],
    hybrid: Option<HybridLayer>,
}

/// Binds layer `i`: its norms, its mixer and its FFN by kind.
fn layer(g: &GgufFile, c: &ModelConfig, i: usize) -> Result<LayerWeights, GgufError> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let family = c.arch.family();
    let kind = c.layer_kind(i);
    let mut m = match (kind.mixer, &c.hybrid) {
        (MixerKind::DeltaNet, Some(h)) => deltanet(g, c, h, i)?,
        (mixer, _) => attention(g, c, i, mixer == MixerKind::GatedAttention)?,
    };
    if family.is_hybrid() && m.hybrid.is_none() {
        m.hybrid = Some(HybridLayer::Attention);
    }
    let (w_gate, w_up, w_down, moe) = match (kind.ffn, &c.moe) {
        (FfnKind::Moe { .. }, Some(mc)) => {
            let (a, b, d) = LayerWeights::empty_dense_ffn(i, c);
            (a, b, d, Some(MoeWeights::from_gguf(g, i, c.dim, mc)?))
        }
        _ => {
            let mat = |s: &str, rows, cols| Tensor::from_gguf(g, &n(s), rows, cols);
            let (f, d) = (c.ffn_dim, c.dim);
            (mat("ffn_gate.weight", f, d)?, mat("ffn_up.weight", f, d)?, mat("ffn_down.weight", d, f)?, None)
        }
    };
    let [bq, bk, bv] = m.bias;
    let [q_norm, k_norm] = m.qk_norm;
    Ok(LayerWeights {
        attn_norm: vector(g, &n("attn_norm.weight"), c.dim)?,
        wq: m.wq,
        wk: m.wk,
        wv: m.wv,
        wo: m.wo,
        bq,
        bk,
        bv,
        q_norm,
        k_norm,
        ffn_norm: vector(g, &n(family.gguf_ffn_norm), c.dim)?,
        w_gate,
        w_up,
        w_down,
        moe,
        hybrid: m.hybrid,
    })
}

/// An attention mixer: `wq` `[q_dim, dim]` (`[2 q_dim, dim]` with the output gate), biases
/// where the file has them, the head norms where the family has them.
fn attention(g: &GgufFile, c: &ModelConfig, i: usize, gated: bool) -> Result<MixerParts, GgufError> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let mat = |s: &str, rows, cols| Tensor::from_gguf(g, &n(s), rows, cols);
    let (dim, qd, kvd, hd) = (c.dim, c.q_dim(), c.kv_dim(), c.head_dim);
    let head_norm = |s: &str| {
        if c.arch.family().attention.qk_norm {
            vector(g, &n(s), hd).map(Some)
        } else {
            opt_vector(g, &n(s), hd)
        }
    };
    Ok(MixerParts {
        wq: mat("attn_q.weight", if gated { 2 * qd } else { qd }, dim)?,
        wk: mat("attn_k.weight", kvd, dim)?,
        wv: mat("attn_v.weight", kvd, dim)?,
        wo: mat("attn_output.weight", dim, qd)?,
        bias: [
            opt_vector(g, &n("attn_q.bias"), qd)?,
            opt_vector(g, &n("attn_k.bias"), kvd)?,
            opt_vector(g, &n("attn_v.bias"), kvd)?,
        ],
        qk_norm: [head_norm("attn_q_norm.weight")?, head_norm("attn_k_norm.weight")?],
        hybrid: None,
    })
}

/// A Gated DeltaNet mixer (`qwen35*`: separate `ssm_beta` / `ssm_alpha`; `qwen3next`: fused
/// `ssm_ba`, grouped per key head). The attention slots are absent.
fn deltanet(g: &GgufFile, c: &ModelConfig, h: &HybridConfig, i: usize) -> Result<MixerParts, GgufError> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let m = |s: &str, rows, cols| Tensor::from_gguf(g, &n(s), rows, cols);
    let dim = c.dim;
    let (ch, vd, nv) = (h.conv_channels(), h.value_dim(), h.n_v_heads);
    let (w_b, w_a) = if g.tensor_info(&n("ssm_ba.weight")).is_some() {
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
        neg_a: vector(g, &n("ssm_a"), nv)?,
        dt_bias: vector(g, &n("ssm_dt.bias"), nv)?,
        norm: vector(g, &n("ssm_norm.weight"), h.d_v)?,
        w_out: m("ssm_out.weight", dim, vd)?,
    };
    let absent = |s: &str, cols| Tensor::absent(n(s), cols);
    Ok(MixerParts {
        wq: absent("attn_q", dim),
        wk: absent("attn_k", dim),
        wv: absent("attn_v", dim),
        wo: absent("attn_output", c.q_dim()),
        bias: [None, None, None],
        qk_norm: [None, None],
        hybrid: Some(HybridLayer::Linear(Box::new(d))),
    })
}

impl MoeWeights {
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
