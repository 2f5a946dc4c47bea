//! The GPU layout of GGML block formats (kernels/quant.cuh) and the load-time repack into it.
//!
//! A matrix `[rows, cols]` of `nblk = cols / block_size` blocks per row becomes two arrays in
//! one device buffer: `qs [rows, nblk, qb]` (the quantized values, 16-byte aligned so that a
//! thread reads them with 16-byte loads) then `aux [rows, nblk, ab]` (scales, mins, high bits).
//! Both are byte permutations of the file's blocks, so the repacked form is exact: `unpack`
//! gives back the file's bytes (tested for every format).

use crate::model::quant::GgmlType;
use crate::model::weights::Tensor;

use super::CudaError;

/// A GGML block format the quantized kernels read, with its device layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QFormat {
    pub dtype: GgmlType,
    /// Index of the format in the kernel entry tables (nvrtc::GEMV_QUANT_ENTRIES).
    pub index: usize,
    /// qs bytes per block (a multiple of 16).
    pub qb: usize,
    /// aux bytes per block.
    pub ab: usize,
    /// Byte ranges of a file block that make its qs part, in order.
    qs_ranges: &'static [(usize, usize)],
    /// Byte ranges that make its aux part, in order (zero padding up to `ab`).
    aux_ranges: &'static [(usize, usize)],
    /// Elements one kernel unit covers (quant.cuh `UE`): the row length must be a multiple.
    pub unit: usize,
}

impl QFormat {
    /// The device layout of `dtype`; `None` for the float types (they become F16).
    pub fn of(dtype: GgmlType) -> Option<QFormat> {
        let f = |index, qb, ab, qs_ranges, aux_ranges, unit| {
            Some(QFormat { dtype, index, qb, ab, qs_ranges, aux_ranges, unit })
        };
        match dtype {
            GgmlType::Q4_0 => f(0, 16, 2, &[(2, 18)], &[(0, 2)], 32),
            GgmlType::Q4_1 => f(1, 16, 4, &[(4, 20)], &[(0, 4)], 32),
            // aux: qh (u32, 4-byte aligned first), then d (and m).
            GgmlType::Q5_0 => f(2, 16, 8, &[(6, 22)], &[(2, 6), (0, 2)], 32),
            GgmlType::Q5_1 => f(3, 16, 8, &[(8, 24)], &[(4, 8), (0, 4)], 32),
            GgmlType::Q8_0 => f(4, 32, 2, &[(2, 34)], &[(0, 2)], 32),
            GgmlType::Q4K => f(5, 128, 16, &[(16, 144)], &[(0, 16)], 32),
            GgmlType::Q5K => f(6, 128, 48, &[(48, 176)], &[(0, 48)], 32),
            // qs: ql[128] and qh[64]; aux: scales[16] then d.
            GgmlType::Q6K => f(7, 192, 20, &[(0, 192)], &[(192, 210)], 64),
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => None,
        }
    }

    /// Every format the quantized kernels read (in `index` order).
    pub fn all() -> [QFormat; 8] {
        use GgmlType as T;
        [T::Q4_0, T::Q4_1, T::Q5_0, T::Q5_1, T::Q8_0, T::Q4K, T::Q5K, T::Q6K]
            .map(|t| QFormat::of(t).expect("a block format"))
    }

    /// qs and aux bytes of one row of `cols` elements.
    pub fn row_parts(&self, cols: usize) -> (usize, usize) {
        let nblk = cols / self.dtype.block_size();
        (nblk * self.qb, nblk * self.ab)
    }

    /// Device bytes of a `[rows, cols]` matrix: qs, then aux from the next 256-byte boundary.
    pub fn device_bytes(&self, rows: usize, cols: usize) -> (usize, usize) {
        let (q, a) = self.row_parts(cols);
        let aux_off = (rows * q).div_ceil(256) * 256;
        (aux_off, aux_off + rows * a)
    }

    /// The device image of `rows` packed rows of `cols` elements (`bytes` as in the file):
    /// `(image, aux offset)`. Preconditions checked by [`check_tensor`].
    pub fn repack(&self, bytes: &[u8], rows: usize, cols: usize) -> (Vec<u8>, usize) {
        let (ts, bs) = (self.dtype.type_size(), self.dtype.block_size());
        let nblk_total = rows * (cols / bs);
        let (aux_off, total) = self.device_bytes(rows, cols);
        let mut out = vec![0u8; total];
        let (qs, aux) = out.split_at_mut(aux_off);
        for (i, b) in bytes.chunks_exact(ts).take(nblk_total).enumerate() {
            let mut q = &mut qs[i * self.qb..(i + 1) * self.qb];
            for &(s, e) in self.qs_ranges {
                q[..e - s].copy_from_slice(&b[s..e]);
                q = &mut q[e - s..];
            }
            let mut a = &mut aux[i * self.ab..(i + 1) * self.ab];
            for &(s, e) in self.aux_ranges {
                a[..e - s].copy_from_slice(&b[s..e]);
                a = &mut a[e - s..];
            }
        }
        (out, aux_off)
    }

    /// The file's bytes back from a device image (the inverse of [`QFormat::repack`]).
    pub fn unpack(&self, image: &[u8], rows: usize, cols: usize) -> Vec<u8> {
        let (ts, bs) = (self.dtype.type_size(), self.dtype.block_size());
        let n = rows * (cols / bs);
        let (aux_off, _) = self.device_bytes(rows, cols);
        let mut out = vec![0u8; n * ts];
        for (i, b) in out.chunks_exact_mut(ts).enumerate() {
            let mut q = &image[i * self.qb..];
            for &(s, e) in self.qs_ranges {
                b[s..e].copy_from_slice(&q[..e - s]);
                q = &q[e - s..];
            }
            let mut a = &image[aux_off + i * self.ab..];
            for &(s, e) in self.aux_ranges {
                b[s..e].copy_from_slice(&a[..e - s]);
                a = &a[e - s..];
            }
        }
        out
    }
}

/// Checks, before anything is allocated on the GPU, that a tensor's bytes match its shape and
/// format and that its row length fits the kernels (a whole number of kernel units, and a
/// multiple of 8 for the F16 kernels); the error names the tensor.
pub fn check_tensor(t: &Tensor) -> Result<(), CudaError> {
    let bad =
        |why: String| Err(CudaError::Weights(format!("tensor {} [{}, {}] {}: {why}", t.name, t.rows, t.cols, t.dtype)));
    let Some(rb) = t.dtype.row_bytes(t.cols) else {
        return bad(format!(
            "a row of {} elements is not a whole number of {}-element blocks",
            t.cols,
            t.dtype.block_size()
        ));
    };
    let want = rb.checked_mul(t.rows);
    if want != Some(t.bytes().len()) {
        return bad(format!("holds {} bytes, the shape needs {want:?} (truncated or corrupt)", t.bytes().len()));
    }
    match QFormat::of(t.dtype) {
        Some(f) if !t.cols.is_multiple_of(f.unit) => {
            bad(format!("the GPU kernels read rows in units of {} elements", f.unit))
        }
        None if !t.cols.is_multiple_of(8) => bad("the GPU kernels read F16 rows in groups of 8 elements".into()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quant::quantize_row;

    fn random_row(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / 8e6 - 1.0).collect()
    }

    #[test]
    fn repack_is_a_permutation_of_the_file_bytes_for_every_format() {
        for f in QFormat::all() {
            let (rows, cols) = (3, 512);
            let bytes: Vec<u8> = (0..rows).flat_map(|r| quantize_row(f.dtype, &random_row(cols, r as u32))).collect();
            let (img, aux_off) = f.repack(&bytes, rows, cols);
            assert_eq!(aux_off % 256, 0);
            assert_eq!(img.len(), f.device_bytes(rows, cols).1);
            assert_eq!(f.unpack(&img, rows, cols), bytes, "{}", f.dtype);
            // Every qs byte and every aux byte (but padding) comes from the file.
            let (ts, bs) = (f.dtype.type_size(), f.dtype.block_size());
            let used: usize = f.qs_ranges.iter().chain(f.aux_ranges).map(|(s, e)| e - s).sum();
            assert_eq!(used, ts, "{}: ranges cover the block", f.dtype);
            assert!(f.qb.is_multiple_of(16) && f.ab >= used - f.qb, "{}", f.dtype);
            assert!(bs.is_multiple_of(f.unit));
        }
    }

    #[test]
    fn bad_tensors_are_named_before_any_allocation() {
        let t = Tensor::from_bytes("blk.0.attn_q.weight", GgmlType::Q6K, 2, 256, vec![0; 420]);
        assert!(check_tensor(&t).is_ok());
        // An F32 matrix (widened to F16 on the GPU) whose rows are not whole 8-element groups.
        let t = Tensor::from_f32("blk.1.ffn_up.weight", 1, 12, &[0.0; 12]);
        let e = check_tensor(&t).unwrap_err().to_string();
        assert!(e.contains("blk.1.ffn_up.weight") && e.contains("groups of 8"), "{e}");
    }
}
