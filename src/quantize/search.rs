//! Scale (and min) searches for one group of weights under per-element importance weights.
//!
//! Both searches minimise `sum_i w_i (x_i - x̂_i)^2` over a grid of candidate inverse scales
//! around the round-to-nearest one: for each candidate the codes are rounded, the scale (and
//! min) solved in closed form by weighted least squares for those codes, and the error of that
//! fit evaluated from the same sums (one pass over the group per candidate). The best candidate
//! wins; the plain round-to-nearest choice is always among them, so the search is never worse
//! than it on the weighted metric. Callers then store the values in f16 / 6-bit form and
//! re-round every code to the nearest under the stored values, which can only lower the error of
//! a fixed scale and min.

/// Candidates either side of the round-to-nearest inverse scale, in steps of a tenth of a code.
const STEPS: i32 = 9;

/// Nearest integer of `v` clamped to `[lo, hi]` (ties to even; `|lo|, |hi| < 2^22`). Adding and
/// subtracting 1.5 * 2^23 rounds in the FPU's mode, avoiding the `roundf` library call that
/// `f32::round` becomes on baseline x86-64.
#[inline(always)]
pub fn round_clamped(v: f32, lo: f32, hi: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v.clamp(lo, hi) + MAGIC) - MAGIC
}

/// Weighted squared error of `x ≈ s * q` with `q` the nearest code in `[-nneg, npos]`.
#[inline]
fn sym_error(x: &[f32], w: &[f32], s: f32, nneg: f32, npos: f32) -> f32 {
    if s == 0.0 {
        return x.iter().zip(w).map(|(&v, &wi)| wi * v * v).sum();
    }
    let is = 1.0 / s;
    x.iter()
        .zip(w)
        .map(|(&v, &wi)| {
            let d = v - s * round_clamped(v * is, -nneg, npos);
            wi * d * d
        })
        .sum()
}

/// The scale `s` of `x ≈ s * q`, codes `q` integers in `[-nneg, npos]` (`nneg` may be 0 for
/// codes that are never negative; then `x` should be non-negative). Returns 0 for an all-zero
/// group.
pub fn symmetric_scale(x: &[f32], w: &[f32], nneg: f32, npos: f32) -> f32 {
    // The element of largest magnitude, with its sign.
    let amax = x.iter().copied().fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
    if amax == 0.0 {
        return 0.0;
    }
    // Round-to-nearest: amax on the end with more levels (-nneg), or on +npos when codes are
    // never negative.
    let mut best_s = if nneg > 0.0 { -amax / nneg } else { amax / npos };
    // Compared as `sum w x^2 - (sum w x q)^2 / sum w q^2`: the error of the best scale for
    // the codes; the constant `sum w x^2` is left out of every candidate alike.
    let sxx: f32 = x.iter().zip(w).map(|(&v, &wi)| wi * v * v).sum();
    let mut best_e = sym_error(x, w, best_s, nneg, npos) - sxx;
    // Candidates put amax at code t = ±(level + k/10) on either end of the range.
    for end in [-nneg, npos] {
        if end == 0.0 {
            continue;
        }
        for k in -STEPS..=STEPS {
            let t = end + 0.1 * k as f32 * end.signum();
            if t == 0.0 || t.signum() != end.signum() {
                continue;
            }
            let is = t / amax;
            let (mut sxq, mut sqq) = (0f32, 0f32);
            for (&v, &wi) in x.iter().zip(w) {
                let q = round_clamped(v * is, -nneg, npos);
                sxq += wi * v * q;
                sqq += wi * q * q;
            }
            if sqq <= 0.0 {
                continue;
            }
            let e = -sxq * sxq / sqq;
            if e < best_e {
                (best_s, best_e) = (sxq / sqq, e);
            }
        }
    }
    best_s
}

/// Weighted squared error of `x ≈ s * q + m` with `q` the nearest code in `[0, nmax]`.
#[inline]
fn affine_error(x: &[f32], w: &[f32], s: f32, m: f32, nmax: f32) -> f32 {
    let is = if s > 0.0 { 1.0 / s } else { 0.0 };
    x.iter()
        .zip(w)
        .map(|(&v, &wi)| {
            let d = v - (s * round_clamped((v - m) * is, 0.0, nmax) + m);
            wi * d * d
        })
        .sum()
}

/// Scale and min `(s, m)` of `x ≈ s * q + m`, `q` integers in `[0, nmax]`, `s >= 0`. With
/// `min_nonpositive` (the K formats store the min as a subtracted non-negative offset) `m <= 0`.
pub fn affine_scale_min(x: &[f32], w: &[f32], nmax: f32, min_nonpositive: bool) -> (f32, f32) {
    if x.is_empty() {
        return (0.0, 0.0);
    }
    let (mut lo, hi) = x.iter().fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    if min_nonpositive {
        lo = lo.min(0.0);
    }
    if hi <= lo {
        return (0.0, lo);
    }
    let (mut best_s, mut best_m) = ((hi - lo) / nmax, lo);
    let (mut sw, mut sx, mut sxx) = (0f32, 0f32, 0f32);
    for (&v, &wi) in x.iter().zip(w) {
        sw += wi;
        sx += wi * v;
        sxx += wi * v * v;
    }
    let mut best_e = affine_error(x, w, best_s, best_m, nmax);
    for k in -STEPS..=STEPS {
        let is = (nmax + 0.1 * k as f32) / (hi - lo);
        if is <= 0.0 {
            continue;
        }
        let (mut sq, mut sqq, mut sqx) = (0f32, 0f32, 0f32);
        for (&v, &wi) in x.iter().zip(w) {
            let q = round_clamped((v - lo) * is, 0.0, nmax);
            sq += wi * q;
            sqq += wi * q * q;
            sqx += wi * q * v;
        }
        // Normal equations of min_{s,m} sum w (s q + m - x)^2.
        let det = sw * sqq - sq * sq;
        if det <= 0.0 {
            continue;
        }
        let (mut s, mut m) = ((sw * sqx - sq * sx) / det, (sqq * sx - sq * sqx) / det);
        if min_nonpositive && m > 0.0 {
            m = 0.0;
            s = if sqq > 0.0 { sqx / sqq } else { 0.0 };
        }
        if s <= 0.0 {
            continue;
        }
        // sum w (s q + m - x)^2 expanded over the sums above.
        let e = s * s * sqq + 2.0 * s * m * sq + m * m * sw - 2.0 * s * sqx - 2.0 * m * sx + sxx;
        if e < best_e {
            (best_s, best_m, best_e) = (s, m, e);
        }
    }
    (best_s, best_m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32 - 0.5) * 2.0
            })
            .collect()
    }

    #[test]
    fn searches_never_lose_to_round_to_nearest() {
        for seed in 0..200 {
            let x = values(32, seed);
            let w = vec![1f32; 32];
            let amax = x.iter().copied().fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
            let s = symmetric_scale(&x, &w, 8.0, 7.0);
            assert!(sym_error(&x, &w, s, 8.0, 7.0) <= sym_error(&x, &w, -amax / 8.0, 8.0, 7.0) * 1.000_001);
            let (lo, hi) = x.iter().fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
            let (s, m) = affine_scale_min(&x, &w, 15.0, false);
            assert!(affine_error(&x, &w, s, m, 15.0) <= affine_error(&x, &w, (hi - lo) / 15.0, lo, 15.0) * 1.000_001);
        }
    }

    #[test]
    fn degenerate_groups() {
        let w = [1f32; 4];
        assert_eq!(symmetric_scale(&[0.0; 4], &w, 8.0, 7.0), 0.0);
        assert_eq!(affine_scale_min(&[0.5; 4], &w, 15.0, false), (0.0, 0.5));
        // All positive with a non-positive min: the min is 0 and the scale covers the maximum.
        let (s, m) = affine_scale_min(&[1.0, 2.0, 3.0, 3.0], &w, 3.0, true);
        assert_eq!(m, 0.0);
        assert!((s - 1.0).abs() < 1e-6, "{s}");
    }
}
