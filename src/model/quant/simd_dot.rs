//! AVX2 dot products of packed rows with f32 activations (the decode GEMV inner loops).
//!
//! Cost model (why it looks like this): per 8 weights the floor is one int->float conversion
//! and one FMA (both on the two FMA ports). Codes are widened with `vpmovzxbd` straight from
//! memory (one shuffle-port uop per 8 bytes = up to 16 nibbles), block scales are converted
//! 8 at a time and broadcast from memory, and constant offsets (Q4_0's -8, Q4_1's min, the
//! K-quant mins) are applied once per 32-element group through precomputed sums of `x`
//! (`xs[g] = x[32g..32g+32].sum()`), so the vector loop only does codes * x.

use std::arch::x86_64::*;

use super::kquants::scale_min;
use super::simd::hsum;
use super::GgmlType;

#[inline(always)]
unsafe fn rd16(p: *const u8) -> u16 {
    u16::from_le_bytes([*p, *p.add(1)])
}

/// 8 bytes at `p` zero-extended to 8 i32 lanes.
#[inline(always)]
unsafe fn zx8(p: *const u8) -> __m256i {
    _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))
}

/// 8 bytes at `p` sign-extended to 8 i32 lanes, as f32.
#[inline(always)]
unsafe fn sx8(p: *const u8) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)))
}

#[inline(always)]
unsafe fn f(v: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(v)
}

#[inline(always)]
unsafe fn ld(x: *const f32) -> __m256 {
    _mm256_loadu_ps(x)
}

/// f16 fields at `p + i * stride` for i < n (n <= 32), widened to f32; entries from n on are 0.
/// Built in registers (`vpinsrw`), not through a u16 array: narrow stores followed by a wide
/// load would stall on store forwarding once per row.
#[inline(always)]
unsafe fn gather_halves(p: *const u8, stride: usize, n: usize, out: &mut [f32; 32]) {
    let at = |i: usize| if i < n { rd16(p.add(i * stride)) as i16 } else { 0 };
    for k in 0..n.div_ceil(8) {
        let i = 8 * k;
        let h = _mm_setr_epi16(at(i), at(i + 1), at(i + 2), at(i + 3), at(i + 4), at(i + 5), at(i + 6), at(i + 7));
        _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
    }
    for k in n.div_ceil(8)..4 {
        _mm256_storeu_ps(out.as_mut_ptr().add(8 * k), _mm256_setzero_ps());
    }
}

/// `sum_i a[i] * xs[i]` over 32 lanes (`xs` readable for 32 floats; lanes past the blocks are 0 in `a`).
#[inline(always)]
unsafe fn dot32(a: &[f32; 32], xs: *const f32) -> f32 {
    let mut v = _mm256_mul_ps(ld(a.as_ptr()), ld(xs));
    for k in 1..4 {
        v = _mm256_fmadd_ps(ld(a.as_ptr().add(8 * k)), ld(xs.add(8 * k)), v);
    }
    hsum(v)
}

/// 0x10 in lane j where bit (j0 + j) of `qh` is set (the fifth bit of Q5_0/Q5_1 codes).
#[inline(always)]
unsafe fn fifth_bits(qh: __m256i, j0: i32) -> __m256i {
    let sh = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(j0));
    _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(qh, sh), _mm256_set1_epi32(1)), 4)
}

/// Q4_0 / Q4_1 / Q5_0 / Q5_1 over `nb` blocks: value = d * code + offset, where the offset is
/// the stored min (`MIN`) or `-bias * d` (bias 8 for Q4_0, 16 for Q5_0).
#[inline(always)]
unsafe fn dot_nibble_blocks<const MIN: bool, const FIVE: bool>(
    row: *const u8,
    nb: usize,
    x: *const f32,
    xs: *const f32,
) -> f32 {
    let ts = 18 + if MIN { 2 } else { 0 } + if FIVE { 4 } else { 0 };
    let qs_off = ts - 16;
    let bias = if FIVE { 16.0 } else { 8.0 };
    let mask = _mm256_set1_epi32(0x0F);
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut off = 0f32;
    let (mut d, mut m) = ([0f32; 32], [0f32; 32]);
    let mut b0 = 0;
    while b0 < nb {
        let n = (nb - b0).min(32);
        let base = row.add(b0 * ts);
        gather_halves(base, ts, n, &mut d);
        if MIN {
            gather_halves(base.add(2), ts, n, &mut m);
        }
        for (i, di) in d[..n].iter().enumerate() {
            let b = base.add(i * ts);
            let q = b.add(qs_off);
            let xb = x.add((b0 + i) * 32);
            let (w0, w1) = (zx8(q), zx8(q.add(8)));
            let (mut l0, mut l1) = (_mm256_and_si256(w0, mask), _mm256_and_si256(w1, mask));
            let (mut h0, mut h1) = (_mm256_srli_epi32(w0, 4), _mm256_srli_epi32(w1, 4));
            if FIVE {
                let qh = _mm256_set1_epi32(i32::from_le_bytes([
                    *b.add(ts - 20),
                    *b.add(ts - 19),
                    *b.add(ts - 18),
                    *b.add(ts - 17),
                ]));
                l0 = _mm256_or_si256(l0, fifth_bits(qh, 0));
                l1 = _mm256_or_si256(l1, fifth_bits(qh, 8));
                h0 = _mm256_or_si256(h0, fifth_bits(qh, 16));
                h1 = _mm256_or_si256(h1, fifth_bits(qh, 24));
            }
            let mut inner = _mm256_mul_ps(f(l0), ld(xb));
            inner = _mm256_fmadd_ps(f(l1), ld(xb.add(8)), inner);
            inner = _mm256_fmadd_ps(f(h0), ld(xb.add(16)), inner);
            inner = _mm256_fmadd_ps(f(h1), ld(xb.add(24)), inner);
            let dv = _mm256_broadcast_ss(di);
            if i % 2 == 0 {
                acc0 = _mm256_fmadd_ps(dv, inner, acc0);
            } else {
                acc1 = _mm256_fmadd_ps(dv, inner, acc1);
            }
        }
        // Offsets: sum_b offset_b * xs_b (xs is padded, and d, m are 0 past the n blocks).
        off += if MIN { dot32(&m, xs.add(b0)) } else { -bias * dot32(&d, xs.add(b0)) };
        b0 += n;
    }
    hsum(_mm256_add_ps(acc0, acc1)) + off
}

#[inline(always)]
unsafe fn dot_q8_0(row: *const u8, nb: usize, x: *const f32) -> f32 {
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut d = [0f32; 32];
    let mut b0 = 0;
    while b0 < nb {
        let n = (nb - b0).min(32);
        let base = row.add(b0 * 34);
        gather_halves(base, 34, n, &mut d);
        for (i, di) in d[..n].iter().enumerate() {
            let q = base.add(i * 34 + 2);
            let xb = x.add((b0 + i) * 32);
            let mut inner = _mm256_mul_ps(sx8(q.add(0)), ld(xb));
            inner = _mm256_fmadd_ps(sx8(q.add(8)), ld(xb.add(8)), inner);
            inner = _mm256_fmadd_ps(sx8(q.add(16)), ld(xb.add(16)), inner);
            inner = _mm256_fmadd_ps(sx8(q.add(24)), ld(xb.add(24)), inner);
            let dv = _mm256_broadcast_ss(di);
            if i % 2 == 0 {
                acc0 = _mm256_fmadd_ps(dv, inner, acc0);
            } else {
                acc1 = _mm256_fmadd_ps(dv, inner, acc1);
            }
        }
        b0 += n;
    }
    hsum(_mm256_add_ps(acc0, acc1))
}

/// Q4_K (`FIVE` false) / Q5_K (`FIVE` true) over `nb` super-blocks.
#[inline(always)]
unsafe fn dot_q45_k<const FIVE: bool>(row: *const u8, nb: usize, x: *const f32, xs: *const f32) -> f32 {
    let ts = if FIVE { 176 } else { 144 };
    let mask = _mm256_set1_epi32(0x0F);
    let one = _mm256_set1_epi32(1);
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut off = 0f32;
    let mut sc = [0f32; 8];
    for bi in 0..nb {
        let b = row.add(bi * ts);
        let (d, dmin) = (super::f16_to_f32(rd16(b)), super::f16_to_f32(rd16(b.add(2))));
        let scales = std::slice::from_raw_parts(b.add(4), 12);
        for (j, s) in sc.iter_mut().enumerate() {
            let (sj, mj) = scale_min(j, scales);
            *s = d * f32::from(sj);
            off -= dmin * f32::from(mj) * *xs.add(bi * 8 + j);
        }
        let (qh, qs) = if FIVE { (b.add(16), b.add(48)) } else { (b, b.add(16)) };
        let xb = x.add(bi * 256);
        for c in 0..4 {
            let (mut lo_in, mut hi_in) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for k in 0..4 {
                let w = zx8(qs.add(32 * c + 8 * k));
                let (mut lo, mut hi) = (_mm256_and_si256(w, mask), _mm256_srli_epi32(w, 4));
                if FIVE {
                    let h = _mm256_srlv_epi32(zx8(qh.add(8 * k)), _mm256_set1_epi32(2 * c as i32));
                    lo = _mm256_or_si256(lo, _mm256_slli_epi32(_mm256_and_si256(h, one), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 1), one), 4));
                }
                lo_in = _mm256_fmadd_ps(f(lo), ld(xb.add(64 * c + 8 * k)), lo_in);
                hi_in = _mm256_fmadd_ps(f(hi), ld(xb.add(64 * c + 32 + 8 * k)), hi_in);
            }
            acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[2 * c]), lo_in, acc0);
            acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[2 * c + 1]), hi_in, acc1);
        }
    }
    hsum(_mm256_add_ps(acc0, acc1)) + off
}

#[inline(always)]
unsafe fn dot_q6_k(row: *const u8, nb: usize, x: *const f32) -> f32 {
    let (m4, m30, k32) = (_mm256_set1_epi32(0x0F), _mm256_set1_epi32(0x30), _mm256_set1_epi32(32));
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut sc = [0f32; 16];
    for bi in 0..nb {
        let b = row.add(bi * 210);
        let d = super::f16_to_f32(rd16(b.add(208)));
        for (j, s) in sc.iter_mut().enumerate() {
            *s = d * f32::from(*b.add(192 + j) as i8);
        }
        let xb = x.add(bi * 256);
        for h in 0..2 {
            let (ql, qh, xh) = (b.add(64 * h), b.add(128 + 32 * h), xb.add(128 * h));
            // Lanes l = 16g + 8k .. +8 of the four quarters (elements l, l+32, l+64, l+96).
            for g in 0..2 {
                let mut q_in = [_mm256_setzero_ps(); 4];
                for k in 0..2 {
                    let l = 16 * g + 8 * k;
                    let (la, lb, hb) = (zx8(ql.add(l)), zx8(ql.add(l + 32)), zx8(qh.add(l)));
                    let q1 = _mm256_or_si256(_mm256_and_si256(la, m4), _mm256_and_si256(_mm256_slli_epi32(hb, 4), m30));
                    let q2 = _mm256_or_si256(_mm256_and_si256(lb, m4), _mm256_and_si256(_mm256_slli_epi32(hb, 2), m30));
                    let q3 = _mm256_or_si256(_mm256_srli_epi32(la, 4), _mm256_and_si256(hb, m30));
                    let q4 = _mm256_or_si256(_mm256_srli_epi32(lb, 4), _mm256_and_si256(_mm256_srli_epi32(hb, 2), m30));
                    for (qi, (q, acc)) in [q1, q2, q3, q4].into_iter().zip(q_in.iter_mut()).enumerate() {
                        let v = f(_mm256_sub_epi32(q, k32));
                        *acc = _mm256_fmadd_ps(v, ld(xh.add(32 * qi + l)), *acc);
                    }
                }
                // Sub-block of 16 for quarter qi and lanes 16g..16g+16: 8h + g + 2qi.
                for (qi, v) in q_in.iter().enumerate() {
                    let s = _mm256_broadcast_ss(&sc[8 * h + g + 2 * qi]);
                    if qi % 2 == 0 {
                        acc0 = _mm256_fmadd_ps(s, *v, acc0);
                    } else {
                        acc1 = _mm256_fmadd_ps(s, *v, acc1);
                    }
                }
            }
        }
    }
    hsum(_mm256_add_ps(acc0, acc1))
}

/// Sums of `x` over consecutive groups of 32 (`xs.len() == x.len() / 32`).
#[inline(always)]
unsafe fn group_sums(x: &[f32], xs: &mut [f32]) {
    for (s, c) in xs.iter_mut().zip(x.chunks_exact(32)) {
        let p = c.as_ptr();
        let v = _mm256_add_ps(_mm256_add_ps(ld(p), ld(p.add(8))), _mm256_add_ps(ld(p.add(16)), ld(p.add(24))));
        *s = hsum(v);
    }
}

/// One quantized row (not a float type): `nb` whole blocks, `xs` the group sums of `x`.
#[inline(always)]
unsafe fn dot_quant(dtype: GgmlType, row: *const u8, nb: usize, x: *const f32, xs: *const f32) -> f32 {
    match dtype {
        GgmlType::Q4_0 => dot_nibble_blocks::<false, false>(row, nb, x, xs),
        GgmlType::Q4_1 => dot_nibble_blocks::<true, false>(row, nb, x, xs),
        GgmlType::Q5_0 => dot_nibble_blocks::<false, true>(row, nb, x, xs),
        GgmlType::Q5_1 => dot_nibble_blocks::<true, true>(row, nb, x, xs),
        GgmlType::Q8_0 => dot_q8_0(row, nb, x),
        GgmlType::Q4K => dot_q45_k::<false>(row, nb, x, xs),
        GgmlType::Q5K => dot_q45_k::<true>(row, nb, x, xs),
        GgmlType::Q6K => dot_q6_k(row, nb, x),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 0.0,
    }
}

/// `out[r] = row r . x` for rows of `rb` bytes packed back to back in `packed`, `dtype` a
/// quantized type. Only whole blocks that both `x` and each row hold are used.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_rows_quant(dtype: GgmlType, packed: &[u8], rb: usize, x: &[f32], out: &mut [f32]) {
    let nb = (rb / dtype.type_size()).min(x.len() / dtype.block_size());
    let groups = nb * dtype.block_size() / 32;
    // Group sums, zero-padded by 32 so the offset sums may read whole vectors past the end.
    let mut stack = [0f32; 256 + 32];
    let mut heap = Vec::new();
    let xs: &mut [f32] = if groups + 32 <= stack.len() {
        &mut stack[..groups + 32]
    } else {
        heap.resize(groups + 32, 0f32);
        &mut heap
    };
    group_sums(&x[..groups * 32], &mut xs[..groups]);
    for (o, row) in out.iter_mut().zip(packed.chunks_exact(rb.max(1))) {
        *o = dot_quant(dtype, row.as_ptr(), nb, x.as_ptr(), xs.as_ptr());
    }
}
