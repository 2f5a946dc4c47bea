//! Small-batch matrix products on the packed rows: `n_tok <= MAX_T` tokens (decode, batched
//! decode of several slots). Each weight block is read and widened once and used for every
//! token, so 8 slots cost far less than 8 single-token steps.
//!
//! Paths, picked at run time:
//! - AVX-512 (avx512f + f16c + fma detected) for Q4_0 / Q4_1 / Q8_0: the block's 32 codes are
//!   widened to two 16-lane f32 vectors of dequantized weights (`d * q + m`) held in registers
//!   and FMA'd against each token's activations (two accumulators per token: no FMA chain
//!   longer than one per block).
//! - AVX2 + FMA (the other block formats, or every format when `DUSTOFF_CPU_PATH=avx2`):
//!   `quant::gemv_rows`, blocks widened in registers, 4 / 2 / 1 rows at a time for 1-2 / 3-4 /
//!   5-8 tokens, summed in the order of the AVX2 GEMM tile.
//! - Otherwise (float types, or the scalar path): each row is dequantized into an
//!   L1-resident f32 buffer (`quant::dequantize_row`) and dotted with every token.
//!
//! Activations and accumulation stay f32 in every path. Batch invariance: every path sums in
//! the same order as the tiled GEMM of `matmul` for the same CPU features and type, so a
//! token's output is bitwise the same whether it runs alone, with 7 other slots' tokens or in
//! a prefill chunk (the engine's greedy-equivalence tests rely on it).

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

/// True when the AVX-512 kernels run: the CPU has avx512f (+ the AVX2 set) and the process's
/// kernel path (`sys::cpu::cpu_path`, `DUSTOFF_CPU_PATH`) is `avx512`.
#[inline]
pub(super) fn avx512_available() -> bool {
    crate::sys::cpu::cpu_path() == crate::sys::cpu::CpuPath::Avx512
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
    #[cfg(target_arch = "x86_64")]
    if quant::simd_available() && quant::gemv_supports(w.dtype) {
        // SAFETY: avx2, fma and f16c run (quant::simd_available); block formats have whole
        // blocks per row (checked by the loader); the caller vouches for `out`.
        unsafe { quant::gemv_rows(w.dtype, packed, nr, cols, x, n_tok, out.ptr.add(r0), out.ld) };
        return;
    }
    // Generic: one row at a time through an f32 buffer that stays in L1. (Not the fused
    // `quant::dot_rows` for one token: its rounding differs from the tiled GEMM's, and a
    // token's logits must not depend on how many tokens share its step.)
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

/// `w . x` in exactly the order of `matmul`'s AVX2 micro-kernel (one 8-lane accumulator,
/// the same horizontal sum, then the tail one product at a time), so the two agree bitwise.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dense_dot_avx2(w: &[f32], x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = w.len().min(x.len());
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let n8 = n / 8 * 8;
    let mut i = 0;
    while i < n8 {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(i)), _mm256_loadu_ps(xp.add(i)), acc);
        i += 8;
    }
    let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    let mut s = _mm_cvtss_f32(s);
    for j in n8..n {
        s += w[j] * x[j];
    }
    s
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! Port budget per 32-weight block (why it looks like this): 512-bit ops issue on two ports
    //! (p0, p5). Widening codes through `vcvtdq2ps` and scaling them put ~9 ops on p0 per
    //! block; instead each block's 16 possible 4-bit values are put in a table (one FMA:
    //! `iota * d + m`) and looked up with `vpermps` (p5), which reads only the low 4 bits of
    //! each index lane. Block scales are converted 8 blocks at a time (a gather + one
    //! `vcvtph2ps`) into a small array and broadcast from memory (load ports only).
    use std::arch::x86_64::*;

    use crate::model::quant::GgmlType;

    /// Blocks whose scales are converted per batch (`dm` holds two floats per block).
    const CHUNK: usize = 64;
    /// Software prefetch distance in bytes (the hardware streamer stops at 4 KiB pages and
    /// ramps up slowly on the short runs of rows a task covers).
    const PREFETCH: usize = 1024;

    /// The first two f16 fields of blocks `0..n` (`n <= CHUNK`, stride `ts` bytes from `row`)
    /// as f32: `dm[2i]` = the block's `d`, `dm[2i + 1]` = the next two bytes read as f16 (the
    /// min `m` for Q4_1; meaningless for Q4_0 / Q8_0, whose callers ignore it).
    #[inline(always)]
    unsafe fn block_halves(row: *const u8, ts: usize, n: usize, dm: &mut [f32; 2 * CHUNK]) {
        let iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let idx = _mm256_mullo_epi32(iota, _mm256_set1_epi32(ts as i32));
        let mut i = 0;
        while i < n {
            let base = row.add(i * ts) as *const i32;
            let g = if n - i >= 8 {
                _mm256_i32gather_epi32::<1>(base, idx)
            } else {
                // Only lanes of existing blocks read memory; the others stay 0.
                let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((n - i) as i32), iota);
                _mm256_mask_i32gather_epi32::<1>(_mm256_setzero_si256(), base, idx, mask)
            };
            _mm512_storeu_ps(dm.as_mut_ptr().add(2 * i), _mm512_cvtph_ps(g));
            i += 8;
        }
    }

    /// The 32 dequantized weights of the block at `b` (scales `d`, `m` = `dm[0]`, `dm[1]`), as
    /// (elements 0..16, elements 16..32).
    #[inline(always)]
    unsafe fn block<const TYPE: u8>(b: *const u8, dm: *const f32) -> (__m512, __m512) {
        let d = _mm512_set1_ps(*dm);
        match TYPE {
            // Q4_0: d, qs[16]; w = d * (q - 8); element j = low nibble of qs[j], j + 16 = high.
            0 => {
                let iota8 = _mm512_setr_ps(-8., -7., -6., -5., -4., -3., -2., -1., 0., 1., 2., 3., 4., 5., 6., 7.);
                let table = _mm512_mul_ps(iota8, d);
                let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(b.add(2) as *const __m128i));
                (_mm512_permutexvar_ps(q, table), _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(q), table))
            }
            // Q4_1: d, m, qs[16]; w = d * q + m.
            1 => {
                let iota = _mm512_setr_ps(0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12., 13., 14., 15.);
                let table = _mm512_fmadd_ps(iota, d, _mm512_set1_ps(*dm.add(1)));
                let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(b.add(4) as *const __m128i));
                (_mm512_permutexvar_ps(q, table), _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(q), table))
            }
            // Q8_0: d, qs[32] (i8); w = d * q.
            _ => {
                let q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(2) as *const __m128i));
                let q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(18) as *const __m128i));
                (_mm512_mul_ps(_mm512_cvtepi32_ps(q0), d), _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d))
            }
        }
    }

    /// `nr` rows of `nb` blocks (`ts` bytes each) times `T` tokens of `x` (row stride `ldx`),
    /// written to `out[t * ldo + r]`.
    // `t` indexes the two accumulator arrays and the token rows at once.
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx2,f16c,fma")]
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
        let mut dm = [0f32; 2 * CHUNK];
        for r in 0..nr {
            let row = packed.add(r * nb * ts);
            // NOTE: the accumulation order (per token: `lo` over the first 16 elements of every
            // block, `hi` over the last 16, blocks in order, then `reduce(lo + hi)`) is the same
            // for every T and the same as `matmul::tile_avx512`: a token's result never depends
            // on how many tokens share the step (greedy output is batch-invariant).
            let mut acc = [[_mm512_setzero_ps(); T]; 2];
            let mut c0 = 0;
            while c0 < nb {
                let n = CHUNK.min(nb - c0);
                block_halves(row.add(c0 * ts), ts, n, &mut dm);
                for bi in 0..n {
                    if bi % 2 == 0 {
                        // Past the end of the run this only touches the next rows' memory (or
                        // nothing: prefetches never fault).
                        _mm_prefetch::<_MM_HINT_T0>(row.add((c0 + bi) * ts + PREFETCH) as *const i8);
                    }
                    let (w0, w1) = block::<TYPE>(row.add((c0 + bi) * ts), dm.as_ptr().add(2 * bi));
                    let xb = x.add((c0 + bi) * 32);
                    for t in 0..T {
                        let xt = xb.add(t * ldx);
                        acc[0][t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xt), acc[0][t]);
                        acc[1][t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xt.add(16)), acc[1][t]);
                    }
                }
                c0 += n;
            }
            for t in 0..T {
                *out.add(t * ldo + r) = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][t], acc[1][t]));
            }
        }
    }

    /// Dispatch on (type, token count). Only Q4_0 / Q4_1 / Q8_0 reach here.
    ///
    /// # Safety
    /// avx512f, avx2, f16c and fma must be available; `packed` holds `nr` rows of `cols`
    /// elements, `x` holds `n_tok` rows of `cols`, `out[t * ldo + r]` is writable for
    /// `t < n_tok, r < nr`.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn rows(
        dtype: GgmlType,
        packed: &[u8],
        nr: usize,
        cols: usize,
        x: &[f32],
        n_tok: usize,
        out: *mut f32,
        ldo: usize,
    ) {
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
