//! The 32-element block formats (reference decoders and quantizers).
//!
//! Layouts (little-endian, `d`/`m` are f16):
//! - Q4_0 (18 B): d, qs[16]; x[j] = d*(lo(qs[j]) - 8), x[j+16] = d*(hi(qs[j]) - 8)
//! - Q4_1 (20 B): d, m, qs[16]; x = d*q + m, nibbles as Q4_0
//! - Q5_0 (22 B): d, qh[4] (u32, bit i = 5th bit of element i), qs[16]; x = d*(q - 16)
//! - Q5_1 (24 B): d, m, qh[4], qs[16]; x = d*q + m
//! - Q8_0 (34 B): d, qs[32] (i8); x = d*q

use super::float::{as_stored_f16, f32_to_f16, half_at};

pub(super) fn dequantize_q4_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = (i32::from(qs[j] & 0x0F) - 8) as f32 * d;
        y[j + 16] = (i32::from(qs[j] >> 4) - 8) as f32 * d;
    }
}

pub(super) fn dequantize_q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = f32::from(qs[j] & 0x0F) * d + m;
        y[j + 16] = f32::from(qs[j] >> 4) * d + m;
    }
}

pub(super) fn dequantize_q5_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let lo = (qs[j] & 0x0F) as u32 | ((qh >> j) & 1) << 4;
        let hi = (qs[j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
        y[j] = (lo as i32 - 16) as f32 * d;
        y[j + 16] = (hi as i32 - 16) as f32 * d;
    }
}

pub(super) fn dequantize_q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let lo = (qs[j] & 0x0F) as u32 | ((qh >> j) & 1) << 4;
        let hi = (qs[j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
        y[j] = lo as f32 * d + m;
        y[j + 16] = hi as f32 * d + m;
    }
}

pub(super) fn dequantize_q8_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[2..34]) {
        *v = f32::from(q as i8) * d;
    }
}

/// The element of largest magnitude, keeping its sign (the symmetric formats map it to the
/// extreme negative code so the full range of codes is used).
fn signed_absmax(x: &[f32]) -> f32 {
    x.iter().copied().fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m })
}

fn push_f16(out: &mut Vec<u8>, v: f32) {
    out.extend_from_slice(&f32_to_f16(v).to_le_bytes());
}

/// `1/d`, or 0 for an all-zero block.
fn inv(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// Rounds `v` to the nearest code in `0..=max`.
fn code(v: f32, max: u8) -> u8 {
    v.round().clamp(0.0, f32::from(max)) as u8
}

/// Packs 32 codes (0..15 each) as GGML does: byte j holds element j (low) and j+16 (high).
fn push_nibbles(out: &mut Vec<u8>, q: &[u8; 32]) {
    out.extend((0..16).map(|j| (q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4));
}

/// Bit i of the result is the fifth bit of code i.
fn high_bits(q: &[u8; 32]) -> u32 {
    q.iter().enumerate().fold(0u32, |h, (i, &v)| h | (u32::from(v >> 4) & 1) << i)
}

pub(super) fn quantize_q4_0(x: &[f32], out: &mut Vec<u8>) {
    let d = as_stored_f16(signed_absmax(x) / -8.0);
    let id = inv(d);
    let q: [u8; 32] = std::array::from_fn(|i| code(x[i] * id + 8.0, 15));
    push_f16(out, d);
    push_nibbles(out, &q);
}

pub(super) fn quantize_q4_1(x: &[f32], out: &mut Vec<u8>) {
    let (mn, mx) = x.iter().fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let m = as_stored_f16(mn);
    let d = as_stored_f16((mx - mn) / 15.0);
    let id = inv(d);
    let q: [u8; 32] = std::array::from_fn(|i| code((x[i] - m) * id, 15));
    push_f16(out, d);
    push_f16(out, m);
    push_nibbles(out, &q);
}

pub(super) fn quantize_q5_0(x: &[f32], out: &mut Vec<u8>) {
    let d = as_stored_f16(signed_absmax(x) / -16.0);
    let id = inv(d);
    let q: [u8; 32] = std::array::from_fn(|i| code(x[i] * id + 16.0, 31));
    push_f16(out, d);
    out.extend_from_slice(&high_bits(&q).to_le_bytes());
    push_nibbles(out, &q);
}

pub(super) fn quantize_q5_1(x: &[f32], out: &mut Vec<u8>) {
    let (mn, mx) = x.iter().fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let m = as_stored_f16(mn);
    let d = as_stored_f16((mx - mn) / 31.0);
    let id = inv(d);
    let q: [u8; 32] = std::array::from_fn(|i| code((x[i] - m) * id, 31));
    push_f16(out, d);
    push_f16(out, m);
    out.extend_from_slice(&high_bits(&q).to_le_bytes());
    push_nibbles(out, &q);
}

pub(super) fn quantize_q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = as_stored_f16(amax / 127.0);
    let id = inv(d);
    push_f16(out, d);
    out.extend(x.iter().map(|&v| (v * id).round().clamp(-127.0, 127.0) as i8 as u8));
}
