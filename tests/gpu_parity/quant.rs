//! Quantized weights on the GPU against their CPU twins (the CPU backend's dot products and
//! decoders on the file's packed blocks), for every block format: the decode GEMV on int8
//! activations (1..=8 tokens; twin: the CPU dot products on the int8-rounded input, `q8x`), the
//! f32-input GEMV (`DUSTOFF_QGEMV_F32=1`), the widen-to-F16 path of larger steps (9..300
//! tokens, through the one dispatcher, in row chunks of a small scratch), the SwiGLU GEMVs, the
//! embedding gather, and whole models (CUDA backend vs CPU backend on the same quantized file,
//! a Q4_K_M-like mix included).

use cudarc::driver::CudaSlice;

use dustoff::backend::cpu::matmul::matmul;
use dustoff::backend::cuda::dmat::{DevMat, Linear};
use dustoff::backend::cuda::matmul::{Mm, Product};
use dustoff::backend::cuda::ops::gemm_tc::tc64_part_len;
use dustoff::backend::cuda::ops::launch::Dev;
use dustoff::backend::cuda::ops::q8x::{dequantized, matmul_q8x};
use dustoff::backend::cuda::ops::qlaunch::{q8x_bytes, DequantF16, EmbeddingQ, GemmQ, GemvQ, QTile, QuantizeX};
use dustoff::backend::cuda::qformat::QFormat;
use dustoff::backend::cuda::CudaBackend;
use dustoff::model::quant::{dequantize_row, dot_row, quantize_row, staged_f16_row, GgmlType};
use dustoff::model::weights::Tensor;

use super::{compare, f16_vals, gpu, opts, run_greedy, with_extras, Gpu};

/// The token counts of the issues (11 and its kernel follow-up): GEMV (1..=4 by default, up to
/// 8), the packed GEMM (5..=64) and widened-F16 steps (65..).
const TOKEN_COUNTS: &[usize] = &[1, 2, 3, 4, 5, 7, 8, 9, 16, 33, 64, 65, 300, 512];

pub(super) fn tensor(g: &mut Gpu, dtype: GgmlType, name: &str, rows: usize, cols: usize) -> Tensor {
    let a = (3.0 / cols as f32).sqrt();
    let mut bytes = Vec::new();
    for _ in 0..rows {
        bytes.extend(quantize_row(dtype, &g.randn(cols, a)));
    }
    Tensor::from_bytes(name, dtype, rows, cols, bytes)
}

fn op(kind: &str, t: GgmlType) -> String {
    format!("{kind}_{}", t.name().to_ascii_lowercase())
}

/// Every format: a two-part Linear (the format's rows, then Q8_0 rows, as a Q4_K_M QKV with a
/// Q6_K V has two parts) with bias and accumulation, through `Mm::run` at every token count.
#[test]
fn quantized_products_every_format_and_token_count() {
    let Some(mut g) = gpu("quantized products") else { return };
    let s = g.dev.stream.clone();
    let blas = cudarc::cublas::CudaBlas::new(s.clone()).unwrap();
    let cols = 512;
    // Whole 64-row tiles: steps of 9..64 tokens take the tensor-core GEMM on the packed blocks.
    let (rows_a, rows_b) = (320, 64);
    let rows = rows_a + rows_b;
    let nmax = *TOKEN_COUNTS.iter().max().unwrap();
    let x16: CudaSlice<u16> = g.zeros(nmax.max(16) * cols);
    let part: CudaSlice<f32> = g.zeros(tc64_part_len(rows, cols, 64).max(1));
    // Room for 128 rows only: at 300 tokens the 320-row part is widened in three chunks.
    let wide: CudaSlice<u16> = g.zeros(128 * cols);
    for f in QFormat::all() {
        let ta = tensor(&mut g, f.dtype, "a", rows_a, cols);
        let tb = tensor(&mut g, GgmlType::Q8_0, "b", rows_b, cols);
        let (lin, _) = Linear::upload(&s, &[&ta, &tb], false, "w").unwrap();
        assert_eq!(lin.parts.len(), if f.dtype == GgmlType::Q8_0 { 1 } else { 2 });
        let bias = g.randn(rows, 1.0);
        let bd = g.up(&bias);
        for &n in TOKEN_COUNTS {
            let x = g.randn(n * cols, 2.0);
            let prev = g.randn(n * rows, 4.0);
            let (xd, od) = (g.up(&x), g.up(&prev));
            let accumulate = n % 2 == 1;
            let with_bias = n % 3 != 0;
            let mut mm = Mm { s: &s, blas: Some(&blas), x16: g.d(&x16), part: g.d(&part), wide: Some(g.d(&wide)) };
            let p = Product { lin: &lin, bias: with_bias.then(|| g.d(&bd)), x: g.d(&xd), n, out: g.d(&od), accumulate };
            mm.run(&mut g.k, p).unwrap();
            // The GEMV steps (1..=4 tokens) read the input as int8 (its twin: the CPU product on
            // those values); 5..64 tokens take the GEMM on the packed blocks, 300 are widened
            // (x16 holds 300 rows, the GEMM would read 320): both round weights and input to
            // F16 (the "wide" tolerance).
            let gemv = n <= 4;
            let xin = if gemv { dequantized(&x, cols) } else { x.clone() };
            let want = with_extras(two_part(&ta, &tb, &xin, n).0, &bias, with_bias, &prev, accumulate);
            let kind = if gemv { "gemvq8" } else { "wide" };
            eprintln!("{} n={n}", f.dtype);
            let got = g.down(&od);
            compare(&op(kind, f.dtype), g.seed, &got, &want);
            let (plain32, wa32) = two_part(&ta, &tb, &x, n);
            if gemv {
                // Against the f32 input: the int8 rounding left is the only extra error.
                let want32 = with_extras(plain32.clone(), &bias, with_bias, &prev, accumulate);
                compare(&op("q8x_vs_f32", f.dtype), g.seed, &got, &want32);
            }
            if n <= 8 {
                // Both GEMV kernels serve up to 8 tokens (DUSTOFF_QGEMV_MAX_TOKENS): checked
                // directly on the first part (one part, Q8_0 with Q8_0, holds all rows).
                let m0 = &lin.parts[0];
                let (want_f32, want_q8) = if lin.parts.len() == 1 {
                    (plain32.clone(), two_part(&ta, &tb, &dequantized(&x, cols), n).0)
                } else {
                    (wa32.clone(), two_part(&ta, &tb, &dequantized(&x, cols), n).1)
                };
                QuantizeX { x: g.d(&xd), xq: g.d(&x16).bytes(), n_tok: n, cols, x_stride: cols }
                    .launch(&mut g.k, &s)
                    .unwrap();
                for (kind, q8, want) in [("gemv", false, &want_f32), ("gemvq8", true, &want_q8)] {
                    let od = g.poisoned(n * m0.rows);
                    GemvQ {
                        w: m0.quant(&s).unwrap(),
                        x: g.d(&xd),
                        out: g.d(&od),
                        bias: None,
                        rows: m0.rows,
                        n_tok: n,
                        x_stride: cols,
                        out_stride: m0.rows,
                        accumulate: false,
                        swiglu: false,
                        xq: q8.then(|| g.d(&x16).bytes()),
                    }
                    .launch(&mut g.k, &s)
                    .unwrap();
                    compare(&op(kind, f.dtype), g.seed, &g.down(&od), want);
                }
            }
        }
    }
}

/// The product of the two-part Linear (`ta`'s rows, then `tb`'s) with `x` on the CPU:
/// `(all rows [n, rows_a + rows_b], ta's rows [n, rows_a])`.
fn two_part(ta: &Tensor, tb: &Tensor, x: &[f32], n: usize) -> (Vec<f32>, Vec<f32>) {
    let (rows_a, rows_b) = (ta.rows, tb.rows);
    let (mut wa, mut wb) = (vec![0f32; n * rows_a], vec![0f32; n * rows_b]);
    matmul(ta, x, n, &mut wa);
    matmul(tb, x, n, &mut wb);
    let mut plain = Vec::with_capacity(n * (rows_a + rows_b));
    for t in 0..n {
        plain.extend_from_slice(&wa[t * rows_a..(t + 1) * rows_a]);
        plain.extend_from_slice(&wb[t * rows_b..(t + 1) * rows_b]);
    }
    (plain, wa)
}

/// Every format, 9..512 tokens: the tensor-core GEMM on the packed blocks (gemm_quant.cu) equals
/// its twin, the product of the weights as the kernel stages them (`staged_f16_row`: Q4_K and
/// Q6_K in F16 arithmetic) and the input rounded to F16, summed in f64; with split-K (a scratch for 2 splits) and without. The
/// 64-row tiles on 192 rows (three blocks); above 64 tokens the 128-token prefill tile (65: one
/// partial tile; 300: two whole and a partial one; 512: four), split-K only at 9..=64. The
/// 128-row batch tile on 256 rows at 9..=128 tokens (partial token fragments: 9, 17, 40, 100),
/// and added into an output of a wider stride (1,280 columns: 10 chunks over the splits). The
/// K-split tile at 9..=64 tokens (8-token fragments past the tokens: 9, 20, 33) the same ways.
#[test]
fn packed_gemm_equals_f16_rounded_twin() {
    let Some(mut g) = gpu("packed gemm") else { return };
    let rows64 = [(9usize, false), (16, true), (33, true), (64, false), (65, false), (300, true), (512, false)];
    packed_gemm_cases(&mut g, (192, 1024), QTile::Rows64, &rows64.map(|(n, s)| (n, s, false)));
    let rows128 = [
        (9usize, true),
        (17, false),
        (32, true),
        (40, false),
        (40, true),
        (64, true),
        (64, false),
        (100, true),
        (128, false),
    ];
    packed_gemm_cases(&mut g, (256, 1024), QTile::Rows128, &rows128.map(|(n, s)| (n, s, false)));
    packed_gemm_cases(&mut g, (256, 1280), QTile::Rows128, &[(24, true, true), (64, true, true), (100, false, true)]);
}

/// `cases`: (tokens, split-K scratch, accumulate into an output of stride rows + 64).
fn packed_gemm_cases(g: &mut super::Gpu, (rows, cols): (usize, usize), tile: QTile, cases: &[(usize, bool, bool)]) {
    let s = g.dev.stream.clone();
    let part: CudaSlice<f32> = g.zeros(2 * 128 * rows);
    for f in QFormat::all() {
        let t = tensor(g, f.dtype, "w", rows, cols);
        let (m, _) = DevMat::upload(&s, &[&t], false, "w").unwrap();
        let mut w16 = vec![0f32; rows * cols];
        for (r, o) in w16.chunks_exact_mut(cols).enumerate() {
            staged_f16_row(f.dtype, t.row(r), o);
        }
        for &(n, split, accumulate) in cases {
            let x = f16_vals(&super::f16_bits(&g.randn(n * cols, 2.0)));
            let mut xpad = super::f16_bits(&x);
            xpad.resize(GemmQ::input_rows(n) * cols, 0);
            let xd = g.up(&xpad);
            let bias = g.randn(rows, 1.0);
            let bd = g.up(&bias);
            let stride = if accumulate { rows + 64 } else { rows };
            let (od, mut want) = if accumulate {
                let init = g.randn(n * stride, 1.0);
                (g.up(&init), init)
            } else {
                (g.poisoned(n * rows), vec![0f32; n * rows])
            };
            let used = GemmQ {
                w: m.quant(&s).unwrap(),
                x16: g.d(&xd),
                out: g.d(&od),
                bias: Some(g.d(&bd)),
                n_tok: n,
                out_stride: stride,
                accumulate,
                part: split.then(|| g.d(&part)),
            }
            .launch_tile(&mut g.k, &s, tile)
            .unwrap();
            assert_eq!(used, tile, "{n} tokens on [{rows}, {cols}]");
            for tk in 0..n {
                for r in 0..rows {
                    let dot: f64 = (0..cols).map(|c| w16[r * cols + c] as f64 * x[tk * cols + c] as f64).sum();
                    let w = &mut want[tk * stride + r];
                    *w = (dot + bias[r] as f64 + if accumulate { *w as f64 } else { 0.0 }) as f32;
                }
            }
            eprintln!(
                "gemmq {:?} {tile:?}: {n} tokens, [{rows}, {cols}], split {split}, accumulate {accumulate}",
                f.dtype
            );
            compare(&op("gemmq", f.dtype), g.seed, &g.down(&od), &want);
        }
    }
}

/// Every format: the widened F16 matrix equals the CPU decoder's values rounded to F16 (bit for
/// bit up to the f32 rounding of an fma), the embedding gather equals the CPU decoder's rows,
/// and the fused SwiGLU GEMV equals silu(gate) * up of the CPU dot products.
#[test]
fn dequant_embedding_and_swiglu_every_format() {
    let Some(mut g) = gpu("dequant, embedding, swiglu") else { return };
    let s = g.dev.stream.clone();
    let (rows, cols) = (40, 768);
    for f in QFormat::all() {
        // Rows longer than one widening block's units (256: 16,896 columns are 528 units of
        // 32 and 264 of 64), so a row spans several blocks, the last one partly idle.
        let t = tensor(&mut g, f.dtype, "w", 6, 16_896);
        let (m, _) = DevMat::upload(&s, &[&t], false, "w").unwrap();
        let out: CudaSlice<u16> = g.zeros(4 * 16_896);
        DequantF16 { w: m.quant(&s).unwrap(), out: g.d(&out), row0: 1, n_rows: 4 }.launch(&mut g.k, &s).unwrap();
        let mut want = vec![0f32; 4 * 16_896];
        for (r, o) in want.chunks_exact_mut(16_896).enumerate() {
            dequantize_row(f.dtype, t.row(1 + r), o);
            o.iter_mut().for_each(|v| *v = half::f16::from_f32(*v).to_f32());
        }
        compare(&op("dequant", f.dtype), g.seed, &f16_vals(&g.down(&out)), &want);

        let t = tensor(&mut g, f.dtype, "w", rows, cols);
        let (m, _) = DevMat::upload(&s, &[&t], false, "w").unwrap();
        let w = m.quant(&s).unwrap();
        let out: CudaSlice<u16> = g.zeros(17 * cols);
        DequantF16 { w, out: g.d(&out), row0: 5, n_rows: 17 }.launch(&mut g.k, &s).unwrap();
        let mut want = vec![0f32; 17 * cols];
        for (r, o) in want.chunks_exact_mut(cols).enumerate() {
            dequantize_row(f.dtype, t.row(5 + r), o);
            o.iter_mut().for_each(|v| *v = half::f16::from_f32(*v).to_f32());
        }
        compare(&op("dequant", f.dtype), g.seed, &f16_vals(&g.down(&out)), &want);

        let ids: Vec<u32> = vec![3, 39, 0, 3, 17];
        let (idd, od) = (g.up(&ids), g.poisoned(ids.len() * cols));
        let ids_dev: Dev<u32> = g.d(&idd);
        EmbeddingQ { table: w, ids: ids_dev, out: g.d(&od), n_tok: ids.len() }.launch(&mut g.k, &s).unwrap();
        let mut want = vec![0f32; ids.len() * cols];
        for (o, &id) in want.chunks_exact_mut(cols).zip(&ids) {
            dequantize_row(f.dtype, t.row(id as usize), o);
        }
        compare(&op("embedding", f.dtype), g.seed, &g.down(&od), &want);

        let ffn = rows / 2;
        let xq: CudaSlice<u8> = g.zeros(q8x_bytes(8, cols).2);
        for n in [1usize, 3, 8] {
            let x = g.randn(n * cols, 1.5);
            let xd = g.up(&x);
            QuantizeX { x: g.d(&xd), xq: g.d(&xq), n_tok: n, cols, x_stride: cols }.launch(&mut g.k, &s).unwrap();
            for (kind, q8) in [("swiglu", false), ("swigluq8", true)] {
                let od = g.poisoned(n * ffn);
                GemvQ {
                    w,
                    x: g.d(&xd),
                    out: g.d(&od),
                    bias: None,
                    rows: ffn,
                    n_tok: n,
                    x_stride: cols,
                    out_stride: ffn,
                    accumulate: false,
                    swiglu: true,
                    xq: q8.then(|| g.d(&xq)),
                }
                .launch(&mut g.k, &s)
                .unwrap();
                let xin = if q8 { dequantized(&x, cols) } else { x.clone() };
                let mut want = vec![0f32; n * ffn];
                for tk in 0..n {
                    let xt = &xin[tk * cols..(tk + 1) * cols];
                    for r in 0..ffn {
                        let (gate, up) = (dot_row(f.dtype, t.row(r), xt), dot_row(f.dtype, t.row(ffn + r), xt));
                        want[tk * ffn + r] = gate / (1.0 + (-gate).exp()) * up;
                    }
                }
                compare(&op(kind, f.dtype), g.seed, &g.down(&od), &want);
            }
        }
    }
}

/// The int8 input (quantize_x_q8) equals its CPU twin bit for bit: both planes of codes, and
/// each run's scale and scaled code sums; and the dp4a GEMV on it equals `q8x::matmul_q8x` (5 tokens;
/// 1 token with 4 and 2 weight rows per warp, plain and SwiGLU).
#[test]
fn int8_activations_equal_the_cpu_twin() {
    let Some(mut g) = gpu("int8 activations") else { return };
    let s = g.dev.stream.clone();
    let (n, cols, rows) = (5, 1024, 64);
    // A wide dynamic range per block, and one all-zero block (scale 0).
    let mut x = g.randn(n * cols, 30.0);
    x[64..96].iter_mut().for_each(|v| *v = 0.0);
    let xd = g.up(&x);
    let xq: CudaSlice<u8> = g.zeros(q8x_bytes(n, cols).2);
    QuantizeX { x: g.d(&xd), xq: g.d(&xq), n_tok: n, cols, x_stride: cols }.launch(&mut g.k, &s).unwrap();
    let bytes = g.down(&xq);
    let (ql_off, xs_off, _) = q8x_bytes(n, cols);
    for t in 0..n {
        let (q, l, ds) = dustoff::backend::cuda::ops::q8x::quantize(&x[t * cols..(t + 1) * cols]);
        let codes =
            |off: usize| -> Vec<i8> { bytes[off + t * cols..off + (t + 1) * cols].iter().map(|&b| b as i8).collect() };
        assert_eq!(codes(0), q, "token {t}: hi codes");
        assert_eq!(codes(ql_off), l, "token {t}: lo codes");
        for run in 0..cols / 16 {
            let o = xs_off + 8 * (t * (cols / 16) + run);
            let d = f32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
            let ds_got = f32::from_le_bytes(bytes[o + 4..o + 8].try_into().unwrap());
            let sum: i32 = q[16 * run..16 * run + 16].iter().map(|&v| v as i32).sum();
            let sum_l: i32 = l[16 * run..16 * run + 16].iter().map(|&v| v as i32).sum();
            assert_eq!(d, ds[run / 2], "token {t} run {run}: scale");
            let dl = d * dustoff::backend::cuda::ops::q8x::Q8X_LO;
            assert_eq!(ds_got, dl.mul_add(sum_l as f32, d * sum as f32), "token {t} run {run}: scaled sums");
        }
    }
    let (xq1, x1) = (g.zeros::<u8>(q8x_bytes(1, cols).2), g.up(&x[..cols]));
    QuantizeX { x: g.d(&x1), xq: g.d(&xq1), n_tok: 1, cols, x_stride: cols }.launch(&mut g.k, &s).unwrap();
    for f in QFormat::all() {
        let tw = tensor(&mut g, f.dtype, "w", rows, cols);
        let (m, _) = DevMat::upload(&s, &[&tw], false, "w").unwrap();
        // n tokens, then 1 token with 4 and with 2 weight rows per warp (the plain and the
        // SwiGLU entries: gate rows 0..rows / 2, up rows after them).
        let mut cases = vec![(n, false, false)];
        for swiglu in [false, true] {
            cases.extend([(1, false, swiglu), (1, true, swiglu)]);
        }
        for (nt, rows2, swiglu) in cases {
            let (xin, xqd) = if nt == 1 { (&x1, &xq1) } else { (&xd, &xq) };
            let out_rows = if swiglu { rows / 2 } else { rows };
            let od = g.poisoned(nt * out_rows);
            GemvQ {
                w: m.quant(&s).unwrap(),
                x: g.d(xin),
                out: g.d(&od),
                bias: None,
                rows: out_rows,
                n_tok: nt,
                x_stride: cols,
                out_stride: out_rows,
                accumulate: false,
                swiglu,
                xq: Some(g.d(xqd)),
            }
            .launch_rows(&mut g.k, &s, rows2)
            .unwrap();
            let mut want = vec![0f32; nt * rows];
            matmul_q8x(&tw, &x[..nt * cols], nt, &mut want);
            if swiglu {
                let (gate, up) = want.split_at(rows / 2);
                want = gate.iter().zip(up).map(|(&a, &b)| a / (1.0 + (-a).exp()) * b).collect();
            }
            let kind = if swiglu { "swigluq8" } else { "gemvq8" };
            eprintln!("{} n={nt} rows2={rows2} swiglu={swiglu}", f.dtype);
            compare(&op(kind, f.dtype), g.seed, &g.down(&od), &want);
        }
    }
}

/// A small Qwen3-shaped model (2 layers, 1024 wide, a 4096-token vocabulary) whose matrices
/// are all `dtype` (layer 0's attn_v and ffn_down in `v_down` when given: a mixed QKV).
fn small_model(
    dtype: GgmlType,
    v_down: Option<GgmlType>,
) -> (dustoff::model::config::ModelConfig, dustoff::model::weights::ModelWeights) {
    let mut cfg = dustoff::model::shapes::shape("qwen3-0.6b").unwrap();
    cfg.n_layers = 2;
    cfg.vocab_size = 4096;
    let mut w = dustoff::model::synth::random_weights(&cfg, dtype, 11);
    if let Some(t) = v_down {
        let other = dustoff::model::synth::random_weights(&cfg, t, 12);
        w.layers[0].wv = other.layers[0].wv.clone();
        w.layers[0].w_down = other.layers[0].w_down.clone();
    }
    (cfg, w)
}

/// The whole CUDA backend on quantized weights kept packed against the CPU backend on the same
/// file: prefill logits (37 tokens: the widened F16 path) and 12 decode steps (the packed GEMV),
/// both fed the CPU's greedy tokens (teacher forcing, so that one near-tie does not fork the
/// sequences), within the F16 model's tolerance, for every format and a Q4_K + Q6_K mix. Where
/// the GPU's own greedy choice differs, the CPU's top two logits must be a near-tie.
#[test]
fn quantized_models_match_cpu_backend() {
    let Some(g) = gpu("quantized models vs cpu") else { return };
    drop(g);
    let mut cases: Vec<(GgmlType, Option<GgmlType>)> = QFormat::all().iter().map(|f| (f.dtype, None)).collect();
    cases.push((GgmlType::Q4K, Some(GgmlType::Q6K)));
    for (dtype, mix) in cases {
        let (cfg, w) = small_model(dtype, mix);
        let mut gb = CudaBackend::new(cfg.clone(), &w, &opts(8)).expect("CUDA backend");
        eprintln!("{dtype} (+{mix:?}): {}", dustoff::backend::Backend::describe(&gb));
        assert_eq!(gb.formats.iter().find(|f| f.0 == GgmlType::F16), None, "{dtype}: no matrix widened at load");
        let want_formats = if mix.is_some() { 2 } else { 1 };
        assert_eq!(gb.formats.len(), want_formats, "{dtype}: {:?}", gb.formats);
        let mut cb = dustoff::backend::cpu::CpuBackend::new(cfg, w, 8, 16);
        let prompt: Vec<u32> = (0..37).map(|i| 50 + i * 97).collect();
        let want = run_greedy(&mut cb, &prompt, 12);
        let forced: Vec<u32> = want.iter().map(|l| dustoff::engine::sampler::argmax(l)).collect();
        let got = run_forced(&mut gb, &prompt, &forced[..12]);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            compare("cuda_vs_cpu_logits", i as u64, a, b);
            let (ga, ca) = (dustoff::engine::sampler::argmax(a), dustoff::engine::sampler::argmax(b));
            if ga != ca {
                let margin = (b[ca as usize] - b[ga as usize]) as f64;
                eprintln!("{dtype} step {i}: GPU picks {ga}, CPU {ca}, CPU margin {margin:.4}");
                assert!(margin < super::TAU_GPU, "{dtype} step {i}: greedy differs beyond a near-tie ({margin})");
            }
        }
    }
}

/// Runs `prompt`, then feeds `tokens` one by one; returns the logits after the prompt and
/// after each token.
fn run_forced(b: &mut dyn dustoff::backend::Backend, prompt: &[u32], tokens: &[u32]) -> Vec<Vec<f32>> {
    use dustoff::engine::single::SingleSeq;
    let mut seq = SingleSeq::new(&*b, 0, prompt.len() + tokens.len() + 1).unwrap();
    let mut all = vec![seq.feed(b, prompt).unwrap()];
    for &t in tokens {
        all.push(seq.feed(b, &[t]).unwrap());
    }
    all
}

/// `--weights f16` widens block formats at load (the older path) and computes the same model.
#[test]
fn f16_weights_option_widens_at_load() {
    let Some(g) = gpu("f16 weights option") else { return };
    drop(g);
    let (cfg, w) = small_model(GgmlType::Q4_0, None);
    let o = dustoff::backend::cuda::CudaOptions { f16_weights: true, ..opts(8) };
    let mut wide = CudaBackend::new(cfg.clone(), &w, &o).expect("CUDA backend");
    assert_eq!(wide.formats.len(), 1, "{:?}", wide.formats);
    assert_eq!(wide.formats[0].0, GgmlType::F16);
    let mut packed = CudaBackend::new(cfg, &w, &opts(8)).expect("CUDA backend");
    assert!(packed.weight_bytes * 3 < wide.weight_bytes, "{} vs {}", packed.weight_bytes, wide.weight_bytes);
    let prompt: Vec<u32> = (0..20).map(|i| 7 + i * 131).collect();
    let a = run_greedy(&mut wide, &prompt, 4);
    let b = run_greedy(&mut packed, &prompt, 4);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        compare("cuda_vs_cpu_logits", i as u64, x, y);
    }
}
