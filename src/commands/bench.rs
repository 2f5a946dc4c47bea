//! `dustoff bench`: the seed method. One stream, a fixed prompt (~768 tokens), 200 generated
//! tokens; time to first token, prefill tok/s, decode tok/s (first to last generated token),
//! peak memory, bytes read per decoded token and the share of the measured copy bandwidth.

use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use crate::backend::Backend;
use crate::engine::sampler::argmax;
use crate::engine::single::SingleSeq;

#[derive(Clone, Debug, Serialize)]
pub struct BenchRun {
    pub ttft_s: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub device: String,
    pub model: String,
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    pub runs: Vec<BenchRun>,
    pub median_ttft_s: f64,
    pub median_prefill_tok_s: f64,
    pub median_decode_tok_s: f64,
    /// Weights read per decode step plus the KV read at the mean context length.
    pub bytes_per_token: u64,
    /// Measured copy bandwidth (bytes read + written per second), when the backend can measure.
    pub copy_bandwidth_gb_s: Option<f64>,
    /// median decode tok/s x bytes per token / copy bandwidth.
    pub bandwidth_share: Option<f64>,
    pub peak_memory_bytes: Option<u64>,
}

/// A deterministic prompt of `n` ordinary token ids (no special tokens: ids from 1000 up).
pub fn bench_prompt(n: usize, vocab: usize) -> Vec<u32> {
    let span = (vocab.saturating_sub(1000)).max(1) as u64;
    (0..n as u64).map(|i| (1000 + (i * 7919 + 13) % span) as u32).collect()
}

pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs the seed method `runs` times (plus one warm-up) on `b`.
pub fn bench<B: Backend + ?Sized>(
    b: &mut B,
    model: &str,
    prompt_tokens: usize,
    gen_tokens: usize,
    runs: usize,
) -> Result<BenchReport> {
    let prompt = bench_prompt(prompt_tokens, b.config().vocab_size);
    let mut results = Vec::new();
    for r in 0..runs + 1 {
        let mut seq = SingleSeq::new(b, 0, prompt_tokens + gen_tokens)?;
        let t0 = Instant::now();
        let mut logits = seq.feed(b, &prompt)?;
        let mut tok = argmax(&logits);
        let ttft = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        // The first token came with the prefill; each further token is one decode step.
        for _ in 1..gen_tokens {
            logits = seq.feed(b, &[tok])?;
            tok = argmax(&logits);
        }
        let dt = t1.elapsed().as_secs_f64();
        if r > 0 {
            results.push(BenchRun {
                ttft_s: ttft,
                prefill_tok_s: prompt_tokens as f64 / ttft,
                decode_tok_s: (gen_tokens.saturating_sub(1)) as f64 / dt.max(1e-9),
            });
        }
    }
    let med = |f: fn(&BenchRun) -> f64| median(&mut results.iter().map(f).collect::<Vec<_>>());
    let mean_ctx = (prompt_tokens + gen_tokens / 2) as u64;
    let bytes_per_token = b.decode_weight_bytes() + mean_ctx * b.kv_bytes_per_position();
    let bw = b.measure_copy_bandwidth();
    let decode = med(|r| r.decode_tok_s);
    Ok(BenchReport {
        device: b.describe(),
        model: model.to_string(),
        prompt_tokens,
        gen_tokens,
        median_ttft_s: med(|r| r.ttft_s),
        median_prefill_tok_s: med(|r| r.prefill_tok_s),
        median_decode_tok_s: decode,
        bytes_per_token,
        copy_bandwidth_gb_s: bw.map(|x| x / 1e9),
        bandwidth_share: bw.map(|x| decode * bytes_per_token as f64 / x),
        peak_memory_bytes: b.peak_memory_bytes(),
        runs: results,
    })
}

impl BenchReport {
    pub fn print_human(&self) {
        println!("device            {}", self.device);
        println!("model             {}", self.model);
        println!(
            "prompt / gen      {} / {} tokens, {} runs (medians)",
            self.prompt_tokens,
            self.gen_tokens,
            self.runs.len()
        );
        println!("time to 1st token {:.1} ms", self.median_ttft_s * 1e3);
        println!("prefill           {:.1} tok/s", self.median_prefill_tok_s);
        println!("decode            {:.1} tok/s", self.median_decode_tok_s);
        println!("bytes per token   {:.1} MB", self.bytes_per_token as f64 / 1e6);
        if let (Some(bw), Some(s)) = (self.copy_bandwidth_gb_s, self.bandwidth_share) {
            println!("copy bandwidth    {bw:.0} GB/s (measured in this run)");
            println!("bandwidth share   {:.1}%", s * 100.0);
        }
        if let Some(p) = self.peak_memory_bytes {
            println!("peak memory       {:.2} GB", p as f64 / 1e9);
        }
    }
}

/// The long-context table of several one-stream runs (`--prompt-tokens 8192,16384`): prefill
/// of each prompt and decode right after it.
pub fn print_prompt_table(reports: &[BenchReport]) {
    println!("| prompt tokens | TTFT ms | prefill tok/s | decode tok/s after the prompt | bandwidth share |");
    println!("|---|---|---|---|---|");
    for r in reports {
        let share = r.bandwidth_share.map_or_else(|| "-".into(), |s| format!("{:.1}%", s * 100.0));
        println!(
            "| {} | {:.1} | {:.0} | {:.1} | {share} |",
            r.prompt_tokens,
            r.median_ttft_s * 1e3,
            r.median_prefill_tok_s,
            r.median_decode_tok_s
        );
    }
}

/// One row of the batched-decode table.
#[derive(Clone, Debug, Serialize)]
pub struct BatchRow {
    pub sequences: usize,
    /// Seconds until every sequence had its first token (all prompts prefilled).
    pub prefill_s: f64,
    /// Total decode tokens per second over all sequences (after the first tokens).
    pub decode_tok_s: f64,
    /// Weights + KV bytes read per decode step at the mean context, over the measured bandwidth.
    pub bandwidth_share: Option<f64>,
    /// The decode steps against their bound (`engine::step_cost`: the weights each step touched, the
    /// KV each sequence read, the FLOPs at the card's tensor-core rate); with the bandwidth.
    pub step_bound: Option<crate::engine::step_cost::BoundTally>,
}

/// Batched decode: `n` sequences of `prompt_tokens` each, `gen_tokens` generated each, run
/// through the slot engine with `n` slots. Repeated for every `n` in `batches`.
pub fn bench_batched<B: Backend>(
    backend: B,
    fingerprint: [u8; 32],
    prompt_tokens: usize,
    gen_tokens: usize,
    batches: &[usize],
    max_batch_tokens: usize,
) -> Result<Vec<BatchRow>> {
    bench_batched_runs(backend, fingerprint, (prompt_tokens, gen_tokens), batches, max_batch_tokens, 1)
}

/// [`bench_batched`] with each row run `runs` times back to back: the row reported is the run
/// of median decode tok/s (its prefill time and step bound with it).
pub fn bench_batched_runs<B: Backend>(
    mut backend: B,
    fingerprint: [u8; 32],
    (prompt_tokens, gen_tokens): (usize, usize),
    batches: &[usize],
    max_batch_tokens: usize,
    runs: usize,
) -> Result<Vec<BatchRow>> {
    use crate::engine::batch::{Engine, EngineConfig, Event, Request};
    use crate::engine::sampler::SamplingParams;
    // Kernel compilation (NVRTC on a machine without a warm cache) stays out of the timings.
    backend.prepare()?;
    let weights = backend.decode_weight_bytes();
    let kv_pos = backend.kv_bytes_per_position();
    let vocab = backend.config().vocab_size;
    let mut engine = Engine::new(
        backend,
        EngineConfig { slots: 1, max_batch_tokens, prefix_cache: false, model_fingerprint: fingerprint },
    )?;
    let mut rows = Vec::new();
    let mut bounds = Vec::new();
    for &n in batches {
        let mut tries = Vec::with_capacity(runs.max(1));
        for _ in 0..runs.max(1) {
            // A fresh engine per row (slots = n) over the same backend.
            let b = engine.into_backend();
            engine = Engine::new(
                b,
                EngineConfig {
                    slots: n,
                    max_batch_tokens: max_batch_tokens.max(n),
                    prefix_cache: false,
                    model_fingerprint: fingerprint,
                },
            )?;
            for i in 0..n {
                // Distinct prompts: no prefix is shared, every sequence reads its own KV.
                let mut prompt = bench_prompt(prompt_tokens + i, vocab);
                prompt.drain(..i);
                engine.add_request(Request {
                    id: i as u64,
                    prompt,
                    max_tokens: gen_tokens,
                    sampling: SamplingParams::greedy(),
                    stop_ids: Vec::new(),
                })?;
            }
            let t0 = Instant::now();
            let mut started = 0;
            while started < n {
                for e in engine.step()? {
                    if let Event::Token { index: 0, .. } = e {
                        started += 1;
                    }
                }
            }
            let prefill_s = t0.elapsed().as_secs_f64();
            let t1 = Instant::now();
            let mut steps = 0u64;
            let mut costs = Vec::new();
            while engine.has_work() {
                // Each token event is a sequence's decode at position prompt + index.
                let contexts: Vec<usize> = engine
                    .step()?
                    .iter()
                    .filter_map(|e| if let Event::Token { index, .. } = e { Some(prompt_tokens + index) } else { None })
                    .collect();
                if !contexts.is_empty() {
                    costs.push(crate::engine::step_cost::StepCost::of(engine.backend(), &contexts));
                }
                steps += 1;
            }
            let dt = t1.elapsed().as_secs_f64();
            let decode_tok_s = (n * gen_tokens.saturating_sub(1)) as f64 / dt.max(1e-9);
            let mean_ctx = (prompt_tokens + gen_tokens / 2) as u64;
            let step_bytes = weights + n as u64 * mean_ctx * kv_pos;
            // Bytes per second read by the decode steps; divided by the bandwidth below.
            let share = step_bytes as f64 * steps as f64 / dt.max(1e-9);
            eprintln!("{n:>4} sequences: prefill {prefill_s:.2} s, decode {decode_tok_s:.1} tok/s");
            tries.push((
                BatchRow { sequences: n, prefill_s, decode_tok_s, bandwidth_share: Some(share), step_bound: None },
                (costs, dt),
            ));
        }
        tries.sort_by(|a, b| a.0.decode_tok_s.total_cmp(&b.0.decode_tok_s));
        let (row, bound) = tries.swap_remove(tries.len() / 2);
        rows.push(row);
        bounds.push(bound);
    }
    if let Some(p) = engine.backend().peak_memory_bytes() {
        eprintln!(
            "peak device memory {:.2} GB (one token reads {:.2} GB of weights; a batched step's weights are in the table)",
            p as f64 / 1e9,
            weights as f64 / 1e9
        );
    }
    // Measured after the rows: its 2 GiB of copy buffers may stay in the allocator's pool and
    // would otherwise count in the peak of every later step.
    let mut backend = engine.into_backend();
    let bw = backend.measure_copy_bandwidth();
    let flops = backend.tensor_flops();
    for (r, (costs, dt)) in rows.iter_mut().zip(&bounds) {
        r.bandwidth_share = bw.and_then(|bw| r.bandwidth_share.map(|s| s / bw));
        r.step_bound = bw.map(|bandwidth| {
            crate::engine::step_cost::BoundTally::of(
                costs,
                *dt,
                crate::engine::step_cost::BoundRates { bandwidth, flops },
            )
        });
    }
    Ok(rows)
}

/// The shared-prefix job: `requests` prompts of a common `shared` tokens + `unique` own tokens,
/// `gen_tokens` out each, with the prefix cache on and off.
#[derive(Clone, Debug, Serialize)]
pub struct SharedPrefixRow {
    pub prefix_cache: bool,
    pub seconds: f64,
    pub prompt_tokens: u64,
    pub prompt_tokens_computed: u64,
}

pub fn bench_shared_prefix<B: Backend>(
    backend: B,
    fingerprint: [u8; 32],
    slots: usize,
    max_batch_tokens: usize,
    (shared, unique, requests, gen_tokens): (usize, usize, usize, usize),
) -> Result<Vec<SharedPrefixRow>> {
    use crate::engine::batch::{Engine, EngineConfig, Request};
    use crate::engine::sampler::SamplingParams;
    let mut backend = backend;
    backend.prepare()?;
    let vocab = backend.config().vocab_size;
    let prefix = bench_prompt(shared, vocab);
    let mut backend = Some(backend);
    let mut rows = Vec::new();
    for cache in [true, false] {
        let cfg = EngineConfig { slots, max_batch_tokens, prefix_cache: cache, model_fingerprint: fingerprint };
        let mut engine = Engine::new(backend.take().expect("backend"), cfg)?;
        for i in 0..requests {
            let mut p = prefix.clone();
            // Unique tail: a different stride per request.
            p.extend((0..unique).map(|j| (1000 + (i * 7 + j * 131 + 17) % (vocab - 1000)) as u32));
            engine.add_request(Request {
                id: i as u64,
                prompt: p,
                max_tokens: gen_tokens,
                sampling: SamplingParams::greedy(),
                stop_ids: Vec::new(),
            })?;
        }
        let t0 = Instant::now();
        engine.run_to_completion()?;
        let m = engine.metrics();
        let secs = t0.elapsed().as_secs_f64();
        eprintln!(
            "prefix cache {}: {secs:.2} s, prompt tokens computed {} of {}",
            if cache { "on " } else { "off" },
            m.prompt_tokens_computed,
            m.prompt_tokens
        );
        rows.push(SharedPrefixRow {
            prefix_cache: cache,
            seconds: secs,
            prompt_tokens: m.prompt_tokens,
            prompt_tokens_computed: m.prompt_tokens_computed,
        });
        backend = Some(engine.into_backend());
    }
    Ok(rows)
}
