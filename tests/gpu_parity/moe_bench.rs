//! Run by hand on the GPU machine (`--ignored moe_bench`): what `dustoff bench --synthetic
//! qwen3-30b-a3b --dtype q4_k_m` (one stream, 768-token prompt, 200 out, medians of 3) and
//! `--batch 8,32,64` measure, through the same functions (`commands::bench`), on one synthetic
//! backend; the batched rows are run three times each and their medians printed.
//! `DUSTOFF_MOE_BENCH_BATCH=0` skips the batched rows, `DUSTOFF_MOE_BENCH_SIZES` picks their
//! sequence counts (default 8,32,64), `DUSTOFF_MOE_BENCH_ONE=0` the one-stream
//! run, `DUSTOFF_MOE_BENCH_SHAPE` picks another
//! shape, `DUSTOFF_MOE_BENCH_PROMPT` the batched prompt length (default 128, 64 out).

use dustoff::backend::Backend;
use dustoff::commands::backend_setup::make_synthetic_backend;
use dustoff::commands::bench::{bench, bench_batched};
use dustoff::commands::device_choice::Device;

use super::gpu;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[test]
#[ignore]
fn moe_bench() {
    let g = gpu("moe bench").unwrap();
    drop(g);
    let shape = std::env::var("DUSTOFF_MOE_BENCH_SHAPE").unwrap_or_else(|_| "qwen3-30b-a3b".into());
    let batched = std::env::var("DUSTOFF_MOE_BENCH_BATCH").map_or(true, |v| v != "0");
    let one = std::env::var("DUSTOFF_MOE_BENCH_ONE").map_or(true, |v| v != "0");
    let prompt: usize = std::env::var("DUSTOFF_MOE_BENCH_PROMPT").ok().and_then(|v| v.parse().ok()).unwrap_or(128);
    let sizes: Vec<usize> = std::env::var("DUSTOFF_MOE_BENCH_SIZES")
        .unwrap_or_else(|_| "8,32,64".into())
        .split(',')
        .map(|v| v.trim().parse().expect("DUSTOFF_MOE_BENCH_SIZES: sequence counts, comma-separated"))
        .collect();
    let most = sizes.iter().copied().max().unwrap_or(1);
    let tokens = (768 + 200 + 16).max(most * (prompt + 64 + 16));
    let mut b = make_synthetic_backend(&shape, "q4_k_m", &Device::Cuda(0), tokens, None).unwrap();
    eprintln!("{}", b.describe());
    let name = format!("synthetic {shape} q4_k_m");
    if one {
        let r = bench(b.as_mut(), &name, 768, 200, 3).unwrap();
        r.print_human();
        println!("ONE-STREAM {}", serde_json::to_string(&r).unwrap());
    }
    if !batched {
        return;
    }
    let all: Vec<usize> = sizes.iter().cycle().take(3 * sizes.len()).copied().collect();
    let rows = bench_batched(b, [0; 32], prompt, 64, &all, 2048).unwrap();
    println!("| sequences | decode tok/s (median of 3) | runs | prefill s (median) | share of bandwidth bound |");
    println!("|---|---|---|---|---|");
    for &n in sizes.iter() {
        let rs: Vec<_> = rows.iter().filter(|r| r.sequences == n).collect();
        let tok: Vec<f64> = rs.iter().map(|r| r.decode_tok_s).collect();
        let pre = median(rs.iter().map(|r| r.prefill_s).collect());
        let share = median(rs.iter().map(|r| r.bandwidth_share.unwrap_or(0.0)).collect());
        let runs: Vec<String> = tok.iter().map(|t| format!("{t:.1}")).collect();
        println!("| {n} | {:.1} | {} | {pre:.3} | {:.1}% |", median(tok.clone()), runs.join(" / "), share * 100.0);
    }
}

/// Run by hand on the GPU machine (`--ignored moe_kernel_breakdown --nocapture`): each launch of
/// a sparse layer of the Qwen3-30B-A3B shape (Q4_K gate/up, Q6_K down: the Q4_K_M mix's heavier
/// layers) alone, median of 20 (`bench::time`, CUDA events), rotating over 4 layers so that
/// repeated runs do not read the L2: one token (pair walk: router logits + top-k, gate/up,
/// down, weighted sum), 8 tokens, and grouped steps of 64 to 2,048 tokens (`MOE_BREAKDOWN_N` picks them) through the grouped
/// GEMV and the tensor-core GEMM. Bytes are the packed expert rows each launch reads.
#[test]
#[ignore]
fn moe_kernel_breakdown() {
    use dustoff::backend::cuda::moe::{
        MoeCombine, MoeDownSum, MoeGroup, MoeLayerW, MoeMat, MoeRouteFused, MoeWork, Walk,
    };
    use dustoff::backend::cuda::ops::launch::Dev;
    use dustoff::backend::cuda::ops::moe_gemm::{GemmOut, MoeGather, MoeGemm, Tile};

    use super::bench::time;
    const L: usize = 4;
    let (mut g, bw, c, m, layers) = bench_layers("moe kernel breakdown", L, 7);
    let s = g.dev.stream.clone();
    let (dim, k, e) = (c.dim, m.n_used, m.n_experts);
    let per_expert = |b: u64| b as f64 / e as f64;
    let gu_bytes = per_expert(layers[0].gate.bytes() + layers[0].up.bytes());
    let down_bytes = per_expert(layers[0].down.bytes());
    let mut work = MoeWork::default();
    // MOE_BREAKDOWN_N="2048" (comma-separated) picks the step sizes, e.g. for a profiler run.
    let sizes: Vec<usize> = match std::env::var("MOE_BREAKDOWN_N") {
        Ok(v) => v.split(',').map(|t| t.trim().parse().expect("MOE_BREAKDOWN_N: token counts")).collect(),
        Err(_) => vec![1, 8, 64, 256, 512, 768, 2048],
    };
    let most = sizes.iter().copied().max().unwrap_or(1);
    work.grow(&s, most, &layers[0]).unwrap();
    let hv = g.randn(most * dim, 1.0);
    let h = g.up(&hv);
    let x = g.zeros::<f32>(most * dim);
    let d = |b: &Option<cudarc::driver::CudaSlice<f32>>| Dev::of(b.as_ref().unwrap(), &s);
    let di = |b: &Option<cudarc::driver::CudaSlice<i32>>| Dev::of(b.as_ref().unwrap(), &s);
    let dh = |b: &Option<cudarc::driver::CudaSlice<u16>>| Dev::of(b.as_ref().unwrap(), &s);
    let di_u32 = |b: &Option<cudarc::driver::CudaSlice<u32>>| Dev::of(b.as_ref().unwrap(), &s);
    let (logits, ids, wts, act, y) = (d(&work.logits), di(&work.ids), d(&work.wts), d(&work.act), d(&work.y));
    let (offsets, entries, position) = (di(&work.offsets), di(&work.entries), di(&work.position));
    let (x16, act16) = (dh(&work.x16), dh(&work.act16));
    let (hd, xd) = (Dev::of(&h, &s), Dev::of(&x, &s));
    let mut i = 0usize;
    let mut next = || {
        i += 1;
        i % L
    };
    println!("| tokens | launch | us (median of 20) | expert bytes read | GB/s | share of copy |");
    println!("|---|---|---|---|---|---|");
    let row = |n: usize, what: &str, t: f64, bytes: f64| {
        let gbs = if bytes > 0.0 { format!("{:.0}", bytes / t / 1e9) } else { "-".into() };
        let share = if bytes > 0.0 { format!("{:.1}%", bytes / t / bw * 100.0) } else { "-".into() };
        println!("| {n} | {what} | {:.1} | {:.1} MB | {gbs} | {share} |", t * 1e6, bytes / 1e6);
    };
    for n in sizes {
        let pairs = n * k;
        let route = |l: &MoeLayerW| layer_route(l, &s, hd, (logits, ids, wts), n);
        // Route every layer once, so that ids / groups hold a real routing for the timed launch.
        let t_route = time(&mut g, &mut |g| route(&layers[next()]).launch(&mut g.k, &s).unwrap());
        row(n, "router logits + top-k (2 launches)", t_route, 0.0);
        if n <= 8 {
            let count = di_u32(&work.route_count);
            let t = time(&mut g, &mut |g| {
                MoeRouteFused { route: route(&layers[next()]), count }.launch(&mut g.k, &s).unwrap()
            });
            row(n, "fused router (1 launch)", t, 0.0);
        }
        route(&layers[0]).launch(&mut g.k, &s).unwrap();
        let group = MoeGroup { ids, offsets, entries, position, n_pairs: pairs, n_experts: e };
        group.launch(&mut g.k, &s).unwrap();
        let ids_h = g.down(work.ids.as_ref().unwrap());
        let mut touched: Vec<i32> = ids_h[..pairs].to_vec();
        touched.sort_unstable();
        touched.dedup();
        let ex = touched.len() as f64;
        let grouped = n > 8;
        let walk = if grouped { Walk::Grouped { offsets, entries, n_experts: e } } else { Walk::Pairs { ids } };
        let mat = |li: usize, down: bool| MoeMat {
            slab: if down { &layers[li].down } else { &layers[li].gate },
            up: (!down).then_some(&layers[li].up),
            n_experts: e,
            x: if down { act } else { hd },
            out: if down { y } else { act },
            walk,
            n_pairs: pairs,
            k,
            x_stride: if down { m.expert_ffn_dim } else { dim },
            out_stride: if down { dim } else { m.expert_ffn_dim },
            x_by_token: !down,
        };
        // Pair mode reads each pair's expert (8 distinct per token); grouped reads each touched one.
        let reads = if grouped { ex } else { pairs as f64 };
        if grouped {
            let t = time(&mut g, &mut |g| group.launch(&mut g.k, &s).unwrap());
            row(n, "group by expert", t, 0.0);
        }
        let kind = if grouped { "grouped GEMV" } else { "pair GEMV" };
        let t = time(&mut g, &mut |g| mat(next(), false).launch(&mut g.k, &s).unwrap());
        row(n, &format!("{kind} gate/up + SwiGLU"), t, reads * gu_bytes);
        let t = time(&mut g, &mut |g| mat(next(), true).launch(&mut g.k, &s).unwrap());
        row(n, &format!("{kind} down"), t, reads * down_bytes);
        let position = grouped.then_some(position);
        let comb = MoeCombine { y, wts, position, x: xd, n_tok: n, dim, k };
        let t = time(&mut g, &mut |g| comb.launch(&mut g.k, &s).unwrap());
        row(n, "weighted sum", t, 0.0);
        if !grouped {
            let t = time(&mut g, &mut |g| {
                let l = &layers[next()];
                MoeDownSum { down: &l.down, n_experts: e, act, ids, wts, x: xd, n_tok: n, k }
                    .launch(&mut g.k, &s)
                    .unwrap()
            });
            row(n, "down + weighted sum (1 launch)", t, reads * down_bytes);
        }
        if grouped {
            let chosen = |down: bool| Tile::for_step(pairs, e, !down);
            let gather = MoeGather { h: hd, entries, x16, n_pairs: pairs, dim, k };
            let t = time(&mut g, &mut |g| gather.launch(&mut g.k, &s).unwrap());
            row(n, "gather F16", t, 0.0);
            // The step's own tile, and the other prefill tiles beside it once a step takes one.
            // Batched decode: every few-token tile (the staged 8 and 16, the register-fragment ones).
            let tiles = if chosen(false).tokens() <= 16 {
                vec![Tile::T8, Tile::T16, Tile::R8, Tile::R16]
            } else {
                vec![Tile::T64, Tile::W48, Tile::T128]
            };
            for tile in tiles {
                let gemm = |li: usize, down: bool| MoeGemm {
                    slab: if down { &layers[li].down } else { &layers[li].gate },
                    n_experts: e,
                    x: if down { act16 } else { x16 },
                    offsets,
                    out: if down { GemmOut::Down { y } } else { GemmOut::GateUp { up: &layers[li].up, act: act16 } },
                    n_pairs: pairs,
                    tile,
                };
                let mark = |down: bool| if tile == chosen(down) { " (the step's)" } else { "" };
                let flop = |rows: usize, cols: usize| 2.0 * (pairs * rows * cols) as f64;
                let t = time(&mut g, &mut |g| gemm(next(), false).launch(&mut g.k, &s).unwrap());
                row(n, &format!("GEMM {tile:?}{} gate/up + SwiGLU", mark(false)), t, ex * gu_bytes);
                println!("|  |  (tensor FLOP/s) | {:.1} T |  |  |  |", flop(2 * m.expert_ffn_dim, dim) / t / 1e12);
                if tile == Tile::T128 {
                    continue; // gate/up only
                }
                let t = time(&mut g, &mut |g| gemm(next(), true).launch(&mut g.k, &s).unwrap());
                row(n, &format!("GEMM {tile:?}{} down", mark(true)), t, ex * down_bytes);
                println!("|  |  (tensor FLOP/s) | {:.1} T |  |  |  |", flop(dim, m.expert_ffn_dim) / t / 1e12);
            }
        }
        let t = time(&mut g, &mut |g| {
            let l = &layers[next()];
            dustoff::backend::cuda::moe::moe_ffn(&mut g.k, &s, l, &work, hd, xd, n).unwrap();
        });
        row(n, "whole moe_ffn (default path)", t, reads * (gu_bytes + down_bytes));
    }
}

/// A GPU and its copy bandwidth (bytes/s, printed), and `n` sparse layers of the Qwen3-30B-A3B shape with
/// random experts, Q4_K gate/up and Q6_K down (seeds `seed`, `seed + 1`, ...).
fn bench_layers(
    what: &str,
    n: usize,
    seed: u64,
) -> (
    super::Gpu,
    f64,
    dustoff::model::config::ModelConfig,
    dustoff::model::moe::MoeConfig,
    Vec<dustoff::backend::cuda::moe::MoeLayerW>,
) {
    use dustoff::backend::cuda::moe::MoeLayerW;
    use dustoff::model::quant::GgmlType;
    let mut g = gpu(what).unwrap();
    let s = g.dev.stream.clone();
    let bw = g.dev.copy_bandwidth(1 << 30, 10).unwrap();
    println!("copy bandwidth {:.0} GB/s", bw / 1e9);
    let c = dustoff::model::shapes::shape("qwen3-30b-a3b").unwrap();
    let m = c.moe.clone().unwrap();
    let layers = (0..n)
        .map(|i| {
            MoeLayerW::synthetic(&s, &mut g.k, &c, &m, GgmlType::Q4K, GgmlType::Q6K, seed + i as u64, "bench").unwrap()
        })
        .collect();
    (g, bw, c, m, layers)
}

/// The router of layer `l` over `n` tokens of `x` (`[n, dim]`): logits, expert ids and weights
/// (`[n, n_used]`) into the given buffers.
fn layer_route(
    l: &dustoff::backend::cuda::moe::MoeLayerW,
    s: &cudarc::driver::CudaStream,
    x: dustoff::backend::cuda::ops::launch::Dev<f32>,
    (logits, ids, wts): (
        dustoff::backend::cuda::ops::launch::Dev<f32>,
        dustoff::backend::cuda::ops::launch::Dev<i32>,
        dustoff::backend::cuda::ops::launch::Dev<f32>,
    ),
    n: usize,
) -> dustoff::backend::cuda::moe::MoeRoute {
    use dustoff::backend::cuda::ops::launch::Dev;
    let w = Dev::of(&l.router, s);
    let (dim, n_experts, k, norm) = (l.dim, l.n_experts, l.n_used, l.norm_topk_prob);
    dustoff::backend::cuda::moe::MoeRoute { x, w, logits, ids, wts, n_tok: n, dim, n_experts, k, norm }
}

/// Median GPU time per layer of `f(layer)` over `n_layers` layers, captured once as a CUDA graph
/// (one launch after another as in a replayed decode step, no host gaps) and replayed.
fn time_graph_layers(g: &mut super::Gpu, n_layers: usize, f: &mut dyn FnMut(&mut super::Gpu, usize)) -> f64 {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    (0..n_layers).for_each(|l| f(g, l));
    let s = g.dev.stream.clone();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    (0..n_layers).for_each(|l| f(g, l));
    let graph = s.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("a captured graph");
    super::bench::time(g, &mut |_| graph.launch().unwrap()) / n_layers as f64
}

/// Run by hand on the GPU machine (`--ignored moe_pair_graph_breakdown --nocapture`): the
/// one-stream (pair mode) launches of a sparse layer of the Qwen3-30B-A3B shape (Q4_K gate/up,
/// Q6_K down), f32-activation kernels (moe.cu) against the int8 ones (moe_q8.cu), each timed
/// inside a CUDA graph over 6 layers (144+ MB of chosen experts: no L2 reuse between replays),
/// per layer, for 1 and 8 tokens. Bytes: the packed rows of the chosen experts.
#[test]
#[ignore]
fn moe_pair_graph_breakdown() {
    use dustoff::backend::cuda::moe::{MoeDownSum, MoeMat, MoeRouteFused, MoeWork, Walk};
    use dustoff::backend::cuda::ops::launch::Dev;
    use dustoff::backend::cuda::ops::moe_q8::MoeGateUpQ8;

    const L: usize = 6;
    let (mut g, bw, c, m, layers) = bench_layers("moe pair graph breakdown", L, 17);
    let s = g.dev.stream.clone();
    let (dim, k, e, f) = (c.dim, m.n_used, m.n_experts, m.expert_ffn_dim);
    let gu_b = (layers[0].gate.bytes() + layers[0].up.bytes()) as f64 / e as f64;
    let dn_b = layers[0].down.bytes() as f64 / e as f64;
    // One work area per layer, so each layer's ids / weights stay its own routing.
    let works: Vec<MoeWork> = (0..L)
        .map(|_| {
            let mut w = MoeWork::default();
            w.grow(&s, 8, &layers[0]).unwrap();
            w
        })
        .collect();
    let hv = g.randn(8 * dim, 1.0);
    let h = g.up(&hv);
    let x = g.zeros::<f32>(8 * dim);
    let (hd, xd) = (Dev::of(&h, &s), Dev::of(&x, &s));
    println!("| tokens | launch (in a graph, per layer) | us | expert bytes | GB/s | share of copy |");
    println!("|---|---|---|---|---|---|");
    let row = |n: usize, what: &str, t: f64, bytes: f64| {
        let (gbs, share) = if bytes > 0.0 {
            (format!("{:.0}", bytes / t / 1e9), format!("{:.1}%", bytes / t / bw * 100.0))
        } else {
            ("-".into(), "-".into())
        };
        println!("| {n} | {what} | {:.2} | {:.1} MB | {gbs} | {share} |", t * 1e6, bytes / 1e6);
    };
    for n in [1usize, 8] {
        let pairs = n * k;
        let d = |w: &MoeWork| {
            let f32d = |b: &Option<cudarc::driver::CudaSlice<f32>>| Dev::of(b.as_ref().unwrap(), &s);
            (f32d(&w.logits), Dev::of(w.ids.as_ref().unwrap(), &s), f32d(&w.wts), f32d(&w.act))
        };
        let route = |g: &mut super::Gpu, l: usize| {
            let (logits, ids, wts, _) = d(&works[l]);
            let r = layer_route(&layers[l], &s, hd, (logits, ids, wts), n);
            let count = Dev::of(works[l].route_count.as_ref().unwrap(), &s);
            MoeRouteFused { route: r, count }.launch(&mut g.k, &s).unwrap();
        };
        let gu_f32 = |g: &mut super::Gpu, l: usize| {
            let (_, ids, _, act) = d(&works[l]);
            MoeMat {
                slab: &layers[l].gate,
                up: Some(&layers[l].up),
                n_experts: e,
                x: hd,
                out: act,
                walk: Walk::Pairs { ids },
                n_pairs: pairs,
                k,
                x_stride: dim,
                out_stride: f,
                x_by_token: true,
            }
            .launch(&mut g.k, &s)
            .unwrap();
        };
        let gu_q8 = |g: &mut super::Gpu, l: usize| {
            let (_, ids, _, act) = d(&works[l]);
            let lw = &layers[l];
            MoeGateUpQ8 { gate: &lw.gate, up: &lw.up, n_experts: e, h: hd, ids, act, n_pairs: pairs, k }
                .launch(&mut g.k, &s)
                .unwrap();
        };
        let dn_f32 = |g: &mut super::Gpu, l: usize| {
            let (_, ids, wts, act) = d(&works[l]);
            MoeDownSum { down: &layers[l].down, n_experts: e, act, ids, wts, x: xd, n_tok: n, k }
                .launch(&mut g.k, &s)
                .unwrap();
        };
        let dn_q8 = |g: &mut super::Gpu, l: usize| {
            let (_, ids, wts, act) = d(&works[l]);
            MoeDownSum { down: &layers[l].down, n_experts: e, act, ids, wts, x: xd, n_tok: n, k }
                .launch_q8(&mut g.k, &s)
                .unwrap();
        };
        (0..L).for_each(|l| route(&mut g, l));
        s.synchronize().unwrap();
        let mut distinct = 0usize;
        for w in &works {
            let mut ids: Vec<i32> = g.down(w.ids.as_ref().unwrap())[..pairs].to_vec();
            ids.sort_unstable();
            ids.dedup();
            distinct += ids.len();
        }
        // Pair mode reads each pair's expert rows (a shared expert is read once per pair, the L2
        // may serve the repeat): bytes counted per distinct expert, the DRAM traffic.
        let ex = distinct as f64 / L as f64;
        row(n, "fused router + top-k", time_graph_layers(&mut g, L, &mut |g, l| route(g, l)), 0.0);
        row(n, "f32 gate/up + SwiGLU (moe.cu)", time_graph_layers(&mut g, L, &mut |g, l| gu_f32(g, l)), ex * gu_b);
        row(n, "int8 gate/up + SwiGLU (moe_q8.cu)", time_graph_layers(&mut g, L, &mut |g, l| gu_q8(g, l)), ex * gu_b);
        row(n, "f32 down + weighted sum", time_graph_layers(&mut g, L, &mut |g, l| dn_f32(g, l)), ex * dn_b);
        row(n, "int8 down + weighted sum", time_graph_layers(&mut g, L, &mut |g, l| dn_q8(g, l)), ex * dn_b);
        let t = time_graph_layers(&mut g, L, &mut |g, l| {
            route(g, l);
            gu_f32(g, l);
            dn_f32(g, l);
        });
        row(n, "whole FFN, f32 (3 launches)", t, ex * (gu_b + dn_b));
        let t = time_graph_layers(&mut g, L, &mut |g, l| {
            route(g, l);
            gu_q8(g, l);
            dn_q8(g, l);
        });
        row(n, "whole FFN, int8 (3 launches)", t, ex * (gu_b + dn_b));
    }
}
