//! The grouped tensor-core GEMM of the MoE FFN (kernels/moe_gemm.cu) for steps that group their
//! (token, slot) pairs by expert (prefill, batches above `moe::pair_max_tokens`):
//! `moe_gather_f16` copies each grouped position's input row as F16, then one launch of
//! gate/up + SwiGLU and one of down run over the (expert, token tile) list that the kernels
//! read from the device's group offsets; `moe::MoeCombine` then sums each token's rows.
//!
//! Formats with a GEMM entry: Q4_0, Q8_0, Q4_K, Q5_K, Q6_K (the Q4_K_M / Q5_K_M / Q8_0 /
//! Q4_0 mixes); a layer with any other slab format, or rows / columns off the tile sizes,
//! takes the grouped GEMV of kernels/moe.cu instead (`gemm_fits`).

use cudarc::driver::{CudaStream, DeviceRepr};

use super::super::compile::entries::{self, MOE_GEMM_FORMATS};
use super::super::compile::kernels::Kernels;
use super::super::dmat::{DevMat, MatData};
use super::super::CudaError;
use super::launch::{allow_smem, blocks_for, check, grid_yz, i32_of, launch, need, Dev};

/// Whether steps that group by expert take the tensor-core GEMM (default) or the grouped GEMV
/// (`DUSTOFF_MOE_GEMM=0`, for comparisons).
pub fn gemm_enabled() -> bool {
    super::super::tuning::tuning().moe_gemm
}

/// A block's tile: weight rows x tokens of one expert (kernels/moe_gemm.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tile {
    /// 64 rows x 16 tokens (batched decode: a few tokens per expert).
    T16,
    /// 64 rows x 64 tokens.
    T64,
    /// 128 rows x 48 tokens: more MMAs per fragment read from shared memory (prefill steps).
    W48,
    /// 64 rows x 8 tokens (wmma m32n8k16, the block's warps split each chunk's K): batched
    /// decode where the mean expert holds one or two tokens (32 sequences of top-8 over 128
    /// experts: 2), so no input row is staged or loaded for a 16-token tile's repeats.
    T8,
    /// 64 rows x 8 tokens, the weights dequantized straight into mma.m8n8k4 fragments
    /// (kernels/moe_gemm_mma.cu: no F16 staging in shared memory); `DUSTOFF_MOE_MMA=1`.
    R8,
    /// As [`Tile::R8`] with 16 tokens.
    R16,
    /// 64 rows x 128 tokens, 8 warps of 32 x 32 (kernels/moe_gemm_t128.cu): the gate/up product
    /// of prefill steps whose mean expert holds many tokens (`DUSTOFF_MOE_T128`), each weight
    /// chunk dequantized once per 128 tokens. No down entry (slower there than [`Tile::W48`]).
    T128,
}

/// The mean tokens an expert up to which a step takes the 8-token tile (`DUSTOFF_MOE_T8`).
/// Measured (docs/BENCHMARKS.md, row M10: Qwen3-30B-A3B, H100, compute_70 PTX): +3.6% at 32
/// sequences (mean 2), even at 64 (mean 4), -5% at 128 (mean 8).
const T8_MAX_MEAN: usize = 2;

/// The mean tokens an expert from which a step's gate/up product takes the 128-token tile
/// (`DUSTOFF_MOE_T128`). Measured (docs/BENCHMARKS.md, row M12: Qwen3-30B-A3B, H100, compute_70
/// PTX, each launch alone): gate/up 796 against t64's 926 us at 2,048 tokens (mean 128), even at
/// 1,024 (mean 64), slower at 512; down stays on the 128-row tile (510 against 400 us at 2,048).
const T128_MIN_MEAN: usize = 96;

impl Tile {
    /// The tile of one product of a step of `n_pairs` pairs over `n_experts`: 8 tokens while the
    /// mean expert has at most `DUSTOFF_MOE_T8` ([`T8_MAX_MEAN`]), 16 while it has at most 16
    /// (batched decode: a few tokens per expert); above that
    /// gate/up takes 64 tokens (128 from a mean of `DUSTOFF_MOE_T128`, [`T128_MIN_MEAN`]) and
    /// down the 128-row tile. Measured on the H200 (docs/BENCHMARKS.md,
    /// `moe_kernel_breakdown`, Qwen3-30B-A3B shape): the wide tile is faster for down at 512 to
    /// 2,048 tokens, but gate/up (two slabs a tile, more registers) runs there at two blocks an SM
    /// against three for t64, which lost at 768 and 2,048 tokens.
    pub fn for_step(n_pairs: usize, n_experts: usize, gate_up: bool) -> Tile {
        let t = super::super::tuning::tuning();
        if Self::wide_gate_up(n_pairs, n_experts, gate_up, t.moe_t128.unwrap_or(T128_MIN_MEAN)) {
            return Tile::T128;
        }
        let tile = Self::for_step_t8(n_pairs, n_experts, gate_up, t.moe_t8.unwrap_or(T8_MAX_MEAN));
        if t.moe_mma {
            tile.register_form()
        } else {
            tile
        }
    }

    /// Whether a product takes [`Tile::T128`]: gate/up while the mean expert holds at least
    /// `t128_mean` tokens (`DUSTOFF_MOE_T128`; 0: never).
    fn wide_gate_up(n_pairs: usize, n_experts: usize, gate_up: bool, t128_mean: usize) -> bool {
        gate_up && t128_mean > 0 && n_pairs >= t128_mean * n_experts.max(1)
    }

    /// The register-fragment tile of the same tokens (R8 for T8, R16 for T16), else the tile.
    fn register_form(self) -> Tile {
        match self {
            Tile::T8 => Tile::R8,
            Tile::T16 => Tile::R16,
            t => t,
        }
    }

    /// [`Tile::for_step`] with the 8-token tile while the mean expert holds at most `t8_mean`
    /// tokens (`DUSTOFF_MOE_T8`; 0: never).
    fn for_step_t8(n_pairs: usize, n_experts: usize, gate_up: bool, t8_mean: usize) -> Tile {
        if t8_mean > 0 && n_pairs <= t8_mean * n_experts.max(1) {
            Tile::T8
        } else if n_pairs <= 16 * n_experts.max(1) {
            Tile::T16
        } else if gate_up {
            Tile::T64
        } else {
            Tile::W48
        }
    }
    /// Tokens of one expert per tile.
    pub fn tokens(self) -> usize {
        match self {
            Tile::T16 => 16,
            Tile::T64 => 64,
            Tile::W48 => 48,
            Tile::T8 | Tile::R8 => 8,
            Tile::R16 => 16,
            Tile::T128 => 128,
        }
    }
    /// Weight rows of one tile (gate/up: half gate rows, half up rows).
    pub fn rows(self) -> usize {
        match self {
            Tile::T16 | Tile::T64 | Tile::T8 | Tile::R8 | Tile::R16 | Tile::T128 => 64,
            Tile::W48 => 128,
        }
    }
    /// Threads of a block and bytes of dynamic shared memory (the t128 tile's staging: 64 + 128
    /// rows of 136 halves; the other tiles' is static).
    fn block(self) -> (u32, usize) {
        match self {
            Tile::T128 => (256, (64 + 128) * (128 + 8) * 2),
            _ => (128, 0),
        }
    }

    /// Position in the entry table's order (`entries::moe_gemm`).
    fn index(self) -> usize {
        match self {
            Tile::T16 => 0,
            Tile::T64 => 1,
            Tile::W48 => 2,
            Tile::T8 => 3,
            Tile::R8 => 4,
            Tile::R16 => 5,
            Tile::T128 => 6,
        }
    }
}

fn gemm_format(m: &DevMat) -> Option<usize> {
    match &m.data {
        MatData::Quant { fmt, .. } => MOE_GEMM_FORMATS.iter().position(|&t| t == fmt.dtype),
        MatData::F16(_) => None,
    }
}

/// Whether a layer's slabs (`moe::MoeLayerW`: experts of width `ffn` over `dim`) have GEMM
/// entries and shapes every tile divides (gate/up rows and both row lengths multiples of 128;
/// down rows `dim` too).
pub fn gemm_fits(gate: &DevMat, up: &DevMat, down: &DevMat, ffn: usize, dim: usize) -> bool {
    gemm_format(gate).is_some()
        && gemm_format(up) == gemm_format(gate)
        && gemm_format(down).is_some()
        && ffn.is_multiple_of(128)
        && dim.is_multiple_of(128)
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct GatherParams {
    h: u64,
    entries: u64,
    x16: u64,
    n_pairs: i32,
    dim: i32,
    k: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for GatherParams {}

/// `x16[q] = f16(h[entries[q] / k])` for the `n_pairs` grouped positions (`h` `[n_pairs / k, dim]`
/// f32, `x16` `[n_pairs, dim]` F16 bits).
pub struct MoeGather {
    pub h: Dev<f32>,
    pub entries: Dev<i32>,
    pub x16: Dev<u16>,
    pub n_pairs: usize,
    pub dim: usize,
    pub k: usize,
}

impl MoeGather {
    pub fn launch(&self, kn: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "moe_gather_f16";
        check(K, self.k >= 1 && self.n_pairs.is_multiple_of(self.k), || {
            format!("{} pairs of {}", self.n_pairs, self.k)
        })?;
        check(
            K,
            self.dim.is_multiple_of(8) && self.h.ptr.is_multiple_of(16) && self.x16.ptr.is_multiple_of(16),
            || format!("width {} (a multiple of 8), 16-byte aligned rows", self.dim),
        )?;
        need(K, "input", self.h, self.n_pairs / self.k * self.dim)?;
        need(K, "entries", self.entries, self.n_pairs)?;
        need(K, "gathered rows", self.x16, self.n_pairs * self.dim)?;
        if self.n_pairs == 0 || self.dim == 0 {
            return Ok(());
        }
        let p = GatherParams {
            h: self.h.ptr,
            entries: self.entries.ptr,
            x16: self.x16.ptr,
            n_pairs: i32_of(K, self.n_pairs)?,
            dim: i32_of(K, self.dim)?,
            k: i32_of(K, self.k)?,
        };
        let grid = (blocks_for(K, self.dim, 8 * 128)?, self.n_pairs.min(65_535) as u32, 1);
        launch(kn, s, K, grid, 128, 0, &p)
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct GemmParams {
    qs: u64,
    aux: u64,
    qs2: u64,
    aux2: u64,
    x: u64,
    offsets: u64,
    act: u64,
    y: u64,
    rows: i32,
    cols: i32,
    n_experts: i32,
    n_pairs: i32,
    qs_row: i32,
    aux_row: i32,
    all_frags: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for GemmParams {}

/// Where a grouped GEMM writes: gate/up (with the up slab) F16 activations, down f32 rows.
#[derive(Clone, Copy)]
pub enum GemmOut<'a> {
    /// `act[q, r] = f16(silu(gate x) * up x)`, `[n_pairs, ffn]` F16 bits.
    GateUp { up: &'a DevMat, act: Dev<u16> },
    /// `y[q, r] = down act`, `[n_pairs, dim]` f32.
    Down { y: Dev<f32> },
}

/// One grouped GEMM over the experts of a step: `x` `[n_pairs, cols]` F16 rows by grouped
/// position, `offsets` `[n_experts + 1]` the grouping (`moe::MoeGroup`), `slab` the gate (with
/// `GemmOut::GateUp`) or down slab of `n_experts` experts.
pub struct MoeGemm<'a> {
    pub slab: &'a DevMat,
    pub n_experts: usize,
    pub x: Dev<u16>,
    pub offsets: Dev<i32>,
    pub out: GemmOut<'a>,
    pub n_pairs: usize,
    pub tile: Tile,
}

fn quant_parts(m: &DevMat, s: &CudaStream) -> Result<(u64, u64, usize, usize), CudaError> {
    const K: &str = "moe_gemm";
    let MatData::Quant { fmt, buf, aux_off } = &m.data else {
        return Err(CudaError::Shape { kernel: K, reason: "an F16 slab (the GEMM reads packed blocks)".into() });
    };
    let d = Dev::of(buf, s);
    let (want_off, total) = fmt.device_bytes(m.rows, m.cols);
    check(K, *aux_off == want_off, || format!("aux at {aux_off}, the layout says {want_off}"))?;
    need(K, "slab", d, total)?;
    let (qr, ar) = fmt.row_parts(m.cols);
    Ok((d.ptr, d.ptr + *aux_off as u64, qr, ar))
}

impl MoeGemm<'_> {
    pub fn launch(&self, kn: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        self.launch_with(kn, s, super::super::tuning::tuning().moe_gemm_skip)
    }

    /// [`MoeGemm::launch`] with the form named: `skip` leaves out the 16-token fragments of a
    /// tile past its expert's tokens (same values; the parity test runs both forms).
    pub fn launch_with(&self, kn: &mut Kernels, s: &CudaStream, skip: bool) -> Result<(), CudaError> {
        const K: &str = "moe_gemm";
        let fi = gemm_format(self.slab)
            .ok_or_else(|| CudaError::Shape { kernel: K, reason: "a slab format without a GEMM entry".into() })?;
        check(K, self.n_experts > 0 && self.slab.rows.is_multiple_of(self.n_experts), || {
            format!("{} slab rows for {} experts", self.slab.rows, self.n_experts)
        })?;
        let (rows, cols) = (self.slab.rows / self.n_experts, self.slab.cols);
        let (qs, aux, qs_row, aux_row) = quant_parts(self.slab, s)?;
        let gate_up = matches!(self.out, GemmOut::GateUp { .. });
        let out_rows = if gate_up { self.tile.rows() / 2 } else { self.tile.rows() };
        check(K, cols.is_multiple_of(128) && rows.is_multiple_of(out_rows), || {
            format!("[{rows}, {cols}] per expert: columns a multiple of 128, rows of {out_rows}")
        })?;
        check(K, self.x.ptr.is_multiple_of(16), || "16-byte aligned input rows".into())?;
        need(K, "input", self.x, self.n_pairs * cols)?;
        need(K, "offsets", self.offsets, self.n_experts + 1)?;
        let (qs2, aux2, act, y) = match self.out {
            GemmOut::GateUp { up, act } => {
                check(K, gemm_format(up) == Some(fi) && (up.rows, up.cols) == (self.slab.rows, cols), || {
                    "the up slab must match the gate slab's format and shape".into()
                })?;
                need(K, "activations", act, self.n_pairs * rows)?;
                let (q2, a2, _, _) = quant_parts(up, s)?;
                (q2, a2, act.ptr, 0)
            }
            GemmOut::Down { y } => {
                need(K, "expert outputs", y, self.n_pairs * rows)?;
                (0, 0, 0, y.ptr)
            }
        };
        if self.n_pairs == 0 || rows == 0 {
            return Ok(());
        }
        let p = GemmParams {
            qs,
            aux,
            qs2,
            aux2,
            x: self.x.ptr,
            offsets: self.offsets.ptr,
            act,
            y,
            rows: i32_of(K, rows)?,
            cols: i32_of(K, cols)?,
            n_experts: i32_of(K, self.n_experts)?,
            n_pairs: i32_of(K, self.n_pairs)?,
            qs_row: i32_of(K, qs_row)?,
            aux_row: i32_of(K, aux_row)?,
            all_frags: i32::from(!skip),
        };
        // Tiles: sum over experts of ceil(count / BN) <= ceil(pairs / BN) + experts with tokens.
        let tiles = self.n_pairs.div_ceil(self.tile.tokens()) + self.n_experts.min(self.n_pairs);
        let tiles = grid_yz(K, tiles, "token tiles")?;
        let grid = (blocks_for(K, rows, out_rows)?, tiles, 1);
        let entry = entries::moe_gemm(fi, gate_up, self.tile.index()).ok_or_else(|| CudaError::Shape {
            kernel: K,
            reason: format!("the {:?} tile has no down product (gate/up only)", self.tile),
        })?;
        let (block, smem) = self.tile.block();
        if smem > 48 * 1024 {
            allow_smem(kn, entry, smem)?;
        }
        launch(kn, s, entry, grid, block, smem as u32, &p)
    }
}

#[cfg(test)]
mod tests {
    use super::{Tile, T128_MIN_MEAN, T8_MAX_MEAN};

    #[test]
    fn tiles_by_tokens_per_expert_and_product() {
        // 128 experts: up to 16 pairs an expert on average is batched decode; 64 sequences of
        // top-8 (4 an expert) take the 8-token tile.
        let pick = |pairs, gate_up| Tile::for_step_t8(pairs, 128, gate_up, 6);
        assert_eq!(pick(64 * 8, true), Tile::T8);
        assert_eq!(pick(6 * 128, false), Tile::T8);
        assert_eq!(pick(6 * 128 + 1, false), Tile::T16);
        assert_eq!(Tile::for_step_t8(32 * 8, 128, true, T8_MAX_MEAN), Tile::T8, "32 sequences by default");
        assert_eq!(Tile::for_step_t8(64 * 8, 128, true, T8_MAX_MEAN), Tile::T16, "64 sequences by default");
        assert_eq!(pick(16 * 128, true), Tile::T16);
        assert_eq!(pick(16 * 128, false), Tile::T16);
        assert_eq!(pick(16 * 128 + 1, true), Tile::T64);
        assert_eq!(pick(16 * 128 + 1, false), Tile::W48);
        assert_eq!(Tile::for_step_t8(64 * 8, 128, true, 0), Tile::T16, "DUSTOFF_MOE_T8=0: never");
        assert_eq!(Tile::for_step_t8(0, 128, true, 0), Tile::T16);
        assert_eq!(Tile::for_step_t8(5, 0, false, 0), Tile::T16);
        // The 128-token tile: gate/up of a 2,048-token step (top-8 of 128 experts: mean 128) by
        // default, not of a 1,024-token one (mean 64), never down, never with 0.
        let wide = |pairs, gate_up, mean| Tile::wide_gate_up(pairs, 128, gate_up, mean);
        assert!(wide(2048 * 8, true, T128_MIN_MEAN) && !wide(1024 * 8, true, T128_MIN_MEAN));
        assert!(!wide(2048 * 8, false, T128_MIN_MEAN) && !wide(2048 * 8, true, 0));
        for t in [Tile::T16, Tile::T64, Tile::W48, Tile::T8, Tile::R8, Tile::R16, Tile::T128] {
            assert!(t.rows() % 64 == 0 && t.tokens() % 8 == 0, "{t:?}");
        }
        // DUSTOFF_MOE_MMA=1: the register-fragment tile of the same tokens where there is one.
        for (t, r) in [
            (Tile::T8, Tile::R8),
            (Tile::T16, Tile::R16),
            (Tile::T64, Tile::T64),
            (Tile::W48, Tile::W48),
            (Tile::T128, Tile::T128),
        ] {
            assert_eq!(t.register_form(), r);
            assert_eq!(t.tokens(), r.tokens());
        }
    }
}
