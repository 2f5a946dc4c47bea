//! The step's device buffers: `Work`, grown on demand (never shrunk) and held by the backend,
//! and the layout of the per-step inputs inside it.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DeviceRepr, PinnedHostSlice, ValidAsZeroBits};

use crate::backend::cuda::device::zeros;
use crate::backend::cuda::ops::launch::Dev;
use crate::backend::cuda::CudaError;

/// Buffers of the masked step (masked.rs), grown on demand (never shrunk; not part of any captured graph).
/// Layout of both, for a step of `m` logit rows: `[m]` mask indices, then `[m, words]` mask bits
/// (the used masks first).
#[derive(Default)]
pub(in crate::backend::cuda) struct MaskBuffers {
    pub cap: usize, // elements of `host` and `dev`
    pub host: Option<PinnedHostSlice<u32>>,
    pub dev: Option<CudaSlice<u32>>,
    /// Timing events: after the layers, and when the mask upload was queued.
    pub events: Option<(CudaEvent, CudaEvent)>,
}

/// Step buffers, grown on demand (never shrunk). Growing one drops the captured graphs, which
/// hold its old address.
#[derive(Default)]
pub(in crate::backend::cuda) struct Work {
    pub cap_tok: usize,
    pub x: Option<CudaSlice<f32>>,   // [tok, dim] residual
    pub h: Option<CudaSlice<f32>>,   // [tok, dim] normed
    pub qkv: Option<CudaSlice<f32>>, // [tok, q_dim + 2 kv_dim]
    pub att: Option<CudaSlice<f32>>, // [tok, q_dim]
    pub gu: Option<CudaSlice<f32>>,  // [tok, 2 ffn]
    pub act: Option<CudaSlice<f32>>, // [tok, ffn]
    pub x16: Option<CudaSlice<u16>>, // [tok, max(dim, q_dim, ffn)] cuBLAS input
    /// Split-K partial sums of the tensor-core GEMM ([splits, tok, rows], the largest matrix's).
    pub tc_part: Option<CudaSlice<f32>>,
    /// Per-step inputs, uploaded in one copy: [ids | pos | kv_rows | tok_seq | rows] (cap_tok
    /// each), then block tables [cap_tok, bt_stride].
    pub meta: Option<CudaSlice<i32>>,
    pub cap_part: usize,
    pub part_o: Option<CudaSlice<f32>>,  // [tok * n_heads * splits * head_dim]
    pub part_ml: Option<CudaSlice<f32>>, // [tok * n_heads * splits * 2]
    pub cap_logits: usize,
    pub hn: Option<CudaSlice<f32>>,     // [m, dim]
    pub logits: Option<CudaSlice<f32>>, // [m, vocab]
    pub argmax: Option<CudaSlice<i32>>, // [m] greedy ids (step_greedy)
    /// Page-locked host copy of `logits` ([cap_logits, vocab]): the download runs at full PCIe
    /// speed into memory reused every step (64 sequences x 151,936 f32 = 39 MB a step).
    pub host_logits: Option<cudarc::driver::PinnedHostSlice<f32>>,
    /// Constrained greedy steps: the mask indices and bits, host (pinned) and device.
    pub masks: MaskBuffers,
    /// Buffers of the sparse layers' routed experts (expert ids, weights, grouping, expert outputs).
    pub experts: moe::MoeWork,
    /// Buffers of the shared experts (Qwen3.5-MoE, Qwen3-Next).
    pub shexp: ops::shared_expert::SharedWork,
}

/// Grows `buf` to at least `n` elements; returns whether it was (re)allocated.
pub(in crate::backend::cuda) fn grow<T: DeviceRepr + ValidAsZeroBits>(
    s: &Arc<CudaStream>,
    buf: &mut Option<CudaSlice<T>>,
    n: usize,
    what: &str,
) -> Result<bool, CudaError> {
    if buf.as_ref().is_none_or(|b| b.len() < n) {
        *buf = None; // free first: the old buffer is not needed
        *buf = Some(zeros(s, n, what)?);
        log_memory(s, what, n * std::mem::size_of::<T>());
        return Ok(true);
    }
    Ok(false)
}

use crate::backend::cuda::device::log_memory;
use crate::backend::cuda::moe;
use crate::backend::cuda::ops;

pub(in crate::backend::cuda) fn ptr<T>(b: &Option<CudaSlice<T>>, s: &CudaStream) -> Dev<T> {
    // Every buffer is grown before use; an absent one would be a bug in `ensure_work`.
    Dev::of(b.as_ref().expect("work buffer allocated by ensure_work"), s)
}

/// Offsets of the per-step inputs in `Work::meta` (in i32 elements) for a token capacity.
pub(in crate::backend::cuda) struct MetaLayout {
    pub ids: usize,
    pub pos: usize,
    pub kv_rows: usize,
    pub tok_seq: usize,
    pub rows: usize,
    /// `[first row, count, kv_end, block-table row]` per prefill tile (at most one per token),
    /// and the tiles' rows (flat tokens).
    pub tiles: usize,
    pub tile_rows: usize,
    /// The same for the shared-prefix pass (rows: decode tokens), and each decode token's first
    /// own position.
    pub casc_tiles: usize,
    pub casc_rows: usize,
    pub kv_begin: usize,
    pub bt: usize,
}

pub(in crate::backend::cuda) fn layout(cap: usize) -> MetaLayout {
    MetaLayout {
        ids: 0,
        pos: cap,
        kv_rows: 2 * cap,
        tok_seq: 3 * cap,
        rows: 4 * cap,
        tiles: 5 * cap,
        tile_rows: 9 * cap,
        casc_tiles: 10 * cap,
        casc_rows: 14 * cap,
        kv_begin: 15 * cap,
        bt: 16 * cap,
    }
}
