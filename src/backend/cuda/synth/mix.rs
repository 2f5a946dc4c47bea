//! Synthetic models (`bench --synthetic`, random weights made on the GPU): the formats of a
//! weight mix, every matrix's (format, rows, cols) in the order the constructors make them
//! (`model::CudaBackend::synthetic_mix`, `synth::hybrid`), and the device bytes the memory
//! plan counts before anything is made.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::backend::cuda::compile::kernels::Kernels;
use crate::backend::cuda::moe::MoeLayerW;
use crate::backend::cuda::ops::moe_slab::slab_bytes;
use crate::backend::cuda::ops::shared_expert::SharedExpertW;
use crate::backend::cuda::CudaError;
use crate::model::config::ModelConfig;
use crate::model::layer::MixerKind;
use crate::model::moe::MoeConfig;
use crate::model::quant::GgmlType;
use crate::quantize::mix::more_bits;

/// Weight formats of a synthetic model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightMix {
    /// Every matrix in one format.
    Uniform(GgmlType),
    /// llama.cpp's Q4_K_M: Q6_K for attn_v and ffn_down in the layers `more_bits` picks
    /// (half of them) and for the output head; Q4_K for everything else, the embedding included.
    Q4KM,
}

impl WeightMix {
    /// (base format, format of the matrices `more_bits` picks and of the output head).
    pub fn formats(self) -> (GgmlType, GgmlType) {
        match self {
            WeightMix::Uniform(t) => (t, t),
            WeightMix::Q4KM => (GgmlType::Q4K, GgmlType::Q6K),
        }
    }

    /// `f16`, `q8_0`, `q4_k`, ... or `q4_k_m`; `None` for other names.
    pub fn parse(s: &str) -> Option<WeightMix> {
        if s.eq_ignore_ascii_case("q4_k_m") {
            return Some(WeightMix::Q4KM);
        }
        // Synthetic weights are made in F16 and the block formats (no F32 / BF16 matrices).
        let t = GgmlType::from_name(s).filter(|t| !matches!(t, GgmlType::F32 | GgmlType::BF16))?;
        Some(WeightMix::Uniform(t))
    }
}

/// (format, rows, cols) of every matrix of a synthetic model, in the order `synthetic_mix`
/// makes them: per layer q, k, v, o, gate, up, down; then the embedding and an untied head.
pub(in crate::backend::cuda) fn synthetic_shapes(c: &ModelConfig, mix: WeightMix) -> Vec<(GgmlType, usize, usize)> {
    let (base, more) = mix.formats();
    let mut v = Vec::new();
    for i in 0..c.n_layers {
        let m = if more_bits(i, c.n_layers) { more } else { base };
        let (d, q, kv, f) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
        v.extend([(base, q, d), (base, kv, d), (m, kv, d), (base, d, q)]);
        // A sparse layer's experts are made by `synthetic_experts` (`moe_formats`).
        if !c.layer_kind(i).is_sparse() {
            v.extend([(base, f, d), (base, f, d), (m, d, f)]);
        }
    }
    v.push((base, c.vocab_size, c.dim));
    if !c.tied_embeddings {
        v.push((more, c.vocab_size, c.dim));
    }
    v
}

/// Formats of a synthetic sparse layer's (gate and up, down) expert slabs: as the dense FFN of
/// the mix (Q4_K_M: down in Q6_K in the layers `more_bits` picks, as llama.cpp does for
/// `ffn_down_exps`).
pub(in crate::backend::cuda) fn moe_formats(mix: WeightMix, layer: usize, n_layers: usize) -> (GgmlType, GgmlType) {
    match mix {
        WeightMix::Uniform(t) => (t, t),
        WeightMix::Q4KM if more_bits(layer, n_layers) => (GgmlType::Q4K, GgmlType::Q6K),
        WeightMix::Q4KM => (GgmlType::Q4K, GgmlType::Q4K),
    }
}

/// Per layer the matrices in the order they are made: linear layers (proj, out, gate/up,
/// down); attention layers (q+gate and k, v, o, gate/up, down); then the embedding and an
/// untied head. (format, rows, cols). Sparse layers have no dense gate/up and down (their
/// experts: `routed_bytes`, `shared_bytes`).
pub(in crate::backend::cuda) fn hybrid_shapes(
    c: &ModelConfig,
    base: GgmlType,
    more: GgmlType,
) -> Vec<(GgmlType, usize, usize)> {
    let (d, q, kv, f) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
    let mut v = Vec::new();
    for i in 0..c.n_layers {
        let m = if more_bits(i, c.n_layers) { more } else { base };
        let kind = c.layer_kind(i);
        if kind.is_recurrent() {
            v.extend(c.mixer_matrices(kind.mixer).into_iter().map(|(rows, cols)| (base, rows, cols)));
        } else {
            // q (+ gate), k and v in one part where v has the base format (as `Linear::upload`
            // stacks them), else v apart.
            let q_rows = if kind.mixer == MixerKind::GatedAttention { 2 * q } else { q };
            if m == base {
                v.push((base, q_rows + 2 * kv, d));
            } else {
                v.extend([(base, q_rows + kv, d), (m, kv, d)]);
            }
            v.push((base, d, q));
        }
        if !kind.is_sparse() {
            v.extend([(base, 2 * f, d), (m, d, f)]);
        }
    }
    v.push((base, c.vocab_size, d));
    if !c.tied_embeddings {
        v.push((more, c.vocab_size, d));
    }
    v
}

/// Device bytes of sparse layer `i`'s f32 router and three expert slabs (`moe::MoeLayerW`).
fn routed_bytes(c: &ModelConfig, m: &MoeConfig, mix: WeightMix, i: usize) -> u64 {
    let (gu, down) = moe_formats(mix, i, c.n_layers);
    let (e, f, d) = (m.n_experts, m.expert_ffn_dim, c.dim);
    (e * d * 4) as u64 + 2 * slab_bytes(gu, e * f, d, false) + slab_bytes(down, e * d, f, false)
}

/// Width of a synthetic sparse layer's shared expert: the config's, else the experts'.
fn shared_width(m: &MoeConfig) -> usize {
    m.shared_ffn_dim.unwrap_or(m.expert_ffn_dim)
}

/// Device bytes of a sparse layer's shared expert (three matrices, f32 gate row).
fn shared_bytes(c: &ModelConfig, m: &MoeConfig, mix: WeightMix, i: usize) -> u64 {
    let (gu, down) = moe_formats(mix, i, c.n_layers);
    let (f, d) = (shared_width(m), c.dim);
    slab_bytes(gu, 2 * f, d, false) + slab_bytes(down, d, f, false) + (d * 4) as u64
}

/// Device bytes of every weight matrix of a synthetic model of shape `c` in `mix` (routers and
/// shared-expert gates in f32, expert slabs packed): what the memory plan counts before
/// anything is made.
pub fn synthetic_matrix_bytes(c: &ModelConfig, mix: WeightMix) -> u64 {
    let dense: u64 = if c.has_hybrid_mixers() {
        let (base, more) = mix.formats();
        hybrid_shapes(c, base, more).into_iter().map(|(t, r, k)| slab_bytes(t, r, k, false)).sum()
    } else {
        synthetic_shapes(c, mix).into_iter().map(|(t, r, k)| slab_bytes(t, r, k, false)).sum()
    };
    let experts: u64 = (0..c.n_layers)
        .filter_map(|i| c.sparse_ffn(i).map(|m| (i, m)))
        .map(|(i, m)| {
            let shared = if c.layer_kind(i).has_shared_expert() { shared_bytes(c, m, mix, i) } else { 0 };
            routed_bytes(c, m, mix, i) + shared
        })
        .sum();
    dense + experts
}

/// Sparse layer `i` of a synthetic model (`None` for a dense layer): routed experts in the
/// formats of `mix` (`moe_formats`) and, where its kind has one, a gated shared expert of the
/// config's shared width. Both synthetic builders (`CudaBackend::synthetic_mix`,
/// `synthetic_hybrid`) make their sparse layers here.
pub(in crate::backend::cuda) fn synthetic_experts(
    s: &Arc<CudaStream>,
    k: &mut Kernels,
    c: &ModelConfig,
    mix: WeightMix,
    i: usize,
    seed: u64,
) -> Result<Option<MoeLayerW>, CudaError> {
    let kind = c.layer_kind(i);
    let Some(m) = c.sparse_ffn(i) else { return Ok(None) };
    let (gu, down) = moe_formats(mix, i, c.n_layers);
    let seed = seed.wrapping_mul(0x2545_f491_4f6c_dd1d).wrapping_add(i as u64);
    let mut w = MoeLayerW::synthetic(s, k, c, m, gu, down, seed, &format!("layer {i} experts"))?;
    if kind.has_shared_expert() {
        let what = format!("layer {i} shared expert");
        w.shared = Some(SharedExpertW::synthetic(s, k, c.dim, shared_width(m), gu, down, seed, &what)?);
    }
    Ok(Some(w))
}
