//! Block quantizers with importance weights: f32 row -> GGML blocks, plus the quantizer's own
//! reconstruction of the row (what a decoder will compute from the bytes, bit for bit).
//!
//! Every format chooses its scales (and mins) with the weighted searches of [`super::search`]
//! (Q8_0 excepted: round-to-nearest on the absolute maximum, whose error is already below the
//! f16 noise of the source), stores them in the format's precision (f16, or 6-bit / 8-bit codes
//! under an f16 super-scale for the K formats), and then rounds every weight to the nearest code
//! under the *stored* scales, so the reconstruction is exactly the decoder's.
//! Block layouts are documented in `model::quant::{legacy, kquants}`.

use crate::model::quant::{f16_to_f32, f32_to_f16, pack_scale_min, GgmlType};

use super::search::{affine_scale_min, round_clamped, symmetric_scale};

/// `v` as a decoder sees it after storing it as f16.
#[inline]
fn stored(v: f32) -> f32 {
    f16_to_f32(f32_to_f16(v))
}

fn push_f16(out: &mut Vec<u8>, v: f32) {
    out.extend_from_slice(&f32_to_f16(v).to_le_bytes());
}

/// Byte j holds code j (low nibble) and code j+16 (high nibble), as the 32-element formats pack.
fn push_nibbles32(out: &mut Vec<u8>, q: &[u8]) {
    out.extend((0..16).map(|j| (q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4));
}

/// Bit i = fifth bit of code i.
fn fifth_bits32(q: &[u8]) -> u32 {
    q.iter().enumerate().fold(0u32, |h, (i, &v)| h | (u32::from(v >> 4) & 1) << i)
}

/// Q4_0 / Q5_0: `x = d * (q - half)`, codes `0..2*half`.
fn symmetric_legacy(x: &[f32], w: &[f32], half: u8, out: &mut Vec<u8>, y: &mut [f32]) {
    let (nneg, npos) = (f32::from(half), f32::from(half) - 1.0);
    let d = stored(symmetric_scale(x, w, nneg, npos));
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let q: [u8; 32] = std::array::from_fn(|i| (round_clamped(x[i] * id, -nneg, npos) + nneg) as u8);
    for (yi, &qi) in y.iter_mut().zip(&q) {
        *yi = (i32::from(qi) - i32::from(half)) as f32 * d;
    }
    push_f16(out, d);
    if half == 16 {
        out.extend_from_slice(&fifth_bits32(&q).to_le_bytes());
    }
    push_nibbles32(out, &q);
}

/// Q4_1 / Q5_1: `x = d * q + m`, codes `0..=nmax`.
fn affine_legacy(x: &[f32], w: &[f32], nmax: u8, out: &mut Vec<u8>, y: &mut [f32]) {
    let (s, m) = affine_scale_min(x, w, f32::from(nmax), false);
    let (d, m) = (stored(s), stored(m));
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let q: [u8; 32] = std::array::from_fn(|i| round_clamped((x[i] - m) * id, 0.0, f32::from(nmax)) as u8);
    for (yi, &qi) in y.iter_mut().zip(&q) {
        *yi = f32::from(qi) * d + m;
    }
    push_f16(out, d);
    push_f16(out, m);
    if nmax == 31 {
        out.extend_from_slice(&fifth_bits32(&q).to_le_bytes());
    }
    push_nibbles32(out, &q);
}

fn q8_0(x: &[f32], out: &mut Vec<u8>, y: &mut [f32]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = stored(amax / 127.0);
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    push_f16(out, d);
    for (yi, &v) in y.iter_mut().zip(x) {
        let q = round_clamped(v * id, -127.0, 127.0) as i8;
        *yi = f32::from(q) * d;
        out.push(q as u8);
    }
}

/// The integer code of `v / step` in `0..=max` (0 for a zero step).
#[inline]
fn code(v: f32, step: f32, max: f32) -> f32 {
    if step == 0.0 {
        0.0
    } else {
        round_clamped(v / step, 0.0, max)
    }
}

/// Q4_K (`nmax` 15) and Q5_K (31) on one 256-element super-block.
fn k_affine(x: &[f32], w: &[f32], nmax: u8, out: &mut Vec<u8>, y: &mut [f32]) {
    let n = f32::from(nmax);
    let (mut s, mut neg_m, mut sw) = ([0f32; 8], [0f32; 8], [0f32; 8]);
    for j in 0..8 {
        let r = 32 * j..32 * j + 32;
        let (sj, mj) = affine_scale_min(&x[r.clone()], &w[r.clone()], n, true);
        (s[j], neg_m[j], sw[j]) = (sj, -mj, w[r].iter().sum());
    }
    // The eight scales and mins as 6-bit codes of two f16 super-scales, chosen by the same
    // weighted search (a sub-block weighs what its elements weigh).
    let d = stored(symmetric_scale(&s, &sw, 0.0, 63.0));
    let dmin = stored(symmetric_scale(&neg_m, &sw, 0.0, 63.0));
    let sc: [u8; 8] = std::array::from_fn(|j| code(s[j], d, 63.0) as u8);
    let mc: [u8; 8] = std::array::from_fn(|j| code(neg_m[j], dmin, 63.0) as u8);
    let mut q = [0u8; 256];
    for j in 0..8 {
        let (d1, o1) = (d * f32::from(sc[j]), dmin * f32::from(mc[j]));
        for i in 32 * j..32 * j + 32 {
            q[i] = code(x[i] + o1, d1, n) as u8;
            y[i] = d1 * f32::from(q[i]) - o1;
        }
    }
    push_f16(out, d);
    push_f16(out, dmin);
    out.extend_from_slice(&pack_scale_min(&sc, &mc));
    if nmax == 31 {
        // Element l of sub-block 2c has its fifth bit at bit 2c of qh[l], of 2c+1 at bit 2c+1.
        let mut qh = [0u8; 32];
        for c in 0..4 {
            for l in 0..32 {
                qh[l] |= ((q[64 * c + l] >> 4) & 1) << (2 * c) | ((q[64 * c + 32 + l] >> 4) & 1) << (2 * c + 1);
            }
        }
        out.extend_from_slice(&qh);
    }
    for c in 0..4 {
        out.extend((0..32).map(|l| (q[64 * c + l] & 0x0F) | (q[64 * c + 32 + l] & 0x0F) << 4));
    }
}

/// Q6_K on one 256-element super-block: sixteen sub-blocks of 16, `x = d * sc * (q - 32)`.
fn q6_k(x: &[f32], w: &[f32], out: &mut Vec<u8>, y: &mut [f32]) {
    let (mut s, mut sw) = ([0f32; 16], [0f32; 16]);
    for j in 0..16 {
        let r = 16 * j..16 * j + 16;
        s[j] = symmetric_scale(&x[r.clone()], &w[r.clone()], 32.0, 31.0);
        sw[j] = w[r].iter().sum();
    }
    let d = stored(symmetric_scale(&s, &sw, 128.0, 127.0));
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let sc: [i8; 16] = std::array::from_fn(|j| round_clamped(s[j] * id, -128.0, 127.0) as i8);
    let mut q = [0u8; 256];
    for (j, &scj) in sc.iter().enumerate() {
        let step = d * f32::from(scj);
        let is = if step == 0.0 { 0.0 } else { 1.0 / step };
        for i in 16 * j..16 * j + 16 {
            let c = round_clamped(x[i] * is, -32.0, 31.0) as i32;
            q[i] = (c + 32) as u8;
            y[i] = step * c as f32;
        }
    }
    crate::model::quant::pack_q6_k(&q, &sc.map(|v| v as u8), d, out);
}

/// Quantizes one row `x` (a whole number of `dtype` blocks) with per-element importance `w`
/// (same length; all ones for plain least squares), appending the blocks to `out` and writing
/// the decoded values to `y`. Float types are stored as the decoders read them (F16 clamps to
/// ±65504). Returns false when `dtype` cannot hold a row of this length.
pub fn quantize_row_weighted(dtype: GgmlType, x: &[f32], w: &[f32], out: &mut Vec<u8>, y: &mut [f32]) -> bool {
    let bs = dtype.block_size();
    if !x.len().is_multiple_of(bs) || w.len() != x.len() || y.len() != x.len() {
        return false;
    }
    match dtype {
        GgmlType::F32 => {
            y.copy_from_slice(x);
            out.extend(x.iter().flat_map(|v| v.to_le_bytes()));
        }
        GgmlType::F16 => {
            for (yi, &v) in y.iter_mut().zip(x) {
                let h = f32_to_f16(v);
                *yi = f16_to_f32(h);
                out.extend_from_slice(&h.to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (yi, &v) in y.iter_mut().zip(x) {
                let h = crate::model::quant::f32_to_bf16(v);
                *yi = crate::model::quant::bf16_to_f32(h);
                out.extend_from_slice(&h.to_le_bytes());
            }
        }
        _ => {
            for ((xb, wb), yb) in x.chunks_exact(bs).zip(w.chunks_exact(bs)).zip(y.chunks_exact_mut(bs)) {
                match dtype {
                    GgmlType::Q4_0 => symmetric_legacy(xb, wb, 8, out, yb),
                    GgmlType::Q5_0 => symmetric_legacy(xb, wb, 16, out, yb),
                    GgmlType::Q4_1 => affine_legacy(xb, wb, 15, out, yb),
                    GgmlType::Q5_1 => affine_legacy(xb, wb, 31, out, yb),
                    GgmlType::Q8_0 => q8_0(xb, out, yb),
                    GgmlType::Q4K => k_affine(xb, wb, 15, out, yb),
                    GgmlType::Q5K => k_affine(xb, wb, 31, out, yb),
                    GgmlType::Q6K => q6_k(xb, wb, out, yb),
                    GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("float types handled above"),
                }
            }
        }
    }
    true
}
