//! The F16 weights the GPU's packed tensor-core GEMMs multiply (`kernels/quant.cuh` `Stage16`:
//! gemm_quant.cu's tiles and the grouped MoE GEMM), computed on the CPU: the twin their parity
//! tests compare against.
//!
//! Q4_K and Q6_K are staged in F16 arithmetic: the run's scale and offset are rounded to F16,
//! then one fused F16 operation per value, rounded once: Q4_K `round16(q * round16(d sc) -
//! round16(dmin m))`, Q6_K `round16(round16(d sc) * (q - 32))`. Every other format (Q8_0 too,
//! whose F16 form gives the same bits: `d` is F16 and `d q` exact in f32) is the reference
//! decoder's f32 value rounded to F16 with the ±65,504 clamp. A run whose values could pass
//! 65,000 (`|o| + 15 |d|` for Q4_K, `32 |sc|` for Q6_K) is staged the generic way, as the
//! kernel's guard does.

use super::float::{f16_to_f32, f32_to_f16};
use super::kquants::{decode_q4_k, decode_q6_k};
use super::{dequantize_row, GgmlType};

/// `src` (one packed row of `dtype`) as the GPU stages it, each value an F16 widened to f32.
///
/// Precondition: `src.len() == dtype.row_bytes(dst.len())` (as [`dequantize_row`]).
pub fn staged_f16_row(dtype: GgmlType, src: &[u8], dst: &mut [f32]) {
    let (bs, ts) = (dtype.block_size(), dtype.type_size());
    match dtype {
        GgmlType::Q4K => {
            for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(bs)) {
                decode_q4_k(b, y, |d, o, q| {
                    if 15f32.mul_add(d.abs(), o.abs()) <= 65_000.0 {
                        round16_exact(f64::from(q) * f64::from(round16(d)) - f64::from(round16(o)))
                    } else {
                        round16(d.mul_add(f32::from(q), -o))
                    }
                });
            }
        }
        GgmlType::Q6K => {
            for (b, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(bs)) {
                decode_q6_k(b, y, |sc, q| {
                    if 32.0 * sc.abs() <= 65_000.0 {
                        round16_exact(f64::from(round16(sc)) * f64::from(q))
                    } else {
                        round16(sc * q as f32)
                    }
                });
            }
        }
        _ => {
            dequantize_row(dtype, src, dst);
            dst.iter_mut().for_each(|v| *v = round16(*v));
        }
    }
}

/// `v` rounded to F16 (nearest, ties to even; clamped to ±65,504), widened back.
fn round16(v: f32) -> f32 {
    f16_to_f32(f32_to_f16(v))
}

/// `v` (a finite f64 within the F16 range, here an exact product or difference of F16 values
/// and small integers) rounded to F16 once: the result of one F16 `fma`/`mul` instruction.
/// (`half`'s f64 conversion goes through f32 on x86, a second rounding.)
fn round16_exact(v: f64) -> f32 {
    if v == 0.0 {
        return v as f32;
    }
    // The F16 spacing at |v|: 2^(e - 10) for binade e >= -14, 2^-24 among the subnormals.
    let e = (((v.abs().to_bits() >> 52) & 0x7FF) as i32 - 1023).max(-14);
    let ulp = 2f64.powi(e - 10);
    ((v / ulp).round_ties_even() * ulp) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round16_exact_rounds_once_to_nearest_even() {
        // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even is 1. A hair above goes up.
        assert_eq!(round16_exact(1.0 + 2f64.powi(-11)), 1.0);
        assert_eq!(round16_exact(1.0 + 2f64.powi(-11) + 2f64.powi(-40)), 1.0 + 2f32.powi(-10));
        // f32 would round the hair away first, then tie to even: two roundings, another value.
        assert_eq!(round16(1.0 + 2f64.powi(-11) as f32 + 2f64.powi(-40) as f32), 1.0);
        // Subnormal spacing 2^-24 below 2^-14; negative values mirror.
        assert_eq!(round16_exact(-3.4 * 2f64.powi(-24)), -3.0 * 2f32.powi(-24));
        assert_eq!(round16_exact(2049.0), 2048.0);
        assert_eq!(round16_exact(2051.0), 2052.0);
    }

    #[test]
    fn staged_values_are_f16_and_near_the_decoder() {
        for dtype in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q8_0, GgmlType::Q4_0] {
            let x: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
            let packed = super::super::quantize_row(dtype, &x);
            let (mut want, mut got) = (vec![0f32; 512], vec![0f32; 512]);
            dequantize_row(dtype, &packed, &mut want);
            staged_f16_row(dtype, &packed, &mut got);
            // The F16 roundings of the scale, the offset and the value: each at most half an F16
            // ulp of the terms (|q d|, |o| <= the block's largest value), whatever cancels.
            let amax = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g, round16(g), "{dtype} element {i}: {g} is not an F16 value");
                assert!((g - w).abs() <= 2f32.powi(-9) * amax, "{dtype} element {i}: {g} vs {w}");
            }
        }
    }
}
