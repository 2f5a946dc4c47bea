//! The shared expert of a Qwen3.5-MoE / Qwen3-Next sparse layer inside the routed experts'
//! one-stream launches (pair mode, `moe::PairPath::Three`): for a step of `n` tokens and `k`
//! routed experts a token, the shared expert is pair `n k + t` of token `t`:
//! - `moe_route_fused_f32` gets one more block per token, which writes the gate weight
//!   `sigmoid(gate . h[t])` to `wts[n k + t]` (the other blocks route as before);
//! - `moe_gate_up_<fmt>_p` gets `n` more block rows, which read the shared expert's gate/up
//!   rows and write `act[n k + t]` `[ffn]`;
//! - `moe_down_sum_<fmt>` gets one more warp, which computes the shared expert's down rows
//!   and adds them, times the gate weight, after the routed slots:
//!   `x[t] += sum_j wts[t k + j] y_j + wts[n k + t] y_shared` (the CPU's order: routed slots,
//!   then the shared expert, into one sum).
//!
//! Three launches a layer instead of six (router, gate/up, down + sum, then the shared
//! expert's gate/up GEMV, gate + quantize, down GEMV). Taken where the shared expert has the
//! routed experts' width and format (Qwen3.6-35B-A3B: 512, both Q4_K / Q6_K), its gate/up one
//! matrix, and the pair buffers hold the extra rows; `DUSTOFF_SHEXP_PAIRS=0` turns it off.
//! The shared expert reads `h` in f32 here (the routed experts' input), not its int8 planes.

use cudarc::driver::CudaStream;

use super::ffn::{pair_ffn, pair_path, PairPath};
use super::launch::ShexpPairs;
use super::weights::{MoeLayerW, MoeWork};
use crate::backend::cuda::compile::kernels::Kernels;
use crate::backend::cuda::ops::launch::Dev;
use crate::backend::cuda::CudaError;

/// Whether one-stream steps run the shared expert inside the routed launches.
pub fn enabled() -> bool {
    crate::backend::cuda::tuning::tuning().shexp_pairs
}

/// The shared expert's views when a step of `n_tok` tokens of this layer takes the routed
/// launches with it ([`moe_ffn_shared`]); `None`: run it apart (shared_expert.rs).
pub fn shared_pairs(w: &MoeLayerW, work: &MoeWork, n_tok: usize, s: &CudaStream) -> Option<ShexpPairs> {
    if !enabled() || pair_path(w, n_tok) != Some(PairPath::Three) || n_tok * (w.n_used + 1) > work.cap_pairs {
        return None;
    }
    ShexpPairs::of(w, s)
}

/// `x[t] += moe(h[t]) + sigmoid(gate . h[t]) shared(h[t])` for a step of `n_tok` tokens in
/// three launches (`sh` from [`shared_pairs`]; `h`, `x` `[n_tok, dim]`).
#[allow(clippy::too_many_arguments)]
pub fn moe_ffn_shared(
    kn: &mut Kernels,
    s: &CudaStream,
    w: &MoeLayerW,
    work: &MoeWork,
    sh: &ShexpPairs,
    h: Dev<f32>,
    x: Dev<f32>,
    n_tok: usize,
) -> Result<(), CudaError> {
    pair_ffn(kn, s, w, work, h, x, n_tok, PairPath::Three, None, Some(sh))
}
