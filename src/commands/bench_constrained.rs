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
//! time steps waited for masks after the model had finished, and the decode step time split
//! into steps that also ran forced tokens (chunks of several tokens) and the others.
//!
//! A third pass repeats the constrained run with the masked choice made on the host
//! ([`HostChoice`]: the logits of every constrained step come down and `sampler::masked_argmax`
//! picks), the path a device backend took before `step_greedy_masked`: the "before" column.
//! It must produce the same tokens. The three compared passes run after a first constrained
//! and a first free pass (reported as `first_*`: on a GPU they capture a graph for each new
//! step shape), so that all three see the same warm backend.

use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use super::bench::bench_prompt;
use crate::backend::{Backend, BackendError};
use crate::engine::batch::{Engine, EngineConfig, Event, Request};
use crate::engine::constraint::{ConstraintMetrics, Grammar, SeqConstraint};
use crate::engine::plan::StepPlan;
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
    /// The constrained run again, its masked choices made on the host from downloaded logits.
    pub host_choice_job_tok_s: f64,
    pub host_choice_ratio: f64,
    pub host_choice_decode_tok_s: f64,
    /// The first constrained and free passes (graph captures and cuBLAS set-up included).
    pub first_constrained_job_tok_s: f64,
    pub first_free_job_tok_s: f64,
    pub first_ratio: f64,
    /// Where the decode time goes: mean ms of the constrained run's steps that also ran forced
    /// tokens (and how many), of its other steps, and of the free run's steps.
    pub constrained_forced_chunk_steps: u64,
    pub constrained_forced_chunk_ms: f64,
    pub constrained_plain_ms: f64,
    pub free_step_ms: f64,
}

/// `B` with the masked greedy choice on the host: the trait's default `step_greedy_masked`
/// (logits downloaded, `sampler::masked_argmax`); every other call goes to `B` (free greedy
/// steps keep the device arg-max).
pub struct HostChoice<B: Backend>(pub B);

impl<B: Backend> Backend for HostChoice<B> {
    fn config(&self) -> &crate::model::config::ModelConfig {
        self.0.config()
    }
    fn block_size(&self) -> usize {
        self.0.block_size()
    }
    fn num_blocks(&self) -> usize {
        self.0.num_blocks()
    }
    fn step(&mut self, plan: &StepPlan) -> Result<Vec<Vec<f32>>, BackendError> {
        self.0.step(plan)
    }
    fn step_greedy(&mut self, plan: &StepPlan) -> Result<Vec<u32>, BackendError> {
        self.0.step_greedy(plan)
    }
    fn state_slots(&self) -> crate::backend::StateSlots {
        self.0.state_slots()
    }
    fn prepare(&mut self) -> Result<(), BackendError> {
        self.0.prepare()
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn max_seq_positions(&self) -> usize {
        self.0.max_seq_positions()
    }
    fn decode_weight_bytes(&self) -> u64 {
        self.0.decode_weight_bytes()
    }
    fn kv_bytes_per_position(&self) -> u64 {
        self.0.kv_bytes_per_position()
    }
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
    /// Decode-phase steps (count, seconds): those that also ran tokens forced after the step
    /// before (chunks of several tokens), and the others.
    forced_chunk: (u64, f64),
    plain: (u64, f64),
}

/// Mean milliseconds of `(steps, seconds)`.
fn ms_per_step((n, s): (u64, f64)) -> f64 {
    if n == 0 {
        0.0
    } else {
        s * 1e3 / n as f64
    }
}

fn timed<B: Backend>(engine: &mut Engine<B>, n: usize) -> Result<Pass> {
    let mut lens = vec![0usize; n];
    let (mut decode_tokens, mut decode_start) = (0, None);
    let (mut forced_chunk, mut plain) = ((0, 0.0), (0, 0.0));
    // Whether the last step emitted forced tokens (several tokens for one request): the next
    // step runs them as a chunk.
    let mut forced_last = false;
    let steps0 = engine.metrics().steps;
    let t0 = Instant::now();
    while engine.has_work() {
        let ts = Instant::now();
        let evs = engine.step()?;
        let dt = ts.elapsed().as_secs_f64();
        if decode_start.is_some() {
            let acc: &mut (u64, f64) = if forced_last { &mut forced_chunk } else { &mut plain };
            acc.0 += 1;
            acc.1 += dt;
        }
        let mut emitted = std::collections::HashMap::<u64, usize>::new();
        for e in evs {
            if let Event::Token { id, index, .. } = e {
                lens[id as usize] = index + 1;
                decode_tokens += usize::from(decode_start.is_some());
                *emitted.entry(id).or_default() += 1;
            }
        }
        forced_last = emitted.values().any(|&k| k > 1);
        let s = engine.scheduler();
        if decode_start.is_none() && s.num_waiting() == 0 && s.running().iter().all(|q| q.num_computed >= q.prompt_len)
        {
            decode_start = Some(Instant::now());
        }
    }
    let decode_s = decode_start.map_or(0.0, |t| t.elapsed().as_secs_f64());
    let steps = engine.metrics().steps - steps0;
    Ok(Pass { lens, total_s: t0.elapsed().as_secs_f64(), decode_s, decode_tokens, steps, forced_chunk, plain })
}

/// Runs `reqs` (with their grammars) to completion on a fresh engine over `b`, timed.
fn pass<B: Backend>(
    b: B,
    cfg: EngineConfig,
    reqs: Vec<(Request, Option<SeqConstraint>)>,
) -> Result<(Pass, ConstraintMetrics, B)> {
    let n = reqs.len();
    let mut e = Engine::new(b, cfg)?;
    for (r, c) in reqs {
        e.add_constrained(r, c)?;
    }
    let p = timed(&mut e, n)?;
    let m = e.metrics().constraint;
    Ok((p, m, e.into_backend()))
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
        let constrained_reqs = || (0..n).map(|i| (req(i, gen_tokens, stop_ids), Some(grammar.start()))).collect();
        let free_reqs =
            |lens: &[usize]| lens.iter().enumerate().map(|(i, &len)| (req(i, len.max(1), &[]), None)).collect();
        // NOTE: the first pass of each kind captures a CUDA graph per new step shape (and cuBLAS
        // picks its kernels); the timed passes come after it, so that the three compared runs
        // see the same warm backend. The first passes are reported too (`first_*`).
        let b = backend.take().expect("backend");
        let (c0, _, b) = pass(b, cfg, constrained_reqs())?;
        let (f0, _, b) = pass(b, cfg, free_reqs(&c0.lens))?;
        let (c, constraint, b) = pass(b, cfg, constrained_reqs())?;
        let (f, _, b) = pass(b, cfg, free_reqs(&c.lens))?;
        let (h, _, b) = pass(HostChoice(b), cfg, constrained_reqs())?;
        backend = Some(b.0);
        for (what, p) in [("first constrained", &c0), ("first free", &f0), ("free", &f), ("host-choice", &h)] {
            anyhow::ensure!(p.lens == c.lens, "the {what} run produced other lengths: {:?} vs {:?}", p.lens, c.lens);
        }
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
            host_choice_job_tok_s: rate(tokens, h.total_s),
            host_choice_ratio: f.total_s / h.total_s.max(1e-9),
            host_choice_decode_tok_s: rate(h.decode_tokens as f64, h.decode_s),
            first_constrained_job_tok_s: rate(tokens, c0.total_s),
            first_free_job_tok_s: rate(tokens, f0.total_s),
            first_ratio: f0.total_s / c0.total_s.max(1e-9),
            constrained_forced_chunk_steps: c.forced_chunk.0,
            constrained_forced_chunk_ms: ms_per_step(c.forced_chunk),
            constrained_plain_ms: ms_per_step(c.plain),
            free_step_ms: ms_per_step((f.plain.0 + f.forced_chunk.0, f.plain.1 + f.forced_chunk.1)),
        };
        eprintln!(
            "{n:>4} sequences: constrained {:.1} tok/s ({} steps), free {:.1} tok/s ({} steps), host choice {:.1} tok/s, mask median {:.1} us, p99 {:.1} us",
            row.constrained_job_tok_s,
            c.steps,
            row.free_job_tok_s,
            f.steps,
            row.host_choice_job_tok_s,
            row.constraint.mask_us_median,
            row.constraint.mask_us_p99
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
    let p = crate::job::pipeline::Pipeline::resolve_in(pipeline, &crate::job::search_path::pipeline_dirs(None))?;
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
    println!("| sequences | tokens/seq | job tok/s constrained / free | ratio | decode tok/s constrained / free | steps c/f | forced | mask median / p99 us | mask wait s | commit s | host choice: job tok/s, ratio | decode ms/step: c forced-chunk (n) / c other / free | first pass: ratio (c / f job tok/s) |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let c = &r.constraint;
        println!(
            "| {} | {:.1} | {:.1} / {:.1} | {:.3} | {:.1} / {:.1} | {}/{} | {} | {:.1} / {:.1} | {:.4} | {:.4} | {:.1}, {:.3} | {:.2} ({}) / {:.2} / {:.2} | {:.3} ({:.1} / {:.1}) |",
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
            c.mask_wait_seconds,
            c.commit_seconds,
            r.host_choice_job_tok_s,
            r.host_choice_ratio,
            r.constrained_forced_chunk_ms,
            r.constrained_forced_chunk_steps,
            r.constrained_plain_ms,
            r.free_step_ms,
            r.first_ratio,
            r.first_constrained_job_tok_s,
            r.first_free_job_tok_s
        );
    }
}
