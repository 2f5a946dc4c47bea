//! Entry names of the kernel files that hold one entry per (variant, block format), and the
//! typed handles launchers pick them with: a launcher says what it wants (the weights' format,
//! the tokens, SwiGLU or not, which expert product) and only this file knows where in a table
//! that entry sits. The tables are `kernels::KERNEL_FILES`' entry lists for those files.

use crate::backend::cuda::qformat::QFormat;

/// Which GEMV of `gemv_quant.cu` / `gemv_q8.cu`: the step's tokens (1..=8), SwiGLU (gate and
/// up rows interleaved, silu(gate) * up out) or plain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemv {
    pub n_tok: usize,
    pub swiglu: bool,
}

impl Gemv {
    /// Table row: n1 / n2 / n4 / n8 (3 tokens run the 4-token kernel, 5-7 the 8-token one),
    /// SwiGLU rows after the plain ones.
    fn row(self) -> usize {
        let width = match self.n_tok {
            0 | 1 => 0,
            2 => 1,
            3 | 4 => 2,
            _ => 3,
        };
        width + if self.swiglu { 4 } else { 0 }
    }
}

/// `gemv_[swiglu_]<fmt>_n<tokens>` (F16 activations).
pub fn gemv_quant(fmt: &QFormat, g: Gemv) -> &'static str {
    GEMV_QUANT_ENTRIES[8 * g.row() + fmt.index]
}

/// `gemvq8_[swiglu_]<fmt>_n<tokens>` (int8 activations, dp4a); `rows2`: at one token, the
/// kernel that reads 2 weight rows per warp instead of 4 (`_n1r2`).
pub fn gemv_q8(fmt: &QFormat, g: Gemv, rows2: bool) -> &'static str {
    let row = if g.n_tok == 1 && rows2 { 8 + usize::from(g.swiglu) } else { g.row() };
    GEMV_Q8_ENTRIES[8 * row + fmt.index]
}

/// The activation quantizer of the int8 GEMVs.
pub const QUANTIZE_X_Q8: &str = GEMV_Q8_ENTRIES[80];

/// `gemmq_<fmt>_t<16 * tiles>`: the tensor-core GEMM over `tiles` (1..=4) 16-token tiles.
pub fn gemm_quant(fmt: &QFormat, tiles: usize) -> &'static str {
    GEMM_QUANT_ENTRIES[8 * (tiles.clamp(1, 4) - 1) + fmt.index]
}

/// `gemmq_<fmt>_w128`: the 128-token prefill tile.
pub fn gemm_quant_w128(fmt: &QFormat) -> &'static str {
    GEMM_QUANT_ENTRIES[33 + fmt.index]
}

/// `gemmq_<fmt>_r128_t<32 * halves>`: the 128-row batch tile over `halves` (1, 2) 32-token halves.
pub fn gemm_quant_r128(fmt: &QFormat, halves: usize) -> &'static str {
    GEMM_QUANT_ENTRIES[41 + 8 * (halves.clamp(1, 2) - 1) + fmt.index]
}

/// The split-K reduction of the quantized GEMM.
pub const SPLITK_REDUCE_Q: &str = GEMM_QUANT_ENTRIES[32];

/// `dequant_<fmt>_f16`: rows to F16.
pub fn dequant(fmt: &QFormat) -> &'static str {
    DEQUANT_ENTRIES[fmt.index]
}

/// `embedding_<fmt>`: the rows of a quantized embedding table for token ids.
pub fn embedding_q(fmt: &QFormat) -> &'static str {
    DEQUANT_ENTRIES[8 + fmt.index]
}

/// The column of an F16 expert slab in the MoE tables (after the packed formats, which sit at
/// `QFormat::index`): `moe_slab::slab_view` returns the column of a slab.
pub const SLAB_F16: usize = 8;

/// Which expert product of `moe.cu`: gate/up (SwiGLU) or down; over (token, expert) pairs or
/// grouped by expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeProduct {
    pub gate_up: bool,
    pub grouped: bool,
}

/// `moe_{gate_up,down}_<fmt>_{p,g}` for a slab of column `slab` (`QFormat::index` or
/// [`SLAB_F16`]).
pub fn moe_mat(slab: usize, m: MoeProduct) -> &'static str {
    let variant = if m.gate_up { 0 } else { 2 } + usize::from(m.grouped);
    MOE_ENTRIES[9 * variant + slab]
}

/// `moe_down_sum_<fmt>`: down product and weighted sum in one kernel.
pub fn moe_down_sum(slab: usize) -> &'static str {
    MOE_ENTRIES[41 + slab]
}

/// Formats with grouped tensor-core GEMM entries (`moe_gemm.cu`), in table order.
pub const MOE_GEMM_FORMATS: [crate::model::quant::GgmlType; 5] = {
    use crate::model::quant::GgmlType;
    [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K]
};

/// `moe_gemm_{gate_up,down}_<fmt>_{t16,t64,w48,t8,r8,r16,t128}` for the format at `col` of
/// [`MOE_GEMM_FORMATS`] and the tile at `tile` of that order (`ops::moe_gemm::Tile::index`;
/// t8 in `moe_gemm_n8.cu`, r8 and r16 in `moe_gemm_mma.cu`, t128 in `moe_gemm_t128.cu`: gate/up
/// only, so None for its down product).
pub fn moe_gemm(col: usize, gate_up: bool, tile: usize) -> Option<&'static str> {
    Some(match tile {
        0..=2 => MOE_GEMM_ENTRIES[6 * col + 3 * usize::from(!gate_up) + tile],
        3 => MOE_GEMM_N8_ENTRIES[2 * col + usize::from(!gate_up)],
        4 | 5 => MOE_GEMM_MMA_ENTRIES[4 * col + 2 * (tile - 4) + usize::from(!gate_up)],
        _ if gate_up => MOE_GEMM_T128_ENTRIES[col],
        _ => return None,
    })
}

/// `moe_gate_up_q8_<fmt>` / `moe_down_sum_q8_<fmt>` (int8 activations) for a packed slab of
/// column `slab` (below [`SLAB_F16`]).
pub fn moe_q8(slab: usize, gate_up: bool) -> &'static str {
    MOE_Q8_ENTRIES[2 * slab + usize::from(!gate_up)]
}

/// Entry names for every GGML block format, in `qformat::QFormat::index` order, for each
/// (prefix, suffix) pair: `gemv_q4_0_n1`, ... (kernels/quant.cuh, FOR_EACH_QFORMAT).
macro_rules! q_names {
    ($(($pre:literal, $suf:literal)),* $(,)?) => {
        [$(
            concat!($pre, "q4_0", $suf), concat!($pre, "q4_1", $suf), concat!($pre, "q5_0", $suf),
            concat!($pre, "q5_1", $suf), concat!($pre, "q8_0", $suf), concat!($pre, "q4_k", $suf),
            concat!($pre, "q5_k", $suf), concat!($pre, "q6_k", $suf),
        )*]
    };
}

/// `kernels/gemv_quant.cu`: entry `8 * v + format` where v = 0..4 is the GEMV for 1 / 2 / 4 / 8
/// tokens and v = 4..8 the SwiGLU GEMV for the same token counts.
pub(in crate::backend::cuda) const GEMV_QUANT_ENTRIES: [&str; 64] = q_names!(
    ("gemv_", "_n1"),
    ("gemv_", "_n2"),
    ("gemv_", "_n4"),
    ("gemv_", "_n8"),
    ("gemv_swiglu_", "_n1"),
    ("gemv_swiglu_", "_n2"),
    ("gemv_swiglu_", "_n4"),
    ("gemv_swiglu_", "_n8"),
);

/// `kernels/gemv_q8.cu`: entry `8 * v + format` as in [`GEMV_QUANT_ENTRIES`] (int8
/// activations, dp4a), v = 8 / 9 the 1-token GEMV / SwiGLU GEMV with 2 weight rows per warp,
/// then `quantize_x_q8` at 80.
pub(in crate::backend::cuda) const GEMV_Q8_ENTRIES: [&str; 81] = {
    let d = q_names!(
        ("gemvq8_", "_n1"),
        ("gemvq8_", "_n2"),
        ("gemvq8_", "_n4"),
        ("gemvq8_", "_n8"),
        ("gemvq8_swiglu_", "_n1"),
        ("gemvq8_swiglu_", "_n2"),
        ("gemvq8_swiglu_", "_n4"),
        ("gemvq8_swiglu_", "_n8"),
        ("gemvq8_", "_n1r2"),
        ("gemvq8_swiglu_", "_n1r2"),
    );
    let mut all = ["quantize_x_q8"; 81];
    let mut i = 0;
    while i < 80 {
        all[i] = d[i];
        i += 1;
    }
    all
};

/// `kernels/gemm_quant.cu`: entry `8 * (tiles of 16 tokens - 1) + format`, then
/// `splitk_reduce_q` at 32, the 128-token prefill tiles `gemmq_<fmt>_w128` at `33 + format`, the
/// 128-row batch tiles `gemmq_<fmt>_r128_t32` / `_t64` at `41 + format` / `49 + format`.
pub(in crate::backend::cuda) const GEMM_QUANT_ENTRIES: [&str; 57] = {
    let d = q_names!(("gemmq_", "_t16"), ("gemmq_", "_t32"), ("gemmq_", "_t48"), ("gemmq_", "_t64"));
    let w = q_names!(("gemmq_", "_w128"), ("gemmq_", "_r128_t32"), ("gemmq_", "_r128_t64"));
    let mut all = ["splitk_reduce_q"; 57];
    let mut i = 0;
    while i < 32 {
        all[i] = d[i];
        i += 1;
    }
    while i < 56 {
        all[i + 1] = w[i - 32];
        i += 1;
    }
    all
};

/// `kernels/dequant.cu`: `dequant_<fmt>_f16` at `format`, `embedding_<fmt>` at `8 + format`,
/// then the synthetic-weight fillers.
pub(in crate::backend::cuda) const DEQUANT_ENTRIES: [&str; 18] = {
    let d = q_names!(("dequant_", "_f16"), ("embedding_", ""));
    let mut all = ["fill_random_u32"; 18];
    let mut i = 0;
    while i < 16 {
        all[i] = d[i];
        i += 1;
    }
    all[17] = "tile_aux";
    all
};

/// Entry points of kernels/moe.cu: `9 * variant + format` for the variants gate/up pair mode,
/// gate/up grouped, down pair mode, down grouped, formats in `QFormat::index` order then F16
/// (8); then the router, the grouping and the weighted sum (36..40); the fused router (40),
/// down + weighted sum `41 + format` (one stream: `fused_enabled`), the few-token router (50),
/// the tiled router (51).
pub(in crate::backend::cuda) const MOE_ENTRIES: [&str; 52] = {
    macro_rules! fmts {
        ($pre:literal, $suf:literal) => {
            [
                concat!($pre, "q4_0", $suf),
                concat!($pre, "q4_1", $suf),
                concat!($pre, "q5_0", $suf),
                concat!($pre, "q5_1", $suf),
                concat!($pre, "q8_0", $suf),
                concat!($pre, "q4_k", $suf),
                concat!($pre, "q5_k", $suf),
                concat!($pre, "q6_k", $suf),
                concat!($pre, "f16", $suf),
            ]
        };
    }
    let v =
        [fmts!("moe_gate_up_", "_p"), fmts!("moe_gate_up_", "_g"), fmts!("moe_down_", "_p"), fmts!("moe_down_", "_g")];
    let ds = fmts!("moe_down_sum_", "");
    let mut all = ["moe_route_f32"; 52];
    let mut i = 0;
    while i < 36 {
        all[i] = v[i / 9][i % 9];
        i += 1;
    }
    all[37] = "moe_group";
    all[38] = "moe_combine_f32";
    all[39] = "moe_router_logits_f32";
    all[40] = "moe_route_fused_f32";
    all[50] = "moe_router_logits_blk_f32";
    all[51] = "moe_router_logits_tile_f32";
    let mut j = 0;
    while j < 9 {
        all[41 + j] = ds[j];
        j += 1;
    }
    all
};

/// Entry points of kernels/moe_gemm.cu: `6 * format + variant` for the variants gate/up t16,
/// t64, w48, down t16, t64, w48 (formats in [`MOE_GEMM_FORMATS`] order), then the gather.
pub(in crate::backend::cuda) const MOE_GEMM_ENTRIES: [&str; 31] = {
    macro_rules! v {
        ($f:literal) => {
            [
                concat!("moe_gemm_gate_up_", $f, "_t16"),
                concat!("moe_gemm_gate_up_", $f, "_t64"),
                concat!("moe_gemm_gate_up_", $f, "_w48"),
                concat!("moe_gemm_down_", $f, "_t16"),
                concat!("moe_gemm_down_", $f, "_t64"),
                concat!("moe_gemm_down_", $f, "_w48"),
            ]
        };
    }
    let f = [v!("q4_0"), v!("q8_0"), v!("q4_k"), v!("q5_k"), v!("q6_k")];
    let mut all = ["moe_gather_f16"; 31];
    let mut i = 0;
    while i < 30 {
        all[i] = f[i / 6][i % 6];
        i += 1;
    }
    all
};

/// Entry points of kernels/moe_gemm_n8.cu: `2 * format + variant` for the variants gate/up t8,
/// down t8 (formats in [`MOE_GEMM_FORMATS`] order).
pub(in crate::backend::cuda) const MOE_GEMM_N8_ENTRIES: [&str; 10] = {
    macro_rules! v {
        ($($f:literal),*) => {
            [$(concat!("moe_gemm_gate_up_", $f, "_t8"), concat!("moe_gemm_down_", $f, "_t8")),*]
        };
    }
    v!("q4_0", "q8_0", "q4_k", "q5_k", "q6_k")
};

/// Entry points of kernels/moe_gemm_t128.cu: gate/up t128 only, formats in
/// [`MOE_GEMM_FORMATS`] order.
pub(in crate::backend::cuda) const MOE_GEMM_T128_ENTRIES: [&str; 5] = {
    macro_rules! v {
        ($($f:literal),*) => {
            [$(concat!("moe_gemm_gate_up_", $f, "_t128")),*]
        };
    }
    v!("q4_0", "q8_0", "q4_k", "q5_k", "q6_k")
};

/// Entry points of kernels/moe_gemm_mma.cu: `4 * format + variant` for the variants gate/up r8,
/// down r8, gate/up r16, down r16 (formats in [`MOE_GEMM_FORMATS`] order).
pub(in crate::backend::cuda) const MOE_GEMM_MMA_ENTRIES: [&str; 20] = {
    macro_rules! v {
        ($($f:literal),*) => {
            [$(
                concat!("moe_gemm_gate_up_", $f, "_r8"),
                concat!("moe_gemm_down_", $f, "_r8"),
                concat!("moe_gemm_gate_up_", $f, "_r16"),
                concat!("moe_gemm_down_", $f, "_r16"),
            )*]
        };
    }
    v!("q4_0", "q8_0", "q4_k", "q5_k", "q6_k")
};

/// Entry points of kernels/moe_q8.cu: `2 * format + v` (formats in `QFormat::index` order),
/// v = 0 gate/up + SwiGLU, v = 1 down + weighted sum.
pub const MOE_Q8_ENTRIES: [&str; 16] = {
    macro_rules! both {
        ($($f:literal),*) => {
            [$(concat!("moe_gate_up_q8_", $f), concat!("moe_down_sum_q8_", $f)),*]
        };
    }
    both!("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")
};
