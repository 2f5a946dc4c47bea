//! Timings of the whole CPU forward pass on the sample model (ignored by default; timings live
//! in benchmarks, not in tests). Batched decode, 1 slot vs 8 slots, measured side by side:
//! `cargo test --release --lib bench_batched_decode -- --ignored --nocapture`.

use std::time::Instant;

use super::CpuBackend;
use crate::backend::Backend;
use crate::commands::bench::{bench_prompt, median};
use crate::engine::plan::{SeqChunk, StepPlan};
use crate::engine::sampler::tests::sample_by_full_sort;
use crate::engine::sampler::{argmax, Sampler, SamplingParams};
use crate::model::config::ModelConfig;
use crate::model::gguf::GgufFile;
use crate::model::weights::ModelWeights;

const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/samples/models/SmolLM2-135M-Instruct.Q4_1.gguf");

/// A decode step of `seqs` sequences (ids 0..seqs), each at its own position.
fn decode_plan(seqs: usize, pos: &[usize], toks: &[u32], blocks_per_seq: usize) -> StepPlan {
    StepPlan::new(
        (0..seqs)
            .map(|s| SeqChunk {
                seq: s as u64,
                tokens: vec![toks[s]],
                start_pos: pos[s],
                block_table: (0..blocks_per_seq as u32).map(|b| s as u32 * blocks_per_seq as u32 + b).collect(),
                want_logits: true,
            })
            .collect(),
    )
}

#[test]
#[ignore]
fn bench_batched_decode() {
    let g = GgufFile::open(MODEL).expect("sample model (samples/models)");
    let cfg = ModelConfig::from_gguf(&g).expect("config");
    let w = ModelWeights::from_gguf(&g, &cfg).expect("weights");
    // DUSTOFF_BENCH_PROMPT overrides the context length (e.g. a short one to profile decode).
    let prompt_len =
        crate::sys::env::get("DUSTOFF_BENCH_PROMPT").and_then(|v| v.parse().ok()).unwrap_or(256usize).max(1);
    let (slots, rounds, steps) = (8usize, 3usize, 12usize);
    let bs = 16;
    let blocks_per_seq = (prompt_len + 2 * rounds * steps + 8).div_ceil(bs);
    let mut b = CpuBackend::new(cfg.clone(), w, slots * blocks_per_seq, bs);
    let prompt = bench_prompt(prompt_len, cfg.vocab_size);
    let mut pos = vec![0usize; slots];
    let mut toks = vec![0u32; slots];
    for s in 0..slots {
        // Distinct prompts (first token differs) so the 8 sequences are not copies.
        let mut p = prompt.clone();
        p[0] = 1000 + s as u32;
        let plan = StepPlan::new(vec![SeqChunk {
            seq: s as u64,
            tokens: p,
            start_pos: 0,
            block_table: (0..blocks_per_seq as u32).map(|x| s as u32 * blocks_per_seq as u32 + x).collect(),
            want_logits: true,
        }]);
        let t = Instant::now();
        let logits = b.step(&plan).expect("prefill");
        if s == 0 {
            println!("prefill {prompt_len} tokens: {:.1} tok/s", prompt_len as f64 / t.elapsed().as_secs_f64());
        }
        toks[s] = argmax(&logits[0]);
        pos[s] = prompt_len;
    }
    let (mut one, mut many) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for (n, acc) in [(1usize, &mut one), (slots, &mut many)] {
            let t = Instant::now();
            for _ in 0..steps {
                let logits = b.step(&decode_plan(n, &pos, &toks, blocks_per_seq)).expect("decode");
                for (s, l) in logits.iter().enumerate() {
                    toks[s] = argmax(l);
                    pos[s] += 1;
                }
            }
            acc.push((n * steps) as f64 / t.elapsed().as_secs_f64());
        }
    }
    let (a, m) = (median(&mut one), median(&mut many));
    println!("decode 1 slot: {a:.1} tok/s; {slots} slots: {m:.1} tok/s total ({:.2}x)", m / a);
}

/// Attention alone at the sample model's shape (9 heads, 3 KV heads, head_dim 64), 8 decode
/// tokens of 8 sequences at context 300: the per-layer cost of a batched decode step.
#[test]
#[ignore]
fn bench_attention_decode() {
    use super::ops::{attend_batch, PagedKv};
    let (nh, nkv, hd, bs, ctx, n) = (9usize, 3usize, 64usize, 16usize, 300usize, 8usize);
    let blocks = ctx.div_ceil(bs);
    let len = n * blocks * bs * nkv * hd;
    let k: Vec<f32> = (0..len).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let v: Vec<f32> = (0..len).map(|i| ((i * 104729) % 1000) as f32 / 1000.0 - 0.5).collect();
    let kv = PagedKv { k: &k, v: &v, block_size: bs, n_kv_heads: nkv, head_dim: hd };
    let tables: Vec<Vec<u32>> = (0..n).map(|s| (0..blocks as u32).map(|b| (s * blocks) as u32 + b).collect()).collect();
    let tabs: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
    let pos = vec![ctx - 1; n];
    let q: Vec<f32> = (0..n * nh * hd).map(|i| (i % 17) as f32 / 17.0 - 0.5).collect();
    let mut out = vec![0f32; n * nh * hd];
    for tokens in [1usize, n] {
        let mut best = f64::MAX;
        for _ in 0..20 {
            let t = Instant::now();
            for _ in 0..30 {
                attend_batch(
                    &kv,
                    &tabs[..tokens],
                    &pos[..tokens],
                    &q[..tokens * nh * hd],
                    nh,
                    &mut out[..tokens * nh * hd],
                );
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!("attention, {tokens} token(s) x 30 layers at context {ctx}: {:.2} ms", best * 1e3);
    }
}

/// Host sampling of one logits row of the sample model (49,152 tokens after a sample document)
/// with temperature / top-k / top-p: the lazy descending order against sorting every candidate
/// (the sampler before it). A batched step draws one row per sequence:
/// `cargo test --release --lib bench_sampling_a_row -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_sampling_a_row() {
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    let g = GgufFile::open(MODEL).expect("sample model (samples/models)");
    let cfg = ModelConfig::from_gguf(&g).expect("config");
    let w = ModelWeights::from_gguf(&g, &cfg).expect("weights");
    // A real document: the summary prompt's text of the first sample record.
    let tok = crate::tokenizer::Tokenizer::from_gguf(&g).expect("tokenizer");
    let news = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/samples/news.jsonl")).expect("news");
    let text = serde_json::from_str::<serde_json::Value>(news.lines().next().expect("a record")).expect("json")["text"]
        .as_str()
        .expect("text")
        .to_string();
    let prompt = tok.encode(&format!("Summarize in one sentence.\n\n{text}\n\nSummary:"), true, false).expect("encode");
    let blocks = prompt.len().div_ceil(16) + 1;
    let mut b = CpuBackend::new(cfg.clone(), w, blocks, 16);
    let plan = StepPlan::new(vec![SeqChunk {
        seq: 0,
        tokens: prompt,
        start_pos: 0,
        block_table: (0..blocks as u32).collect(),
        want_logits: true,
    }]);
    let logits = b.step(&plan).expect("prefill").remove(0);
    let draws = 200;
    for (temperature, top_k, top_p) in [(0.7f32, 0, 0.9f32), (1.0, 0, 1.0), (0.8, 40, 0.95)] {
        let params = SamplingParams { temperature, top_k, top_p, seed: 5 };
        let (mut lazy, mut full) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            let mut s = Sampler::new(params);
            let t = Instant::now();
            for _ in 0..draws {
                std::hint::black_box(s.sample(&logits));
            }
            lazy.push(t.elapsed().as_secs_f64() * 1e3 / draws as f64);
            let mut rng = StdRng::seed_from_u64(5);
            let t = Instant::now();
            for _ in 0..draws {
                std::hint::black_box(sample_by_full_sort(&params, &mut rng, &logits, None));
            }
            full.push(t.elapsed().as_secs_f64() * 1e3 / draws as f64);
        }
        let (l, f) = (median(&mut lazy), median(&mut full));
        println!(
            "temperature {temperature}, top_k {top_k}, top_p {top_p}: {l:.3} ms a row (full sort {f:.3} ms, {:.1}x)",
            f / l
        );
    }
}
