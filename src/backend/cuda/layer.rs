//! The device weights of one decoder layer, typed by its kinds (`model::layer::LayerKind`): the
//! mixer (softmax attention with its KV cache, or Gated DeltaNet) and the FFN (dense or
//! experts). Shared by construction (`model`, `synth::hybrid`) and the walker (`layers/`).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::device::{up, zeros};
use super::dmat::Linear;
use super::hybrid::LinearW;
use super::moe::MoeLayerW;
use super::ops::launch::{Dev, KvScales};
use super::CudaError;
use crate::backend::kv_type::{KvType, Q8_GROUP};

pub(super) struct LayerW {
    pub attn_norm: CudaSlice<f32>, // [dim]
    pub mixer: MixerW,
    pub ffn_norm: CudaSlice<f32>, // [dim]
    pub ffn: FfnW,
}

/// The mixer of a layer: softmax attention (`MixerKind::Attention`, `GatedAttention`) or Gated
/// DeltaNet (its recurrent state lives in the recurrent-state pool, `hybrid.rs`).
pub(super) enum MixerW {
    Attention(AttnW),
    DeltaNet(LinearW),
}

/// A softmax-attention mixer: its products and norms and its part of the paged KV cache.
pub(super) struct AttnW {
    pub wqkv: Linear,                   // [q_dim (x2 with a gate) + 2 kv_dim, dim]
    pub bqkv: Option<CudaSlice<f32>>,   // [q_dim + 2 kv_dim]
    pub q_norm: Option<CudaSlice<f32>>, // [head_dim]
    pub k_norm: Option<CudaSlice<f32>>, // [head_dim]
    pub wo: Linear,                     // [dim, q_dim]
    /// `[num_blocks, block_size, n_kv, head_dim]` f16; the 8-bit cache: int8 values in the same
    /// order, two per element (`kernels/common.cuh`).
    pub k_cache: CudaSlice<u16>,
    pub v_cache: CudaSlice<u16>, // same
    /// The 8-bit cache's scales, K's and V's: `[num_blocks * block_size, n_kv * head_dim / 32]`
    /// f16 each; `None`: an F16 cache.
    pub kv_scales: Option<(CudaSlice<u16>, CudaSlice<u16>)>,
}

impl MixerW {
    /// The attention mixer, if the layer has one.
    pub fn attention(&self) -> Option<&AttnW> {
        match self {
            MixerW::Attention(a) => Some(a),
            MixerW::DeltaNet(_) => None,
        }
    }

    /// The mixer's products: Q|K|V and O, or DeltaNet's stacked input projection and its output.
    pub fn mats(&self) -> [&Linear; 2] {
        match self {
            MixerW::Attention(a) => [&a.wqkv, &a.wo],
            MixerW::DeltaNet(d) => [&d.proj, &d.out],
        }
    }
}

/// The FFN of a layer, one variant per `model::layer::FfnKind`.
pub(super) enum FfnW {
    /// SwiGLU: `wgu` `[2 ffn, dim]` (gate rows then up rows), `wdown` `[dim, ffn]`.
    Dense { wgu: Linear, wdown: Linear },
    /// Mixture of experts: router, expert slabs and any shared expert.
    Moe(Box<MoeLayerW>),
}

impl FfnW {
    /// The experts of a sparse layer.
    pub fn experts(&self) -> Option<&MoeLayerW> {
        match self {
            FfnW::Moe(m) => Some(m.as_ref()),
            FfnW::Dense { .. } => None,
        }
    }

    /// The dense matrices (none for a sparse layer: its slabs are counted by [`MoeLayerW`]).
    pub fn dense_mats(&self) -> impl Iterator<Item = &Linear> {
        let (a, b) = match self {
            FfnW::Dense { wgu, wdown } => (Some(wgu), Some(wdown)),
            FfnW::Moe(_) => (None, None),
        };
        a.into_iter().chain(b)
    }
}

/// One layer's K cache, V cache and (8-bit) scales.
pub(super) type KvCaches = (CudaSlice<u16>, CudaSlice<u16>, Option<(CudaSlice<u16>, CudaSlice<u16>)>);

/// Zeroed K and V caches of `values` values each in type `kv` (0 values: a layer without
/// attention). `name` names the layer's buffers.
pub(super) fn kv_caches(
    s: &Arc<CudaStream>,
    kv: KvType,
    values: usize,
    name: &dyn Fn(&str) -> String,
) -> Result<KvCaches, CudaError> {
    Ok(match kv {
        KvType::F16 => (zeros(s, values, &name("K cache"))?, zeros(s, values, &name("V cache"))?, None),
        KvType::Q8 => {
            let (data, scales) = (values.div_ceil(2), values / Q8_GROUP);
            (
                zeros(s, data, &name("K cache (8-bit)"))?,
                zeros(s, data, &name("V cache (8-bit)"))?,
                Some((zeros(s, scales, &name("K scales"))?, zeros(s, scales, &name("V scales"))?)),
            )
        }
    })
}

impl AttnW {
    /// The layer's caches as the launchers take them.
    pub fn kv_dev(&self, s: &CudaStream) -> (Dev<u16>, Dev<u16>, Option<KvScales>) {
        let scales = self.kv_scales.as_ref().map(|(k, v)| KvScales { k: Dev::of(k, s), v: Dev::of(v, s) });
        (Dev::of(&self.k_cache, s), Dev::of(&self.v_cache, s), scales)
    }
}

impl AttnW {
    /// The attention of layer `i` of a synthetic model: Q/K norms (weights 1) where `qk_norm`,
    /// K and V caches of `cache` zeroed values each in its type.
    pub(super) fn synthetic(
        s: &Arc<CudaStream>,
        head_dim: usize,
        i: usize,
        cache: (usize, KvType),
        (wqkv, bqkv, wo): (Linear, Option<CudaSlice<f32>>, Linear),
        qk_norm: bool,
    ) -> Result<Self, CudaError> {
        let name = |x: &str| format!("layer {i} {x}");
        let ones = |n: usize, what: &str| up(s, &vec![1.0f32; n], what);
        let (k_cache, v_cache, kv_scales) = kv_caches(s, cache.1, cache.0, &name)?;
        Ok(AttnW {
            wqkv,
            bqkv,
            q_norm: if qk_norm { Some(ones(head_dim, &name("q_norm"))?) } else { None },
            k_norm: if qk_norm { Some(ones(head_dim, &name("k_norm"))?) } else { None },
            wo,
            k_cache,
            v_cache,
            kv_scales,
        })
    }
}

impl LayerW {
    /// Layer `i` of a synthetic model around its mixer and FFN: norm weights 1.
    pub(super) fn synthetic(
        s: &Arc<CudaStream>,
        dim: usize,
        i: usize,
        mixer: MixerW,
        ffn: FfnW,
    ) -> Result<Self, CudaError> {
        let ones = |what: &str| up(s, &vec![1.0f32; dim], &format!("layer {i} {what}"));
        Ok(LayerW { attn_norm: ones("attn_norm")?, mixer, ffn_norm: ones("ffn_norm")?, ffn })
    }
}
