//! Mixture-of-experts layers on the GPU (Qwen3-MoE): the experts of a sparse layer as three
//! slabs in their file format, the router in f32, and the launchers of kernels/moe.cu.
//!
//! A step's FFN of a sparse layer (`moe_ffn`), for `n` tokens and `k` experts per token:
//! 1. `moe_router_logits_f32` (a warp per expert and token; 32 x 32 tiles with
//!    `DUSTOFF_ROUTER_TILED=1`), then `moe_route_f32` (a warp
//!    per token): softmax, top-k (ties to the lower expert index, as the CPU's `route`),
//!    renormalisation: expert ids `[n, k]` and weights `[n, k]` stay on the device, so a
//!    captured CUDA graph replays whatever the tokens choose;
//! 2. few tokens (`pair_mode`): gate/up + SwiGLU for every (token, rank) pair in one launch
//!    (grid over pairs and row tiles, the weight rows at slab + id * stride found on the
//!    device), then down in one launch, into per-pair rows;
//!    more tokens: `moe_group` sorts the pairs by expert (count, prefix sum, stable fill), and
//!    the same two kernels run over experts instead of pairs, each decoding its weight rows
//!    once per 8 of its tokens (experts nobody chose exit at once);
//! 3. `moe_combine_f32`: the weighted sum of each token's k rows into the residual, rank 0
//!    first: a fixed order, the CPU reference's (no float atomics).
//!
//! Files: `weights` (a layer's device experts and the step's buffers), `launch` (the launchers of
//! kernels/moe.cu and the shared expert's device views for them), `ffn` (which launches a step
//! takes: pair mode or the grouped walk with the tensor-core GEMM of `ops::moe_gemm`), `shexp`
//! (the shared expert inside the pair-mode launches).

mod ffn;
mod launch;
pub mod shexp;
mod weights;

pub use crate::backend::cuda::ops::moe_slab::MoeDownSum;
pub use ffn::{moe_ffn, moe_ffn_grouped, moe_ffn_normed, pair_ffn, PairPath};
pub use launch::{top_k_smem, MoeCombine, MoeGroup, MoeMat, MoeRoute, MoeRouteFused, RouterLogits, ShexpPairs, Walk};
pub use weights::{check_layer, layer_bytes, workspace_bytes, MoeLayerW, MoeWork};

/// Whether one-stream steps (pair mode) take the fused kernels (router + top-k in one launch,
/// down + weighted sum in one: three launches a layer) or the five of the grouped walk
/// (`DUSTOFF_MOE_FUSED=0`, for comparisons).
pub fn fused_enabled() -> bool {
    crate::backend::cuda::tuning::tuning().moe_fused
}

/// Most tokens of a step that take the pair-mode kernels (grid over (token, rank) pairs);
/// larger steps group by expert. `DUSTOFF_MOE_PAIR_MAX_TOKENS` overrides the default of 8.
pub fn pair_max_tokens() -> usize {
    crate::backend::cuda::tuning::tuning().moe_pair_max_tokens
}
