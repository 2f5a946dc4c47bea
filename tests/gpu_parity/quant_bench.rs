//! Run by hand on the GPU machine (`--ignored`): the quantized decode kernels alone on the
//! Qwen3-8B matrices, per format, as bytes of packed weights read per second, next to the copy
//! bandwidth of the same run; and the cost of widening a matrix to F16 (steps of 9+ tokens).
//! Each timing is a run of back-to-back launches over the rotating copies (as in a replayed
//! decode graph, no host gap between kernels), divided by the launches.

use dustoff::backend::cuda::dmat::DevMat;
use dustoff::backend::cuda::ops::launch::Dev;
use dustoff::backend::cuda::ops::qlaunch::{q8x_bytes, DequantF16, GemmQ, GemvQ, QTile, QView, QuantizeX};
use dustoff::backend::cuda::WeightMix;
use dustoff::model::quant::GgmlType;
use dustoff::model::synth_scale::Scale;

use super::bench::time;
use super::{gpu, Gpu};

/// Median GPU time of `f`'s launches captured once as a CUDA graph and replayed (after a direct
/// run that loads the modules), in seconds.
fn time_graph(g: &mut super::Gpu, f: &mut dyn FnMut(&mut super::Gpu)) -> f64 {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    f(g);
    let s = g.dev.stream.clone();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    f(g);
    let graph = s.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("a captured graph");
    time(g, &mut |_| graph.launch().unwrap())
}

/// The packed GEMV of `rows x cols` weights over `n` contiguous tokens (`[n, cols]` in,
/// `[n, rows]` out): int8 planes `xq` where given, else the f32 input.
pub(super) fn gemv(
    w: QView,
    x: Dev<f32>,
    out: Dev<f32>,
    (rows, cols, n): (usize, usize, usize),
    swiglu: bool,
    xq: Option<Dev<u8>>,
) -> GemvQ {
    GemvQ { w, x, out, bias: None, rows, n_tok: n, x_stride: cols, out_stride: rows, accumulate: false, swiglu, xq }
}

/// Synthetic `[rows, cols]` matrices of format `t` (seeds 1, 2, ...): as many as reach `bytes`
/// in all (rounded up, within `lo..=hi` copies), so that kernels timed over them in turn do
/// not read the L2.
fn copies(
    g: &mut Gpu,
    t: GgmlType,
    (rows, cols): (usize, usize),
    what: &str,
    (bytes, lo, hi): (usize, usize, usize),
) -> Vec<DevMat> {
    let s = g.dev.stream.clone();
    let probe = DevMat::synthetic(&s, &mut g.k, t, rows, cols, (Scale::Matrix, 1), what).unwrap();
    let ratio = bytes as f64 / probe.bytes() as f64;
    let n = ratio.ceil().clamp(lo as f64, hi as f64) as usize;
    let mut ws = vec![probe];
    for j in 1..n {
        ws.push(DevMat::synthetic(&s, &mut g.k, t, rows, cols, (Scale::Matrix, j as u64 + 1), what).unwrap());
    }
    ws
}

/// Widening (dequant_<fmt>_f16) alone on the Qwen3-8B layer matrices, per format: GB/s moved
/// (packed bytes read + F16 bytes written) against the copy bandwidth of the same run, over
/// rotating copies (at least 256 MB of them, so the L2 does not serve the reads).
/// `DUSTOFF_BREAKDOWN_FORMATS` picks the formats (default the Q4_K_M ones, then Q4_0, Q8_0).
#[test]
#[ignore]
fn widen_breakdown() {
    let mut g = gpu("widening breakdown").unwrap();
    let s = g.dev.stream.clone();
    let bw = g.dev.copy_bandwidth(1 << 30, 10).unwrap();
    eprintln!("copy bandwidth {:.0} GB/s", bw / 1e9);
    let dim = 4096;
    let wide = g.zeros::<u16>(2 * 12288 * dim);
    let formats = std::env::var("DUSTOFF_BREAKDOWN_FORMATS").unwrap_or_else(|_| "q4_k,q6_k,q4_0,q8_0".into());
    for name in formats.split(',') {
        let Some(WeightMix::Uniform(t)) = WeightMix::parse(name) else { panic!("{name}: one block format") };
        for (what, rows, cols) in [("qkv", 6144, dim), ("o", dim, dim), ("gate/up", 24576, dim), ("down", dim, 12288)] {
            let ws = copies(&mut g, t, (rows, cols), what, (256 << 20, 2, 16));
            let (bytes, n_copies) = (ws[0].bytes() as f64, ws.len());
            let mut i = 0;
            let dt = time(&mut g, &mut |g| {
                let w = ws[i % n_copies].quant(&s).unwrap();
                i += 1;
                DequantF16 { w, out: g.d(&wide), row0: 0, n_rows: rows }.launch(&mut g.k, &s).unwrap();
            });
            let moved = bytes + (rows * cols * 2) as f64;
            eprintln!(
                "widen {name:5} {what:8} [{rows}x{cols}]: {:7.1} us {:6.0} GB/s moved ({:.0}% of copy)",
                dt * 1e6,
                moved / dt / 1e9,
                100.0 * moved / dt / bw
            );
        }
    }
}

#[test]
#[ignore]
fn quant_kernel_breakdown() {
    let mut g = gpu("quantized kernel breakdown").unwrap();
    let s = g.dev.stream.clone();
    let bw = g.dev.copy_bandwidth(1 << 30, 10).unwrap();
    eprintln!("copy bandwidth {:.0} GB/s", bw / 1e9);
    let dim = 4096;
    let xv = g.randn(8 * 12288, 1.0);
    let x = g.up(&xv);
    let out = g.zeros::<f32>(64 * 151_936);
    let xq = g.zeros::<u8>(q8x_bytes(8, 12288).2);
    let x16 = g.zeros::<u16>(64 * 12288);
    let part = g.zeros::<f32>(8 * 64 * 24576);
    let formats = std::env::var("DUSTOFF_BREAKDOWN_FORMATS").unwrap_or_else(|_| "q4_0,q8_0,q4_k,q6_k,q5_k".into());
    for name in formats.split(',') {
        let Some(WeightMix::Uniform(t)) = WeightMix::parse(name) else { panic!("{name}: one block format") };
        assert_ne!(t, GgmlType::F16);
        for (what, rows, cols, swiglu) in [
            ("qkv", 6144, dim, false),
            ("o", dim, dim, false),
            ("gate/up+swiglu", 12288, dim, true),
            ("down", dim, 12288, false),
            ("head", 151_936, dim, false),
        ] {
            let all_rows = rows * if swiglu { 2 } else { 1 };
            // Several copies so that repeated runs do not read the L2.
            let ws = copies(&mut g, t, (all_rows, cols), what, (2 << 30, 1, 8));
            let (bytes, n_copies) = (ws[0].bytes() as f64, ws.len());
            let mut i = 0;
            // Launches per timing (each on the next copy).
            let reps = n_copies.max(4);
            // DUSTOFF_BREAKDOWN_GEMM_ONLY=1: the packed GEMM rows only.
            let gemv_ns: &[usize] =
                if std::env::var("DUSTOFF_BREAKDOWN_GEMM_ONLY").is_ok_and(|v| v == "1") { &[] } else { &[1, 2, 8] };
            for &n in gemv_ns {
                // f32: the f32-input kernel (DUSTOFF_QGEMV_F32=1); int8: quantize_x_q8 then the
                // dp4a kernel (both launches timed: the default path's cost per matrix input).
                // int8r2: 2 weight rows per warp (DUSTOFF_QGEMV_ROWS=2), 1 token only.
                for (kind, q8, rows2) in [("f32   ", false, false), ("int8  ", true, false), ("int8r2", true, true)] {
                    if rows2 && n != 1 {
                        continue;
                    }
                    let dt = time(&mut g, &mut |g| {
                        for _ in 0..reps {
                            let w = ws[i % n_copies].quant(&s).unwrap();
                            i += 1;
                            if q8 {
                                QuantizeX { x: g.d(&x), xq: g.d(&xq), n_tok: n, cols, x_stride: cols }
                                    .launch(&mut g.k, &s)
                                    .unwrap();
                            }
                            let xq = q8.then(|| g.d(&xq));
                            gemv(w, g.d(&x), g.d(&out), (rows, cols, n), swiglu, xq)
                                .launch_rows(&mut g.k, &s, rows2)
                                .unwrap();
                        }
                    }) / reps as f64;
                    eprintln!(
                        "gemv {name} {kind} {what:15} [{all_rows}x{cols}] {n} tok: {:8.1} us {:7.0} GB/s ({:.0}% of copy)",
                        dt * 1e6,
                        bytes / dt / 1e9,
                        100.0 * bytes / dt / bw
                    );
                }
                // The decode path as a replayed graph runs it: quantize_x_q8 then the int8 GEMV
                // on each copy in turn, captured once, no host launches between the kernels.
                let dt = time_graph(&mut g, &mut |g| {
                    for j in 0..reps {
                        let w = ws[j % n_copies].quant(&s).unwrap();
                        QuantizeX { x: g.d(&x), xq: g.d(&xq), n_tok: n, cols, x_stride: cols }
                            .launch(&mut g.k, &s)
                            .unwrap();
                        gemv(w, g.d(&x), g.d(&out), (rows, cols, n), swiglu, Some(g.d(&xq)))
                            .launch(&mut g.k, &s)
                            .unwrap();
                    }
                }) / reps as f64;
                eprintln!(
                    "gemv {name} graph  {what:15} [{all_rows}x{cols}] {n} tok: {:8.1} us {:7.0} GB/s ({:.0}% of copy)",
                    dt * 1e6,
                    bytes / dt / 1e9,
                    100.0 * bytes / dt / bw
                );
            }
            // The packed tensor-core GEMM (steps of 9+ tokens) at 16, 32, 48 and 64 tokens (the SwiGLU
            // matrix as its plain gate/up product), the 64-row tiles and the 128-row batch tile.
            let tiles = [QTile::Rows64, QTile::Rows128];
            for (n, tile) in [16usize, 32, 48, 64].into_iter().flat_map(|n| tiles.map(|t| (n, t))) {
                let dt = time(&mut g, &mut |g| {
                    for _ in 0..reps {
                        let w = ws[i % n_copies].quant(&s).unwrap();
                        i += 1;
                        GemmQ {
                            w,
                            x16: g.d(&x16),
                            out: g.d(&out),
                            bias: None,
                            n_tok: n,
                            out_stride: all_rows,
                            accumulate: false,
                            part: Some(g.d(&part)),
                        }
                        .launch_tile(&mut g.k, &s, tile)
                        .unwrap();
                    }
                }) / reps as f64;
                eprintln!(
                    "gemm {name} {tile:?} {what:15} [{all_rows}x{cols}] {n} tok: {:8.1} us {:7.0} GB/s ({:.0}% of copy)",
                    dt * 1e6,
                    bytes / dt / 1e9,
                    100.0 * bytes / dt / bw
                );
            }
        }
    }
}

/// Prefill of one 768-token prompt on the synthetic Qwen3-8B shape (`bench --synthetic
/// qwen3-8b --dtype D` weights), per weight mix (`DUSTOFF_PREFILL_DTYPES`, default
/// `q4_k_m,f16`) and per chunking (steps of 512 tokens, the engine's default, and the backend's
/// `prefill_chunk`): the median wall time of 3 prompts after a warm-up, then the GPU time per
/// kernel class of 3 more (`DUSTOFF_PROFILE`'s classes, graphs off; the sums of the 3 prompts
/// are printed, so a class's time per prompt is a third of its line).
#[test]
#[ignore]
fn prefill_profile() {
    use dustoff::backend::cuda::CudaBackend;
    use dustoff::backend::Backend;
    use dustoff::engine::single::SingleSeq;
    let Some(g) = gpu("prefill profile") else { return };
    drop(g);
    let cfg = dustoff::model::shapes::shape("qwen3-8b").unwrap();
    let dtypes = std::env::var("DUSTOFF_PREFILL_DTYPES").unwrap_or_else(|_| "q4_k_m,f16".into());
    let n = 768;
    let prompt = dustoff::commands::bench::bench_prompt(n, cfg.vocab_size);
    for dtype in dtypes.split(',') {
        let mix = WeightMix::parse(dtype).expect("a weight mix");
        let mut b = CudaBackend::synthetic_mix(cfg.clone(), mix, 1, &super::opts((n + 16).div_ceil(16))).unwrap();
        b.load_kernels().unwrap();
        let mut chunks = vec![512, b.prefill_chunk()];
        chunks.dedup();
        for chunk in chunks {
            // One prompt fed `chunk` tokens a call (each call a step of at most prefill_chunk).
            let prefill = |b: &mut CudaBackend| {
                let mut seq = SingleSeq::new(b, 0, n + 16).unwrap();
                let t = std::time::Instant::now();
                for part in prompt.chunks(chunk) {
                    seq.feed(b, part).unwrap();
                }
                t.elapsed().as_secs_f64()
            };
            prefill(&mut b);
            let mut ts: Vec<f64> = (0..3).map(|_| prefill(&mut b)).collect();
            ts.sort_by(f64::total_cmp);
            eprintln!(
                "prefill {dtype} 768 in steps of {chunk}: {:.2} ms = {:.0} tok/s (median of 3)",
                ts[1] * 1e3,
                n as f64 / ts[1]
            );
            b.set_profile(true);
            for _ in 0..3 {
                prefill(&mut b);
            }
            eprintln!("profile of 3 prompts, {dtype}, steps of {chunk}:");
            b.set_profile(false);
        }
    }
}
