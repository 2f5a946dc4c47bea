//! AVX2 + FMA matrix-vector products on the packed blocks for a few tokens (decode and batched
//! decode): `out[t, r] = row r . x[t]` for `T <= 8` tokens, each block widened to f32 in
//! registers once and used for every token. No row is expanded to memory first.
//!
//! Bitwise contract (why the loop looks like this): every weight is computed exactly as
//! `simd::dequantize_row` stores it (the same single-rounding `d * q` or `fma(q, d, m)`), and
//! each (row, token) pair has one 8-lane accumulator fed 8 columns at a time in column order,
//! reduced with `hsum`. That is the order of the tiled AVX2 GEMM of the prefill
//! (`backend::cpu::matmul`), so a token's result does not depend on how many tokens share its
//! step. One accumulator chain per pair is latency-bound (4-5 cycles per FMA), so `R` rows run
//! together to give the core `R * T` independent chains.
//!
//! Port budget per 8 weights (T = 1): one int->float conversion, the dequantizing multiply or
//! FMA, the dot FMA (p0/p1), plus a mask or shift (p0/p1/p5) and a `vpmovzxbd` load (p5):
//! about 1.5-2 cycles, against ~4 when a row is first dequantized and dotted in one chain.

use std::arch::x86_64::*;

use super::kquants::scale_min;
use super::simd::hsum;
use super::GgmlType;

/// One GGML block format as the GEMV walks it: scales prepared once per (row, block), then the
/// block's weights as 8-lane vectors in column order.
trait Fmt {
    /// Weights and bytes per block.
    const BS: usize;
    const TS: usize;
    type Sc: Copy;
    /// `tab`: the f16 -> f32 table ([`f16_table`]).
    unsafe fn scales(b: *const u8, tab: *const f32) -> Self::Sc;
    /// Weights `32g .. 32g + 32` of the block at `b` as four 8-lane vectors in column order,
    /// bitwise as `simd::dequantize_row` writes them. (Groups of 32, not 8: a nibble byte
    /// holds two weights 16 apart, and one widened load serves both.)
    unsafe fn w32(b: *const u8, sc: &Self::Sc, g: usize) -> [__m256; 4];
}

/// Every f16 bit pattern as f32 (256 KiB, stays in L2). A block scale is then a 16-bit load and
/// a broadcast *from memory* (load ports only): converting it in registers (`vmovd`,
/// `vcvtph2ps`, `vbroadcastss` from a register) put three uops per scale on port 5, which the
/// code widening already keeps busy, and was the bottleneck of the 4-bit formats.
static F16_TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();

#[target_feature(enable = "avx2,f16c")]
unsafe fn build_f16_table() -> Vec<f32> {
    let mut t = vec![0f32; 1 << 16];
    for (i, c) in t.chunks_exact_mut(8).enumerate() {
        let b = (8 * i) as i16;
        let h = _mm_setr_epi16(b, b + 1, b + 2, b + 3, b + 4, b + 5, b + 6, b + 7);
        // The same conversion `simd::half` does (F16C), so the table is bitwise the same.
        _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
    }
    t
}

/// # Safety
/// f16c must be available.
#[inline(always)]
unsafe fn f16_table() -> *const f32 {
    F16_TABLE.get_or_init(|| build_f16_table()).as_ptr()
}

/// The table entry of the f16 at `p` (a pointer, so the kernels broadcast it from memory).
#[inline(always)]
unsafe fn half_at(p: *const u8, tab: *const f32) -> *const f32 {
    tab.add(usize::from(u16::from_le_bytes([*p, *p.add(1)])))
}

#[inline(always)]
unsafe fn half(p: *const u8, tab: *const f32) -> f32 {
    *half_at(p, tab)
}

#[inline(always)]
unsafe fn bcast(p: *const f32) -> __m256 {
    _mm256_broadcast_ss(&*p)
}

/// 8 bytes at `p` zero-extended to 8 i32 lanes.
#[inline(always)]
unsafe fn zx8(p: *const u8) -> __m256i {
    _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))
}

/// Low (`hi == false`) or high nibbles of the 8 bytes at `p`, as i32 lanes.
#[inline(always)]
unsafe fn nib8(p: *const u8, hi: bool) -> __m256i {
    let v = zx8(p);
    if hi {
        _mm256_srli_epi32(v, 4)
    } else {
        _mm256_and_si256(v, _mm256_set1_epi32(0x0F))
    }
}

/// 0x10 in lane i where bit `first + i` of `qh` is set (the fifth bit of Q5_0 / Q5_1 codes).
#[inline(always)]
unsafe fn fifth8(qh: u32, first: u32) -> __m256i {
    let v = _mm256_set1_epi32((qh >> first) as i32);
    let bit = _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), _mm256_set1_epi32(1));
    _mm256_slli_epi32(bit, 4)
}

#[inline(always)]
unsafe fn cvt(v: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(v)
}

/// `[e(0), e(1), e(2), e(3)]` written out (closures through `array::map` / `from_fn` are not
/// always inlined into the `target_feature` caller; a non-inlined one calls every intrinsic).
macro_rules! four {
    (|$k:ident| $e:expr) => {
        [
            {
                let $k = 0usize;
                $e
            },
            {
                let $k = 1usize;
                $e
            },
            {
                let $k = 2usize;
                $e
            },
            {
                let $k = 3usize;
                $e
            },
        ]
    };
}

/// The 32 codes of a nibble block as four i32 vectors in element order: element j < 16 is the
/// low nibble of `qs[j]`, element 16 + j its high nibble.
#[inline(always)]
unsafe fn legacy_nibs(qs: *const u8) -> [__m256i; 4] {
    let (a, b) = (zx8(qs), zx8(qs.add(8)));
    let m = _mm256_set1_epi32(0x0F);
    [_mm256_and_si256(a, m), _mm256_and_si256(b, m), _mm256_srli_epi32(a, 4), _mm256_srli_epi32(b, 4)]
}

/// Q4_0 (`EIGHT` false) and Q8_0: one F16 scale `d` per block of 32, weights `d * q` (Q4_0's
/// codes are nibbles offset by 8, Q8_0's signed bytes).
struct Q4Q8_0<const EIGHT: bool>;
impl<const EIGHT: bool> Fmt for Q4Q8_0<EIGHT> {
    const BS: usize = 32;
    const TS: usize = if EIGHT { 34 } else { 18 };
    type Sc = *const f32;
    #[inline(always)]
    unsafe fn scales(b: *const u8, tab: *const f32) -> *const f32 {
        half_at(b, tab)
    }
    #[inline(always)]
    unsafe fn w32(b: *const u8, d: &*const f32, _g: usize) -> [__m256; 4] {
        let d = bcast(*d);
        if EIGHT {
            four!(|j| {
                let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.add(2 + 8 * j) as *const __m128i));
                _mm256_mul_ps(cvt(q), d)
            })
        } else {
            let (q, eight) = (legacy_nibs(b.add(2)), _mm256_set1_epi32(8));
            four!(|j| _mm256_mul_ps(cvt(_mm256_sub_epi32(q[j], eight)), d))
        }
    }
}

struct Q4_1;
impl Fmt for Q4_1 {
    const BS: usize = 32;
    const TS: usize = 20;
    type Sc = (*const f32, *const f32);
    #[inline(always)]
    unsafe fn scales(b: *const u8, tab: *const f32) -> (*const f32, *const f32) {
        (half_at(b, tab), half_at(b.add(2), tab))
    }
    #[inline(always)]
    unsafe fn w32(b: *const u8, &(d, m): &(*const f32, *const f32), _g: usize) -> [__m256; 4] {
        let (d, m) = (bcast(d), bcast(m));
        let q = legacy_nibs(b.add(4));
        four!(|j| _mm256_fmadd_ps(cvt(q[j]), d, m))
    }
}

struct Q5_0;
impl Fmt for Q5_0 {
    const BS: usize = 32;
    const TS: usize = 22;
    type Sc = (*const f32, u32);
    #[inline(always)]
    unsafe fn scales(b: *const u8, tab: *const f32) -> (*const f32, u32) {
        (half_at(b, tab), u32::from_le_bytes([*b.add(2), *b.add(3), *b.add(4), *b.add(5)]))
    }
    #[inline(always)]
    unsafe fn w32(b: *const u8, &(d, qh): &(*const f32, u32), _g: usize) -> [__m256; 4] {
        let (q, sixteen, d) = (legacy_nibs(b.add(6)), _mm256_set1_epi32(16), bcast(d));
        four!(|j| {
            let q = _mm256_or_si256(q[j], fifth8(qh, 8 * j as u32));
            _mm256_mul_ps(cvt(_mm256_sub_epi32(q, sixteen)), d)
        })
    }
}

struct Q5_1;
impl Fmt for Q5_1 {
    const BS: usize = 32;
    const TS: usize = 24;
    type Sc = (*const f32, *const f32, u32);
    #[inline(always)]
    unsafe fn scales(b: *const u8, tab: *const f32) -> (*const f32, *const f32, u32) {
        (half_at(b, tab), half_at(b.add(2), tab), u32::from_le_bytes([*b.add(4), *b.add(5), *b.add(6), *b.add(7)]))
    }
    #[inline(always)]
    unsafe fn w32(b: *const u8, &(d, m, qh): &(*const f32, *const f32, u32), _g: usize) -> [__m256; 4] {
        let (q, d, m) = (legacy_nibs(b.add(8)), bcast(d), bcast(m));
        four!(|j| _mm256_fmadd_ps(cvt(_mm256_or_si256(q[j], fifth8(qh, 8 * j as u32))), d, m))
    }
}

/// Q4_K (`FIVE` false) and Q5_K: 8 sub-blocks of 32 with a scale and an offset each
/// (`sc[s] = d * scale_s`, `off[s] = -dmin * min_s`, as `simd::visit_q45_k` computes them).
struct Q45K<const FIVE: bool>;
impl<const FIVE: bool> Fmt for Q45K<FIVE> {
    const BS: usize = 256;
    const TS: usize = if FIVE { 176 } else { 144 };
    type Sc = ([f32; 8], [f32; 8]);
    #[inline(always)]
    unsafe fn scales(b: *const u8, tab: *const f32) -> ([f32; 8], [f32; 8]) {
        let (d, dmin) = (half(b, tab), half(b.add(2), tab));
        let scales = std::slice::from_raw_parts(b.add(4), 12);
        let mut sc = ([0f32; 8], [0f32; 8]);
        for s in 0..8 {
            let (sj, mj) = scale_min(s, scales);
            sc.0[s] = d * f32::from(sj);
            sc.1[s] = -dmin * f32::from(mj);
        }
        sc
    }
    #[inline(always)]
    unsafe fn w32(b: *const u8, sc: &([f32; 8], [f32; 8]), g: usize) -> [__m256; 4] {
        // Sub-block g = elements 32g .. 32g + 32: for g = 2c the low nibbles of
        // qs[32c..32c + 32], for g = 2c + 1 their high nibbles. `l` is the byte (and qh) index.
        let (c, hi) = (g / 2, g % 2 == 1);
        let qs = b.add(if FIVE { 48 } else { 16 });
        let (d, m) = (_mm256_set1_ps(sc.0[g]), _mm256_set1_ps(sc.1[g]));
        four!(|k| {
            let l = 8 * k;
            let mut q = nib8(qs.add(32 * c + l), hi);
            if FIVE {
                // Bit g of qh[l] is the fifth bit (2c for the low nibble, 2c + 1 the high one).
                let h = _mm256_srlv_epi32(zx8(b.add(16 + l)), _mm256_set1_epi32(g as i32));
                q = _mm256_or_si256(q, _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(1)), 4));
            }
            _mm256_fmadd_ps(cvt(q), d, m)
        })
    }
}

/// Q6_K: 16 sub-blocks of 16, `sc[s] = d * scale_s`; codes from 4 low bits (ql) + 2 high (qh).
struct Q6K;
impl Fmt for Q6K {
    const BS: usize = 256;
    const TS: usize = 210;
    type Sc = [f32; 16];
    #[inline(always)]
    unsafe fn scales(b: *const u8, tab: *const f32) -> [f32; 16] {
        let d = half(b.add(208), tab);
        std::array::from_fn(|s| d * f32::from(*b.add(192 + s) as i8))
    }
    #[inline(always)]
    unsafe fn w32(b: *const u8, sc: &[f32; 16], g: usize) -> [__m256; 4] {
        // Half h (128 elements) = 4 quarters qi of 32 (g = 4h + qi); element 128h + 32qi + l
        // comes from ql[64h + 32(qi % 2) + l] (low nibble for qi < 2) and bits 2qi.. of
        // qh[32h + l]; its scale is sub-block 8h + l / 16 + 2qi.
        let (h, qi) = (g / 4, g % 4);
        four!(|k| {
            let l = 8 * k;
            let lo = nib8(b.add(64 * h + 32 * (qi % 2) + l), qi >= 2);
            let hb = _mm256_srlv_epi32(zx8(b.add(128 + 32 * h + l)), _mm256_set1_epi32(2 * qi as i32));
            let q = _mm256_or_si256(lo, _mm256_slli_epi32(_mm256_and_si256(hb, _mm256_set1_epi32(3)), 4));
            let s = 8 * h + l / 16 + 2 * qi;
            _mm256_mul_ps(cvt(_mm256_sub_epi32(q, _mm256_set1_epi32(32))), _mm256_set1_ps(sc[s]))
        })
    }
}

/// Software prefetch distance in bytes (as the AVX-512 GEMV of `backend::cpu::gemv`).
const PREFETCH: usize = 1024;

/// `R` rows (stride `rb` bytes from `rows`) of `nb` blocks times `T` tokens of `x` (stride
/// `ldx` floats), written to `out[t * ldo + r]`.
#[inline(always)]
unsafe fn rows_rt<F: Fmt, const R: usize, const T: usize>(
    rows: *const u8,
    rb: usize,
    nb: usize,
    x: *const f32,
    ldx: usize,
    out: *mut f32,
    ldo: usize,
) {
    let tab = f16_table();
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    for bi in 0..nb {
        // Software prefetch PREFETCH bytes ahead in each row (a decode streams the weights from
        // DRAM; the hardware streamer stops at 4 KiB pages and ramps up slowly on short runs).
        // Small blocks: one line every other block; prefetches past the end never fault.
        if F::TS >= 64 || bi % 2 == 0 {
            for r in 0..R {
                let ahead = rows.wrapping_add(r * rb + bi * F::TS + PREFETCH);
                let mut off = 0;
                while off < F::TS {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off) as *const i8);
                    off += 64;
                }
            }
        }
        let sc: [F::Sc; R] = std::array::from_fn(|r| F::scales(rows.add(r * rb + bi * F::TS), tab));
        let xb = x.add(bi * F::BS);
        for g in 0..F::BS / 32 {
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let w = F::w32(rows.add(r * rb + bi * F::TS), &sc[r], g);
                for (k, wk) in w.iter().enumerate() {
                    for (t, a) in acc_r.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(*wk, _mm256_loadu_ps(xb.add(t * ldx + 32 * g + 8 * k)), *a);
                    }
                }
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (t, a) in acc_r.iter().enumerate() {
            *out.add(t * ldo + r) = hsum(*a);
        }
    }
}

/// All `nr` rows for `T` tokens: groups of `R` rows (`R * T <= 8` accumulators), the rest one
/// row at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_t<F: Fmt, const R: usize, const T: usize>(
    packed: *const u8,
    rb: usize,
    nr: usize,
    nb: usize,
    x: *const f32,
    ldx: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut r = 0;
    while r + R <= nr {
        rows_rt::<F, R, T>(packed.add(r * rb), rb, nb, x, ldx, out.add(r), ldo);
        r += R;
    }
    while r < nr {
        rows_rt::<F, 1, T>(packed.add(r * rb), rb, nb, x, ldx, out.add(r), ldo);
        r += 1;
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_fmt<F: Fmt>(
    packed: *const u8,
    rb: usize,
    nr: usize,
    nb: usize,
    x: *const f32,
    n_tok: usize,
    out: *mut f32,
    ldo: usize,
) {
    let ldx = nb * F::BS;
    match n_tok {
        1 => rows_t::<F, 4, 1>(packed, rb, nr, nb, x, ldx, out, ldo),
        2 => rows_t::<F, 4, 2>(packed, rb, nr, nb, x, ldx, out, ldo),
        3 => rows_t::<F, 2, 3>(packed, rb, nr, nb, x, ldx, out, ldo),
        4 => rows_t::<F, 2, 4>(packed, rb, nr, nb, x, ldx, out, ldo),
        5 => rows_t::<F, 1, 5>(packed, rb, nr, nb, x, ldx, out, ldo),
        6 => rows_t::<F, 1, 6>(packed, rb, nr, nb, x, ldx, out, ldo),
        7 => rows_t::<F, 1, 7>(packed, rb, nr, nb, x, ldx, out, ldo),
        _ => rows_t::<F, 1, 8>(packed, rb, nr, nb, x, ldx, out, ldo),
    }
}

/// Most tokens per call.
pub(crate) const GEMV_MAX_T: usize = 8;

/// Whether [`gemv_rows`] handles `dtype` (the quantized block formats).
pub(crate) fn gemv_supports(dtype: GgmlType) -> bool {
    !matches!(dtype, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// `out[t * ldo + r] = row r . x[t]` for the `nr` rows of `cols` elements packed back to back in
/// `packed` and `n_tok` (1..=8) tokens of `x` (`[n_tok, cols]`).
///
/// # Safety
/// avx2, fma and f16c must be available; `gemv_supports(dtype)`; `cols` a whole number of
/// blocks; `out[t * ldo + r]` writable for `t < n_tok`, `r < nr`. Lengths of `packed` and `x`
/// are checked (a short buffer panics rather than reading out of bounds).
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemv_rows(
    dtype: GgmlType,
    packed: &[u8],
    nr: usize,
    cols: usize,
    x: &[f32],
    n_tok: usize,
    out: *mut f32,
    ldo: usize,
) {
    let nb = cols / dtype.block_size();
    let rb = nb * dtype.type_size();
    assert!(
        (1..=GEMV_MAX_T).contains(&n_tok)
            && cols.is_multiple_of(dtype.block_size())
            && packed.len() >= nr * rb
            && x.len() >= n_tok * cols,
        "gemv_rows {dtype}: shapes do not match"
    );
    let (p, xp) = (packed.as_ptr(), x.as_ptr());
    match dtype {
        GgmlType::Q4_0 => rows_fmt::<Q4Q8_0<false>>(p, rb, nr, nb, xp, n_tok, out, ldo),
        GgmlType::Q4_1 => rows_fmt::<Q4_1>(p, rb, nr, nb, xp, n_tok, out, ldo),
        GgmlType::Q5_0 => rows_fmt::<Q5_0>(p, rb, nr, nb, xp, n_tok, out, ldo),
        GgmlType::Q5_1 => rows_fmt::<Q5_1>(p, rb, nr, nb, xp, n_tok, out, ldo),
        GgmlType::Q8_0 => rows_fmt::<Q4Q8_0<true>>(p, rb, nr, nb, xp, n_tok, out, ldo),
        GgmlType::Q4K => rows_fmt::<Q45K<false>>(p, rb, nr, nb, xp, n_tok, out, ldo),
        GgmlType::Q5K => rows_fmt::<Q45K<true>>(p, rb, nr, nb, xp, n_tok, out, ldo),
        GgmlType::Q6K => rows_fmt::<Q6K>(p, rb, nr, nb, xp, n_tok, out, ldo),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => panic!("gemv_rows: {dtype} is not a block format"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quant::tests::test_values;
    use crate::model::quant::{dot_row_scalar, quantize_row};

    fn avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    }

    /// The AVX2 GEMM tile's order, written out in scalar code: one 8-lane accumulator fed with
    /// fused multiply-adds in column order, then `hsum`'s pairing (lanes l and l + 4, then
    /// l and l + 2, then 0 and 1).
    fn tile_order_dot(w: &[f32], x: &[f32]) -> f32 {
        let mut a = [0f32; 8];
        for (cw, cx) in w.chunks_exact(8).zip(x.chunks_exact(8)) {
            for l in 0..8 {
                a[l] = cw[l].mul_add(cx[l], a[l]);
            }
        }
        let s: [f32; 4] = std::array::from_fn(|l| a[l] + a[l + 4]);
        let s = [s[0] + s[2], s[1] + s[3]];
        s[0] + s[1]
    }

    #[test]
    fn gemv_rows_is_bitwise_the_tile_order_over_the_simd_dequantized_rows() {
        if !avx2() {
            eprintln!("skipped: no avx2/fma/f16c on this CPU");
            return;
        }
        for (k, &dtype) in GgmlType::BLOCK_TYPES.iter().enumerate() {
            let cols = dtype.block_size() * if dtype.block_size() == 256 { 2 } else { 5 };
            for nr in [1usize, 3, 6, 9] {
                let rows: Vec<Vec<u8>> =
                    (0..nr).map(|r| quantize_row(dtype, &test_values(cols, 100 * k as u64 + r as u64))).collect();
                let packed: Vec<u8> = rows.concat();
                let deq: Vec<Vec<f32>> = rows
                    .iter()
                    .map(|b| {
                        let mut y = vec![0f32; cols];
                        // SAFETY: avx2, fma and f16c were detected above.
                        unsafe { crate::model::quant::simd::dequantize_row(dtype, b, &mut y) };
                        y
                    })
                    .collect();
                for n_tok in 1..=GEMV_MAX_T {
                    let x = test_values(n_tok * cols, 7 + n_tok as u64);
                    let ldo = nr + 2;
                    let mut out = vec![f32::NAN; n_tok * ldo];
                    // SAFETY: avx2/fma/f16c detected; out holds n_tok rows of ldo >= nr cells.
                    unsafe { gemv_rows(dtype, &packed, nr, cols, &x, n_tok, out.as_mut_ptr(), ldo) };
                    for t in 0..n_tok {
                        let xt = &x[t * cols..(t + 1) * cols];
                        for r in 0..nr {
                            let got = out[t * ldo + r];
                            let want = tile_order_dot(&deq[r], xt);
                            assert_eq!(got.to_bits(), want.to_bits(), "{dtype} nr {nr} T {n_tok} row {r} token {t}");
                            // And close to the portable reference (a different summation order).
                            let reference = dot_row_scalar(dtype, &rows[r], xt);
                            let scale: f32 = deq[r].iter().zip(xt).map(|(a, b)| (a * b).abs()).sum();
                            assert!((got - reference).abs() <= 1e-5 * scale.max(1.0), "{dtype}: {got} vs {reference}");
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod bench {
    //! `cargo test --release --lib simd_gemv::bench -- --ignored --nocapture`: one thread's CPU
    //! time (not wall time: the dev machine is shared) for one decode token through matrices of
    //! the sample model's shapes, the packed-block kernel against dequantize-then-dot.
    use super::*;
    use crate::model::quant::quantize_row;
    use crate::model::quant::tests::test_values;

    /// CPU time of the whole process (run this test alone: `--ignored` with its name).
    fn thread_cpu_s() -> f64 {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `t` is a valid timespec for the call to write.
        unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
        t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
    }

    /// The previous AVX2 decode path: the row expanded to f32, then one accumulator chain.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dequant_then_dot(dtype: GgmlType, packed: &[u8], nr: usize, cols: usize, x: &[f32], out: &mut [f32]) {
        let rb = packed.len() / nr;
        let mut buf = vec![0f32; cols];
        for (r, o) in out.iter_mut().enumerate().take(nr) {
            crate::model::quant::simd::dequantize_row(dtype, &packed[r * rb..(r + 1) * rb], &mut buf);
            let mut acc = _mm256_setzero_ps();
            for (w, xv) in buf.chunks_exact(8).zip(x.chunks_exact(8)) {
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(w.as_ptr()), _mm256_loadu_ps(xv.as_ptr()), acc);
            }
            *o = hsum(acc);
        }
    }

    #[test]
    #[ignore = "benchmark"]
    fn bench_decode_token_sample_shapes() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")) {
            return;
        }
        // The layers of SmolLM2-135M (q, k, v, o, gate, up, down) x 30, then the 49,152-row head.
        let layer = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)];
        for (dtype, head) in
            [(GgmlType::Q4_1, GgmlType::Q8_0), (GgmlType::Q4_0, GgmlType::Q8_0), (GgmlType::Q5_1, GgmlType::Q8_0)]
        {
            // 30 distinct layers (~66 MB for Q4_1) and the head: the weights stream from DRAM as
            // in a decode. Each matrix repeats one valid row (quantizing 130M values here would
            // take longer than the benchmark).
            let mut mats: Vec<(GgmlType, Vec<u8>, usize, usize)> = Vec::new();
            for _layer in 0..30 {
                for (i, &(rows, cols)) in layer.iter().enumerate() {
                    let row = quantize_row(dtype, &test_values(cols, i as u64));
                    mats.push((dtype, row.repeat(rows), rows, cols));
                }
            }
            let head_bytes = quantize_row(head, &test_values(576, 9)).repeat(49152);
            let x = test_values(1536, 3);
            let mut out = vec![0f32; 49152];
            let mut time = |packed_block: bool| {
                let mut best = f64::MAX;
                for _ in 0..5 {
                    let t = thread_cpu_s();
                    {
                        for (dt, b, rows, cols) in &mats {
                            // SAFETY: features detected above; out holds rows cells.
                            unsafe {
                                if packed_block {
                                    gemv_rows(*dt, b, *rows, *cols, &x[..*cols], 1, out.as_mut_ptr(), *rows)
                                } else {
                                    dequant_then_dot(*dt, b, *rows, *cols, &x[..*cols], &mut out)
                                }
                            }
                        }
                    }
                    // SAFETY: as above.
                    unsafe {
                        if packed_block {
                            gemv_rows(head, &head_bytes, 49152, 576, &x[..576], 1, out.as_mut_ptr(), 49152)
                        } else {
                            dequant_then_dot(head, &head_bytes, 49152, 576, &x[..576], &mut out)
                        }
                    }
                    best = best.min(thread_cpu_s() - t);
                }
                best
            };
            let (new, old) = (time(true), time(false));
            // The process's own path through the backend's `matmul` (AVX-512 for Q4_0 / Q4_1 /
            // Q8_0 where the CPU has it), on a one-thread pool.
            let ts: Vec<crate::model::weights::Tensor> = mats
                .iter()
                .map(|(dt, b, r, c)| crate::model::weights::Tensor::from_bytes("m", *dt, *r, *c, b.clone()))
                .collect();
            let head_t = crate::model::weights::Tensor::from_bytes("head", head, 49152, 576, head_bytes.clone());
            let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
            let via = pool.install(|| {
                let mut best = f64::MAX;
                for _ in 0..5 {
                    let t = thread_cpu_s();
                    {
                        for w in &ts {
                            crate::backend::cpu::matmul::matmul(w, &x[..w.cols], 1, &mut out[..w.rows]);
                        }
                    }
                    crate::backend::cpu::matmul::matmul(&head_t, &x[..576], 1, &mut out);
                    best = best.min(thread_cpu_s() - t);
                }
                best
            });
            println!(
                "{dtype} layers + {head} head, one token, one thread: packed-block {:.2} ms CPU ({:.0} tok/s), dequantize-then-dot {:.2} ms ({:.0} tok/s), matmul on the {} path {:.2} ms ({:.0} tok/s)",
                new * 1e3,
                1.0 / new,
                old * 1e3,
                1.0 / old,
                crate::sys::cpu::cpu_path(),
                via * 1e3,
                1.0 / via
            );
        }
    }
}
