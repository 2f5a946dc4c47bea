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

use std::sync::OnceLock;

use cudarc::driver::CudaStream;

use super::kernels::Kernels;
use super::launch::{check, Dev};
use super::moe::{pair_ffn, pair_path, MoeLayerW, MoeWork, PairPath};
use super::moe_slab::slab_view;
use super::CudaError;

/// Whether one-stream steps run the shared expert inside the routed launches.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| crate::sys::env::get("DUSTOFF_SHEXP_PAIRS").is_none_or(|v| v != "0"))
}

/// A shared expert's device views for the pair-mode kernels.
#[derive(Clone, Copy, Debug)]
pub struct ShexpPairs {
    /// Gate rows (qs, aux), then up rows (qs, aux): the halves of the `[2 f, dim]` gate/up.
    pub(super) gu: [u64; 4],
    /// Down rows (qs, aux) of the `[dim, f]` down matrix.
    pub(super) down: [u64; 2],
    /// The gate row `[dim]` f32.
    pub(super) gate: Dev<f32>,
    /// Format index and (qs, aux) row bytes of gate/up and of down.
    fmt: (usize, usize),
    gu_row: (usize, usize),
    down_row: (usize, usize),
    /// (ffn, dim).
    shape: (usize, usize),
}

impl ShexpPairs {
    /// The views of `w`'s shared expert where it matches the routed experts' width and
    /// formats and its gate/up is one matrix; else `None`.
    pub fn of(w: &MoeLayerW, s: &CudaStream) -> Option<Self> {
        let sh = w.shared.as_ref()?;
        let ([gu], [dn]) = (&sh.gu.parts[..], &sh.down.parts[..]) else { return None };
        let (f, dim) = (w.ffn, w.dim);
        if sh.ffn != f || (gu.rows, gu.cols) != (2 * f, dim) || (dn.rows, dn.cols) != (dim, f) {
            return None;
        }
        let (fg, qs, aux, qr, ar, _) = slab_view(gu, s).ok()?;
        let (fd, dqs, daux, dqr, dar, _) = slab_view(dn, s).ok()?;
        let (rg, _, _, _, _, _) = slab_view(&w.gate, s).ok()?;
        let (rd, _, _, _, _, _) = slab_view(&w.down, s).ok()?;
        if (fg, fd) != (rg, rd) {
            return None;
        }
        let up = (qs + (f * qr) as u64, aux + (f * ar) as u64);
        Some(ShexpPairs {
            gu: [qs, aux, up.0, up.1],
            down: [dqs, daux],
            gate: Dev::of(&sh.gate, s),
            fmt: (fg, fd),
            gu_row: (qr, ar),
            down_row: (dqr, dar),
            shape: (f, dim),
        })
    }

    /// The gate/up launch's experts (`(rows, cols)` each, format `fi`, row bytes) are these.
    pub(super) fn check_gate_up(
        &self,
        kernel: &'static str,
        fi: usize,
        shape: (usize, usize),
        row: (usize, usize),
        gate_up_by_token: bool,
    ) -> Result<(), CudaError> {
        check(kernel, gate_up_by_token && (fi, shape, row) == (self.fmt.0, self.shape, self.gu_row), || {
            format!(
                "a shared expert of format {} {:?} for gate/up experts of format {fi} {shape:?}",
                self.fmt.0, self.shape
            )
        })
    }

    /// The down launch's experts are of this shape, format and row bytes.
    pub(super) fn check_down(
        &self,
        kernel: &'static str,
        fi: usize,
        shape: (usize, usize),
        row: (usize, usize),
    ) -> Result<(), CudaError> {
        let want = (self.shape.1, self.shape.0);
        check(kernel, (fi, shape, row) == (self.fmt.1, want, self.down_row), || {
            format!("a shared expert's down of format {} {want:?} for experts of format {fi} {shape:?}", self.fmt.1)
        })
    }
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
