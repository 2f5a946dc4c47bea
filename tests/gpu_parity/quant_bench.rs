//! Run by hand on the GPU machine (`--ignored`): the quantized decode kernels alone on the
//! Qwen3-8B matrices, per format, as bytes of packed weights read per second, next to the copy
//! bandwidth of the same run; and the cost of widening a matrix to F16 (steps of 9+ tokens).
//! Each timing is a run of back-to-back launches over the rotating copies (as in a replayed
//! decode graph, no host gap between kernels), divided by the launches.

use dustoff::backend::cuda::dmat::DevMat;
use dustoff::backend::cuda::qlaunch::{q8x_bytes, DequantF16, GemmQ, GemvQ, QuantizeX};
use dustoff::backend::cuda::WeightMix;
use dustoff::model::quant::GgmlType;

use super::bench::time;
use super::gpu;

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
    let wide = g.zeros::<u16>(2 * 12288 * dim);
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
            let probe = DevMat::synthetic(&s, &mut g.k, t, all_rows, cols, 1, what).unwrap();
            let bytes = probe.bytes() as f64;
            // Several copies so that repeated runs do not read the L2.
            let n_copies = ((2usize << 30) as f64 / bytes).clamp(1.0, 8.0) as usize;
            let mut ws = vec![probe];
            for j in 1..n_copies {
                ws.push(DevMat::synthetic(&s, &mut g.k, t, all_rows, cols, j as u64 + 1, what).unwrap());
            }
            let mut i = 0;
            // Launches per timing (each on the next copy).
            let reps = n_copies.max(4);
            for n in [1usize, 2, 8] {
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
                            GemvQ {
                                w,
                                x: g.d(&x),
                                out: g.d(&out),
                                bias: None,
                                rows,
                                n_tok: n,
                                x_stride: cols,
                                out_stride: rows,
                                accumulate: false,
                                swiglu,
                                xq: q8.then(|| g.d(&xq)),
                            }
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
                        GemvQ {
                            w,
                            x: g.d(&x),
                            out: g.d(&out),
                            bias: None,
                            rows,
                            n_tok: n,
                            x_stride: cols,
                            out_stride: rows,
                            accumulate: false,
                            swiglu,
                            xq: Some(g.d(&xq)),
                        }
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
            // The packed tensor-core GEMM (steps of 9+ tokens) at 16 and 64 tokens (the SwiGLU
            // matrix as its plain gate/up product).
            for n in [16usize, 64] {
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
                        .launch(&mut g.k, &s)
                        .unwrap();
                    }
                }) / reps as f64;
                eprintln!(
                    "gemm {name} {what:15} [{all_rows}x{cols}] {n} tok: {:8.1} us {:7.0} GB/s ({:.0}% of copy)",
                    dt * 1e6,
                    bytes / dt / 1e9,
                    100.0 * bytes / dt / bw
                );
            }
            if all_rows * cols <= wide.len() {
                let dt = time(&mut g, &mut |g| {
                    let w = ws[i % n_copies].quant(&s).unwrap();
                    i += 1;
                    DequantF16 { w, out: g.d(&wide), row0: 0, n_rows: all_rows }.launch(&mut g.k, &s).unwrap();
                });
                let moved = bytes + (all_rows * cols * 2) as f64;
                eprintln!(
                    "widen {name} {what:14} [{all_rows}x{cols}]: {:8.1} us {:7.0} GB/s moved",
                    dt * 1e6,
                    moved / dt / 1e9
                );
            }
        }
    }
}
