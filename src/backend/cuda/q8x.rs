//! CPU twin of the int8 activations that the packed-weight GEMV reads (kernels/gemv_q8.cu):
//! a step input quantized in blocks of 32 values with the kernel's arithmetic (d = amax / 127
//! in f32, q = x * (1 / d) rounded to nearest even), and the product of a quantized matrix with
//! those values. The dp4a kernel computes `sum_j w_j * d * q_j` exactly in integers per run, so
//! its twin is the CPU backend's dot product on the dequantized input `d * q_j`; against the
//! f32 input the int8 rounding (at most d / 2 per value) is the only extra error.

use crate::backend::cpu::matmul::matmul;
use crate::model::weights::Tensor;

/// Values per activation block (one scale).
pub const Q8X_BLOCK: usize = 32;

/// One row of `x` quantized as the kernel does: `(q, d)` with `q` `[x.len()]` and `d` one
/// scale per block of 32. `x.len()` is a multiple of 32.
pub fn quantize(x: &[f32]) -> (Vec<i8>, Vec<f32>) {
    let mut q = Vec::with_capacity(x.len());
    let mut ds = Vec::with_capacity(x.len() / Q8X_BLOCK);
    for b in x.chunks(Q8X_BLOCK) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        q.extend(b.iter().map(|&v| (v * id).round_ties_even().clamp(-127.0, 127.0) as i8));
        ds.push(d);
    }
    (q, ds)
}

/// `x` `[n, cols]` as the int8 GEMV sees it: every value replaced by `d * q`.
pub fn dequantized(x: &[f32], cols: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        let (q, ds) = quantize(row);
        out.extend(q.iter().enumerate().map(|(j, &v)| ds[j / Q8X_BLOCK] * v as f32));
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
    fn blocks_round_to_nearest_within_half_a_step() {
        let x: Vec<f32> = (0..96).map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 8) as f32 / 8e6 - 1.0).collect();
        let (q, ds) = quantize(&x);
        assert_eq!((q.len(), ds.len()), (96, 3));
        for (j, (&v, &qj)) in x.iter().zip(&q).enumerate() {
            let d = ds[j / 32];
            assert!((v - d * qj as f32).abs() <= d * 0.5 * (1.0 + 1e-6), "{j}: {v} vs {d} * {qj}");
        }
        // The largest magnitude of each block maps to +-127.
        for (b, blk) in q.chunks(32).enumerate() {
            assert_eq!(blk.iter().map(|v| v.unsigned_abs()).max(), Some(127), "block {b}");
        }
        // An all-zero block has scale 0 and codes 0.
        let (q, ds) = quantize(&[0.0; 32]);
        assert_eq!((q, ds), (vec![0i8; 32], vec![0.0]));
    }
}
