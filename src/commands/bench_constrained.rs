//! `dustoff bench --constrained PIPELINE --batch 32`: what schema-constrained decoding costs.
//!
//! For each batch size `n`: `n` sequences (distinct prompts of `--prompt-tokens`, greedy) are
//! decoded under the pipeline's output grammar, then the same `n` prompts are decoded without
//! it, each for exactly as many tokens as its constrained run produced. Both runs therefore
//! emit the same number of tokens per sequence with the same batch occupancy over time; the
//! constrained one takes fewer model steps where the grammar forces tokens. Reported: decode
//! tok/s of both (tokens after each sequence's first, over the time after every sequence had
//! its first token), their ratio, steps, forced tokens, and the mask time per token (median,
//! p99: CPU time of one mask, computed on worker threads while the model step runs) with the
//! time steps waited for masks after the model had finished.

use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use super::bench::bench_prompt;
use crate::backend::Backend;
use crate::engine::constraint::{ConstraintMetrics, Grammar};
use crate::engine::engine::{Engine, EngineConfig, Event, Request};
use crate::engine::sampler::SamplingParams;

#[derive(Clone, Debug, Serialize)]
pub struct ConstrainedRow {
    pub sequences: usize,
    /// Tokens per sequence, mean (set by the constrained run; the free run matches it).
    pub mean_tokens: f64,
    /// All tokens over the whole pass (prefill included): the same job, both ways.
    pub constrained_job_tok_s: f64,
    pub free_job_tok_s: f64,
    /// `constrained / free` job throughput (the goal: >= 0.9).
    pub ratio: f64,
    /// Tokens emitted after every prompt was computed, over that time.
    pub constrained_decode_tok_s: f64,
    pub free_decode_tok_s: f64,
    pub constrained_steps: u64,
    pub free_steps: u64,
    pub constraint: ConstraintMetrics,
}

/// One pass over queued requests `0..n`.
struct Pass {
    /// Tokens of each request.
    lens: Vec<usize>,
    /// The whole pass, prefill included.
    total_s: f64,
    /// From the step after which every prompt was computed, to the end.
    decode_s: f64,
    /// Tokens emitted in that time.
    decode_tokens: usize,
    steps: u64,
}

fn timed<B: Backend>(engine: &mut Engine<B>, n: usize) -> Result<Pass> {
    let mut lens = vec![0usize; n];
    let (mut decode_tokens, mut decode_start) = (0, None);
    let steps0 = engine.metrics().steps;
    let t0 = Instant::now();
    while engine.has_work() {
        let evs = engine.step()?;
        for e in evs {
            if let Event::Token { id, index, .. } = e {
                lens[id as usize] = index + 1;
                decode_tokens += usize::from(decode_start.is_some());
            }
        }
        let s = engine.scheduler();
        if decode_start.is_none() && s.num_waiting() == 0 && s.running().iter().all(|q| q.num_computed >= q.prompt_len)
        {
            decode_start = Some(Instant::now());
        }
    }
    let decode_s = decode_start.map_or(0.0, |t| t.elapsed().as_secs_f64());
    let steps = engine.metrics().steps - steps0;
    Ok(Pass { lens, total_s: t0.elapsed().as_secs_f64(), decode_s, decode_tokens, steps })
}

#[allow(clippy::too_many_arguments)]
pub fn bench_constrained<B: Backend>(
    mut backend: B,
    fingerprint: [u8; 32],
    grammar: &Grammar,
    stop_ids: &[u32],
    prompt_tokens: usize,
    gen_tokens: usize,
    batches: &[usize],
    max_batch_tokens: usize,
) -> Result<Vec<ConstrainedRow>> {
    backend.prepare()?;
    let vocab = backend.config().vocab_size;
    let mut backend = Some(backend);
    let mut rows = Vec::new();
    for &n in batches {
        let cfg = EngineConfig {
            slots: n,
            max_batch_tokens: max_batch_tokens.max(n),
            prefix_cache: false,
            model_fingerprint: fingerprint,
        };
        let prompts: Vec<Vec<u32>> = (0..n)
            .map(|i| {
                let mut p = bench_prompt(prompt_tokens + i, vocab);
                p.drain(..i);
                p
            })
            .collect();
        let req = |i: usize, max_tokens: usize, stop: &[u32]| Request {
            id: i as u64,
            prompt: prompts[i].clone(),
            max_tokens,
            sampling: SamplingParams::greedy(),
            stop_ids: stop.to_vec(),
        };
        let mut e = Engine::new(backend.take().expect("backend"), cfg)?;
        for i in 0..n {
            e.add_constrained(req(i, gen_tokens, stop_ids), Some(grammar.start()))?;
        }
        let c = timed(&mut e, n)?;
        let constraint = e.metrics().constraint;
        let mut e = Engine::new(e.into_backend(), cfg)?;
        for (i, &len) in c.lens.iter().enumerate() {
            e.add_request(req(i, len.max(1), &[]))?;
        }
        let f = timed(&mut e, n)?;
        backend = Some(e.into_backend());
        anyhow::ensure!(f.lens == c.lens, "the free run produced other lengths: {:?} vs {:?}", f.lens, c.lens);
        let tokens = c.lens.iter().sum::<usize>() as f64;
        let rate = |tok: f64, s: f64| tok / s.max(1e-9);
        let row = ConstrainedRow {
            sequences: n,
            mean_tokens: tokens / n.max(1) as f64,
            constrained_job_tok_s: rate(tokens, c.total_s),
            free_job_tok_s: rate(tokens, f.total_s),
            ratio: f.total_s / c.total_s.max(1e-9),
            constrained_decode_tok_s: rate(c.decode_tokens as f64, c.decode_s),
            free_decode_tok_s: rate(f.decode_tokens as f64, f.decode_s),
            constrained_steps: c.steps,
            free_steps: f.steps,
            constraint,
        };
        eprintln!(
            "{n:>4} sequences: constrained {:.1} tok/s ({} steps), free {:.1} tok/s ({} steps), mask median {:.1} us, p99 {:.1} us",
            row.constrained_job_tok_s, c.steps, row.free_job_tok_s, f.steps, row.constraint.mask_us_median, row.constraint.mask_us_p99
        );
        rows.push(row);
    }
    Ok(rows)
}

/// `bench --constrained PIPELINE`: the pipeline's output grammar over the model's vocabulary,
/// then `bench_constrained`. `shape`: (prompt tokens, generated tokens at most, max batch tokens).
pub fn run<B: Backend>(
    backend: B,
    model: &crate::model::loader::LoadedModel,
    pipeline: &str,
    fingerprint: [u8; 32],
    (prompt_tokens, gen_tokens, max_batch_tokens): (usize, usize, usize),
    batches: &[usize],
) -> Result<Vec<ConstrainedRow>> {
    let p = crate::job::pipeline::Pipeline::resolve(pipeline, std::path::Path::new("pipelines"))?;
    let Some(c) = p.constraint() else {
        anyhow::bail!("pipeline {} has no output shape to constrain (output.kind = \"text\")", p.path.display())
    };
    let t = Instant::now();
    let grammar = crate::engine::constraint::ConstraintFactory::new(&model.tokenizer)?.compile(c)?;
    eprintln!("grammar of {} compiled in {:.2} s", p.path.display(), t.elapsed().as_secs_f64());
    let stop = model.tokenizer.eos_ids();
    bench_constrained(backend, fingerprint, &grammar, stop, prompt_tokens, gen_tokens, batches, max_batch_tokens)
}

/// The markdown table of `rows` (for docs/BENCHMARKS.md).
pub fn print_table(rows: &[ConstrainedRow]) {
    println!("| sequences | tokens/seq | job tok/s constrained / free | ratio | decode tok/s constrained / free | steps c/f | forced | mask median / p99 us | mask wait s |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let c = &r.constraint;
        println!(
            "| {} | {:.1} | {:.1} / {:.1} | {:.3} | {:.1} / {:.1} | {}/{} | {} | {:.1} / {:.1} | {:.4} |",
            r.sequences,
            r.mean_tokens,
            r.constrained_job_tok_s,
            r.free_job_tok_s,
            r.ratio,
            r.constrained_decode_tok_s,
            r.free_decode_tok_s,
            r.constrained_steps,
            r.free_steps,
            c.forced_tokens,
            c.mask_us_median,
            c.mask_us_p99,
            c.mask_wait_seconds
        );
    }
}
