//! Small-batch matrix products on the packed rows: `n_tok <= MAX_T` tokens (decode, batched
//! decode of several slots). Each weight block is read and widened once and used for every
//! token, so 8 slots cost far less than 8 single-token steps.
//!
//! Paths, picked at run time:
//! - AVX-512 (avx512f + f16c + fma detected) for Q4_0 / Q4_1 / Q8_0: the block's 32 codes are
//!   widened to two 16-lane f32 vectors of dequantized weights (`d * q + m`) held in registers
//!   and FMA'd against each token's activations (two accumulators per token: no FMA chain
//!   longer than one per block).
//! - Otherwise, one token: `quant::dot_rows` (the tuned AVX2 / portable row dots).
//! - Otherwise, several tokens: each row is dequantized into an L1-resident f32 buffer
//!   (`quant::dequantize_row`) and dotted with every token (AVX2 when present).
//!
//! Activations and accumulation stay f32 in every path.

use crate::model::quant::{self, GgmlType};
use crate::model::weights::Tensor;

/// Most tokens handled by the register kernels (2 accumulators per token = 16 zmm registers).
pub const MAX_T: usize = 8;

/// Destination of a row range: element (token t, row r) lives at `ptr + t * ld + r`.
#[derive(Clone, Copy)]
pub(super) struct OutPtr {
    pub ptr: *mut f32,
    pub ld: usize,
}

// SAFETY: an OutPtr is handed to parallel tasks that write disjoint row ranges of one buffer
// that outlives the parallel region (see `matmul::matmul_fused`); no two tasks touch one cell.
unsafe impl Send for OutPtr {}
// SAFETY: as above, shared references only carry the pointer to tasks with disjoint rows.
unsafe impl Sync for OutPtr {}

/// True when the AVX-512 kernels can run (checked once by std, cached).
#[inline]
pub(super) fn avx512_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("f16c") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Rows `r0..r0 + nr` of `w` times the `n_tok` (1..=MAX_T) tokens of `x` (`[n_tok, w.cols]`).
///
/// # Safety
/// `out.ptr + t * out.ld + r` must be valid for writes for `t < n_tok`, `r0 <= r < r0 + nr`, and
/// no other thread may access those cells during the call.
pub(super) unsafe fn rows_multi(w: &Tensor, r0: usize, nr: usize, x: &[f32], n_tok: usize, out: OutPtr) {
    let cols = w.cols;
    debug_assert!((1..=MAX_T).contains(&n_tok) && x.len() >= n_tok * cols && r0 + nr <= w.rows);
    let rb = w.row_bytes();
    let packed = &w.bytes()[r0 * rb..(r0 + nr) * rb];
    #[cfg(target_arch = "x86_64")]
    if matches!(w.dtype, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0) && avx512_available() {
        // SAFETY: the features were detected just above; the caller vouches for `out`.
        unsafe { avx512::rows(w.dtype, packed, nr, cols, x, n_tok, out.ptr.add(r0), out.ld) };
        return;
    }
    if n_tok == 1 {
        // SAFETY: the caller guarantees the `nr` cells from `out.ptr + r0` are ours.
        let o = unsafe { std::slice::from_raw_parts_mut(out.ptr.add(r0), nr) };
        quant::dot_rows(w.dtype, packed, &x[..cols], o);
        return;
    }
    // Generic: one row at a time through an f32 buffer that stays in L1.
    let mut buf = vec![0f32; cols];
    let mut dots = [0f32; MAX_T];
    for r in 0..nr {
        quant::dequantize_row(w.dtype, &packed[r * rb..(r + 1) * rb], &mut buf);
        dense_multi(&buf, x, n_tok, &mut dots);
        for (t, &d) in dots[..n_tok].iter().enumerate() {
            // SAFETY: (t, r0 + r) is inside the caller's range.
            unsafe { *out.ptr.add(t * out.ld + r0 + r) = d };
        }
    }
}

/// `dots[t] = w . x[t]` for `t < n_tok` (`x` is `[n_tok, w.len()]`).
fn dense_multi(w: &[f32], x: &[f32], n_tok: usize, dots: &mut [f32; MAX_T]) {
    #[cfg(target_arch = "x86_64")]
    if quant::simd_available() {
        for (t, d) in dots[..n_tok].iter_mut().enumerate() {
            // SAFETY: avx2 and fma were detected at run time (quant::simd_available).
            *d = unsafe { dense_dot_avx2(w, &x[t * w.len()..(t + 1) * w.len()]) };
        }
        return;
    }
    for (t, d) in dots[..n_tok].iter_mut().enumerate() {
        let xt = &x[t * w.len()..(t + 1) * w.len()];
        let mut acc = [0f32; 8];
        for (a, b) in w.chunks_exact(8).zip(xt.chunks_exact(8)) {
            for l in 0..8 {
                acc[l] += a[l] * b[l];
            }
        }
        let whole = w.len() / 8 * 8;
        let tail: f32 = w[whole..].iter().zip(&xt[whole..]).map(|(a, b)| a * b).sum();
        *d = acc.iter().sum::<f32>() + tail;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dense_dot_avx2(w: &[f32], x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = w.len().min(x.len());
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i + 16 <= n {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(i)), _mm256_loadu_ps(xp.add(i)), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(i + 8)), _mm256_loadu_ps(xp.add(i + 8)), a1);
        i += 16;
    }
    let v = _mm256_add_ps(a0, a1);
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    let tail: f32 = w[i..n].iter().zip(&x[i..n]).map(|(a, b)| a * b).sum();
    _mm_cvtss_f32(s) + tail
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use crate::model::quant::GgmlType;

    /// f16 at `p` as f32 (F16C scalar conversion).
    #[inline(always)]
    unsafe fn half(p: *const u8) -> f32 {
        let bits = u16::from_le_bytes([*p, *p.add(1)]);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
    }

    /// The 32 dequantized weights of block `b` as (elements 0..16, elements 16..32).
    #[inline(always)]
    unsafe fn block<const TYPE: u8>(b: *const u8) -> (__m512, __m512) {
        match TYPE {
            // Q4_0: d, qs[16]; w = d * (q - 8); element j = low nibble of qs[j], j + 16 = high.
            0 => {
                let d = half(b);
                let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(b.add(2) as *const __m128i));
                let (dv, ov) = (_mm512_set1_ps(d), _mm512_set1_ps(-8.0 * d));
                let lo = _mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(0x0F)));
                let hi = _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(q));
                (_mm512_fmadd_ps(lo, dv, ov), _mm512_fmadd_ps(hi, dv, ov))
            }
            // Q4_1: d, m, qs[16]; w = d * q + m.
            1 => {
                let (d, m) = (half(b), half(b.add(2)));
                let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(b.add(4) as *const __m128i));
                let (dv, mv) = (_mm512_set1_ps(d), _mm512_set1_ps(m));
                let lo = _mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(0x0F)));
                let hi = _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(q));
                (_mm512_fmadd_ps(lo, dv, mv), _mm512_fmadd_ps(hi, dv, mv))
            }
            // Q8_0: d, qs[32] (i8); w = d * q.
            _ => {
                let dv = _mm512_set1_ps(half(b));
                let q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(2) as *const __m128i));
                let q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(18) as *const __m128i));
                (_mm512_mul_ps(_mm512_cvtepi32_ps(q0), dv), _mm512_mul_ps(_mm512_cvtepi32_ps(q1), dv))
            }
        }
    }

    /// `nr` rows of `nb` blocks (`ts` bytes each) times `T` tokens of `x` (row stride `ldx`),
    /// written to `out[t * ldo + r]`.
    #[target_feature(enable = "avx512f,f16c,fma")]
    unsafe fn rows_t<const TYPE: u8, const T: usize>(
        packed: *const u8,
        nr: usize,
        nb: usize,
        ts: usize,
        x: *const f32,
        ldx: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        for r in 0..nr {
            let row = packed.add(r * nb * ts);
            // acc[0..2]: even blocks (lo, hi halves); acc[2..4]: odd blocks when few tokens, so
            // the FMA chains are long enough apart to hide the FMA latency.
            let split = T <= 4;
            let mut acc = [[_mm512_setzero_ps(); T]; 4];
            // Unrolled by two blocks so the accumulator set is a compile-time index.
            macro_rules! step {
                ($bi:expr, $s:expr) => {{
                    let (w0, w1) = block::<TYPE>(row.add($bi * ts));
                    let xb = x.add($bi * 32);
                    let s = $s;
                    for t in 0..T {
                        let xt = xb.add(t * ldx);
                        acc[s][t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xt), acc[s][t]);
                        acc[s + 1][t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xt.add(16)), acc[s + 1][t]);
                    }
                }};
            }
            let mut bi = 0;
            while bi + 2 <= nb {
                step!(bi, 0);
                step!(bi + 1, if split { 2 } else { 0 });
                bi += 2;
            }
            if bi < nb {
                step!(bi, 0);
            }
            for t in 0..T {
                let v = _mm512_add_ps(_mm512_add_ps(acc[0][t], acc[1][t]), _mm512_add_ps(acc[2][t], acc[3][t]));
                *out.add(t * ldo + r) = _mm512_reduce_add_ps(v);
            }
        }
    }

    /// Dispatch on (type, token count). Only Q4_0 / Q4_1 / Q8_0 reach here.
    ///
    /// # Safety
    /// avx512f, f16c and fma must be available; `packed` holds `nr` rows of `cols` elements,
    /// `x` holds `n_tok` rows of `cols`, `out[t * ldo + r]` is writable for `t < n_tok, r < nr`.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn rows(dtype: GgmlType, packed: &[u8], nr: usize, cols: usize, x: &[f32], n_tok: usize, out: *mut f32, ldo: usize) {
        let nb = cols / 32;
        let ts = dtype.type_size();
        assert!(packed.len() >= nr * nb * ts && x.len() >= n_tok * cols);
        let (p, xp) = (packed.as_ptr(), x.as_ptr());
        macro_rules! go {
            ($ty:literal) => {
                match n_tok {
                    1 => rows_t::<$ty, 1>(p, nr, nb, ts, xp, cols, out, ldo),
                    2 => rows_t::<$ty, 2>(p, nr, nb, ts, xp, cols, out, ldo),
                    3 => rows_t::<$ty, 3>(p, nr, nb, ts, xp, cols, out, ldo),
                    4 => rows_t::<$ty, 4>(p, nr, nb, ts, xp, cols, out, ldo),
                    5 => rows_t::<$ty, 5>(p, nr, nb, ts, xp, cols, out, ldo),
                    6 => rows_t::<$ty, 6>(p, nr, nb, ts, xp, cols, out, ldo),
                    7 => rows_t::<$ty, 7>(p, nr, nb, ts, xp, cols, out, ldo),
                    _ => rows_t::<$ty, 8>(p, nr, nb, ts, xp, cols, out, ldo),
                }
            };
        }
        match dtype {
            GgmlType::Q4_0 => go!(0),
            GgmlType::Q4_1 => go!(1),
            _ => go!(2),
        }
    }
}
