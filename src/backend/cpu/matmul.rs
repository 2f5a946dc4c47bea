//! Matrix products of packed weight matrices with f32 activations (the CPU hot path).
//!
//! `w` is `[rows, cols]` (packed GGML rows), `x` is `[n_tok, cols]`, `out` is `[n_tok, rows]`.
//! - Decode and batched decode (`n_tok <= gemv::MAX_T`): a GEMV straight over the packed
//!   blocks, each block widened once for all tokens, rayon over runs of rows (see `gemv`).
//! - Prefill (`n_tok > MAX_T`): rows are taken in tiles; a tile is dequantized once
//!   into an f32 scratch that fits L1/L2 and reused for every token by a register-blocked
//!   micro-kernel (4 rows x 3 tokens of 8-lane accumulators), so the work is compute-bound.

use rayon::prelude::*;

use super::gemv::{avx512_available, rows_multi, OutPtr, MAX_T};
use crate::model::quant::{self, GgmlType};
use crate::model::weights::Tensor;

/// Rows x tokens of one micro-kernel call (12 accumulators + 3 activation vectors + 1 weight
/// vector = the 16 AVX2 registers).
const MR: usize = 4;
const NT: usize = 3;
/// Target size of the dequantized f32 tile (fits the per-core L2 with room for activations).
const TILE_BYTES: usize = 96 * 1024;
/// Target size of the block of activations swept per tile pass (kept in L2).
const XBLOCK_BYTES: usize = 512 * 1024;

/// `out[t * w.rows + r] = sum_c w[r, c] * x[t * w.cols + c]` for `t < n_tok`.
///
/// Preconditions (the backend guarantees them): `x.len() >= n_tok * w.cols` and
/// `out.len() >= n_tok * w.rows`. Debug builds assert; release builds compute only the tokens
/// that fit both buffers.
pub fn matmul(w: &Tensor, x: &[f32], n_tok: usize, out: &mut [f32]) {
    let (rows, cols) = (w.rows, w.cols);
    debug_assert!(x.len() >= n_tok * cols, "matmul {}: x too short", w.name);
    debug_assert!(out.len() >= n_tok * rows, "matmul {}: out too short", w.name);
    if rows == 0 {
        return;
    }
    let n_tok = x.len().checked_div(cols).map_or(n_tok, |fit| n_tok.min(fit)).min(out.len() / rows);
    let out = &mut out[..n_tok * rows];
    if cols == 0 {
        out.fill(0.0);
    } else if n_tok > MAX_T {
        gemm(w, &x[..n_tok * cols], n_tok, out);
    } else if n_tok >= 1 {
        gemv_fused(&[w], &x[..n_tok * cols], n_tok, &mut [out]);
    }
}

/// Several matrices that read the same input (`x`: `[n_tok, cols]`, every `ws[i].cols == cols`),
/// e.g. Q/K/V or gate/up: `outs[i]` (`[n_tok, ws[i].rows]`) = `x . ws[i]^T`. For a few tokens
/// all of them share one parallel region (one fork/join instead of one per matrix); for more
/// tokens each goes through the tiled GEMM. Same preconditions as [`matmul`].
pub fn matmul_fused(ws: &[&Tensor], x: &[f32], n_tok: usize, outs: &mut [&mut [f32]]) {
    let cols = ws.first().map_or(0, |w| w.cols);
    let fits = ws.len() == outs.len()
        && ws.iter().all(|w| w.cols == cols && w.rows > 0)
        && ws.iter().zip(outs.iter()).all(|(w, o)| o.len() >= n_tok * w.rows)
        && x.len() >= n_tok * cols;
    debug_assert!(fits, "matmul_fused: mismatched shapes");
    if !fits || cols == 0 || n_tok > MAX_T {
        for (w, o) in ws.iter().zip(outs.iter_mut()) {
            matmul(w, x, n_tok, o);
        }
    } else if n_tok >= 1 {
        gemv_fused(ws, &x[..n_tok * cols], n_tok, outs);
    }
}

/// Packed bytes a parallel task should cover at least (rayon's fork/steal costs about a
/// microsecond; 48 KiB of weights take several).
const MIN_TASK_BYTES: usize = 48 * 1024;

/// `n_tok <= MAX_T` tokens through several matrices sharing `x`; tasks are runs of rows.
/// Preconditions checked by the callers: shapes match (see [`matmul_fused`]).
fn gemv_fused(ws: &[&Tensor], x: &[f32], n_tok: usize, outs: &mut [&mut [f32]]) {
    let total_bytes: usize = ws.iter().map(|w| w.bytes().len()).sum();
    let threads = rayon::current_num_threads();
    let n_tasks = (total_bytes / MIN_TASK_BYTES).clamp(1, threads * 4);
    let bytes_per_task = total_bytes.div_ceil(n_tasks).max(1);
    // (matrix, first row, row count), each run about `bytes_per_task` long.
    let mut tasks = Vec::with_capacity(n_tasks + ws.len());
    for (i, w) in ws.iter().enumerate() {
        let per = (bytes_per_task / w.row_bytes().max(1)).clamp(1, w.rows);
        let mut r0 = 0;
        while r0 < w.rows {
            let nr = per.min(w.rows - r0);
            tasks.push((i, r0, nr));
            r0 += nr;
        }
    }
    let ptrs: Vec<OutPtr> =
        ws.iter().zip(outs.iter_mut()).map(|(w, o)| OutPtr { ptr: o.as_mut_ptr(), ld: w.rows }).collect();
    let run = |&(i, r0, nr): &(usize, usize, usize)| {
        // SAFETY: tasks cover disjoint row ranges of matrix i; `outs[i]` holds `n_tok * rows`
        // cells (checked by the callers) and is mutably borrowed for the whole region.
        unsafe { rows_multi(ws[i], r0, nr, x, n_tok, ptrs[i]) };
    };
    if tasks.len() == 1 || threads == 1 {
        tasks.iter().for_each(run);
    } else {
        tasks.par_iter().for_each(run);
    }
}

/// Rows per tile: a multiple of `MR` whose f32 scratch is about `TILE_BYTES`.
fn tile_rows(cols: usize) -> usize {
    (TILE_BYTES / (4 * cols) / MR * MR).clamp(MR, 64)
}

/// Several tokens: tiles of rows, dequantized once, reused across all tokens.
fn gemm(w: &Tensor, x: &[f32], n_tok: usize, out: &mut [f32]) {
    let (rows, cols) = (w.rows, w.cols);
    let tile = tile_rows(cols);
    let n_tiles = rows.div_ceil(tile);
    let xblock = (XBLOCK_BYTES / (4 * cols) / NT * NT).max(NT);
    let simd = quant::simd_available();
    // Same summation order as the AVX-512 GEMV (see `gemv`): batch-invariant results.
    let wide = simd && avx512_available() && matches!(w.dtype, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0);
    // Results tile-major ([tile][token][row in tile]) so each task owns one contiguous part;
    // scattered to the token-major `out` afterwards.
    let mut parts = vec![0f32; n_tiles * tile * n_tok];
    parts.par_chunks_mut(tile * n_tok).enumerate().for_each_init(
        || vec![0f32; tile * cols],
        |scratch, (ti, part)| {
            let r0 = ti * tile;
            let nr = tile.min(rows - r0);
            for r in 0..nr {
                quant::dequantize_row(w.dtype, w.row(r0 + r), &mut scratch[r * cols..(r + 1) * cols]);
            }
            for t0 in (0..n_tok).step_by(xblock) {
                let nt = xblock.min(n_tok - t0);
                let xs = &x[t0 * cols..(t0 + nt) * cols];
                let dst = &mut part[t0 * tile..(t0 + nt) * tile];
                #[cfg(target_arch = "x86_64")]
                if wide {
                    // SAFETY: avx512f was detected at run time; these types have cols % 32 == 0.
                    unsafe { tile_avx512(&scratch[..nr * cols], nr, cols, xs, nt, dst, tile) };
                    continue;
                }
                #[cfg(target_arch = "x86_64")]
                if simd {
                    // SAFETY: avx2, fma and f16c were detected at run time (quant::simd_available).
                    unsafe { tile_avx2(&scratch[..nr * cols], nr, cols, xs, nt, dst, tile) };
                    continue;
                }
                let _ = (simd, wide);
                tile_scalar(&scratch[..nr * cols], nr, cols, xs, nt, dst, tile);
            }
        },
    );
    out.par_chunks_mut(rows).enumerate().for_each(|(t, o)| {
        for ti in 0..n_tiles {
            let r0 = ti * tile;
            let nr = tile.min(rows - r0);
            let src = &parts[ti * tile * n_tok + t * tile..][..nr];
            o[r0..r0 + nr].copy_from_slice(src);
        }
    });
}

/// Portable tile product: `dst[t * ld_dst + r] = wt[r, :] . x[t, :]`.
fn tile_scalar(wt: &[f32], nr: usize, cols: usize, x: &[f32], nt: usize, dst: &mut [f32], ld_dst: usize) {
    for t in 0..nt {
        let xr = &x[t * cols..(t + 1) * cols];
        for r in 0..nr {
            let wr = &wt[r * cols..(r + 1) * cols];
            let mut acc = [0f32; 8];
            for (a, b) in wr.chunks_exact(8).zip(xr.chunks_exact(8)) {
                for l in 0..8 {
                    acc[l] += a[l] * b[l];
                }
            }
            let whole = cols / 8 * 8;
            let tail: f32 = wr[whole..].iter().zip(&xr[whole..]).map(|(a, b)| a * b).sum();
            dst[t * ld_dst + r] = acc.iter().sum::<f32>() + tail;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    #[inline(always)]
    pub(super) unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// `R` rows of `w` times `T` rows of `x` (both with row stride `ld`, `k` columns), written to
    /// `dst[t * ld_dst + r]`. Caller guarantees the reads and writes are in bounds.
    #[inline(always)]
    pub(super) unsafe fn micro<const R: usize, const T: usize>(
        w: *const f32,
        x: *const f32,
        k: usize,
        ld: usize,
        dst: *mut f32,
        ld_dst: usize,
    ) {
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        let k8 = k / 8 * 8;
        let mut i = 0;
        while i < k8 {
            let mut xv = [_mm256_setzero_ps(); T];
            for (t, v) in xv.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(x.add(t * ld + i));
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let wv = _mm256_loadu_ps(w.add(r * ld + i));
                for (a, xv_t) in acc_r.iter_mut().zip(&xv) {
                    *a = _mm256_fmadd_ps(wv, *xv_t, *a);
                }
            }
            i += 8;
        }
        for (r, acc_r) in acc.iter().enumerate() {
            for (t, a) in acc_r.iter().enumerate() {
                let mut s = hsum(*a);
                for j in k8..k {
                    s += *w.add(r * ld + j) * *x.add(t * ld + j);
                }
                *dst.add(t * ld_dst + r) = s;
            }
        }
    }
}

/// AVX2 tile product, same contract as [`tile_scalar`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2(wt: &[f32], nr: usize, cols: usize, x: &[f32], nt: usize, dst: &mut [f32], ld_dst: usize) {
    use avx2::micro;
    assert!(wt.len() >= nr * cols && x.len() >= nt * cols && dst.len() >= (nt.max(1) - 1) * ld_dst + nr);
    let (wp, xp, dp) = (wt.as_ptr(), x.as_ptr(), dst.as_mut_ptr());
    for r0 in (0..nr).step_by(MR) {
        let mr = MR.min(nr - r0);
        for t0 in (0..nt).step_by(NT) {
            let tn = NT.min(nt - t0);
            let (w, x, d) = (wp.add(r0 * cols), xp.add(t0 * cols), dp.add(t0 * ld_dst + r0));
            match (mr, tn) {
                (4, 3) => micro::<4, 3>(w, x, cols, cols, d, ld_dst),
                (4, 2) => micro::<4, 2>(w, x, cols, cols, d, ld_dst),
                (4, _) => micro::<4, 1>(w, x, cols, cols, d, ld_dst),
                (3, 3) => micro::<3, 3>(w, x, cols, cols, d, ld_dst),
                (3, 2) => micro::<3, 2>(w, x, cols, cols, d, ld_dst),
                (3, _) => micro::<3, 1>(w, x, cols, cols, d, ld_dst),
                (2, 3) => micro::<2, 3>(w, x, cols, cols, d, ld_dst),
                (2, 2) => micro::<2, 2>(w, x, cols, cols, d, ld_dst),
                (2, _) => micro::<2, 1>(w, x, cols, cols, d, ld_dst),
                (_, 3) => micro::<1, 3>(w, x, cols, cols, d, ld_dst),
                (_, 2) => micro::<1, 2>(w, x, cols, cols, d, ld_dst),
                (_, _) => micro::<1, 1>(w, x, cols, cols, d, ld_dst),
            }
        }
    }
}

/// AVX-512 tile product for rows of whole 32-element blocks, same contract as
/// [`tile_scalar`]. Per (row, token): a 16-lane accumulator over the first half of every
/// block and one over the second half, then `reduce(lo + hi)`: the order of the AVX-512 GEMV.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_avx512(wt: &[f32], nr: usize, cols: usize, x: &[f32], nt: usize, dst: &mut [f32], ld_dst: usize) {
    use std::arch::x86_64::*;
    assert!(
        cols.is_multiple_of(32)
            && wt.len() >= nr * cols
            && x.len() >= nt * cols
            && dst.len() >= (nt.max(1) - 1) * ld_dst + nr
    );
    #[inline(always)]
    unsafe fn micro<const R: usize, const T: usize>(
        w: *const f32,
        x: *const f32,
        cols: usize,
        dst: *mut f32,
        ld_dst: usize,
    ) {
        let mut lo = [[_mm512_setzero_ps(); T]; R];
        let mut hi = [[_mm512_setzero_ps(); T]; R];
        for b in 0..cols / 32 {
            let xv: [(__m512, __m512); T] = std::array::from_fn(|t| {
                (_mm512_loadu_ps(x.add(t * cols + 32 * b)), _mm512_loadu_ps(x.add(t * cols + 32 * b + 16)))
            });
            for r in 0..R {
                let (w0, w1) =
                    (_mm512_loadu_ps(w.add(r * cols + 32 * b)), _mm512_loadu_ps(w.add(r * cols + 32 * b + 16)));
                for t in 0..T {
                    lo[r][t] = _mm512_fmadd_ps(w0, xv[t].0, lo[r][t]);
                    hi[r][t] = _mm512_fmadd_ps(w1, xv[t].1, hi[r][t]);
                }
            }
        }
        for r in 0..R {
            for t in 0..T {
                *dst.add(t * ld_dst + r) = _mm512_reduce_add_ps(_mm512_add_ps(lo[r][t], hi[r][t]));
            }
        }
    }
    let (wp, xp, dp) = (wt.as_ptr(), x.as_ptr(), dst.as_mut_ptr());
    for r0 in (0..nr).step_by(4) {
        let mr = 4.min(nr - r0);
        for t0 in (0..nt).step_by(2) {
            let tn = 2.min(nt - t0);
            let (w, x, d) = (wp.add(r0 * cols), xp.add(t0 * cols), dp.add(t0 * ld_dst + r0));
            match (mr, tn) {
                (4, 2) => micro::<4, 2>(w, x, cols, d, ld_dst),
                (4, _) => micro::<4, 1>(w, x, cols, d, ld_dst),
                (3, 2) => micro::<3, 2>(w, x, cols, d, ld_dst),
                (3, _) => micro::<3, 1>(w, x, cols, d, ld_dst),
                (2, 2) => micro::<2, 2>(w, x, cols, d, ld_dst),
                (2, _) => micro::<2, 1>(w, x, cols, d, ld_dst),
                (_, 2) => micro::<1, 2>(w, x, cols, d, ld_dst),
                (_, _) => micro::<1, 1>(w, x, cols, d, ld_dst),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quant::{dequantize_row, quantize_row, GgmlType};

    fn values(n: usize, seed: u64) -> Vec<f32> {
        crate::model::quant::tests::uniform_values(n, seed)
    }

    fn random_tensor(dtype: GgmlType, rows: usize, cols: usize, seed: u64) -> Tensor {
        let vals = values(rows * cols, seed);
        let bytes: Vec<u8> = vals.chunks(cols).flat_map(|r| quantize_row(dtype, r)).collect();
        Tensor::from_bytes("test", dtype, rows, cols, bytes)
    }

    /// Checks `matmul` against an f64 product of the dequantized weights.
    fn check(w: &Tensor, n_tok: usize, seed: u64) {
        let (rows, cols) = (w.rows, w.cols);
        let x = values(n_tok * cols, seed);
        let mut out = vec![f32::NAN; n_tok * rows];
        matmul(w, &x, n_tok, &mut out);
        let mut wr = vec![0f32; cols];
        for r in 0..rows {
            dequantize_row(w.dtype, w.row(r), &mut wr);
            for t in 0..n_tok {
                let xt = &x[t * cols..(t + 1) * cols];
                let want: f64 = wr.iter().zip(xt).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
                let mag: f64 = wr.iter().zip(xt).map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs()).sum();
                let got = f64::from(out[t * rows + r]);
                assert!(
                    (got - want).abs() <= 1e-5 * mag + 1e-6,
                    "{} [{rows}x{cols}] n_tok {n_tok}: out[{t},{r}] = {got}, want {want}",
                    w.dtype
                );
            }
        }
    }

    #[test]
    fn matmul_matches_f64_reference_all_types() {
        for (i, dtype) in GgmlType::ALL.into_iter().enumerate() {
            for rows in [49, 577] {
                let w = random_tensor(dtype, rows, 512, 100 + i as u64);
                for n_tok in [1, 3, 17] {
                    check(&w, n_tok, 7 * n_tok as u64 + rows as u64);
                }
            }
        }
    }

    #[test]
    fn results_do_not_depend_on_the_token_count() {
        // A token's output must be bitwise the same alone, in a small batch (GEMV) and in a
        // prefill batch (tiled GEMM): greedy output may not depend on the batch.
        for (i, dtype) in GgmlType::ALL.into_iter().enumerate() {
            let w = random_tensor(dtype, 37, 256, 300 + i as u64);
            let x = values(20 * 256, 9);
            let mut alone = vec![0f32; 37];
            matmul(&w, &x[..256], 1, &mut alone);
            for n_tok in [2, 5, 8, 9, 20] {
                let mut out = vec![0f32; n_tok * 37];
                matmul(&w, &x[..n_tok * 256], n_tok, &mut out);
                assert_eq!(out[..37], alone[..], "{dtype}: token 0 of {n_tok} differs from token 0 alone");
            }
        }
    }

    #[test]
    fn matmul_odd_shapes() {
        // Float rows whose length is not a multiple of 8 (micro-kernel and GEMV tails), a single
        // row, and more tokens than one activation block.
        for dtype in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            let w = random_tensor(dtype, 13, 77, 5);
            for n_tok in [1, 2, 5] {
                check(&w, n_tok, 11);
            }
        }
        check(&random_tensor(GgmlType::Q8_0, 1, 64, 6), 4, 12);
        check(&random_tensor(GgmlType::Q4_1, 6, 1536, 7), 300, 13);
    }

    #[test]
    fn matmul_scalar_tile_matches_avx2_tile() {
        // The portable tile kernel is the fallback on CPUs without AVX2: test it directly.
        let (nr, cols, nt, ld) = (7, 40, 5, 8);
        let (wt, x) = (values(nr * cols, 1), values(nt * cols, 2));
        let mut a = vec![0f32; nt * ld];
        tile_scalar(&wt, nr, cols, &x, nt, &mut a, ld);
        for t in 0..nt {
            for r in 0..nr {
                let want: f32 = (0..cols).map(|c| wt[r * cols + c] * x[t * cols + c]).sum();
                assert!((a[t * ld + r] - want).abs() < 1e-5, "t{t} r{r}");
            }
        }
        #[cfg(target_arch = "x86_64")]
        if quant::simd_available() {
            let mut b = vec![0f32; nt * ld];
            // SAFETY: avx2, fma and f16c were detected at run time.
            unsafe { tile_avx2(&wt, nr, cols, &x, nt, &mut b, ld) };
            for (p, q) in a.iter().zip(&b) {
                assert!((p - q).abs() < 1e-5);
            }
        }
    }

    /// Timings on the sample model's real matrices:
    /// `cargo test --release bench_matmul_sample_shapes -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn bench_matmul_sample_shapes() {
        use crate::model::config::ModelConfig;
        use crate::model::gguf::GgufFile;
        use crate::model::weights::ModelWeights;
        use std::time::Instant;

        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/samples/models/SmolLM2-135M-Instruct.Q4_1.gguf");
        // The real sample model; where it is absent (a bare benchmark machine), random weights
        // of the same shapes and types (30 layers, dim 576, kv 192, ffn 1536 Q4_1; Q8_0 head).
        let (mats, output): (Vec<Tensor>, Tensor) = match GgufFile::open(path) {
            Ok(g) => {
                let cfg = ModelConfig::from_gguf(&g).expect("config");
                let mw = ModelWeights::from_gguf(&g, &cfg).expect("weights");
                let mats = mw
                    .layers
                    .iter()
                    .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down])
                    .cloned()
                    .collect();
                (mats, mw.output.clone())
            }
            Err(e) => {
                println!("{e}: using random weights of the sample model's shapes");
                let q = GgmlType::Q4_1;
                let shapes = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)];
                let mats = (0..30 * shapes.len())
                    .map(|i| random_tensor(q, shapes[i % 7].0, shapes[i % 7].1, i as u64))
                    .collect();
                (mats, random_tensor(GgmlType::Q8_0, 49152, 576, 999))
            }
        };
        let mats: Vec<&Tensor> = mats.iter().collect();
        let max_cols = mats.iter().map(|m| m.cols).max().unwrap_or(0).max(output.cols);
        let max_rows = mats.iter().map(|m| m.rows).max().unwrap_or(0).max(output.rows);
        println!("threads {}  simd {}", rayon::current_num_threads(), quant::simd_available());

        // Decode: one token through every layer matrix, then the output head.
        let x = values(256 * max_cols, 3);
        let mut out = vec![0f32; 256 * max_rows];
        let reps = 20;
        for m in &mats {
            matmul(m, &x, 1, &mut out); // warm the page cache / mapping
        }
        let t = Instant::now();
        for _ in 0..reps {
            for m in &mats {
                matmul(m, &x, 1, &mut out);
            }
        }
        let layers_ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
        matmul(&output, &x, 1, &mut out);
        let t = Instant::now();
        for _ in 0..reps {
            matmul(&output, &x, 1, &mut out);
        }
        let head_ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
        let bytes: usize = mats.iter().map(|m| m.bytes().len()).sum::<usize>() + output.bytes().len();
        let total = layers_ms + head_ms;
        println!(
            "decode: layers {layers_ms:.2} ms + head ({} {}x{}) {head_ms:.2} ms = {total:.2} ms/token ({:.1} GB/s)",
            output.dtype,
            output.rows,
            output.cols,
            bytes as f64 / total / 1e6
        );

        // Kernel alone, one thread, no fork/join: a matrix hot in cache, then all layers streamed.
        for n_tok in [1usize, 8] {
            let m = mats[4];
            // Best of 30 rounds of 10 calls (robust to other processes taking the core).
            let mut best = f64::MAX;
            for _ in 0..30 {
                let t = Instant::now();
                for _ in 0..10 {
                    // SAFETY: `out` holds n_tok * rows cells; single thread.
                    unsafe { rows_multi(m, 0, m.rows, &x, n_tok, OutPtr { ptr: out.as_mut_ptr(), ld: m.rows }) };
                }
                best = best.min(t.elapsed().as_secs_f64() / 10.0);
            }
            let hot = m.bytes().len() as f64 / best / 1e9;
            let t = Instant::now();
            for _ in 0..5 {
                for m in &mats {
                    // SAFETY: as above.
                    unsafe { rows_multi(m, 0, m.rows, &x, n_tok, OutPtr { ptr: out.as_mut_ptr(), ld: m.rows }) };
                }
            }
            let per = t.elapsed().as_secs_f64() / 5.0;
            let lb: usize = mats.iter().map(|m| m.bytes().len()).sum();
            println!(
                "1 thread, {n_tok} tok: hot {} {hot:.1} GB/s; all layers {:.2} ms ({:.1} GB/s)",
                m.dtype,
                per * 1e3,
                lb as f64 / per / 1e9
            );
        }

        // Prefill: 256 tokens through every layer matrix; the head for all 256 separately.
        for n_tok in [16usize, 256] {
            let t = Instant::now();
            for m in &mats {
                matmul(m, &x, n_tok, &mut out);
            }
            let s = t.elapsed().as_secs_f64();
            let macs: f64 = mats.iter().map(|m| (m.rows * m.cols) as f64).sum::<f64>() * n_tok as f64;
            println!(
                "prefill {n_tok} tokens, layer matrices: {:.1} ms = {:.0} tok/s ({:.1} GFLOP/s)",
                s * 1e3,
                n_tok as f64 / s,
                2.0 * macs / s / 1e9
            );
        }
        let t = Instant::now();
        matmul(&output, &x, 256, &mut out);
        let s = t.elapsed().as_secs_f64();
        println!("prefill 256 tokens, output head: {:.1} ms", s * 1e3);
    }
}
