//! The 256-element "K" super-block formats (reference decoders and quantizers).
//!
//! Layouts (little-endian, `d`/`dmin` are f16):
//! - Q4_K (144 B): d, dmin, scales[12], qs[128]. Eight sub-blocks of 32 with a 6-bit scale `sc`
//!   and a 6-bit min `m` each (packed by [`scale_min`]); x = d*sc*q - dmin*m. Chunk c (64
//!   elements) uses qs[32c..32c+32]: low nibbles = sub-block 2c, high nibbles = sub-block 2c+1.
//! - Q5_K (176 B): d, dmin, scales[12], qh[32], qs[128]; as Q4_K plus a fifth bit: element l of
//!   sub-block 2c has it at bit 2c of qh[l], element l of sub-block 2c+1 at bit 2c+1.
//! - Q6_K (210 B): ql[128], qh[64], scales[16] (i8), d. Sixteen sub-blocks of 16, x = d*sc*(q-32).
//!   Half h (128 elements) uses ql[64h..], qh[32h..]; for l < 32 the four elements
//!   l, l+32, l+64, l+96 take the low nibble of ql[l], low of ql[l+32], high of ql[l], high of
//!   ql[l+32], and bits 0-1, 2-3, 4-5, 6-7 of qh[l] as their top two bits.

use super::float::{as_stored_f16, f32_to_f16, half_at};

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes: entries 0-3 sit in the low
/// 6 bits of bytes 0-3 (scales) and 4-7 (mins); entries 4-7 keep their low 4 bits in bytes
/// 8-11 (scale low nibble, min high nibble) and their top 2 bits in the top bits of bytes 0-7.
#[inline(always)]
pub(super) fn scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0F) | (s[j - 4] >> 6) << 4, (s[j + 4] >> 4) | (s[j] >> 6) << 4)
    }
}

/// Sub-block `j`'s scale and offset, `(d * sc_j, dmin * m_j)`: its values are `scale * q - offset`.
#[inline(always)]
pub(super) fn sub_scale(j: usize, scales: &[u8], d: f32, dmin: f32) -> (f32, f32) {
    let (sc, m) = scale_min(j, scales);
    (d * f32::from(sc), dmin * f32::from(m))
}

pub(super) fn dequantize_q4_k(b: &[u8], y: &mut [f32]) {
    decode_q4_k(b, y, |d, o, q| d * f32::from(q) - o);
}

/// Q4_K's elements as `value(d * sc, dmin * m, q)` of their sub-block's scale and offset (f32)
/// and code: the reference decoder and the GPU staging's twin (`staged`) share the walk.
#[inline(always)]
pub(super) fn decode_q4_k(b: &[u8], y: &mut [f32], value: impl Fn(f32, f32, u8) -> f32) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for c in 0..4 {
        let ((d1, o1), (d2, o2)) = (sub_scale(2 * c, scales, d, dmin), sub_scale(2 * c + 1, scales, d, dmin));
        for l in 0..32 {
            let q = qs[32 * c + l];
            y[64 * c + l] = value(d1, o1, q & 0x0F);
            y[64 * c + 32 + l] = value(d2, o2, q >> 4);
        }
    }
}

pub(super) fn dequantize_q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for c in 0..4 {
        let ((d1, o1), (d2, o2)) = (sub_scale(2 * c, scales, d, dmin), sub_scale(2 * c + 1, scales, d, dmin));
        for l in 0..32 {
            let q = qs[32 * c + l];
            let lo = (q & 0x0F) | ((qh[l] >> (2 * c)) & 1) << 4;
            let hi = (q >> 4) | ((qh[l] >> (2 * c + 1)) & 1) << 4;
            y[64 * c + l] = d1 * f32::from(lo) - o1;
            y[64 * c + 32 + l] = d2 * f32::from(hi) - o2;
        }
    }
}

pub(super) fn dequantize_q6_k(b: &[u8], y: &mut [f32]) {
    decode_q6_k(b, y, |sc, q| sc * q as f32);
}

/// Q6_K's elements as `value(d * sc, q - 32)` of their sub-block's scale (f32) and signed code
/// (as [`decode_q4_k`]).
#[inline(always)]
pub(super) fn decode_q6_k(b: &[u8], y: &mut [f32], value: impl Fn(f32, i32) -> f32) {
    let d = half_at(b, 208);
    let sc = |j: usize| d * f32::from(b[192 + j] as i8);
    for h in 0..2 {
        let (ql, qh) = (&b[64 * h..64 * h + 64], &b[128 + 32 * h..128 + 32 * h + 32]);
        for l in 0..32 {
            let is = 8 * h + l / 16;
            let q1 = (ql[l] & 0x0F) | (qh[l] & 3) << 4;
            let q2 = (ql[l + 32] & 0x0F) | ((qh[l] >> 2) & 3) << 4;
            let q3 = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4;
            let q4 = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4;
            let y = &mut y[128 * h..];
            y[l] = value(sc(is), i32::from(q1) - 32);
            y[l + 32] = value(sc(is + 2), i32::from(q2) - 32);
            y[l + 64] = value(sc(is + 4), i32::from(q3) - 32);
            y[l + 96] = value(sc(is + 6), i32::from(q4) - 32);
        }
    }
}

/// A super-block scale stored as f16, nudged up so that `ceil(v / scale) <= codes` holds for
/// every `v <= max` despite the f16 rounding.
fn stored_scale(max: f32, codes: f32) -> f32 {
    as_stored_f16(max / codes * (1.0 + 1.0 / 512.0))
}

/// Smallest code whose step covers `v` (codes rounded up so no element needs clamping).
fn ceil_code(v: f32, step: f32, max: u8) -> u8 {
    if step == 0.0 {
        return 0;
    }
    (v / step).ceil().clamp(0.0, f32::from(max)) as u8
}

/// Shared by Q4_K (`levels` 15) and Q5_K (31): per sub-block of 32, the min (rounded up to a
/// multiple of dmin) and the scale (rounded up to a multiple of d); then round-to-nearest codes.
/// Returns (d, dmin, scales, mins, codes).
fn quantize_k_affine(x: &[f32], levels: f32) -> (f32, f32, [u8; 8], [u8; 8], [u8; 256]) {
    let mut mins_real = [0f32; 8];
    let mut maxs = [0f32; 8];
    for j in 0..8 {
        let sub = &x[32 * j..32 * j + 32];
        mins_real[j] = -sub.iter().fold(0f32, |m, &v| m.min(v));
        maxs[j] = sub.iter().fold(f32::MIN, |m, &v| m.max(v));
    }
    let dmin = stored_scale(mins_real.iter().fold(0f32, |a, &v| a.max(v)), 63.0);
    let mins: [u8; 8] = std::array::from_fn(|j| ceil_code(mins_real[j], dmin, 63));
    let offs: [f32; 8] = std::array::from_fn(|j| dmin * f32::from(mins[j]));
    let scales_real: [f32; 8] = std::array::from_fn(|j| ((maxs[j] + offs[j]) / levels).max(0.0));
    let d = stored_scale(scales_real.iter().fold(0f32, |a, &v| a.max(v)), 63.0);
    let scales: [u8; 8] = std::array::from_fn(|j| ceil_code(scales_real[j], d, 63));
    let mut q = [0u8; 256];
    for (i, v) in q.iter_mut().enumerate() {
        let step = d * f32::from(scales[i / 32]);
        if step > 0.0 {
            *v = ((x[i] + offs[i / 32]) / step).round().clamp(0.0, levels) as u8;
        }
    }
    (d, dmin, scales, mins, q)
}

/// Packs eight 6-bit scales and mins into the 12 bytes Q4_K/Q5_K store (the inverse of
/// [`scale_min`]); the quantizer's blocks use it too.
pub(crate) fn pack_scale_min(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for i in 0..4 {
        s[i] = (sc[i] & 63) | (sc[i + 4] >> 4) << 6;
        s[i + 4] = (m[i] & 63) | (m[i + 4] >> 4) << 6;
        s[i + 8] = (sc[i + 4] & 0x0F) | (m[i + 4] & 0x0F) << 4;
    }
    s
}

fn push_header(out: &mut Vec<u8>, d: f32, dmin: f32, sc: &[u8; 8], m: &[u8; 8]) {
    out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
    out.extend_from_slice(&f32_to_f16(dmin).to_le_bytes());
    out.extend_from_slice(&pack_scale_min(sc, m));
}

fn push_k_nibbles(out: &mut Vec<u8>, q: &[u8; 256]) {
    for c in 0..4 {
        out.extend((0..32).map(|l| (q[64 * c + l] & 0x0F) | (q[64 * c + 32 + l] & 0x0F) << 4));
    }
}

pub(super) fn quantize_q4_k(x: &[f32], out: &mut Vec<u8>) {
    let (d, dmin, sc, m, q) = quantize_k_affine(x, 15.0);
    push_header(out, d, dmin, &sc, &m);
    push_k_nibbles(out, &q);
}

pub(super) fn quantize_q5_k(x: &[f32], out: &mut Vec<u8>) {
    let (d, dmin, sc, m, q) = quantize_k_affine(x, 31.0);
    push_header(out, d, dmin, &sc, &m);
    let mut qh = [0u8; 32];
    for c in 0..4 {
        for l in 0..32 {
            qh[l] |= ((q[64 * c + l] >> 4) & 1) << (2 * c) | ((q[64 * c + 32 + l] >> 4) & 1) << (2 * c + 1);
        }
    }
    out.extend_from_slice(&qh);
    push_k_nibbles(out, &q);
}

pub(super) fn quantize_q6_k(x: &[f32], out: &mut Vec<u8>) {
    // Symmetric per 16 elements: codes -31..31 (the -32 code stays unused so nothing clamps).
    let scales_real: [f32; 16] =
        std::array::from_fn(|j| x[16 * j..16 * j + 16].iter().fold(0f32, |m, v| m.max(v.abs())) / 31.0);
    let d = stored_scale(scales_real.iter().fold(0f32, |a, &v| a.max(v)), 127.0);
    let sc: [u8; 16] = std::array::from_fn(|j| ceil_code(scales_real[j], d, 127));
    let q: [u8; 256] = std::array::from_fn(|i| {
        let step = d * f32::from(sc[i / 16]);
        let v = if step > 0.0 { (x[i] / step).round().clamp(-32.0, 31.0) } else { 0.0 };
        (v as i32 + 32) as u8
    });
    pack_q6_k(&q, &sc, d, out);
}

/// Writes one Q6_K block: 256 codes `q` (0..64, the value + 32), 16 scale bytes (i8 bits) and
/// the super-block scale `d`. Half h (128 elements): for l < 32 the elements l, l+32, l+64,
/// l+96 take the low nibble of ql[l], low of ql[l+32], high of ql[l], high of ql[l+32]; their
/// top two bits go to qh[l].
pub(crate) fn pack_q6_k(q: &[u8; 256], sc: &[u8; 16], d: f32, out: &mut Vec<u8>) {
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for h in 0..2 {
        for l in 0..32 {
            let e = |k: usize| q[128 * h + l + 32 * k];
            ql[64 * h + l] = (e(0) & 0x0F) | (e(2) & 0x0F) << 4;
            ql[64 * h + l + 32] = (e(1) & 0x0F) | (e(3) & 0x0F) << 4;
            qh[32 * h + l] = (e(0) >> 4) | (e(1) >> 4) << 2 | (e(2) >> 4) << 4 | (e(3) >> 4) << 6;
        }
    }
    out.extend_from_slice(&ql);
    out.extend_from_slice(&qh);
    out.extend_from_slice(sc);
    out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
}
