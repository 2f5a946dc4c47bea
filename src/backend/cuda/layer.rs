//! The device weights of one decoder layer (plain and sparse layers; a hybrid model's
//! linear-attention layers keep theirs in `hybrid`), shared by construction (`backend`,
//! `hybrid_synth`) and the step (`step`, `hybrid`).

use cudarc::driver::CudaSlice;

use super::dmat::Linear;

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
    pub moe: Option<super::moe::MoeLayerW>,
    pub k_cache: CudaSlice<u16>, // [num_blocks, block_size, n_kv, head_dim] f16
    pub v_cache: CudaSlice<u16>, // same
}
