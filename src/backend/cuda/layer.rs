//! The device weights of one decoder layer (plain and sparse layers; a hybrid model's
//! linear-attention layers keep theirs in `hybrid`), shared by construction (`backend`,
//! `hybrid_synth`) and the step (`step`, `hybrid`).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::device::{up, zeros};
use super::dmat::Linear;
use super::moe::MoeLayerW;
use super::CudaError;

pub(super) struct LayerW {
    pub attn_norm: CudaSlice<f32>,      // [dim]
    pub wqkv: Linear,                   // [q_dim + 2 kv_dim, dim]
    pub bqkv: Option<CudaSlice<f32>>,   // [q_dim + 2 kv_dim]
    pub q_norm: Option<CudaSlice<f32>>, // [head_dim]
    pub k_norm: Option<CudaSlice<f32>>, // [head_dim]
    pub wo: Linear,                     // [dim, q_dim]
    pub ffn_norm: CudaSlice<f32>,       // [dim]
    pub wgu: Linear,                    // [2 ffn, dim]: gate rows then up rows (sparse layer: none)
    pub wdown: Linear,                  // [dim, ffn] (sparse layer: none)
    /// Sparse (mixture-of-experts) layers: router and expert slabs, in place of wgu/wdown.
    pub moe: Option<MoeLayerW>,
    pub k_cache: CudaSlice<u16>, // [num_blocks, block_size, n_kv, head_dim] f16
    pub v_cache: CudaSlice<u16>, // same
}

/// The matrices of a synthetic layer (`CudaBackend::synthetic_mix`, `synthetic_hybrid`): the
/// attention products (empty for a linear-attention layer) and the FFN (dense gate/up and
/// down, or experts).
pub(super) struct SynthMats {
    pub wqkv: Linear,
    pub bqkv: Option<CudaSlice<f32>>,
    /// Qwen3-style per-head Q/K norms (weights 1).
    pub qk_norm: bool,
    pub wo: Linear,
    pub ffn: (Linear, Linear, Option<MoeLayerW>),
}

impl LayerW {
    /// Layer `i` of a synthetic model around `m`: every norm weight 1, K and V caches of
    /// `cache` zeroed f16 elements each (0 for a layer without attention).
    pub(super) fn synthetic(
        s: &Arc<CudaStream>,
        dim: usize,
        head_dim: usize,
        i: usize,
        cache: usize,
        m: SynthMats,
    ) -> Result<Self, CudaError> {
        let name = |x: &str| format!("layer {i} {x}");
        let ones = |n: usize, what: &str| up(s, &vec![1.0f32; n], what);
        let (wgu, wdown, moe) = m.ffn;
        Ok(LayerW {
            attn_norm: ones(dim, &name("attn_norm"))?,
            wqkv: m.wqkv,
            bqkv: m.bqkv,
            q_norm: if m.qk_norm { Some(ones(head_dim, &name("q_norm"))?) } else { None },
            k_norm: if m.qk_norm { Some(ones(head_dim, &name("k_norm"))?) } else { None },
            wo: m.wo,
            ffn_norm: ones(dim, &name("ffn_norm"))?,
            wgu,
            wdown,
            moe,
            k_cache: zeros(s, cache, &name("K cache"))?,
            v_cache: zeros(s, cache, &name("V cache"))?,
        })
    }
}
