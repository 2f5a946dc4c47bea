//! CPU twin of the int8 activations that the packed-weight GEMV reads (kernels/gemv_q8.cu):
//! a step input quantized in blocks of 32 values with the kernel's arithmetic, as two int8
//! planes (kernels/quant.cuh, "int8 activations"): hi codes q = rint(x / d), d = amax / 127,
//! and lo codes l = rint((x - d q) / dl) of the residual, dl = d / 254; and the product of a
//! quantized matrix with those values. The dp4a kernel computes `sum_j w_j (d q_j + dl l_j)`
//! with exact integer sums per run, so its twin is the CPU backend's dot product on the
//! dequantized input `d q_j + dl l_j`; against the f32 input the rounding left (at most
//! dl / 2 per value, amax / 64,500) is the only extra error.

use crate::backend::cpu::matmul::matmul;
use crate::model::weights::Tensor;

/// Values per activation block (one scale).
pub const Q8X_BLOCK: usize = 32;
/// The lo plane's scale over the hi plane's (quant.cuh: Q8X_LO).
pub const Q8X_LO: f32 = 1.0 / 254.0;

/// One row of `x` quantized as the kernel does: `(q, l, d)` with the hi and lo codes
/// `[x.len()]` and one scale `d` per block of 32 (the lo scale is `d * Q8X_LO`). `x.len()` is a
/// multiple of 32.
pub fn quantize(x: &[f32]) -> (Vec<i8>, Vec<i8>, Vec<f32>) {
    let mut q = Vec::with_capacity(x.len());
    let mut l = Vec::with_capacity(x.len());
    let mut ds = Vec::with_capacity(x.len() / Q8X_BLOCK);
    for b in x.chunks(Q8X_BLOCK) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let dl = d * Q8X_LO;
        let idl = if dl > 0.0 { 1.0 / dl } else { 0.0 };
        for &v in b {
            let qv = (v * id).round_ties_even().clamp(-127.0, 127.0);
            let r = (-d).mul_add(qv, v);
            q.push(qv as i8);
            l.push((r * idl).round_ties_even().clamp(-127.0, 127.0) as i8);
        }
        ds.push(d);
    }
    (q, l, ds)
}

/// `x` `[n, cols]` as the int8 GEMV sees it: every value replaced by `d q + dl l`.
pub fn dequantized(x: &[f32], cols: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        let (q, l, ds) = quantize(row);
        out.extend((0..row.len()).map(|j| {
            let d = ds[j / Q8X_BLOCK];
            (d * Q8X_LO).mul_add(l[j] as f32, d * q[j] as f32)
        }));
    }
    out
}

/// `out[t, r] = sum_c w[r, c] * xq[t, c]` with `xq` = [`dequantized`] `x` (`[n, w.cols]`):
/// what the int8 GEMV computes, up to the order of its f32 sums.
pub fn matmul_q8x(w: &Tensor, x: &[f32], n: usize, out: &mut [f32]) {
    matmul(w, &dequantized(x, w.cols), n, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_planes_round_to_within_half_a_lo_step() {
        let x: Vec<f32> = (0..96).map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 8) as f32 / 8e6 - 1.0).collect();
        let (q, l, ds) = quantize(&x);
        assert_eq!((q.len(), l.len(), ds.len()), (96, 96, 3));
        let xq = dequantized(&x, 96);
        for (j, (&v, &w)) in x.iter().zip(&xq).enumerate() {
            let d = ds[j / 32];
            // The hi plane alone is within d / 2; with the lo plane within dl / 2 (and rounding).
            assert!((v - d * q[j] as f32).abs() <= d * 0.5 * (1.0 + 1e-6), "{j}: hi");
            assert!((v - w).abs() <= d * Q8X_LO * 0.5 * 1.01 + 1e-7, "{j}: {v} vs {w}");
        }
        // The largest magnitude of each block maps to +-127.
        for (b, blk) in q.chunks(32).enumerate() {
            assert_eq!(blk.iter().map(|v| v.unsigned_abs()).max(), Some(127), "block {b}");
        }
        // An all-zero block has scale 0 and codes 0.
        let (q, l, ds) = quantize(&[0.0; 32]);
        assert_eq!((q, l, ds), (vec![0i8; 32], vec![0i8; 32], vec![0.0]));
    }
}
