//! Benchmarks run by hand on the GPU machine (`--ignored`): the seed-method benchmark of the
//! Qwen3-8B shape and the per-kernel bandwidth table.

use cudarc::driver::CudaSlice;

use dustoff::backend::cuda::ops as l;
use dustoff::backend::cuda::CudaBackend;

use super::attention::{decode_attention, Group};
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
    if let Ok(dtype) = std::env::var("DUSTOFF_BENCH_DTYPE") {
        // One weight mix, one stream with graphs (`dustoff bench --synthetic NAME --dtype D`).
        let mix = dustoff::backend::cuda::WeightMix::parse(&dtype).expect("a weight mix");
        let num = |v: &str, d: usize| std::env::var(v).ok().and_then(|s| s.parse().ok()).unwrap_or(d);
        let (runs, gen) = (num("DUSTOFF_BENCH_RUNS", 3), num("DUSTOFF_BENCH_GEN", 200));
        let batch = num("DUSTOFF_BENCH_SEQS", 0);
        if batch > 0 {
            // `dustoff bench --synthetic NAME --dtype D --batch N --prompt-tokens P --gen-tokens G`:
            // N sequences of P + G positions (its peak memory line: the 2 x 4,096 row of issue 11).
            let prompt = num("DUSTOFF_BENCH_PROMPT_TOKENS", 768);
            let blocks = batch * (prompt + gen + 16).div_ceil(16);
            let b = CudaBackend::synthetic_mix(cfg, mix, 1, &opts(blocks)).expect("synthetic");
            // `--max-batch-tokens` (DUSTOFF_BENCH_STEP_TOKENS, default 2048 as the CLI's).
            let step = num("DUSTOFF_BENCH_STEP_TOKENS", 2048);
            let rows = dustoff::commands::bench::bench_batched(b, [0; 32], prompt, gen, &[batch], step).unwrap();
            for r in rows {
                println!(
                    "batch {} x {prompt}: decode {:.1} tok/s, prefill {:.2} s",
                    r.sequences, r.decode_tok_s, r.prefill_s
                );
            }
            return;
        }
        let mut b = CudaBackend::synthetic_mix(cfg, mix, 1, &opts((768 + gen).div_ceil(16))).expect("synthetic");
        b.load_kernels().unwrap();
        let r = dustoff::commands::bench::bench(&mut b, &format!("{name} {dtype}"), 768, gen, runs).unwrap();
        r.print_human();
        return;
    }
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

/// The long-context rows of `dustoff bench --device cuda --synthetic qwen3-8b --prompt-tokens
/// 8192,16384` through the same code (`common::make_synthetic_backend_for`, `bench::bench`):
/// prefill tok/s of one long prompt (512-token chunks) and decode tok/s after it, medians of
/// `DUSTOFF_LONG_RUNS` (default 3) runs. Kernels from `DUSTOFF_PTX_DIR` where it is set.
#[test]
#[ignore]
fn long_context_bench() {
    let Some(g) = gpu("long-context bench") else { return };
    drop(g);
    use dustoff::commands::backend_setup::make_synthetic_backend_for;
    use dustoff::commands::device_choice::Device;
    let runs = std::env::var("DUSTOFF_LONG_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    // `DUSTOFF_LONG_PROMPTS=16384` (comma-separated): only those prompt lengths.
    let prompts: Vec<usize> = std::env::var("DUSTOFF_LONG_PROMPTS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| vec![8192, 16384]);
    let gen = 200;
    let step = dustoff::engine::single::PREFILL_CHUNK;
    let mut b = make_synthetic_backend_for(
        ("qwen3-8b", None),
        "f16",
        &Device::Cuda(0),
        16384 + gen,
        (step, 1),
        &Default::default(),
    )
    .expect("synthetic qwen3-8b on cuda:0");
    for p in prompts {
        let r = dustoff::commands::bench::bench(b.as_mut(), "synthetic qwen3-8b f16", p, gen, runs).unwrap();
        let runs: Vec<String> =
            r.runs.iter().map(|x| format!("{:.0}/{:.1}", x.prefill_tok_s, x.decode_tok_s)).collect();
        eprintln!(
            "long-context {p}: prefill {:.0} tok/s, decode after it {:.1} tok/s (medians of {}: {})",
            r.median_prefill_tok_s,
            r.median_decode_tok_s,
            r.runs.len(),
            runs.join(", ")
        );
    }
}

/// The shared-prefix job of `dustoff bench --device cuda --synthetic qwen3-8b --shared-prefix
/// REQUESTS,1000,300` (32 slots, 200 generated tokens each, the default step budget) through the
/// same code, `DUSTOFF_SP_REQUESTS` requests (default 256): seconds with the prefix cache on
/// and off (`DUSTOFF_SP_CACHE=on`: the first half alone). With `DUSTOFF_STEP_TIMES=1` the backend prints each step size's median GPU time when
/// it is dropped, so a run with `DUSTOFF_CASCADE=0` beside one without gives the 32-token
/// decode steps' time with and without the shared-prefix pass. Kernels from `DUSTOFF_PTX_DIR`
/// where it is set.
#[test]
#[ignore]
fn shared_prefix_job_bench() {
    let Some(g) = gpu("shared-prefix job") else { return };
    drop(g);
    use dustoff::commands::backend_setup::make_synthetic_backend_for;
    use dustoff::commands::device_choice::Device;
    use dustoff::engine::batch::{BLOCK_SIZE, DEFAULT_MAX_BATCH_TOKENS};
    let requests = std::env::var("DUSTOFF_SP_REQUESTS").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
    let (shared, unique, gen, slots) = (1000usize, 300usize, 200usize, 32usize);
    let tokens = slots * (shared + unique + gen + BLOCK_SIZE) + shared * 2;
    let step = DEFAULT_MAX_BATCH_TOKENS.max(slots);
    let b = make_synthetic_backend_for(
        ("qwen3-8b", None),
        "f16",
        &Device::Cuda(0),
        tokens,
        (step, slots),
        &Default::default(),
    )
    .expect("synthetic qwen3-8b on cuda:0");
    if std::env::var("DUSTOFF_SP_CACHE").as_deref() == Ok("on") {
        // The cache-on half alone (the same requests as `bench_shared_prefix` makes), so that
        // the backend's step times hold only steps whose sequences share the prefix blocks.
        use dustoff::backend::Backend;
        use dustoff::engine::batch::{Engine, EngineConfig, Request};
        use dustoff::engine::sampler::SamplingParams;
        let mut b = b;
        b.prepare().unwrap();
        let vocab = b.config().vocab_size;
        let prefix = dustoff::commands::bench::bench_prompt(shared, vocab);
        let cfg = EngineConfig { slots, max_batch_tokens: step, prefix_cache: true, model_fingerprint: [7; 32] };
        let mut engine = Engine::new(b, cfg).unwrap();
        for i in 0..requests {
            let mut p = prefix.clone();
            p.extend((0..unique).map(|j| (1000 + (i * 7 + j * 131 + 17) % (vocab - 1000)) as u32));
            let sampling = SamplingParams::greedy();
            engine
                .add_request(Request { id: i as u64, prompt: p, max_tokens: gen, sampling, stop_ids: Vec::new() })
                .unwrap();
        }
        let t0 = std::time::Instant::now();
        engine.run_to_completion().unwrap();
        let m = engine.metrics();
        eprintln!(
            "shared-prefix job {requests} x ({shared} + {unique}), {gen} out, {slots} slots: cache on {:.2} s ({} of {} prompt tokens computed)",
            t0.elapsed().as_secs_f64(),
            m.prompt_tokens_computed,
            m.prompt_tokens
        );
        return;
    }
    let rows = dustoff::commands::bench::bench_shared_prefix(b, [7; 32], slots, step, (shared, unique, requests, gen))
        .expect("the shared-prefix job");
    let (on, off) = (rows[0].seconds, rows[1].seconds);
    eprintln!(
        "shared-prefix job {requests} x ({shared} + {unique}), {gen} out, {slots} slots: cache on {on:.2} s, off {off:.2} s, {:.2}x",
        off / on
    );
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

/// One layer's attention of the Qwen3-8B shape (32 query heads over 8 KV heads of 128; `hd256`
/// rows: 16 over 4 of 256, the Qwen3.5 full-attention shape; `decode-g8` rows: 32 over 4 of
/// 128, Qwen3-30B-A3B), F16 cache of random values, each
/// sequence in its own blocks. Decode (n sequences, one token each, context `ctx`): bytes of
/// K/V read per second, with the split rule of the last session (`attn_split_len` of the token
/// count) and this one (`decode_split_len`, also by context). Prefill (n sequences x `new`
/// tokens after `ctx` cached positions): tensor FLOP/s, one split per tile (the kernel of the
/// last session) and split along the context (`prefill_splits`). Shared prefix (n sequences,
/// `ctx` shared positions + 300..=500 own): plain split attention and the cascade pass.
#[test]
#[ignore]
fn attention_breakdown() {
    use dustoff::backend::cuda::ops::prefill::{
        acc_available, prefill_splits, push_tiles, PrefillAttention, PrefillSplit,
    };
    use dustoff::backend::cuda::step::cascade;
    let mut g = gpu("attention breakdown").unwrap();
    let s = g.dev.stream.clone();
    let bs = 16usize;
    // What the driver made of each attention kernel (registers bound how many blocks share an
    // SM): every entry of the decode and prefill files, as the kernel table lists them.
    let attention_files = ["attention_decode", "attention_decode_tc", "attention_prefill"];
    for file in
        dustoff::backend::cuda::compile::kernels::KERNEL_FILES.iter().filter(|f| attention_files.contains(&f.name))
    {
        for &entry in file.entries {
            let f = g.k.get(entry).unwrap();
            eprintln!(
                "attn kernel {entry}: {} registers, {} bytes of local memory a thread",
                f.num_regs().unwrap(),
                f.local_size_bytes().unwrap()
            );
        }
    }
    // `ATTN_BREAKDOWN=prefill` (or decode, shared): only the rows of that kind.
    let only = std::env::var("ATTN_BREAKDOWN").unwrap_or_default();
    // (kind, sequences, context, new tokens, head size)
    let cases: &[(&str, usize, usize, usize, usize)] = &[
        ("decode", 1, 870, 1, 128),
        ("decode", 1, 8192, 1, 128),
        ("decode", 1, 16384, 1, 128),
        ("decode", 8, 870, 1, 128),
        ("decode", 32, 1300, 1, 128),
        ("decode", 64, 870, 1, 128),
        ("decode", 64, 1024, 1, 128),
        ("decode", 1, 8192, 1, 256),
        ("decode", 1, 16384, 1, 256),
        ("decode", 32, 1300, 1, 256),
        ("decode-g8", 1, 870, 1, 128),
        ("decode-g8", 1, 8192, 1, 128),
        ("decode-g8", 32, 1300, 1, 128),
        ("decode-g8", 48, 2000, 1, 128),
        ("decode-g8", 64, 1024, 1, 128),
        ("prefill", 4, 1000, 128, 128),
        ("prefill", 1, 0, 512, 128),
        ("prefill", 1, 8192, 512, 128),
        ("prefill", 1, 16384, 512, 128),
        ("prefill", 1, 8192, 2048, 128),
        ("prefill", 1, 8192, 512, 256),
        ("shared", 32, 1000, 1, 128),
    ];
    for &(kind, n, ctx, new, hd) in cases.iter().filter(|c| c.0.starts_with(only.as_str())) {
        // decode-g8: Qwen3-30B-A3B's 32 query heads over 4 KV heads (groups of 8).
        let (nh, nkv) = match (kind, hd) {
            ("decode-g8", _) => (32usize, 4usize),
            (_, 256) => (16, 4),
            _ => (32, 8),
        };
        let stride = nh * hd + 2 * nkv * hd;
        // Own positions per sequence (the shared case: 300..=500 after the shared blocks).
        let own = |si: usize| if kind == "shared" { 300 + (si * 7) % 201 } else { ctx + new };
        let per_seq = (ctx + new + 600).div_ceil(bs);
        let n_blocks = n * per_seq + ctx.div_ceil(bs);
        let cache_rows = n_blocks * bs;
        let (kc, vc) = (g.zeros::<u16>(cache_rows * nkv * hd), g.zeros::<u16>(cache_rows * nkv * hd));
        for (j, c) in [&kc, &vc].into_iter().enumerate() {
            dustoff::backend::cuda::ops::embedding::FillUniform { out: g.d(c), seed: 9 + j as u64, scale: 1.0 }
                .launch(&mut g.k, &s)
                .unwrap();
        }
        // Tables: sequence si owns blocks si * per_seq..; the shared case starts every table
        // with the same blocks (past the sequences' own).
        let shared_blocks: Vec<u32> = ((n * per_seq) as u32..n_blocks as u32).collect();
        let tables: Vec<Vec<u32>> = (0..n)
            .map(|si| {
                let own_blocks = (si * per_seq) as u32..((si + 1) * per_seq) as u32;
                if kind == "shared" {
                    shared_blocks.iter().copied().chain(own_blocks).collect()
                } else {
                    own_blocks.collect()
                }
            })
            .collect();
        let bt_stride = tables.iter().map(Vec::len).max().unwrap();
        let mut bt = vec![0i32; n * bt_stride];
        for (si, t) in tables.iter().enumerate() {
            for (j, &b) in t.iter().enumerate() {
                bt[si * bt_stride + j] = b as i32;
            }
        }
        let (mut pos, mut tok_seq, mut tiles, mut rows) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for si in 0..n {
            let first = if kind == "shared" { ctx + own(si) - 1 } else { ctx };
            push_tiles(&mut tiles, &mut rows, pos.len(), new, first, si);
            for i in 0..new {
                pos.push((first + i) as i32);
                tok_seq.push(si as i32);
            }
        }
        let n_tok = n * new;
        let qv = g.randn(n_tok * stride, 1.0);
        let q = g.up(&qv);
        let (btd, pd, tsd, tld, rwd) = (g.up(&bt), g.up(&pos), g.up(&tok_seq), g.up(&tiles), g.up(&rows));
        let max_len = pos.iter().map(|&p| p as usize + 1).max().unwrap();
        let out = g.zeros::<f32>(n_tok * nh * hd);
        let paged = l::PagedAttn {
            q: g.d(&q),
            k_cache: g.d(&kc),
            v_cache: g.d(&vc),
            kv_scales: None,
            block_tables: g.d(&btd),
            tok_seq: g.d(&tsd),
            pos: g.d(&pd),
            out: g.d(&out),
            cache_rows,
            n_seqs: n,
            n_tok,
            n_heads: nh,
            n_kv: nkv,
            head_dim: hd,
            block_size: bs,
            bt_stride,
            q_stride: stride,
            out_stride: nh * hd,
        };
        let work: f64 = pos.iter().map(|&p| p as f64 + 1.0).sum();
        let kv_bytes = work * (nkv * hd * 2 * 2) as f64;
        let flops = work * nh as f64 * hd as f64 * 4.0;
        // Partials: the most decode splits (shortest split) + up to 64 prefill or shared-prefix splits.
        let part_len = n_tok * nh * (l::attn_splits(max_len, n_tok) + 64);
        let (po, pml) = (g.zeros::<f32>(part_len * hd), g.zeros::<f32>(part_len * 2));
        let decode =
            |g: &mut Gpu, split_len: usize, prefix: Option<&cascade::Cascade>, kernel: Option<l::DecodeKernel>| {
                let dev = prefix.map(|c| (g.up(&c.tiles), g.up(&c.rows), g.up(&c.kv_begin)));
                let pre = prefix.map(|c| cascade::splits(c.tiles.len() / 4, c.max_shared, nh, nkv, hd));
                time(g, &mut |g| {
                    let group = dev.as_ref().zip(pre).map(|((t, r, b), pre)| Group { dev: (t, r, b), pre });
                    decode_attention(g, paged, (&po, &pml), max_len, split_len, kernel, group)
                        .launch(&mut g.k, &s)
                        .unwrap();
                })
            };
        let label = format!("{kind:7} {n:3} seqs ctx {ctx:5} +{new:3} hd {hd}");
        match kind {
            "decode" | "decode-g8" => {
                let before = decode(&mut g, l::attn_split_len(n_tok), None, None);
                let split = l::decode_split_len(n_tok, max_len, nh, nkv, hd);
                let after = decode(&mut g, split, None, None);
                eprintln!(
                    "attn {label}: splits of {:4} {:8.1} us {:6.0} GB/s | of {split:4} {:8.1} us {:6.0} GB/s",
                    l::attn_split_len(n_tok),
                    before * 1e6,
                    kv_bytes / before / 1e9,
                    after * 1e6,
                    kv_bytes / after / 1e9
                );
                {
                    // Every kernel at several split lengths.
                    let mut line = format!("attn {label}: sweep");
                    for kernel in [l::DecodeKernel::TwoPass, l::DecodeKernel::OnePass, l::DecodeKernel::Tensor] {
                        for len in [64usize, 128, 256, 512, 1024] {
                            let dt = decode(&mut g, len, None, Some(kernel));
                            line += &format!(" | {kernel:?} {len} {:.1} us {:.0} GB/s", dt * 1e6, kv_bytes / dt / 1e9);
                        }
                    }
                    eprintln!("{line}");
                }
            }
            "shared" => {
                let split = l::decode_split_len(n_tok, max_len, nh, nkv, hd);
                let plain = decode(&mut g, split, None, None);
                let toks: Vec<cascade::DecodeTok> = (0..n)
                    .map(|si| cascade::DecodeTok { token: si, bt_row: si, table: &tables[si], pos: pos[si] as usize })
                    .collect();
                let plan = cascade::plan(&toks, n, bs).expect("a shared prefix");
                let casc = decode(&mut g, split, Some(&plan), None);
                // Its parts alone: the group pass over the shared range, and the merge.
                let (ps, pl) = cascade::splits(plan.tiles.len() / 4, plan.max_shared, nh, nkv, hd);
                let n_parts = max_len.div_ceil(split) + ps;
                let (td, rd) = (g.up(&plan.tiles), g.up(&plan.rows));
                let group_pass = time(&mut g, &mut |g| {
                    let split = Some(PrefillSplit {
                        part_o: g.d(&po),
                        part_ml: g.d(&pml),
                        split_len: pl,
                        n_splits: ps,
                        n_parts,
                        part0: n_parts - ps,
                        tok0: 0,
                        n_part_tok: n_tok,
                        merge: false,
                    });
                    let (tiles, rows) = (g.d(&td), g.d(&rd));
                    let n_tiles = plan.tiles.len() / 4;
                    PrefillAttention { paged, tiles, rows, n_rows: plan.rows.len(), n_tiles, split }
                        .launch(&mut g.k, &s)
                        .unwrap();
                });
                let merge = time(&mut g, &mut |g| {
                    l::Merge {
                        part_o: g.d(&po),
                        part_ml: g.d(&pml),
                        out: g.d(&out),
                        n_tok,
                        n_heads: nh,
                        head_dim: hd,
                        n_parts,
                        out_stride: nh * hd,
                    }
                    .launch(&mut g.k, &s)
                    .unwrap();
                });
                eprintln!(
                    "attn {label}: cascade parts: group pass ({ps} splits of {pl}) {:.1} us, merge of {n_parts} partials {:.1} us",
                    group_pass * 1e6,
                    merge * 1e6
                );
                eprintln!(
                    "attn {label}: plain {:8.1} us {:6.0} GB/s | cascade ({} shared) {:8.1} us ({:6.0} GB/s equivalent)",
                    plain * 1e6,
                    kv_bytes / plain / 1e9,
                    plan.max_shared,
                    casc * 1e6,
                    kv_bytes / casc / 1e9
                );
            }
            _ => {
                let n_tiles = tiles.len() / 4;
                let (pf, pl) = prefill_splits(n_tiles, n_tok, max_len, nh, nkv, hd, false);
                let run = |g: &mut Gpu, split: bool, acc: bool| {
                    time(g, &mut |g| {
                        let split = (split && pf > 1).then(|| PrefillSplit {
                            part_o: g.d(&po),
                            part_ml: g.d(&pml),
                            split_len: pl,
                            n_splits: pf,
                            n_parts: pf,
                            part0: 0,
                            tok0: 0,
                            n_part_tok: n_tok,
                            merge: true,
                        });
                        let rows = g.d(&rwd);
                        PrefillAttention { paged, tiles: g.d(&tld), rows, n_rows: n_tok, n_tiles, split }
                            .launch_kernel(&mut g.k, &s, Some(acc))
                            .unwrap();
                    })
                };
                // Both kernel families (the softmax through shared memory, and on the
                // accumulators where the device has that layout), one split and the rule's.
                let families: &[bool] = if acc_available(&g.k) { &[false, true] } else { &[false] };
                for &acc in families {
                    let one = run(&mut g, false, acc);
                    let split = run(&mut g, true, acc);
                    eprintln!(
                        "attn {label} {}: one split {:8.1} us {:6.1} TFLOP/s | {pf:2} splits of {pl:5} {:8.1} us {:6.1} TFLOP/s",
                        if acc { "acc " } else { "smem" },
                        one * 1e6,
                        flops / one / 1e12,
                        split * 1e6,
                        flops / split / 1e12
                    );
                }
            }
        }
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
            dustoff::backend::cuda::ops::embedding::FillUniform { out, seed: j as u64 + 1, scale: 0.03 }
                .launch(&mut g.k, &s)
                .unwrap();
        }
        let mut i = 0;
        let dt = time(&mut g, &mut |g| {
            let w = g.d(&ws[i % n_copies]);
            i += 1;
            if swiglu {
                dustoff::backend::cuda::ops::gemv_f16::GemvSwiglu {
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
        let part = g.zeros::<f32>(dustoff::backend::cuda::ops::gemm_tc::tc64_part_len(all_rows, cols, 64).max(1));
        for n in [8usize, 16, 32, 64] {
            let dt = time(&mut g, &mut |g| {
                let w = g.d(&ws[i % n_copies]);
                i += 1;
                dustoff::backend::cuda::ops::gemm_tc::GemmTc {
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
