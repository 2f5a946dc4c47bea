//! AVX2 attention of one query head over the paged f32 KV cache (the fast twin of
//! `ops::attend_head_generic`, which it is tested against).
//!
//! Cost model: per position, `q . k` is `head_dim / 8` FMAs; the horizontal sums are done 8
//! positions at a time (one transposed `hadd` tree instead of 8 separate reductions); `exp`
//! is a vectorized polynomial (relative error ~2e-7, below f32 rounding of the sums); the
//! weighted sum of V keeps the `head_dim` outputs in registers (`V8 = head_dim / 8` vectors),
//! so each position costs loads and FMAs only.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::paged::{for_positions, PagedKv};
use crate::model::quant::hsum;

/// `[sum(v[0]), ..., sum(v[7])]`.
#[inline(always)]
unsafe fn hsum8(v: &[__m256; 8]) -> __m256 {
    let t0 = _mm256_hadd_ps(v[0], v[1]);
    let t1 = _mm256_hadd_ps(v[2], v[3]);
    let t2 = _mm256_hadd_ps(v[4], v[5]);
    let t3 = _mm256_hadd_ps(v[6], v[7]);
    let u0 = _mm256_hadd_ps(t0, t1);
    let u1 = _mm256_hadd_ps(t2, t3);
    _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(u0, u1), _mm256_permute2f128_ps::<0x31>(u0, u1))
}

/// `exp(x)` for `x <= 0` (softmax after max subtraction); inputs below -87 give ~0.
#[inline(always)]
unsafe fn exp8(x: __m256) -> __m256 {
    let x = _mm256_max_ps(x, _mm256_set1_ps(-87.0));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    // r = x - n ln2 in two steps (Cody-Waite), |r| <= ln2 / 2.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
    // Taylor polynomial of e^r to degree 7 (truncation error < 3e-9 relative on |r| <= 0.347).
    let mut p = _mm256_set1_ps(1.0 / 5040.0);
    for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let scale = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
    _mm256_mul_ps(p, _mm256_castsi256_ps(scale))
}

/// One query head (`q`: `[V8 * 8]`) over positions `0..=pos` of KV head `kvh`; `out`:
/// `[V8 * 8]`. `scores` is reusable scratch.
///
/// # Safety
/// avx2 and fma must be available; `kv.head_dim == V8 * 8`; the block table must cover
/// positions `0..=pos` within the cache arrays; `q` and `out` hold `head_dim` floats.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn attend_head<const V8: usize>(
    kv: &PagedKv,
    table: &[u32],
    pos: usize,
    q: &[f32],
    kvh: usize,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let hd = V8 * 8;
    assert!(kv.head_dim == hd && q.len() >= hd && out.len() >= hd);
    let stride = kv.n_kv_heads * hd;
    let needed = table
        .iter()
        .take((pos + 1).div_ceil(kv.block_size))
        .map(|&b| (b as usize + 1) * kv.block_size * stride)
        .max()
        .unwrap_or(0);
    assert!(kv.k.len() >= needed && kv.v.len() >= needed && table.len() * kv.block_size > pos);
    let n = pos + 1;
    // Room for a whole vector past the end (the last group of 8 is stored whole).
    scores.clear();
    scores.resize(n + 8, 0.0);
    let sp = scores.as_mut_ptr();
    let scale = 1.0 / (hd as f32).sqrt();
    let qv: [__m256; V8] =
        std::array::from_fn(|i| _mm256_mul_ps(_mm256_loadu_ps(q.as_ptr().add(8 * i)), _mm256_set1_ps(scale)));
    let (kp, vp) = (kv.k.as_ptr(), kv.v.as_ptr());

    // Pass 1: scaled scores, 8 positions per reduction.
    let mut pending = [_mm256_setzero_ps(); 8];
    let (mut p, mut group) = (0usize, 0usize);
    let mut maxv = _mm256_set1_ps(f32::NEG_INFINITY);
    for_positions!(kv, table, pos, kvh, |_p, o| {
        let k = kp.add(o);
        prefetch_row(k.add(PREFETCH_ROWS * stride), hd);
        let (mut a0, mut a1) = (_mm256_mul_ps(qv[0], _mm256_loadu_ps(k)), _mm256_setzero_ps());
        for (i, qi) in qv.iter().enumerate().skip(1) {
            if i % 2 == 1 {
                a1 = _mm256_fmadd_ps(*qi, _mm256_loadu_ps(k.add(8 * i)), a1);
            } else {
                a0 = _mm256_fmadd_ps(*qi, _mm256_loadu_ps(k.add(8 * i)), a0);
            }
        }
        pending[p - group] = _mm256_add_ps(a0, a1);
        p += 1;
        if p - group == 8 {
            let s = hsum8(&pending);
            _mm256_storeu_ps(sp.add(group), s);
            maxv = _mm256_max_ps(maxv, s);
            group = p;
        }
    });
    let mut max = hsum_max(maxv);
    for (i, v) in pending[..n - group].iter().enumerate() {
        let s = hsum(*v);
        *sp.add(group + i) = s;
        max = max.max(s);
    }

    // Softmax numerators in place, and their sum.
    let mv = _mm256_set1_ps(max);
    let mut denv = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sp.add(i)), mv));
        _mm256_storeu_ps(sp.add(i), e);
        denv = _mm256_add_ps(denv, e);
        i += 8;
    }
    if i < n {
        // Lanes past n are masked to -inf (exp = 0) so they add nothing.
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((n - i) as i32), lane));
        let x = _mm256_blendv_ps(_mm256_set1_ps(-100.0), _mm256_sub_ps(_mm256_loadu_ps(sp.add(i)), mv), live);
        let e = _mm256_and_ps(exp8(x), live);
        _mm256_storeu_ps(sp.add(i), e);
        denv = _mm256_add_ps(denv, e);
    }
    let inv = 1.0 / hsum(denv);

    // Pass 2: out = sum_p w_p v_p, accumulators in registers.
    let mut acc = [_mm256_setzero_ps(); V8];
    let mut p = 0usize;
    for_positions!(kv, table, pos, kvh, |_p, o| {
        let w = _mm256_broadcast_ss(&*sp.add(p));
        let v = vp.add(o);
        prefetch_row(v.add(PREFETCH_ROWS * stride), hd);
        for (i, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(v.add(8 * i)), *a);
        }
        p += 1;
    });
    let iv = _mm256_set1_ps(inv);
    for (i, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(out.as_mut_ptr().add(8 * i), _mm256_mul_ps(*a, iv));
    }
}

/// Positions ahead to prefetch: a head's K/V row is `head_dim` floats every
/// `n_kv_heads * head_dim` floats, a strided stream the hardware prefetcher picks up late.
/// (Past the block's end this touches other cache memory or nothing: prefetches never fault.)
const PREFETCH_ROWS: usize = 6;

#[inline(always)]
unsafe fn prefetch_row(p: *const f32, len: usize) {
    let mut i = 0;
    while i < len {
        _mm_prefetch::<_MM_HINT_T0>(p.add(i) as *const i8);
        i += 16;
    }
}

#[inline(always)]
unsafe fn hsum_max(v: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_max_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp8_matches_std() {
        if !crate::model::quant::simd_available() {
            return;
        }
        let xs: Vec<f32> = (0..2000).map(|i| -(i as f32) * 0.05).collect();
        for c in xs.chunks_exact(8) {
            let mut got = [0f32; 8];
            // SAFETY: avx2 and fma were detected just above.
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), exp8(_mm256_loadu_ps(c.as_ptr()))) };
            for (g, &x) in got.iter().zip(c) {
                let want = (x as f64).exp();
                assert!(((*g as f64) - want).abs() <= 5e-7 * want + 1e-37, "exp({x}) = {g}, want {want}");
            }
        }
    }
}
