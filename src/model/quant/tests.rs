//! Format tests: hand-built blocks, quantize round trips, dot products, SIMD vs portable paths.

use super::*;

/// Deterministic pseudo-random values (xorshift), uniform in [-1, 1): the test data of the
/// quantizer and matmul tests too.
pub(crate) fn uniform_values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// Deterministic pseudo-random values (xorshift), roughly uniform in [-1, 1), with a few
/// larger outliers so blocks have uneven ranges.
pub(crate) fn test_values(n: usize, seed: u64) -> Vec<f32> {
    let mut v = uniform_values(n, seed);
    for x in v.iter_mut().skip(13).step_by(97) {
        *x *= 6.0;
    }
    v
}

fn decode(dtype: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(dtype, bytes, &mut y);
    y
}

fn dequant_scalar(dtype: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row_scalar(dtype, bytes, &mut y);
    y
}

fn h(v: f32) -> [u8; 2] {
    f32_to_f16(v).to_le_bytes()
}

#[test]
fn hand_built_q4_0() {
    // d = 0.5; byte j holds element j (low nibble j) and element j+16 (high nibble 15-j).
    let mut b = h(0.5).to_vec();
    b.extend((0..16u8).map(|j| j | (15 - j) << 4));
    let y = decode(GgmlType::Q4_0, &b, 32);
    assert_eq!(y[0], -4.0); // (0 - 8) * 0.5
    assert_eq!(y[15], 3.5); // (15 - 8) * 0.5
    assert_eq!(y[16], 3.5); // (15 - 8) * 0.5
    assert_eq!(y[31], -4.0); // (0 - 8) * 0.5
    for j in 0..16 {
        assert_eq!(y[j], (j as f32 - 8.0) * 0.5);
        assert_eq!(y[j + 16], (7.0 - j as f32) * 0.5);
    }
    assert_eq!(y, dequant_scalar(GgmlType::Q4_0, &b, 32));
}

#[test]
fn hand_built_q4_1() {
    // d = 0.25, m = -1.
    let mut b = h(0.25).to_vec();
    b.extend(h(-1.0));
    b.extend((0..16u8).map(|j| j | (15 - j) << 4));
    let y = decode(GgmlType::Q4_1, &b, 32);
    assert_eq!((y[0], y[15], y[16], y[31]), (-1.0, 2.75, 2.75, -1.0));
    for j in 0..16 {
        assert_eq!(y[j], j as f32 * 0.25 - 1.0);
        assert_eq!(y[j + 16], (15 - j) as f32 * 0.25 - 1.0);
    }
}

#[test]
fn hand_built_q8_0_and_q5() {
    let mut b = h(2.0).to_vec();
    b.extend((0..32).map(|i| (i as i8 - 16) as u8));
    b[2 + 31] = 0x80; // -128
    let y = decode(GgmlType::Q8_0, &b, 32);
    assert_eq!((y[0], y[16], y[30], y[31]), (-32.0, 0.0, 28.0, -256.0));

    // Q5_0: d = 1; fifth bits set for elements 0, 17 and 31; element 17's low nibble is 3.
    let mut b = h(1.0).to_vec();
    b.extend((1u32 | 1 << 17 | 1 << 31).to_le_bytes());
    let mut qs = [0u8; 16];
    qs[1] = 0x30;
    b.extend(qs);
    let y = decode(GgmlType::Q5_0, &b, 32);
    assert_eq!((y[0], y[1], y[17], y[31], y[5]), (0.0, -16.0, 3.0, 0.0, -16.0));

    // Q5_1: d = 0.5, m = 1; same bits: element 17 = 19 * 0.5 + 1.
    let mut b = h(0.5).to_vec();
    b.extend(h(1.0));
    b.extend((1u32 | 1 << 17 | 1 << 31).to_le_bytes());
    b.extend(qs);
    let y = decode(GgmlType::Q5_1, &b, 32);
    assert_eq!((y[0], y[1], y[17], y[31]), (9.0, 1.0, 10.5, 9.0));
}

#[test]
fn hand_built_q4_k() {
    // Sub-block scales and mins, with values >= 16 to exercise the split high bits.
    let sc = [1u8, 2, 3, 4, 20, 33, 47, 63];
    let m = [0u8, 5, 10, 63, 16, 31, 40, 1];
    // Packed by hand: bytes 0-3 = sc[i] | (sc[i+4] >> 4) << 6, bytes 4-7 = m[i] | (m[i+4] >> 4) << 6,
    // bytes 8-11 = (sc[i+4] & 15) | (m[i+4] & 15) << 4.
    let scales = [65u8, 130, 131, 196, 64, 69, 138, 63, 4, 241, 143, 31];
    let mut b = h(1.0).to_vec();
    b.extend(h(0.5));
    b.extend(scales);
    for _ in 0..4 {
        b.extend((0..32u8).map(|l| (l % 16) | (15 - l % 16) << 4));
    }
    assert_eq!(b.len(), 144);
    let y = decode(GgmlType::Q4K, &b, 256);
    // Element 0: sub-block 0, q 0 -> 1*0 - 0.5*0; element 47: sub-block 1, q 15-15=0 -> -2.5;
    // element 32: sub-block 1, q 15 -> 2*15 - 2.5; element 79: sub-block 2, q 15 -> 3*15 - 5.
    assert_eq!((y[0], y[47], y[32], y[79]), (0.0, -2.5, 27.5, 45.0 - 5.0));
    for c in 0..4 {
        for l in 0..32 {
            let (lo, hi) = ((l % 16) as f32, (15 - l % 16) as f32);
            assert_eq!(y[64 * c + l], f32::from(sc[2 * c]) * lo - 0.5 * f32::from(m[2 * c]), "c{c} l{l}");
            assert_eq!(y[64 * c + 32 + l], f32::from(sc[2 * c + 1]) * hi - 0.5 * f32::from(m[2 * c + 1]));
        }
    }
    assert_eq!(y, dequant_scalar(GgmlType::Q4K, &b, 256));
}

#[test]
fn hand_built_q6_k() {
    // ql: first 32 bytes of each half 0x21, next 32 0x43; qh: half 0 = 0xE4 (top bits 0,1,2,3),
    // half 1 = 0x1B (3,2,1,0); scales j + 1; d = 0.5.
    let mut b = Vec::new();
    for _ in 0..2 {
        b.extend([0x21u8; 32]);
        b.extend([0x43u8; 32]);
    }
    b.extend([0xE4u8; 32]);
    b.extend([0x1Bu8; 32]);
    b.extend(1..=16u8);
    b.extend(h(0.5));
    assert_eq!(b.len(), 210);
    let y = decode(GgmlType::Q6K, &b, 256);
    // Half 0 codes: q1 = 1 | 0<<4 = 1, q2 = 3 | 1<<4 = 19, q3 = 2 | 2<<4 = 34, q4 = 4 | 3<<4 = 52.
    // Half 1 codes: q1 = 1 | 3<<4 = 49, q2 = 3 | 2<<4 = 35, q3 = 2 | 1<<4 = 18, q4 = 4.
    let codes = [[1, 19, 34, 52], [49, 35, 18, 4]];
    for (e, &v) in y.iter().enumerate() {
        let (hf, k, l) = (e / 128, (e % 128) / 32, e % 32);
        let scale = (8 * hf + l / 16 + 2 * k + 1) as f32;
        assert_eq!(v, 0.5 * scale * (codes[hf][k] - 32) as f32, "element {e}");
    }
    assert_eq!(y[0], -15.5); // 0.5 * 1 * (1 - 32)
    assert_eq!(y[32], -19.5); // 0.5 * 3 * (19 - 32)
    assert_eq!(y[255], 0.5 * 16.0 * -28.0);
    assert_eq!(y, dequant_scalar(GgmlType::Q6K, &b, 256));
}

#[test]
fn float_conversions() {
    assert_eq!(f16_to_f32(f32_to_f16(1e6)), 65504.0);
    assert_eq!(f16_to_f32(f32_to_f16(-1e6)), -65504.0);
    assert_eq!(f16_to_f32(f32_to_f16(f32::INFINITY)), 65504.0);
    assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
    assert_eq!(f16_to_f32(f32_to_f16(0.333_333)), 0.333_251_95);
    // BF16 keeps 8 mantissa bits: ties go to the even neighbour.
    assert_eq!(bf16_to_f32(f32_to_bf16(1.0 + 1.0 / 256.0)), 1.0);
    assert_eq!(bf16_to_f32(f32_to_bf16(1.0 + 3.0 / 256.0)), 1.0 + 1.0 / 64.0);
    assert_eq!(bf16_to_f32(f32_to_bf16(1.0 + 1.0 / 256.0 + 1e-6)), 1.0 + 1.0 / 128.0);
    assert_eq!(f32_to_bf16(-2.5), 0xC020);
    assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
}

/// Per element bound on |x - decode(quantize(x))| for block `b` of the encoded row.
fn error_bound(dtype: GgmlType, x: &[f32], enc: &[u8], i: usize) -> f32 {
    let bs = dtype.block_size();
    let blk = &x[i / bs * bs..][..bs];
    let eb = &enc[i / bs * dtype.type_size()..];
    let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (mn, mx) = blk.iter().fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let slack = 1.001;
    match dtype {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => x[i].abs() / 2048.0,
        GgmlType::BF16 => x[i].abs() / 256.0,
        // Symmetric formats: the far side of the range may clamp one code short.
        GgmlType::Q4_0 => amax / 8.0 * slack,
        GgmlType::Q5_0 => amax / 16.0 * slack,
        GgmlType::Q8_0 => amax / 254.0 * slack,
        GgmlType::Q4_1 => (mx - mn) / 30.0 * slack + mn.abs() / 1024.0,
        GgmlType::Q5_1 => (mx - mn) / 62.0 * slack + mn.abs() / 1024.0,
        // K formats: half a step of the decoded sub-block scale (codes never clamp).
        GgmlType::Q4K | GgmlType::Q5K => {
            let (sc, _) = kquants::scale_min((i % 256) / 32, &eb[4..16]);
            half_at(eb, 0) * f32::from(sc) / 2.0 * slack + 1e-6
        }
        GgmlType::Q6K => {
            let sc = eb[192 + (i % 256) / 16] as i8;
            (half_at(eb, 208) * f32::from(sc)).abs() / 2.0 * slack + 1e-6
        }
    }
}

use super::float::half_at;

#[test]
fn quantize_round_trip_all_types() {
    for dtype in GgmlType::ALL {
        let n = 1024;
        let x = test_values(n, 7 + dtype.id() as u64);
        let enc = quantize_row(dtype, &x);
        assert_eq!(Some(enc.len()), dtype.row_bytes(n), "{dtype}");
        let y = decode(dtype, &enc, n);
        let (mut se, mut sx) = (0f64, 0f64);
        for i in 0..n {
            let err = (x[i] - y[i]).abs();
            let bound = error_bound(dtype, &x, &enc, i);
            assert!(err <= bound, "{dtype} element {i}: {} -> {} (err {err}, bound {bound})", x[i], y[i]);
            se += f64::from(err).powi(2);
            sx += f64::from(x[i]).powi(2);
        }
        let rel_rms = (se / sx).sqrt();
        let max_rel_rms = match dtype {
            GgmlType::F32 => 0.0,
            GgmlType::F16 => 1e-3,
            GgmlType::BF16 => 4e-3,
            GgmlType::Q8_0 => 0.01,
            GgmlType::Q6K => 0.03,
            GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5K => 0.08,
            _ => 0.12,
        };
        println!("{dtype}: relative rms error {rel_rms:.4}");
        assert!(rel_rms <= max_rel_rms, "{dtype}: relative rms error {rel_rms}");
        // All-zero input decodes to zeros (no NaN from a zero scale).
        let z = decode(dtype, &quantize_row(dtype, &vec![0.0; 256]), 256);
        assert!(z.iter().all(|&v| v == 0.0), "{dtype} zeros");
    }
}

#[test]
fn quantize_pads_partial_block() {
    let enc = quantize_row(GgmlType::Q8_0, &[1.0, -1.0, 0.5]);
    assert_eq!(enc.len(), 34);
    let y = decode(GgmlType::Q8_0, &enc, 32);
    assert!((y[0] - 1.0).abs() < 0.01 && (y[1] + 1.0).abs() < 0.01 && y[3..].iter().all(|&v| v == 0.0));
}

fn naive_dot(w: &[f32], x: &[f32]) -> (f64, f64) {
    let dot = w.iter().zip(x).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
    let mag = w.iter().zip(x).map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs()).sum();
    (dot, mag)
}

#[test]
fn dot_row_matches_dequantized_dot() {
    for dtype in GgmlType::ALL {
        for (n, seed) in [(256usize, 1u64), (1536, 2), (2048, 3)] {
            let w = test_values(n, seed * 31 + dtype.id() as u64);
            let x = test_values(n, seed * 77 + 5);
            let enc = quantize_row(dtype, &w);
            let (want, mag) = naive_dot(&dequant_scalar(dtype, &enc, n), &x);
            for (path, got) in [("dispatch", dot_row(dtype, &enc, &x)), ("scalar", dot_row_scalar(dtype, &enc, &x))] {
                let err = (f64::from(got) - want).abs();
                assert!(err <= 1e-4 * want.abs().max(mag * 1e-2), "{dtype} n={n} {path}: {got} vs {want}");
                assert!(err <= 1e-5 * mag, "{dtype} n={n} {path}: {got} vs {want} (sum|wx| {mag})");
            }
        }
    }
    // Float rows of a length that is not a multiple of 8 exercise the tails.
    for dtype in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        let (w, x) = (test_values(77, 9), test_values(77, 10));
        let enc = quantize_row(dtype, &w);
        let (want, mag) = naive_dot(&dequant_scalar(dtype, &enc, 77), &x);
        assert!((f64::from(dot_row(dtype, &enc, &x)) - want).abs() <= 1e-5 * mag, "{dtype}");
        assert_eq!(decode(dtype, &enc, 77), dequant_scalar(dtype, &enc, 77), "{dtype}");
    }
}

#[test]
fn simd_dequantize_matches_scalar() {
    for dtype in GgmlType::ALL {
        let n = 2048;
        let enc = quantize_row(dtype, &test_values(n, 40 + dtype.id() as u64));
        let (a, b) = (decode(dtype, &enc, n), dequant_scalar(dtype, &enc, n));
        for i in 0..n {
            // Fused multiply-add in the SIMD path may differ in the last bit.
            assert!((a[i] - b[i]).abs() <= 1e-6 * b[i].abs().max(1e-3), "{dtype} element {i}: {} vs {}", a[i], b[i]);
        }
    }
}

#[test]
fn sample_model_rows_dot_and_dequantize() {
    use crate::model::gguf::GgufFile;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/samples/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let g = GgufFile::open(path).expect("sample model present (samples/models)");
    for (name, want_type) in [("blk.0.attn_q.weight", GgmlType::Q4_1), ("token_embd.weight", GgmlType::Q8_0)] {
        let info = g.tensor_info(name).expect("tensor present");
        assert_eq!(info.dtype, want_type, "{name}");
        let (cols, n_rows) = (info.row_len(), info.n_rows());
        let rb = want_type.row_bytes(cols).expect("whole blocks");
        let data = g.tensor_data(info);
        let x = test_values(cols, 99);
        let mut sum_sq = 0f64;
        for r in [0, 1, n_rows / 2, n_rows - 1] {
            let row = &data[r * rb..(r + 1) * rb];
            let (w, ws) = (decode(want_type, row, cols), dequant_scalar(want_type, row, cols));
            assert!(w.iter().zip(&ws).all(|(a, b)| (a - b).abs() <= 1e-6 * b.abs().max(1e-3)), "{name} row {r}");
            assert!(w.iter().all(|v| v.is_finite() && v.abs() < 100.0), "{name} row {r} has wild values");
            sum_sq += w.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>();
            let (want, mag) = naive_dot(&ws, &x);
            let got = f64::from(dot_row(want_type, row, &x));
            assert!((got - want).abs() <= 1e-5 * mag, "{name} row {r}: {got} vs {want}");
        }
        // Real weights: not all zero, typical magnitude well below 1.
        let rms = (sum_sq / (4 * cols) as f64).sqrt();
        assert!(rms > 1e-3 && rms < 1.0, "{name}: rms {rms}");
    }
}
