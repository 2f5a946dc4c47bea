//! Weights converted to F16 for the GPU: float files, and block formats under `--weights f16`
//! (otherwise block formats stay packed: `qformat`, `dmat`). F16 tensors are copied as they
//! are; BF16, F32 and the GGML block formats are widened to f32 and rounded to F16. Values beyond the F16 range
//! (+-65504, and infinities) are clamped to it and counted, never turned into inf.

use rayon::prelude::*;

use crate::model::quant::{dequantize_row, GgmlType};
use crate::model::weights::Tensor;

use super::CudaError;

/// The clamp rule is the model's (`quant::float`): one owner for every F16 conversion.
pub use crate::model::quant::{f32_to_f16_clamped, F16_MAX};

/// The F16 values of a tensor (`[rows, cols]`, row-major) and how many were clamped.
pub fn tensor_to_f16(t: &Tensor) -> Result<(Vec<u16>, u64), CudaError> {
    let n = t.rows * t.cols;
    let want = t.dtype.row_bytes(t.cols).map(|r| r * t.rows);
    if want != Some(t.bytes().len()) {
        return Err(CudaError::Weights(format!(
            "tensor {}: {} bytes for [{}, {}] {}",
            t.name,
            t.bytes().len(),
            t.rows,
            t.cols,
            t.dtype
        )));
    }
    let mut out = vec![0u16; n];
    if n == 0 {
        return Ok((out, 0));
    }
    let clamped = match t.dtype {
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(t.bytes().chunks_exact(2)) {
                *o = u16::from_le_bytes([b[0], b[1]]);
            }
            0
        }
        GgmlType::BF16 => out
            .par_chunks_mut(t.cols)
            .zip(t.bytes().par_chunks(2 * t.cols))
            .map(|(o, b)| {
                let mut c = 0u64;
                for (d, s) in o.iter_mut().zip(b.chunks_exact(2)) {
                    let v = half::bf16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
                    *d = f32_to_f16_clamped(v, &mut c);
                }
                c
            })
            .sum(),
        dtype => {
            let rb = t.row_bytes();
            out.par_chunks_mut(t.cols)
                .zip(t.bytes().par_chunks(rb))
                .map_init(
                    || vec![0f32; t.cols],
                    |row, (o, b)| {
                        dequantize_row(dtype, b, row);
                        let mut c = 0u64;
                        for (d, &v) in o.iter_mut().zip(row.iter()) {
                            *d = f32_to_f16_clamped(v, &mut c);
                        }
                        c
                    },
                )
                .sum()
        }
    };
    Ok((out, clamped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_values_clamp_and_count() {
        let mut c = 0;
        assert_eq!(half::f16::from_bits(f32_to_f16_clamped(1e6, &mut c)).to_f32(), 65504.0);
        assert_eq!(half::f16::from_bits(f32_to_f16_clamped(f32::NEG_INFINITY, &mut c)).to_f32(), -65504.0);
        assert_eq!(half::f16::from_bits(f32_to_f16_clamped(1.5, &mut c)).to_f32(), 1.5);
        assert!(half::f16::from_bits(f32_to_f16_clamped(f32::NAN, &mut c)).is_nan());
        assert_eq!(c, 2);
    }

    #[test]
    fn bf16_and_f32_tensors_convert_with_counts() {
        let vals = [1.0f32, -2.5, 70000.0, -1e30, 0.125, 3.0];
        let bf: Vec<u8> = vals.iter().flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes()).collect();
        let t = Tensor::from_bytes("t.bf16", GgmlType::BF16, 2, 3, bf);
        let (h, c) = tensor_to_f16(&t).unwrap();
        let back: Vec<f32> = h.iter().map(|&b| half::f16::from_bits(b).to_f32()).collect();
        assert_eq!(back, vec![1.0, -2.5, 65504.0, -65504.0, 0.125, 3.0]);
        assert_eq!(c, 2);

        let t = Tensor::from_f32("t.f32", 2, 3, &vals);
        let (h2, c2) = tensor_to_f16(&t).unwrap();
        assert_eq!(h2, h);
        assert_eq!(c2, 2);
    }
}
