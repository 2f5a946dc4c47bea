//! Launchers of kernels/moe_q8.cu: the one-stream (pair mode) expert products on int8
//! activations (dp4a on the packed rows), each block quantizing the input it reads into shared
//! memory (bit for bit as `quantize_x_q8`, CPU twin `q8x::quantize`). A sparse layer's FFN of
//! a few tokens is then still three launches: `moe::MoeRouteFused`, [`MoeGateUpQ8`],
//! [`MoeDownSum::launch_q8`]. CPU twin of the products: `q8x::matmul_q8x` per pair. Taken only with
//! `DUSTOFF_MOE_Q8=1` ([`q8_enabled`]).

use std::sync::OnceLock;

use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::entries::{self, MOE_Q8_ENTRIES, SLAB_F16};
use super::super::compile::kernels::{file_of, Kernels};
use super::super::dmat::{DevMat, MatData};
use super::super::CudaError;
use super::launch::{blocks_for, check, grid_yz, launch, need, Dev};
use super::moe_slab::{slab_view, MoeDownSum, RowWalk};

/// Whether pair-mode steps take the int8 kernels (`DUSTOFF_MOE_Q8=1`) instead of the f32 ones
/// of moe.cu. Off by default because they are slower there: a whole one-stream FFN takes 32.9 us
/// against 28.5 us a layer in a graph on an H200 (`gpu_parity --ignored
/// moe_bench::moe_pair_graph_breakdown`; docs/BENCHMARKS.md), with 148-248 registers a thread
/// before the 128-register bound, whose effect is not measured.
pub fn q8_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| file_of(MOE_Q8_ENTRIES[0]).is_some_and(|f| f.switched_on()))
}

/// Threads of a gate/up block (kernels/moe_q8.cu GU_THREADS) and output rows per row group.
const GU_THREADS: usize = 256;
const GU_R: usize = 2;
/// Output rows per row group of the down product (DS_R).
const DS_R: usize = 4;
/// Shared memory the kernels may take per block (the default limit, no opt-in).
const SMEM_MAX: usize = 48 * 1024;

/// Shared-memory bytes of one quantized input row (kernels/moe_q8.cu q8_row_bytes).
fn q8_row_bytes(cols: usize) -> usize {
    2 * cols + cols / 2
}

/// Whether the int8 kernels take slabs of these shapes and formats: packed block formats
/// (not F16), rows of whole 32-value blocks, the input rows in shared memory, `k <= 8`.
pub fn fits(gate: &DevMat, down: &DevMat, k: usize) -> bool {
    let packed = |m: &DevMat| matches!(m.data, MatData::Quant { .. }) && m.cols.is_multiple_of(32);
    packed(gate)
        && packed(down)
        && (1..=8).contains(&k)
        && q8_row_bytes(gate.cols) <= SMEM_MAX
        && k * q8_row_bytes(down.cols) <= SMEM_MAX
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct MoeQ8Params {
    qs: u64,
    aux: u64,
    qs2: u64,
    aux2: u64,
    x: u64,
    ids: u64,
    wts: u64,
    out: u64,
    walk: RowWalk,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for MoeQ8Params {}

/// Lanes per row group for rows of `units` units: about two units a lane, at most a warp.
fn lanes_per_row(units: usize) -> usize {
    units.div_ceil(2).next_power_of_two().clamp(1, 32)
}

/// `act[p, r] = silu(gate_e[r] . h[p / k]) * (up_e[r] . h[p / k])` with `e = ids[p]`, for
/// `n_pairs` pairs (`h` `[n_pairs / k, dim]` f32, `act` `[n_pairs, ffn]` f32), on int8 `h`.
pub struct MoeGateUpQ8<'a> {
    pub gate: &'a DevMat,
    pub up: &'a DevMat,
    pub n_experts: usize,
    pub h: Dev<f32>,
    pub ids: Dev<i32>,
    pub act: Dev<f32>,
    pub n_pairs: usize,
    pub k: usize,
}

impl MoeGateUpQ8<'_> {
    pub fn launch(&self, kn: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "moe_gate_up_q8";
        let (fi, qs, aux, qs_row, aux_row, unit) = slab_view(self.gate, s)?;
        let (f2, qs2, aux2, _, _, _) = slab_view(self.up, s)?;
        check(
            K,
            fi < SLAB_F16 && f2 == fi && (self.up.rows, self.up.cols) == (self.gate.rows, self.gate.cols),
            || "gate and up slabs of one packed format and shape".into(),
        )?;
        check(K, self.n_experts > 0 && self.gate.rows.is_multiple_of(self.n_experts), || {
            format!("{} slab rows for {} experts", self.gate.rows, self.n_experts)
        })?;
        let (rows, cols) = (self.gate.rows / self.n_experts, self.gate.cols);
        check(K, cols.is_multiple_of(32) && q8_row_bytes(cols) <= SMEM_MAX, || {
            format!("rows of {cols} (whole 32-value blocks, the int8 input in 48 KB)")
        })?;
        check(K, self.k >= 1 && self.n_pairs.is_multiple_of(self.k), || {
            format!("{} pairs of {}", self.n_pairs, self.k)
        })?;
        check(K, self.h.ptr.is_multiple_of(16), || "16-byte aligned input".into())?;
        need(K, "input", self.h, self.n_pairs / self.k * cols)?;
        need(K, "ids", self.ids, self.n_pairs)?;
        need(K, "activations", self.act, self.n_pairs * rows)?;
        grid_yz(K, self.n_pairs, "pairs")?;
        if self.n_pairs == 0 || rows == 0 {
            return Ok(());
        }
        let lpr = lanes_per_row(cols / unit);
        let per_block = (GU_THREADS / 32) * (32 / lpr) * GU_R;
        let p = MoeQ8Params {
            qs,
            aux,
            qs2,
            aux2,
            x: self.h.ptr,
            ids: self.ids.ptr,
            wts: 0,
            out: self.act.ptr,
            walk: RowWalk::new(K, (rows, cols), self.k, (qs_row, aux_row), lpr)?,
        };
        let grid = (blocks_for(K, rows, per_block)?, self.n_pairs as u32, 1);
        launch(kn, s, entries::moe_q8(fi, true), grid, GU_THREADS as u32, q8_row_bytes(cols) as u32, &p)
    }
}

/// The down product and weighted sum on int8 activations (`moe_down_sum_q8_<fmt>`).
impl MoeDownSum<'_> {
    pub fn launch_q8(&self, kn: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "moe_down_sum_q8";
        let (fi, qs, aux, qs_row, aux_row, unit) = slab_view(self.down, s)?;
        check(K, fi < SLAB_F16, || "a packed block format".into())?;
        let (rows, cols) = self.expert_shape(K)?;
        check(K, cols.is_multiple_of(32) && self.k * q8_row_bytes(cols) <= SMEM_MAX, || {
            format!("rows of {cols} (whole 32-value blocks, {} int8 inputs in 48 KB)", self.k)
        })?;
        let pairs = self.check_pairs(K, rows, cols)?;
        if pairs == 0 || rows == 0 {
            return Ok(());
        }
        let lpr = lanes_per_row(cols / unit);
        let per_block = (32 / lpr) * DS_R;
        let p = MoeQ8Params {
            qs,
            aux,
            qs2: 0,
            aux2: 0,
            x: self.act.ptr,
            ids: self.ids.ptr,
            wts: self.wts.ptr,
            out: self.x.ptr,
            walk: RowWalk::new(K, (rows, cols), self.k, (qs_row, aux_row), lpr)?,
        };
        let grid = (blocks_for(K, rows, per_block)?, self.n_tok as u32, 1);
        let smem = (self.k * q8_row_bytes(cols)) as u32;
        launch(kn, s, entries::moe_q8(fi, false), grid, 32 * self.k as u32, smem, &p)
    }
}
