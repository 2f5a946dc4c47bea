//! The device weights of one decoder layer (plain and sparse layers; a hybrid model's
//! linear-attention layers keep theirs in `hybrid`), shared by construction (`backend`,
//! `hybrid_synth`) and the step (`step`, `hybrid`).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::device::{up, zeros};
use super::dmat::Linear;
use super::moe::MoeLayerW;
use super::ops::launch::{Dev, KvScales};
use super::CudaError;
use crate::backend::kv_type::{KvType, Q8_GROUP};

pub(super) struct LayerW {
    pub attn_norm: CudaSlice<f32>,      // [dim]
    pub wqkv: Linear,                   // [q_dim + 2 kv_dim, dim]
    pub bqkv: Option<CudaSlice<f32>>,   // [q_dim + 2 kv_dim]
    pub q_norm: Option<CudaSlice<f32>>, // [head_dim]
    pub k_norm: Option<CudaSlice<f32>>, // [head_dim]
    pub wo: Linear,                     // [dim, q_dim]
    pub ffn_norm: CudaSlice<f32>,       // [dim]
    pub ffn: FfnW,
    /// `[num_blocks, block_size, n_kv, head_dim]` f16; the 8-bit cache: int8 values in the same
    /// order, two per element (`kernels/common.cuh`).
    pub k_cache: CudaSlice<u16>,
    pub v_cache: CudaSlice<u16>, // same
    /// The 8-bit cache's scales, K's and V's: `[num_blocks * block_size, n_kv * head_dim / 32]`
    /// f16 each; `None`: an F16 cache.
    pub kv_scales: Option<(CudaSlice<u16>, CudaSlice<u16>)>,
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

impl LayerW {
    /// The layer's caches as the launchers take them.
    pub fn kv_dev(&self, s: &CudaStream) -> (Dev<u16>, Dev<u16>, Option<KvScales>) {
        let scales = self.kv_scales.as_ref().map(|(k, v)| KvScales { k: Dev::of(k, s), v: Dev::of(v, s) });
        (Dev::of(&self.k_cache, s), Dev::of(&self.v_cache, s), scales)
    }
}

/// The matrices of a synthetic layer (`CudaBackend::synthetic_mix`, `synthetic_hybrid`): the
/// attention products (empty for a linear-attention layer) and the FFN.
pub(super) struct SynthMats {
    pub wqkv: Linear,
    pub bqkv: Option<CudaSlice<f32>>,
    /// Qwen3-style per-head Q/K norms (weights 1).
    pub qk_norm: bool,
    pub wo: Linear,
    pub ffn: FfnW,
}

impl LayerW {
    /// Layer `i` of a synthetic model around `m`: every norm weight 1, K and V caches of
    /// `cache` zeroed values each in its type (0 for a layer without attention).
    pub(super) fn synthetic(
        s: &Arc<CudaStream>,
        dim: usize,
        head_dim: usize,
        i: usize,
        cache: (usize, KvType),
        m: SynthMats,
    ) -> Result<Self, CudaError> {
        let name = |x: &str| format!("layer {i} {x}");
        let ones = |n: usize, what: &str| up(s, &vec![1.0f32; n], what);
        let (k_cache, v_cache, kv_scales) = kv_caches(s, cache.1, cache.0, &name)?;
        Ok(LayerW {
            attn_norm: ones(dim, &name("attn_norm"))?,
            wqkv: m.wqkv,
            bqkv: m.bqkv,
            q_norm: if m.qk_norm { Some(ones(head_dim, &name("q_norm"))?) } else { None },
            k_norm: if m.qk_norm { Some(ones(head_dim, &name("k_norm"))?) } else { None },
            wo: m.wo,
            ffn_norm: ones(dim, &name("ffn_norm"))?,
            ffn: m.ffn,
            k_cache,
            v_cache,
            kv_scales,
        })
    }
}
