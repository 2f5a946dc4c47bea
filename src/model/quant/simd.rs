//! AVX2 + FMA + F16C kernels for x86_64 (selected at run time; see `super::simd_available`).
//!
//! Dequantization (used by the prefill tiles) and float-row dot products. Every quantized
//! format is walked block by block and handed to a [`Sink`] as groups of 16 signed 8-bit codes
//! with a scale and an offset (value = scale * code + offset). The quantized dot products of the
//! decode GEMV live in `simd_dot` (tuned separately).
//!
//! All functions here are `unsafe`: they must only run on a CPU with avx2, fma and f16c, and
//! they read whole blocks through raw pointers, within the lengths checked at their entry.

use std::arch::x86_64::*;

use super::kquants::sub_scale;
use super::GgmlType;

/// Receives 16 consecutive elements starting at element `pos` of the current block.
trait Sink {
    /// `OFF`: whether `offset` is non-zero (skips the offset work for symmetric formats).
    unsafe fn g16<const OFF: bool>(&mut self, pos: usize, q: __m128i, scale: f32, offset: f32);
}

#[inline(always)]
unsafe fn half(p: *const u8) -> f32 {
    let bits = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// The 16 codes as two f32 vectors (elements 0-7 and 8-15).
#[inline(always)]
unsafe fn widen(q: __m128i) -> (__m256, __m256) {
    let a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
    let b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
    (a, b)
}

/// Sum of the 8 lanes (shared by every AVX2 kernel of the crate).
#[inline(always)]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

struct DequantSink {
    /// Output of the current block.
    y: *mut f32,
}

impl Sink for DequantSink {
    #[inline(always)]
    unsafe fn g16<const OFF: bool>(&mut self, pos: usize, q: __m128i, scale: f32, offset: f32) {
        let (qa, qb) = widen(q);
        let (s, o) = (_mm256_set1_ps(scale), _mm256_set1_ps(offset));
        let (va, vb) = if OFF {
            (_mm256_fmadd_ps(qa, s, o), _mm256_fmadd_ps(qb, s, o))
        } else {
            (_mm256_mul_ps(qa, s), _mm256_mul_ps(qb, s))
        };
        _mm256_storeu_ps(self.y.add(pos), va);
        _mm256_storeu_ps(self.y.add(pos + 8), vb);
    }
}

#[inline(always)]
unsafe fn load16(p: *const u8) -> __m128i {
    _mm_loadu_si128(p as *const __m128i)
}

/// (low nibbles, high nibbles) of 16 bytes.
#[inline(always)]
unsafe fn nibbles(v: __m128i) -> (__m128i, __m128i) {
    let m4 = _mm_set1_epi8(0x0F);
    (_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4))
}

/// 0x10 in byte i where bit i of `bits` (16 bits) is set: the fifth bit of Q5_0/Q5_1 codes.
#[inline(always)]
unsafe fn bit16_to_0x10(bits: u32) -> __m128i {
    let spread =
        _mm_shuffle_epi8(_mm_cvtsi32_si128(bits as i32), _mm_set_epi8(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
    let sel = _mm_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    let set = _mm_cmpeq_epi8(_mm_and_si128(spread, sel), sel);
    _mm_and_si128(set, _mm_set1_epi8(0x10))
}

/// 0x10 in each byte of `v` whose bit `k` is set (the fifth bit of Q5_K codes).
#[inline(always)]
unsafe fn bit_to_0x10(v: __m128i, k: u32, x10: __m128i) -> __m128i {
    let m = _mm_set1_epi8((1u8 << k) as i8);
    _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(v, m), m), x10)
}

#[inline(always)]
unsafe fn visit_q4_0<S: Sink>(b: *const u8, s: &mut S) {
    let d = half(b);
    let (lo, hi) = nibbles(load16(b.add(2)));
    let eight = _mm_set1_epi8(8);
    s.g16::<false>(0, _mm_sub_epi8(lo, eight), d, 0.0);
    s.g16::<false>(16, _mm_sub_epi8(hi, eight), d, 0.0);
}

#[inline(always)]
unsafe fn visit_q4_1<S: Sink>(b: *const u8, s: &mut S) {
    let (d, m) = (half(b), half(b.add(2)));
    let (lo, hi) = nibbles(load16(b.add(4)));
    s.g16::<true>(0, lo, d, m);
    s.g16::<true>(16, hi, d, m);
}

#[inline(always)]
unsafe fn visit_q5_0<S: Sink>(b: *const u8, s: &mut S) {
    let d = half(b);
    let qh = u32::from_le_bytes([*b.add(2), *b.add(3), *b.add(4), *b.add(5)]);
    let (lo, hi) = nibbles(load16(b.add(6)));
    let sixteen = _mm_set1_epi8(16);
    let lo = _mm_sub_epi8(_mm_or_si128(lo, bit16_to_0x10(qh & 0xFFFF)), sixteen);
    let hi = _mm_sub_epi8(_mm_or_si128(hi, bit16_to_0x10(qh >> 16)), sixteen);
    s.g16::<false>(0, lo, d, 0.0);
    s.g16::<false>(16, hi, d, 0.0);
}

#[inline(always)]
unsafe fn visit_q5_1<S: Sink>(b: *const u8, s: &mut S) {
    let (d, m) = (half(b), half(b.add(2)));
    let qh = u32::from_le_bytes([*b.add(4), *b.add(5), *b.add(6), *b.add(7)]);
    let (lo, hi) = nibbles(load16(b.add(8)));
    s.g16::<true>(0, _mm_or_si128(lo, bit16_to_0x10(qh & 0xFFFF)), d, m);
    s.g16::<true>(16, _mm_or_si128(hi, bit16_to_0x10(qh >> 16)), d, m);
}

#[inline(always)]
unsafe fn visit_q8_0<S: Sink>(b: *const u8, s: &mut S) {
    let d = half(b);
    s.g16::<false>(0, load16(b.add(2)), d, 0.0);
    s.g16::<false>(16, load16(b.add(18)), d, 0.0);
}

/// Q4_K (`FIVE` false) and Q5_K (`FIVE` true): they differ only in the qh plane.
#[inline(always)]
unsafe fn visit_q45_k<S: Sink, const FIVE: bool>(b: *const u8, s: &mut S) {
    let (d, dmin) = (half(b), half(b.add(2)));
    let scales = std::slice::from_raw_parts(b.add(4), 12);
    let (qh, qs) = if FIVE { (b.add(16), b.add(48)) } else { (b, b.add(16)) };
    let (qh_a, qh_b) = if FIVE { (load16(qh), load16(qh.add(16))) } else { (_mm_setzero_si128(), _mm_setzero_si128()) };
    let x10 = _mm_set1_epi8(0x10);
    for c in 0..4 {
        // The offsets negated (a sign flip, exact): the sink takes `d * q + o`.
        let ((d1, o1), (d2, o2)) = (sub_scale(2 * c, scales, d, -dmin), sub_scale(2 * c + 1, scales, d, -dmin));
        let (lo_a, hi_a) = nibbles(load16(qs.add(32 * c)));
        let (lo_b, hi_b) = nibbles(load16(qs.add(32 * c + 16)));
        let (lo_a, lo_b, hi_a, hi_b) = if FIVE {
            // Bit 2c of qh[l] -> fifth bit of the low-nibble element, bit 2c+1 -> the high one.
            let bit = |v, k| bit_to_0x10(v, k, x10);
            let k = 2 * c as u32;
            (
                _mm_or_si128(lo_a, bit(qh_a, k)),
                _mm_or_si128(lo_b, bit(qh_b, k)),
                _mm_or_si128(hi_a, bit(qh_a, k + 1)),
                _mm_or_si128(hi_b, bit(qh_b, k + 1)),
            )
        } else {
            (lo_a, lo_b, hi_a, hi_b)
        };
        s.g16::<true>(64 * c, lo_a, d1, o1);
        s.g16::<true>(64 * c + 16, lo_b, d1, o1);
        s.g16::<true>(64 * c + 32, hi_a, d2, o2);
        s.g16::<true>(64 * c + 48, hi_b, d2, o2);
    }
}

#[inline(always)]
unsafe fn visit_q6_k<S: Sink>(b: *const u8, s: &mut S) {
    let d = half(b.add(208));
    let sc = |j: usize| d * f32::from(*b.add(192 + j) as i8);
    let (m4, m30, k32) = (_mm_set1_epi8(0x0F), _mm_set1_epi8(0x30), _mm_set1_epi8(32));
    for h in 0..2 {
        let (ql, qh) = (b.add(64 * h), b.add(128 + 32 * h));
        for g in 0..2 {
            let la = load16(ql.add(16 * g));
            let lb = load16(ql.add(32 + 16 * g));
            let hb = load16(qh.add(16 * g));
            let q1 = _mm_or_si128(_mm_and_si128(la, m4), _mm_and_si128(_mm_slli_epi16(hb, 4), m30));
            let q2 = _mm_or_si128(_mm_and_si128(lb, m4), _mm_and_si128(_mm_slli_epi16(hb, 2), m30));
            let q3 = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(la, 4), m4), _mm_and_si128(hb, m30));
            let q4 = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(lb, 4), m4), _mm_and_si128(_mm_srli_epi16(hb, 2), m30));
            let (base, is) = (128 * h + 16 * g, 8 * h + g);
            s.g16::<false>(base, _mm_sub_epi8(q1, k32), sc(is), 0.0);
            s.g16::<false>(base + 32, _mm_sub_epi8(q2, k32), sc(is + 2), 0.0);
            s.g16::<false>(base + 64, _mm_sub_epi8(q3, k32), sc(is + 4), 0.0);
            s.g16::<false>(base + 96, _mm_sub_epi8(q4, k32), sc(is + 6), 0.0);
        }
    }
}

/// Calls `visit` for each of the first `n` blocks of `row`, moving the sink along.
macro_rules! for_blocks {
    ($dtype:expr, $row:expr, $n:expr, $sink:expr, $advance:expr) => {{
        let ts = $dtype.type_size();
        let p = $row.as_ptr();
        for i in 0..$n {
            let b = p.add(i * ts);
            match $dtype {
                GgmlType::Q4_0 => visit_q4_0(b, $sink),
                GgmlType::Q4_1 => visit_q4_1(b, $sink),
                GgmlType::Q5_0 => visit_q5_0(b, $sink),
                GgmlType::Q5_1 => visit_q5_1(b, $sink),
                GgmlType::Q8_0 => visit_q8_0(b, $sink),
                GgmlType::Q4K => visit_q45_k::<_, false>(b, $sink),
                GgmlType::Q5K => visit_q45_k::<_, true>(b, $sink),
                GgmlType::Q6K => visit_q6_k(b, $sink),
                GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {}
            }
            $advance;
        }
    }};
}

/// Loads 8 elements of a float row (`F32`, `F16` or `BF16`) starting at element `i`.
#[inline(always)]
unsafe fn load8(dtype: GgmlType, p: *const u8, i: usize) -> __m256 {
    match dtype {
        GgmlType::F16 => _mm256_cvtph_ps(load16(p.add(2 * i))),
        GgmlType::BF16 => {
            let w = _mm256_cvtepu16_epi32(load16(p.add(2 * i)));
            _mm256_castsi256_ps(_mm256_slli_epi32(w, 16))
        }
        _ => _mm256_loadu_ps(p.add(4 * i) as *const f32),
    }
}

/// Dot product of a float row (`F32`, `F16` or `BF16`) with `x`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_float(dtype: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    let n = x.len().min(row.len() / dtype.type_size());
    let (p, xp) = (row.as_ptr(), x.as_ptr());
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i + 16 <= n {
        a0 = _mm256_fmadd_ps(load8(dtype, p, i), _mm256_loadu_ps(xp.add(i)), a0);
        a1 = _mm256_fmadd_ps(load8(dtype, p, i + 8), _mm256_loadu_ps(xp.add(i + 8)), a1);
        i += 16;
    }
    if i + 8 <= n {
        a0 = _mm256_fmadd_ps(load8(dtype, p, i), _mm256_loadu_ps(xp.add(i)), a0);
        i += 8;
    }
    let mut tail = [0f32; 8];
    super::dequantize_row_scalar(dtype, &row[i * dtype.type_size()..n * dtype.type_size()], &mut tail[..n - i]);
    let rest: f32 = tail[..n - i].iter().zip(&x[i..n]).map(|(a, b)| a * b).sum();
    hsum(_mm256_add_ps(a0, a1)) + rest
}

/// AVX2 [`super::dequantize_row`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dequantize_row(dtype: GgmlType, src: &[u8], dst: &mut [f32]) {
    if matches!(dtype, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        let n = dst.len().min(src.len() / dtype.type_size());
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), load8(dtype, src.as_ptr(), i));
            i += 8;
        }
        let ts = dtype.type_size();
        super::dequantize_row_scalar(dtype, &src[i * ts..n * ts], &mut dst[i..n]);
        return;
    }
    let bs = dtype.block_size();
    let n = (src.len() / dtype.type_size()).min(dst.len() / bs);
    let mut s = DequantSink { y: dst.as_mut_ptr() };
    for_blocks!(dtype, src, n, &mut s, s.y = s.y.add(bs));
}
