//! Benchmarks run by hand on the GPU machine (`--ignored`): the seed-method benchmark of the
//! Qwen3-8B shape and the per-kernel bandwidth table.

use cudarc::driver::CudaSlice;

use dustoff::backend::cuda::launch as l;
use dustoff::backend::cuda::CudaBackend;

use super::{gpu, opts, Gpu};

/// Seed-method benchmark of the Qwen3-8B shape with GPU-made weights, plus achieved bandwidth
/// of each decode kernel class. `cargo test --release --test gpu_parity -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_qwen3_8b_synthetic() {
    let Some(g) = gpu("bench") else { return };
    drop(g);
    let name = std::env::var("DUSTOFF_BENCH_SHAPE").unwrap_or_else(|_| "qwen3-8b".into());
    let cfg = dustoff::model::shapes::shape(&name).unwrap();
    let t = std::time::Instant::now();
    let mut b = CudaBackend::synthetic(cfg, 1, &opts((768 + 200usize).div_ceil(16))).expect("synthetic backend");
    b.load_kernels().unwrap();
    eprintln!("made {name} on the GPU in {:.1} s", t.elapsed().as_secs_f64());
    for graphs in [true, false] {
        b.set_graphs(graphs);
        let r = dustoff::commands::bench::bench(&mut b, &name, 768, 200, 3).unwrap();
        eprintln!("--- graphs {graphs}");
        r.print_human();
    }
    kernel_breakdown();
}

/// Median GPU time of `f` over 20 runs (after one warm-up), in seconds.
pub(crate) fn time(g: &mut Gpu, f: &mut dyn FnMut(&mut Gpu)) -> f64 {
    let ev = |g: &Gpu| g.dev.ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).unwrap();
    f(g);
    let (a, b) = (ev(g), ev(g));
    let mut v: Vec<f32> = (0..20)
        .map(|_| {
            a.record(&g.dev.stream).unwrap();
            f(g);
            b.record(&g.dev.stream).unwrap();
            a.elapsed_ms(&b).unwrap()
        })
        .collect();
    v.sort_by(f32::total_cmp);
    v[10] as f64 / 1e3
}

/// One layer's attention of the Qwen3-8B shape (32 query heads over 8 KV heads of 128), F16
/// cache of random values: decode (n sequences, one token each, context `ctx`) as bytes of K/V
/// read per second, and prefill (4 sequences x 128 new tokens after `ctx` cached positions) as
/// tensor FLOP/s.
#[test]
#[ignore]
fn attention_breakdown() {
    use dustoff::backend::cuda::prefill::{push_tiles, PrefillAttention};
    let mut g = gpu("attention breakdown").unwrap();
    let s = g.dev.stream.clone();
    let (nh, nkv, hd, bs) = (32usize, 8usize, 128usize, 16usize);
    let stride = nh * hd + 2 * nkv * hd;
    let max_seq = 2048usize;
    for (n, ctx, new) in [(8usize, 870usize, 1usize), (32, 870, 1), (64, 870, 1), (32, 1300, 1), (4, 1000, 128)] {
        let per_seq = max_seq / bs;
        let n_blocks = n * per_seq;
        let n_slots = n_blocks * bs;
        let (kc, vc) = (g.zeros::<u16>(n_slots * nkv * hd), g.zeros::<u16>(n_slots * nkv * hd));
        for (j, c) in [&kc, &vc].into_iter().enumerate() {
            dustoff::backend::cuda::fused::FillUniform { out: g.d(c), seed: 9 + j as u64, scale: 1.0 }
                .launch(&mut g.k, &s)
                .unwrap();
        }
        let bt: Vec<i32> = (0..n_blocks as i32).collect();
        let n_tok = n * new;
        let (mut pos, mut tok_seq, mut tiles) = (Vec::new(), Vec::new(), Vec::new());
        for si in 0..n {
            push_tiles(&mut tiles, pos.len(), new);
            for i in 0..new {
                pos.push((ctx + i) as i32);
                tok_seq.push(si as i32);
            }
        }
        let qv = g.randn(n_tok * stride, 1.0);
        let q = g.up(&qv);
        let (btd, pd, tsd, tld) = (g.up(&bt), g.up(&pos), g.up(&tok_seq), g.up(&tiles));
        let max_len = ctx + new;
        let splits = l::attn_splits(max_len, n_tok);
        let (po, pml) = (g.zeros::<f32>(n_tok * nh * splits * hd), g.zeros::<f32>(n_tok * nh * splits * 2));
        let out = g.zeros::<f32>(n_tok * nh * hd);
        let dt = time(&mut g, &mut |g| {
            l::Attention {
                paged: l::PagedAttn {
                    q: g.d(&q),
                    k_cache: g.d(&kc),
                    v_cache: g.d(&vc),
                    block_tables: g.d(&btd),
                    tok_seq: g.d(&tsd),
                    pos: g.d(&pd),
                    out: g.d(&out),
                    n_slots,
                    n_seqs: n,
                    n_tok,
                    n_heads: nh,
                    n_kv: nkv,
                    head_dim: hd,
                    block_size: bs,
                    bt_stride: per_seq,
                    q_stride: stride,
                    out_stride: nh * hd,
                },
                part_o: g.d(&po),
                part_ml: g.d(&pml),
                max_len,
                n_splits: splits,
            }
            .launch(&mut g.k, &s)
            .unwrap();
        });
        let kv_bytes = (n * (ctx + 1) * nkv * hd * 2 * 2) as f64;
        let flops = |tok_ctx: f64| tok_ctx * nh as f64 * hd as f64 * 4.0;
        if new == 1 {
            eprintln!(
                "attention split   {n:3} seqs ctx {ctx:5}: {:8.1} us  {:7.0} GB/s of K/V",
                dt * 1e6,
                kv_bytes / dt / 1e9
            );
            continue;
        }
        let work: f64 = pos.iter().map(|&p| p as f64 + 1.0).sum();
        eprintln!(
            "attention split   {n_tok:4} prefill tokens ctx {ctx}: {:8.1} us  {:6.1} TFLOP/s",
            dt * 1e6,
            flops(work) / dt / 1e12
        );
        let dt = time(&mut g, &mut |g| {
            PrefillAttention {
                paged: l::PagedAttn {
                    q: g.d(&q),
                    k_cache: g.d(&kc),
                    v_cache: g.d(&vc),
                    block_tables: g.d(&btd),
                    tok_seq: g.d(&tsd),
                    pos: g.d(&pd),
                    out: g.d(&out),
                    n_slots,
                    n_seqs: n,
                    n_tok,
                    n_heads: nh,
                    n_kv: nkv,
                    head_dim: hd,
                    block_size: bs,
                    bt_stride: per_seq,
                    q_stride: stride,
                    out_stride: nh * hd,
                },
                tiles: g.d(&tld),
                n_tiles: tiles.len() / 2,
            }
            .launch(&mut g.k, &s)
            .unwrap();
        });
        eprintln!(
            "attention prefill {n_tok:4} prefill tokens ctx {ctx}: {:8.1} us  {:6.1} TFLOP/s",
            dt * 1e6,
            flops(work) / dt / 1e12
        );
    }
}

/// Times each decode kernel class of the Qwen3-8B shape alone (events, median of 20) and prints
/// the bandwidth it reaches.
#[test]
#[ignore]
fn kernel_breakdown() {
    let mut g = gpu("breakdown").unwrap();
    let s = g.dev.stream.clone();
    let blas = cudarc::cublas::CudaBlas::new(s.clone()).unwrap();
    let dim = 4096;
    let xv = g.randn(12288, 1.0);
    let x = g.up(&xv);
    let out = g.zeros::<f32>(151_936);
    for (what, rows, cols, swiglu) in [
        ("qkv", 6144, dim, false),
        ("o", dim, dim, false),
        ("gate/up+swiglu", 12288, dim, true),
        ("down", dim, 12288, false),
        ("head", 151_936, dim, false),
    ] {
        // Several copies so that repeated runs do not read the L2.
        let n_copies = (2usize << 30) / (rows * cols * 2 * if swiglu { 2 } else { 1 });
        let n_copies = n_copies.clamp(1, 8);
        let ws: Vec<CudaSlice<u16>> =
            (0..n_copies).map(|_| g.zeros::<u16>(rows * cols * if swiglu { 2 } else { 1 })).collect();
        // Random values, not zeros (zeros can run faster than real data).
        for (j, w) in ws.iter().enumerate() {
            let out = g.d(w);
            dustoff::backend::cuda::fused::FillUniform { out, seed: j as u64 + 1, scale: 0.03 }
                .launch(&mut g.k, &s)
                .unwrap();
        }
        let mut i = 0;
        let dt = time(&mut g, &mut |g| {
            let w = g.d(&ws[i % n_copies]);
            i += 1;
            if swiglu {
                dustoff::backend::cuda::fused::GemvSwiglu {
                    w,
                    x: g.d(&x),
                    out: g.d(&out),
                    ffn: rows,
                    cols,
                    n_tok: 1,
                    x_stride: cols,
                    out_stride: rows,
                }
                .launch(&mut g.k, &s)
                .unwrap();
            } else {
                l::Gemv {
                    w,
                    x: g.d(&x),
                    out: g.d(&out),
                    bias: None,
                    rows,
                    cols,
                    n_tok: 1,
                    x_stride: cols,
                    out_stride: rows,
                    accumulate: false,
                }
                .launch(&mut g.k, &s)
                .unwrap();
            }
        });
        let bytes = (rows * cols * 2 * if swiglu { 2 } else { 1 }) as f64;
        eprintln!("gemv {what:16} [{rows}x{cols}]: {:8.1} us  {:7.0} GB/s", dt * 1e6, bytes / dt / 1e9);
        // The tensor-core GEMM of decode batches on the same matrices (gate/up as one matrix).
        let all_rows = rows * if swiglu { 2 } else { 1 };
        let x16 = g.zeros::<u16>(64 * cols);
        let outn = g.zeros::<f32>(64 * all_rows);
        let part = g.zeros::<f32>(dustoff::backend::cuda::tc::tc64_part_len(all_rows, cols, 64).max(1));
        for n in [8usize, 16, 32, 64] {
            let dt = time(&mut g, &mut |g| {
                let w = g.d(&ws[i % n_copies]);
                i += 1;
                dustoff::backend::cuda::tc::GemmTc {
                    w,
                    x: g.d(&x16),
                    out: g.d(&outn),
                    bias: None,
                    rows: all_rows,
                    cols,
                    n_tok: n,
                    out_stride: all_rows,
                    accumulate: false,
                    part: Some(g.d(&part)),
                }
                .launch(&mut g.k, &s)
                .unwrap();
            });
            eprintln!("gemm_tc {what:13} {n:2} tok: {:8.1} us  {:7.0} GB/s", dt * 1e6, bytes / dt / 1e9);
            let dt = time(&mut g, &mut |g| {
                let w = g.d(&ws[i % n_copies]);
                i += 1;
                l::Gemm {
                    w,
                    x: g.d(&x16),
                    out: g.d(&outn),
                    rows: all_rows,
                    cols,
                    n_tok: n,
                    out_stride: all_rows,
                    accumulate: false,
                }
                .launch(&blas)
                .unwrap();
            });
            eprintln!("cublas  {what:13} {n:2} tok: {:8.1} us  {:7.0} GB/s", dt * 1e6, bytes / dt / 1e9);
        }
    }
}
