//! Scalar conversions between f32 and the 16-bit float formats of GGUF files.

/// Largest finite f16 value; larger magnitudes are clamped to it (never turned into inf).
/// The one F16 range rule: `f32_to_f16`, the counted `f32_to_f16_clamped` (GPU weights) and
/// the conversion policy (`model::convert::f16_policy`) all clamp here.
pub const F16_MAX: f32 = 65504.0;

pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// f32 -> f16 bits, round-to-nearest-even, clamped to ±65504 (NaN stays NaN).
pub fn f32_to_f16(v: f32) -> u16 {
    half::f16::from_f32(v.clamp(-F16_MAX, F16_MAX)).to_bits()
}

/// As [`f32_to_f16`], counting the values (infinities included) that were clamped.
pub fn f32_to_f16_clamped(v: f32, clamped: &mut u64) -> u16 {
    *clamped += u64::from(v.abs() > F16_MAX);
    f32_to_f16(v)
}

pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// f32 -> bf16 bits, round-to-nearest-even on the 16 dropped mantissa bits (NaN stays a quiet NaN).
pub fn f32_to_bf16(v: f32) -> u16 {
    let b = v.to_bits();
    if v.is_nan() {
        return ((b >> 16) as u16) | 0x0040;
    }
    let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1));
    (rounded >> 16) as u16
}

/// An f16 field of a block (little-endian bytes at `at`) as f32.
#[inline(always)]
pub(super) fn half_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// `v` after a round trip through f16: what a decoder will see for a stored scale.
#[inline]
pub(super) fn as_stored_f16(v: f32) -> f32 {
    f16_to_f32(f32_to_f16(v))
}
