//! GGML block formats: sizes, dequantization and dot products on the packed blocks.
//!
//! A row of a quantized matrix is a sequence of blocks; each block encodes `block_size()` weights
//! in `type_size()` bytes. Dot products work on the packed bytes against an f32 vector, so the
//! model is never expanded to f32 at load.

use std::fmt;

/// The tensor element types of GGUF files (ids as the GGUF spec numbers them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

impl GgmlType {
    /// Every type, in the enum's order.
    pub const ALL: [GgmlType; 11] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
    ];
    /// The GGML block formats (every type but the three float ones).
    pub const BLOCK_TYPES: [GgmlType; 8] =
        [Self::Q4_0, Self::Q4_1, Self::Q5_0, Self::Q5_1, Self::Q8_0, Self::Q4K, Self::Q5K, Self::Q6K];

    /// Maps a GGUF type id to a supported type; `None` for ids dustoff cannot compute with.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            30 => Self::BF16,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q4K => 12,
            Self::Q5K => 13,
            Self::Q6K => 14,
            Self::BF16 => 30,
        }
    }

    /// Weights per block.
    pub fn block_size(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 => 32,
            Self::Q4K | Self::Q5K | Self::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
        }
    }

    /// Bytes of a row of `n` elements, or `None` when `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.type_size())
    }

    /// The type of a name as [`GgmlType::name`] writes it, in any case (`q4_k`, `F16`...).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(s))
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod float;
mod kquants;
pub(crate) use kquants::{pack_q6_k, pack_scale_min};
mod legacy;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(target_arch = "x86_64")]
pub(crate) use simd::hsum;
#[cfg(target_arch = "x86_64")]
mod simd_dot;
#[cfg(target_arch = "x86_64")]
mod simd_gemv;
#[cfg(target_arch = "x86_64")]
pub(crate) use simd_gemv::{gemv_rows, gemv_supports};
mod staged;
pub use staged::staged_f16_row;
#[cfg(test)]
pub(crate) mod tests;

pub use float::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, f32_to_f16_clamped, F16_MAX};

/// True when the AVX2 + FMA + F16C kernels run: the CPU has them and the process's kernel
/// path (`sys::cpu::cpu_path`, `DUSTOFF_CPU_PATH`) is not `scalar`. One atomic load.
#[inline]
pub(crate) fn simd_available() -> bool {
    crate::sys::cpu::cpu_path() >= crate::sys::cpu::CpuPath::Avx2
}

/// Widens one packed row to f32.
///
/// Precondition (guaranteed by the weights loader, which checks byte counts against shapes):
/// `src.len() == dtype.row_bytes(dst.len())`. On a mismatch only the whole blocks both sides
/// hold are converted (debug builds assert).
pub fn dequantize_row(dtype: GgmlType, src: &[u8], dst: &mut [f32]) {
    debug_assert_eq!(dtype.row_bytes(dst.len()), Some(src.len()), "dequantize_row {dtype}: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: avx2, fma and f16c were detected at run time just above.
        unsafe { simd::dequantize_row(dtype, src, dst) };
        return;
    }
    dequantize_row_scalar(dtype, src, dst);
}

/// Dot product of one packed row with an f32 vector (f32 accumulation, activations stay f32).
///
/// Precondition: `row.len() == dtype.row_bytes(x.len())` (see [`dequantize_row`]).
pub fn dot_row(dtype: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    debug_assert_eq!(dtype.row_bytes(x.len()), Some(row.len()), "dot_row {dtype}: length mismatch");
    let mut out = [0f32];
    dot_packed_rows(dtype, row, row.len(), x, &mut out);
    out[0]
}

/// Dot products of consecutive packed rows of `rb` bytes with `x` (`out[r]` for row r).
fn dot_packed_rows(dtype: GgmlType, packed: &[u8], rb: usize, x: &[f32], out: &mut [f32]) {
    if rb == 0 {
        out.fill(0.0);
        return;
    }
    let float = matches!(dtype, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        if float {
            for (o, row) in out.iter_mut().zip(packed.chunks_exact(rb)) {
                // SAFETY: avx2, fma and f16c were detected at run time just above.
                *o = unsafe { simd::dot_float(dtype, row, x) };
            }
        } else {
            // SAFETY: avx2, fma and f16c were detected at run time just above.
            unsafe { simd_dot::dot_rows_quant(dtype, packed, rb, x, out) };
        }
        return;
    }
    let _ = float;
    for (o, row) in out.iter_mut().zip(packed.chunks_exact(rb)) {
        *o = dot_row_scalar(dtype, row, x);
    }
}

/// Reference quantizer (round-to-nearest) from f32 to `dtype` blocks. A trailing partial block
/// is padded with zeros. F16 clamps to ±65504; BF16 rounds to nearest even.
pub fn quantize_row(dtype: GgmlType, src: &[f32]) -> Vec<u8> {
    match dtype {
        GgmlType::F32 => src.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => src.iter().flat_map(|&v| f32_to_f16(v).to_le_bytes()).collect(),
        GgmlType::BF16 => src.iter().flat_map(|&v| f32_to_bf16(v).to_le_bytes()).collect(),
        _ => {
            let bs = dtype.block_size();
            let mut out = Vec::with_capacity(src.len().div_ceil(bs) * dtype.type_size());
            let mut block = [0f32; 256];
            for chunk in src.chunks(bs) {
                block[..chunk.len()].copy_from_slice(chunk);
                block[chunk.len()..bs].fill(0.0);
                let x = &block[..bs];
                match dtype {
                    GgmlType::Q4_0 => legacy::quantize_q4_0(x, &mut out),
                    GgmlType::Q4_1 => legacy::quantize_q4_1(x, &mut out),
                    GgmlType::Q5_0 => legacy::quantize_q5_0(x, &mut out),
                    GgmlType::Q5_1 => legacy::quantize_q5_1(x, &mut out),
                    GgmlType::Q8_0 => legacy::quantize_q8_0(x, &mut out),
                    GgmlType::Q4K => kquants::quantize_q4_k(x, &mut out),
                    GgmlType::Q5K => kquants::quantize_q5_k(x, &mut out),
                    GgmlType::Q6K => kquants::quantize_q6_k(x, &mut out),
                    GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("handled above"),
                }
            }
            out
        }
    }
}

/// Decodes one quantized block (`dtype.type_size()` bytes) into `dtype.block_size()` values.
fn dequantize_block(dtype: GgmlType, b: &[u8], y: &mut [f32]) {
    match dtype {
        GgmlType::Q4_0 => legacy::dequantize_q4_0(b, y),
        GgmlType::Q4_1 => legacy::dequantize_q4_1(b, y),
        GgmlType::Q5_0 => legacy::dequantize_q5_0(b, y),
        GgmlType::Q5_1 => legacy::dequantize_q5_1(b, y),
        GgmlType::Q8_0 => legacy::dequantize_q8_0(b, y),
        GgmlType::Q4K => kquants::dequantize_q4_k(b, y),
        GgmlType::Q5K => kquants::dequantize_q5_k(b, y),
        GgmlType::Q6K => kquants::dequantize_q6_k(b, y),
        // Float types have one-element "blocks" and never reach here (callers handle them).
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {}
    }
}

/// Portable reference path of [`dequantize_row`] (also what the SIMD path is tested against).
pub(crate) fn dequantize_row_scalar(dtype: GgmlType, src: &[u8], dst: &mut [f32]) {
    match dtype {
        GgmlType::F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        GgmlType::F16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16_to_f32(u16::from_le_bytes([s[0], s[1]]));
            }
        }
        GgmlType::BF16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
            }
        }
        _ => {
            let (bs, ts) = (dtype.block_size(), dtype.type_size());
            for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(bs)) {
                dequantize_block(dtype, b, y);
            }
        }
    }
}

/// Eight-lane partial sums so the portable path vectorizes and rounds like the SIMD one.
#[inline(always)]
fn dot8(acc: &mut [f32; 8], a: &[f32], b: &[f32]) {
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += ca[l] * cb[l];
        }
    }
}

/// Portable reference path of [`dot_row`]: decodes one block at a time into a stack buffer.
pub(crate) fn dot_row_scalar(dtype: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut tail = 0f32;
    match dtype {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            let mut buf = [0f32; 256];
            let es = dtype.type_size();
            for (bytes, xs) in row.chunks(256 * es).zip(x.chunks(256)) {
                let n = xs.len().min(bytes.len() / es);
                dequantize_row_scalar(dtype, &bytes[..n * es], &mut buf[..n]);
                let whole = n / 8 * 8;
                dot8(&mut acc, &buf[..whole], &xs[..whole]);
                tail += buf[whole..n].iter().zip(&xs[whole..n]).map(|(a, b)| a * b).sum::<f32>();
            }
        }
        _ => {
            let (bs, ts) = (dtype.block_size(), dtype.type_size());
            let mut buf = [0f32; 256];
            for (b, xs) in row.chunks_exact(ts).zip(x.chunks_exact(bs)) {
                dequantize_block(dtype, b, &mut buf[..bs]);
                dot8(&mut acc, &buf[..bs], xs);
            }
        }
    }
    acc.iter().sum::<f32>() + tail
}
