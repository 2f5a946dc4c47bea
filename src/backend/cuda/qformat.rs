//! The GPU layout of GGML block formats (kernels/quant.cuh) and the load-time repack into it.
//!
//! A matrix `[rows, cols]` of `nblk = cols / block_size` blocks per row becomes two arrays in
//! one device buffer: `qs [rows, nblk, qb]` (the quantized values, 16-byte aligned so that a
//! thread reads them with 16-byte loads) then `aux [rows, nblk, ab]` (scales, mins, high bits).
//! Both are byte permutations of the file's blocks (Q6_K's scales reordered per kernel unit),
//! except that the 12 scale bytes of a Q4_K / Q5_K super-block are rewritten by a bijection of
//! their bits ([`pack_k_scales`]: each unit's scales and mins at fixed bit offsets) and that
//! the 256 nibbles of a Q4_K super-block are put in sub-block order ([`q4k_subblock_nibbles`]).
//! So the repacked form is exact: `unpack` gives back the file's bytes (tested for every format).

use rayon::prelude::*;

use crate::model::quant::GgmlType;
use crate::model::weights::Tensor;

use super::CudaError;

/// A GGML block format the quantized kernels read, with its device layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QFormat {
    pub dtype: GgmlType,
    /// Index of the format in the per-format kernel tables (`entries`).
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
    /// Q4_K / Q5_K: the aux offset of the 12 packed scale bytes, rewritten by
    /// [`pack_k_scales`] (a bijection of their 96 bits).
    k_scales: Option<usize>,
    /// Q4_K: the qs nibbles of each super-block in sub-block order ([`q4k_subblock_nibbles`]).
    subblock_nibbles: bool,
}

/// Q6_K's 16 scales reordered so that unit `w = 2 hh + g` of a super-block (quant.cuh FQ6K)
/// finds its four runs' scales `sc[8 hh + g + 2 k]`, k = 0..3, in aux word `w`; then d.
const Q6K_AUX: &[(usize, usize)] = &[
    (192, 193),
    (194, 195),
    (196, 197),
    (198, 199),
    (193, 194),
    (195, 196),
    (197, 198),
    (199, 200),
    (200, 201),
    (202, 203),
    (204, 205),
    (206, 207),
    (201, 202),
    (203, 204),
    (205, 206),
    (207, 208),
    (208, 210),
];

/// The 6-bit scale and min of sub-block `j` (0..8) from a K super-block's 12 scale bytes (the
/// file's packing, model/quant/kquants.rs).
fn k_scale_min(s: &[u8], j: usize) -> (u32, u32) {
    if j < 4 {
        ((s[j] & 63) as u32, (s[j + 4] & 63) as u32)
    } else {
        (((s[j + 4] & 15) | (s[j - 4] >> 6) << 4) as u32, ((s[j + 4] >> 4) | (s[j] >> 6) << 4) as u32)
    }
}

/// Nibble `e` (element 0..256) of a Q4_K super-block's 128 qs bytes in the file's order:
/// byte `32c + l` holds element `64c + l` (low nibble) and `64c + 32 + l` (high nibble).
fn q4k_file_nibble(q: &[u8], e: usize) -> u8 {
    let (j, i) = (e / 32, e % 32);
    let b = q[32 * (j / 2) + i];
    if j % 2 == 0 {
        b & 15
    } else {
        b >> 4
    }
}

/// Nibble `e` of a Q4_K super-block's qs in sub-block order (the inverse layout below).
fn q4k_subblock_nibble(q: &[u8], e: usize) -> u8 {
    let (j, i) = (e / 32, e % 32);
    let b = q[16 * j + i % 16];
    if i < 16 {
        b & 15
    } else {
        b >> 4
    }
}

/// Reorders the 128 qs bytes of a Q4_K super-block for the GPU (quant.cuh FQ4K): byte
/// `16j + i` (j = 0..8, i = 0..16) holds element `32j + i` (low nibble) and `32j + 16 + i`
/// (high nibble), so one 16-byte load is one whole sub-block (one scale and min, one
/// activation block of 32) instead of halves of two. A bijection of the nibbles.
pub fn q4k_subblock_nibbles(q: &mut [u8]) {
    let file: [u8; 128] = q[..128].try_into().expect("128 qs bytes");
    for j in 0..8 {
        for i in 0..16 {
            q[16 * j + i] = q4k_file_nibble(&file, 32 * j + i) | q4k_file_nibble(&file, 32 * j + 16 + i) << 4;
        }
    }
}

/// The inverse of [`q4k_subblock_nibbles`]: the file's qs order back.
pub fn q4k_file_nibbles(q: &mut [u8]) {
    let dev: [u8; 128] = q[..128].try_into().expect("128 qs bytes");
    for c in 0..4 {
        for l in 0..32 {
            q[32 * c + l] = q4k_subblock_nibble(&dev, 64 * c + l) | q4k_subblock_nibble(&dev, 64 * c + 32 + l) << 4;
        }
    }
}

/// Rewrites the 12 scale bytes of a Q4_K / Q5_K super-block for the GPU: chunk `c` (sub-blocks
/// 2c, 2c + 1: one kernel unit's two runs) as the 24 bits from bit 24c of the 96-bit
/// little-endian string, `sc[2c] | mn[2c] << 6 | sc[2c+1] << 12 | mn[2c+1] << 18`: a thread
/// extracts its four values with one funnel shift and constant shifts (quant.cuh
/// `k_chunk_bits`) instead of the file's data-dependent byte selects.
pub fn pack_k_scales(s: &mut [u8]) {
    let mut bits: u128 = 0;
    for c in 0..4 {
        let (s0, m0) = k_scale_min(s, 2 * c);
        let (s1, m1) = k_scale_min(s, 2 * c + 1);
        bits |= ((s0 | m0 << 6 | s1 << 12 | m1 << 18) as u128) << (24 * c);
    }
    s[..12].copy_from_slice(&bits.to_le_bytes()[..12]);
}

/// The inverse of [`pack_k_scales`]: the file's 12 scale bytes back.
pub fn unpack_k_scales(s: &mut [u8]) {
    let mut b = [0u8; 16];
    b[..12].copy_from_slice(&s[..12]);
    let bits = u128::from_le_bytes(b);
    let v = |j: usize, min: bool| ((bits >> (24 * (j / 2) + 12 * (j % 2) + if min { 6 } else { 0 })) & 63) as u8;
    let mut out = [0u8; 12];
    for j in 0..4 {
        out[j] = v(j, false) | (v(j + 4, false) >> 4) << 6;
        out[j + 4] = v(j, true) | (v(j + 4, true) >> 4) << 6;
        out[j + 8] = (v(j + 4, false) & 15) | (v(j + 4, true) & 15) << 4;
    }
    s[..12].copy_from_slice(&out);
}

impl QFormat {
    /// The device layout of `dtype`; `None` for the float types (they become F16).
    pub fn of(dtype: GgmlType) -> Option<QFormat> {
        let f = |index, qb, ab, qs_ranges, aux_ranges, unit| {
            Some(QFormat { dtype, index, qb, ab, qs_ranges, aux_ranges, unit, k_scales: None, subblock_nibbles: false })
        };
        let k = |f: Option<QFormat>| f.map(|f| QFormat { k_scales: Some(4), ..f });
        match dtype {
            GgmlType::Q4_0 => f(0, 16, 2, &[(2, 18)], &[(0, 2)], 32),
            GgmlType::Q4_1 => f(1, 16, 4, &[(4, 20)], &[(0, 4)], 32),
            // aux: qh (u32, 4-byte aligned first), then d (and m).
            GgmlType::Q5_0 => f(2, 16, 8, &[(6, 22)], &[(2, 6), (0, 2)], 32),
            GgmlType::Q5_1 => f(3, 16, 8, &[(8, 24)], &[(4, 8), (0, 4)], 32),
            GgmlType::Q8_0 => f(4, 32, 2, &[(2, 34)], &[(0, 2)], 32),
            // aux: d, dmin, the scales (rewritten by pack_k_scales).
            // qs: in sub-block order (q4k_subblock_nibbles).
            GgmlType::Q4K => {
                k(f(5, 128, 16, &[(16, 144)], &[(0, 16)], 32)).map(|f| QFormat { subblock_nibbles: true, ..f })
            }
            GgmlType::Q5K => k(f(6, 128, 48, &[(48, 176)], &[(0, 48)], 32)),
            // qs: ql[128] and qh[64]; aux: scales[16] (reordered: Q6K_AUX) then d.
            GgmlType::Q6K => f(7, 192, 20, &[(0, 192)], Q6K_AUX, 64),
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
        self.repack_parts(&[bytes], rows, cols)
    }

    /// [`QFormat::repack`] of matrices stacked along rows (`parts`: their file bytes in order,
    /// `rows` in all), without joining them first.
    pub fn repack_parts(&self, parts: &[&[u8]], rows: usize, cols: usize) -> (Vec<u8>, usize) {
        let (ts, bs) = (self.dtype.type_size(), self.dtype.block_size());
        let nblk_total = rows * (cols / bs);
        let (aux_off, total) = self.device_bytes(rows, cols);
        let mut out = vec![0u8; total];
        let (mut qs, aux) = out.split_at_mut(aux_off);
        let mut aux = aux;
        let mut left = nblk_total;
        // Blocks are independent: runs of them repack on every core (an 18.5 GB Qwen3-30B-A3B
        // file is 129 M blocks, ~20 s on one core, most of the model's load time).
        const RUN: usize = 4096;
        for part in parts {
            let n = (part.len() / ts).min(left);
            let (q, q_rest) = std::mem::take(&mut qs).split_at_mut(n * self.qb);
            let (a, a_rest) = std::mem::take(&mut aux).split_at_mut(n * self.ab);
            (qs, aux, left) = (q_rest, a_rest, left - n);
            q.par_chunks_mut(self.qb * RUN)
                .zip(a.par_chunks_mut(self.ab * RUN))
                .zip(part[..n * ts].par_chunks(ts * RUN))
                .for_each(|((q, a), b)| self.repack_blocks(b, q, a));
        }
        (out, aux_off)
    }

    /// Repacks whole file blocks `b` into their qs part `q` and aux part `a` (same block count).
    fn repack_blocks(&self, b: &[u8], qs: &mut [u8], aux: &mut [u8]) {
        let ts = self.dtype.type_size();
        for ((b, q), blk) in b.chunks_exact(ts).zip(qs.chunks_exact_mut(self.qb)).zip(aux.chunks_exact_mut(self.ab)) {
            let mut qr = &mut q[..];
            for &(s, e) in self.qs_ranges {
                qr[..e - s].copy_from_slice(&b[s..e]);
                qr = &mut qr[e - s..];
            }
            let mut a = &mut blk[..];
            for &(s, e) in self.aux_ranges {
                a[..e - s].copy_from_slice(&b[s..e]);
                a = &mut a[e - s..];
            }
            if let Some(o) = self.k_scales {
                pack_k_scales(&mut blk[o..o + 12]);
            }
            if self.subblock_nibbles {
                q4k_subblock_nibbles(q);
            }
        }
    }

    /// The file's bytes back from a device image (the inverse of [`QFormat::repack`]).
    pub fn unpack(&self, image: &[u8], rows: usize, cols: usize) -> Vec<u8> {
        let (ts, bs) = (self.dtype.type_size(), self.dtype.block_size());
        let n = rows * (cols / bs);
        let (aux_off, _) = self.device_bytes(rows, cols);
        let mut out = vec![0u8; n * ts];
        for (i, b) in out.chunks_exact_mut(ts).enumerate() {
            let mut qv = image[i * self.qb..(i + 1) * self.qb].to_vec();
            if self.subblock_nibbles {
                q4k_file_nibbles(&mut qv);
            }
            let mut q = &qv[..];
            for &(s, e) in self.qs_ranges {
                b[s..e].copy_from_slice(&q[..e - s]);
                q = &q[e - s..];
            }
            let mut blk = image[aux_off + i * self.ab..aux_off + (i + 1) * self.ab].to_vec();
            if let Some(o) = self.k_scales {
                unpack_k_scales(&mut blk[o..o + 12]);
            }
            let mut a = &blk[..];
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

    /// The scale rewrite is a bijection of the 96 bits (every byte pattern comes back) and puts
    /// chunk c's values where quant.cuh's k_chunk_bits reads them.
    #[test]
    fn stacked_parts_repack_as_the_joined_matrix_across_parallel_runs() {
        // 9,001 rows of one block: three runs of 4,096 blocks, parts split mid-run.
        for t in [GgmlType::Q4K, GgmlType::Q8_0] {
            let f = QFormat::of(t).expect("a block format");
            let cols = t.block_size().max(256);
            let rows = 9001;
            let bytes: Vec<u8> = (0..rows).flat_map(|r| quantize_row(t, &random_row(cols, r as u32))).collect();
            let row = bytes.len() / rows;
            let (a, b) = bytes.split_at(5000 * row);
            let (b, c) = b.split_at(17 * row);
            let joined = f.repack(&bytes, rows, cols);
            assert_eq!(f.repack_parts(&[a, b, c], rows, cols), joined, "{t}");
            assert_eq!(f.unpack(&joined.0, rows, cols), bytes, "{t}");
        }
    }

    #[test]
    fn k_scale_repack_round_trips_and_places_each_chunk() {
        let mut seed = 0x9e37_79b9u32;
        for _ in 0..2000 {
            let mut s = [0u8; 12];
            for b in &mut s {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                *b = (seed >> 24) as u8;
            }
            let file = s;
            pack_k_scales(&mut s);
            let mut w = [0u8; 16];
            w[..12].copy_from_slice(&s);
            let bits = u128::from_le_bytes(w);
            for c in 0..4 {
                let f = (bits >> (24 * c)) as u32;
                let want = [k_scale_min(&file, 2 * c), k_scale_min(&file, 2 * c + 1)];
                assert_eq!([(f & 63, f >> 6 & 63), (f >> 12 & 63, f >> 18 & 63)], want, "chunk {c}");
            }
            unpack_k_scales(&mut s);
            assert_eq!(s, file);
        }
    }

    /// The Q4_K qs reorder puts element `32j + i` where quant.cuh FQ4K reads it (unit j, run
    /// i / 16, byte i % 16) and is undone by its inverse.
    #[test]
    fn q4k_nibbles_in_subblock_order_decode_to_the_file_values() {
        let f = QFormat::of(GgmlType::Q4K).expect("a block format");
        let cols = 512;
        let row = random_row(cols, 7);
        let bytes = quantize_row(GgmlType::Q4K, &row);
        let mut want = vec![0f32; cols];
        crate::model::quant::dequantize_row(GgmlType::Q4K, &bytes, &mut want);
        let (img, aux_off) = f.repack(&bytes, 1, cols);
        for (sb, blk) in bytes.chunks_exact(144).enumerate() {
            let q = &img[128 * sb..128 * (sb + 1)];
            let aux = &img[aux_off + 16 * sb..aux_off + 16 * (sb + 1)];
            let d = crate::model::quant::f16_to_f32(u16::from_le_bytes([aux[0], aux[1]]));
            let dmin = crate::model::quant::f16_to_f32(u16::from_le_bytes([aux[2], aux[3]]));
            let mut w = [0u8; 16];
            w[..12].copy_from_slice(&aux[4..16]);
            let bits = u128::from_le_bytes(w);
            for j in 0..8 {
                let chunk = (bits >> (24 * (j / 2))) as u32 >> (12 * (j % 2));
                let (sc, mn) = ((chunk & 63) as f32, (chunk >> 6 & 63) as f32);
                for i in 0..32 {
                    let code = (q[16 * j + i % 16] >> (4 * (i / 16))) & 15;
                    let v = d * sc * code as f32 - dmin * mn;
                    let e = 256 * sb + 32 * j + i;
                    let tol = 1e-6 * ((d * sc * code as f32).abs() + (dmin * mn).abs()) + 1e-9;
                    assert!((v - want[e]).abs() <= tol, "element {e}: {v} vs {}", want[e]);
                }
            }
            let mut back = q.to_vec();
            q4k_file_nibbles(&mut back);
            assert_eq!(back, blk[16..144], "super-block {sb}");
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
