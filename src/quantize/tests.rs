//! The block quantizers against the decoders of `model::quant` (the exact inverse), error bounds
//! per format, the naive round-to-nearest quantizers as a floor, and importance weighting on
//! planted data.

use super::blocks::quantize_row_weighted;
use super::{column_weights, quantize_tensor, row_weights};
use crate::model::quant::{dequantize_row, quantize_row, GgmlType};

/// xorshift values in [-1, 1).
fn uniform(n: usize, seed: u64) -> Vec<f32> {
    crate::model::quant::tests::uniform_values(n, seed)
}

/// A weight-like row: roughly normal values (sum of uniforms) whose scale changes every 64
/// elements, a few outliers, and an offset in some blocks (so the affine formats' mins matter).
fn weight_row(n: usize, seed: u64) -> Vec<f32> {
    let u = uniform(4 * n, seed);
    (0..n)
        .map(|i| {
            let g: f32 = u[4 * i..4 * i + 4].iter().sum::<f32>() * 0.5;
            let scale = 0.02 * (1.0 + (i / 64 % 5) as f32);
            let outlier = if i % 97 == 13 { 6.0 } else { 1.0 };
            let offset = if i / 128 % 3 == 1 { 0.01 } else { 0.0 };
            g * scale * outlier + offset
        })
        .collect()
}

fn rel_err(x: &[f32], y: &[f32], w: &[f32]) -> f64 {
    let e: f64 = x.iter().zip(y).zip(w).map(|((&a, &b), &wi)| f64::from(wi) * f64::from(a - b).powi(2)).sum();
    let r: f64 = x.iter().zip(w).map(|(&a, &wi)| f64::from(wi) * f64::from(a).powi(2)).sum();
    e / r
}

fn decode(dtype: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(dtype, bytes, &mut y);
    y
}

/// Upper bounds of `sum (x - x̂)^2 / sum x^2` on `weight_row` data: about 1.5x the worst the
/// quantizers reached (2026-12-01: Q4_0 1.5e-2, Q4_1 6.8e-3, Q5_0 4.3e-3, Q5_1 1.7e-3, Q8_0
/// 6.7e-5, Q4_K 7.0e-3, Q5_K 1.9e-3, Q6_K 5.6e-4), far below what a wrong layout gives (~1).
fn bound(t: GgmlType) -> f64 {
    match t {
        GgmlType::Q4_0 => 2.3e-2,
        GgmlType::Q4_1 => 1.0e-2,
        GgmlType::Q5_0 => 6.5e-3,
        GgmlType::Q5_1 => 2.6e-3,
        GgmlType::Q8_0 => 1.0e-4,
        GgmlType::Q4K => 1.05e-2,
        GgmlType::Q5K => 2.8e-3,
        GgmlType::Q6K => 8.5e-4,
        _ => 0.0,
    }
}

#[test]
fn reconstruction_is_the_decoders_bit_for_bit_and_errors_are_bounded() {
    let n = 1024;
    for t in GgmlType::BLOCK_TYPES {
        for seed in 0..4 {
            let x = weight_row(n, seed);
            for imp in [None, Some(uniform(n, seed + 100).iter().map(|v| v.abs() + 0.01).collect::<Vec<_>>())] {
                let w = column_weights(imp.as_deref(), n);
                let (mut out, mut y) = (Vec::new(), vec![0f32; n]);
                assert!(quantize_row_weighted(t, &x, &w, &mut out, &mut y));
                assert_eq!(Some(out.len()), t.row_bytes(n), "{t}");
                let d = decode(t, &out, n);
                assert!(d.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()), "{t}: decoder differs");
                let e = rel_err(&x, &y, &[1.0; 1024]);
                assert!(e < bound(t), "{t} seed {seed}: relative error {e:.3e} above {:.1e}", bound(t));
            }
        }
    }
}

#[test]
fn the_search_beats_naive_round_to_nearest() {
    // The naive quantizers of model::quant (absmax / min-max scales, no search) as the floor.
    let n = 2048;
    for t in GgmlType::BLOCK_TYPES.into_iter().filter(|&t| t != GgmlType::Q8_0) {
        let (mut ours, mut naive) = (0f64, 0f64);
        for seed in 0..4 {
            let x = weight_row(n, seed + 7);
            let (mut out, mut y) = (Vec::new(), vec![0f32; n]);
            quantize_row_weighted(t, &x, &vec![1.0; n], &mut out, &mut y);
            ours += rel_err(&x, &y, &vec![1.0; n]);
            naive += rel_err(&x, &decode(t, &quantize_row(t, &x), n), &vec![1.0; n]);
        }
        assert!(ours < 0.95 * naive, "{t}: search {ours:.3e} vs round-to-nearest {naive:.3e}");
    }
}

#[test]
fn importance_lowers_the_weighted_error_on_planted_data() {
    // Planted: one input column in eight carries 50x the activation energy of the others, as
    // outlier channels of real models do. The weighted fit must never be worse on the weighted
    // metric, and clearly better in total.
    let n = 1024;
    let imp: Vec<f32> = (0..n).map(|c| if c % 8 == 3 { 50.0 } else { 1.0 }).collect();
    for t in GgmlType::BLOCK_TYPES.into_iter().filter(|&t| t != GgmlType::Q8_0) {
        let (mut with, mut without) = (0f64, 0f64);
        for seed in 0..6 {
            let x = weight_row(n, seed + 31);
            let (mut o1, mut y1, mut o2, mut y2) = (Vec::new(), vec![0f32; n], Vec::new(), vec![0f32; n]);
            quantize_row_weighted(t, &x, &column_weights(Some(&imp), n), &mut o1, &mut y1);
            quantize_row_weighted(t, &x, &vec![1.0; n], &mut o2, &mut y2);
            let (a, b) = (rel_err(&x, &y1, &imp), rel_err(&x, &y2, &imp));
            assert!(a <= b * 1.0001, "{t} seed {seed}: weighted {a:.3e} > unweighted {b:.3e}");
            with += a;
            without += b;
        }
        assert!(with < 0.9 * without, "{t}: importance-weighted {with:.3e} vs plain {without:.3e}");
    }
}

#[test]
fn tensor_quantization_is_row_parallel_and_deterministic() {
    // Source F16 rows of a [300, 256] matrix (more rows than one task holds): the parallel result
    // equals row-by-row quantization, and the error sums match a direct computation.
    let (rows, cols) = (300, 256);
    let vals: Vec<f32> = (0..rows).flat_map(|r| weight_row(cols, r as u64)).collect();
    let src = quantize_row(GgmlType::F16, &vals);
    let imp: Vec<f32> = (0..cols).map(|c| 1.0 + (c % 5) as f32).collect();
    let (bytes, e) = quantize_tensor(GgmlType::F16, &src, rows, cols, GgmlType::Q4K, Some(&imp)).unwrap();
    let w = column_weights(Some(&imp), cols);
    let (mut want, mut err) = (Vec::new(), 0f64);
    for r in 0..rows {
        let x = decode(GgmlType::F16, &src[r * cols * 2..(r + 1) * cols * 2], cols);
        let (mut y, mut rw) = (vec![0f32; cols], vec![0f32; cols]);
        row_weights(GgmlType::Q4K, &w, &x, &mut rw);
        quantize_row_weighted(GgmlType::Q4K, &x, &rw, &mut want, &mut y);
        err += x.iter().zip(&y).map(|(a, b)| f64::from(a - b).powi(2)).sum::<f64>();
    }
    assert_eq!(bytes, want);
    assert!((e.sq_err - err).abs() <= 1e-9 * err.max(1e-30), "{} vs {err}", e.sq_err);
    assert!(e.weighted_relative().is_some_and(|v| v > 0.0 && v < bound(GgmlType::Q4K)));
    // A row length the type cannot hold is refused, not padded.
    assert!(quantize_tensor(GgmlType::F16, &src[..cols * 2], 1, cols, GgmlType::Q4K, None).is_some());
    assert!(quantize_tensor(GgmlType::F16, &src[..200], 1, 100, GgmlType::Q4K, None).is_none());
}

/// Regression: raw importances (1e-5 to 1e1) made the weighted quantization of the sample model
/// 2.6x slower than the unweighted one (subnormal f32 arithmetic, it seems); the column weights
/// are normalized to mean 1 and do not depend on the importance's scale.
#[test]
fn column_weights_have_mean_one_whatever_the_importance_scale() {
    let n = 256;
    let imp: Vec<f32> = (0..n).map(|c| 1e-6 * (1.0 + (c % 7) as f32)).collect();
    let big: Vec<f32> = imp.iter().map(|v| v * 1e6).collect();
    let (a, b) = (column_weights(Some(&imp), n), column_weights(Some(&big), n));
    let mean = a.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
    assert!((mean - 1.0).abs() < 1e-6, "mean {mean}");
    assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 1e-6 * y), "scale changed the weights");
    // A column no token touched gets the floor, 1e-3 of the mean.
    let mut z = vec![1.0f32; n];
    z[0] = 0.0;
    assert_eq!(column_weights(Some(&z), n)[0], 1e-3);
}
