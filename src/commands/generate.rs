//! `dustoff generate`: JSONL prompts in, JSONL completions out; or one `--prompt` streamed to the
//! terminal with prefill and decode speed at the end.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::common::read_jsonl;
use crate::backend::Backend;
use crate::engine::sampler::{derive_seed, Sampler, SamplingParams};
use crate::engine::single::generate_one;
use crate::job::checkpoint::{file_identity, model_identity, Checkpoint, JobFingerprint, PendingRow};
use crate::job::exit::ExitCode;
use crate::job::lock::JobLock;
use crate::job::runner::{GenRequest, Generate, StopFlag};
use crate::model::loader::LoadedModel;
use crate::tokenizer::{ChatMessage, StreamDecoder};

#[derive(Clone, Debug)]
pub struct GenOptions {
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub seed: u64,
}

impl GenOptions {
    /// Per-request sampling: the seed is derived from (job seed, record id) so reordering or
    /// resuming a job does not change a record's text.
    pub fn sampling_for(&self, record_key: &str) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: derive_seed(self.seed, record_key),
        }
    }
}

/// A prompt ready to run.
pub struct Prepared {
    pub id: Value,
    pub prompt_ids: Vec<u32>,
}

/// Turns one input line into prompt ids: `{"id", "prompt"}` (raw text, BOS as the model says),
/// `{"id", "prompt_ids": [...]}`, optionally `"chat": true` for the model's chat template.
pub fn prepare(m: &LoadedModel, v: &Value) -> Result<Prepared, String> {
    let id = v.get("id").cloned().unwrap_or(Value::Null);
    if !v.is_object() {
        return Err("each line must be a JSON object".into());
    }
    let chat = match v.get("chat") {
        None => false,
        Some(c) => c.as_bool().ok_or("field 'chat' is not a bool")?,
    };
    let prompt_ids = if let Some(p) = v.get("prompt_ids") {
        let arr = p.as_array().ok_or("field 'prompt_ids' is not an array")?;
        let mut ids = Vec::with_capacity(arr.len());
        for x in arr {
            let t = x.as_u64().filter(|&t| (t as usize) < m.config.vocab_size).ok_or_else(|| {
                format!("prompt_ids holds {x}, not a token id below the vocabulary size {}", m.config.vocab_size)
            })?;
            ids.push(t as u32);
        }
        ids
    } else {
        let text = v
            .get("prompt")
            .and_then(Value::as_str)
            .ok_or("field 'prompt' (or 'prompt_ids') is missing or not a string")?;
        let tok = &m.tokenizer;
        if chat {
            let msgs = [ChatMessage { role: "user".into(), content: text.into() }];
            let rendered = tok.apply_chat_template(&msgs, true).map_err(|e| e.to_string())?;
            // The template writes any BOS itself; special tokens in it must be parsed.
            tok.encode(&rendered, false, true).map_err(|e| e.to_string())?
        } else {
            tok.encode(text, tok.add_bos_default(), false).map_err(|e| e.to_string())?
        }
    };
    if prompt_ids.is_empty() {
        return Err("the prompt is empty".into());
    }
    Ok(Prepared { id, prompt_ids })
}

/// Stable key of a record id for seed derivation.
pub fn id_key(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Where a `generate --input` job runs and how it checkpoints.
pub struct BatchJob<'a> {
    pub model_path: &'a Path,
    pub input: &'a Path,
    pub output: &'a Path,
    /// `--ctx`: part of the fingerprint (it decides which prompts fit).
    pub ctx: usize,
    pub restart: bool,
    pub commit_rows: usize,
}

/// How a `generate --input` run ended.
pub struct BatchResult {
    /// Error rows in the output (this run's and earlier runs').
    pub error_rows: u64,
    pub rows: u64,
    pub resumed_rows: u64,
    pub exit: ExitCode,
    /// The engine's counters (`EngineMetrics` as JSON).
    pub metrics: Value,
}

/// What makes two `generate --input` runs the same job (see `checkpoint`): the model, the
/// input, the sampling options and `--ctx`.
pub fn fingerprint(job: &BatchJob, opt: &GenOptions) -> Result<JobFingerprint> {
    Ok(JobFingerprint {
        model: model_identity(job.model_path).with_context(|| format!("reading model {}", job.model_path.display()))?,
        pipeline: "generate".into(),
        params: json!({
            "max_tokens": opt.max_tokens, "temperature": opt.temperature, "top_k": opt.top_k,
            "top_p": opt.top_p, "seed": opt.seed, "ctx": job.ctx,
        })
        .to_string(),
        inputs: vec![file_identity(job.input).with_context(|| format!("reading input {}", job.input.display()))?],
        shard: None,
        base: None,
    })
}

/// JSONL mode through the job machinery: every prompt becomes the job's request type
/// ([`GenRequest`], as `run` makes them) and goes to the slot engine through the same
/// [`Generate`] adapter; finished rows are committed to a checkpoint beside the output
/// (`<output>.dustoff/`), so SIGINT or SIGTERM (exit 4) or `kill -9` loses at most the rows in
/// flight and the same command resumes. The output, in input order, is written when every line
/// has its row. `lock` is the output's [`JobLock`], taken before the model was loaded.
pub fn run_jsonl<G: Generate>(
    m: &LoadedModel,
    gen: &mut G,
    job: &BatchJob,
    opt: &GenOptions,
    lock: &JobLock,
    stop: &StopFlag,
) -> Result<BatchResult> {
    let (input, output) = (job.input, job.output);
    if lock.path() != JobLock::path_for(output) {
        anyhow::bail!("internal: the job lock {} is not the lock of {}", lock.path().display(), output.display());
    }
    let fingerprint = fingerprint(job, opt)?;
    let mut ck = Checkpoint::open(output, &fingerprint, job.restart)
        .with_context(|| format!("opening the checkpoint of {}", output.display()))?;
    if let Some(note) = ck.replaced() {
        eprintln!("{note}");
    }
    let committing = || format!("committing finished rows to the checkpoint of {}", output.display());
    let records = read_jsonl(input)?;
    let total = records.len() as u64;
    let mut pending: Vec<PendingRow> = Vec::new();
    let error_row = |i: u64, id: Value, line: usize, msg: String| {
        eprintln!("{}:{line}: {msg}", input.display());
        PendingRow { index: i, line: json!({"id": id, "line": line, "error": msg}).to_string(), is_error: true }
    };
    let max_tokens = u32::try_from(opt.max_tokens).unwrap_or(u32::MAX);
    // Requests not yet submitted, in input order, and per submitted one: (id, prompt length, line).
    let mut todo: VecDeque<(GenRequest, Value, usize)> = VecDeque::new();
    let mut queued: HashMap<u64, (Value, usize, usize)> = HashMap::new();
    for (i, (line, rec)) in records.into_iter().enumerate() {
        let key = i as u64;
        if ck.is_done(key) {
            continue;
        }
        // A row that failed keeps its id when the line had one; `line` locates it either way.
        let prepared = match rec {
            Err(msg) => Err((Value::Null, msg)),
            Ok(v) => prepare(m, &v).map_err(|e| (v.get("id").cloned().unwrap_or(Value::Null), e)),
        };
        match prepared {
            Ok(p) => {
                let sampling = opt.sampling_for(&id_key(&p.id));
                todo.push_back((GenRequest { key, prompt: p.prompt_ids, max_tokens, sampling }, p.id, line));
            }
            Err((id, msg)) => pending.push(error_row(key, id, line, msg)),
        }
    }
    let resumed = ck.committed_rows();
    let mut done = resumed + pending.len() as u64;
    let mut last_commit = Instant::now();
    while !stop.is_set() {
        while queued.len() < gen.capacity() {
            let Some((req, id, line)) = todo.pop_front() else { break };
            queued.insert(req.key, (id, req.prompt.len(), line));
            gen.submit(req)?;
        }
        if queued.is_empty() {
            break;
        }
        let finished = gen.poll()?;
        if finished.is_empty() && !stop.is_set() {
            anyhow::bail!("internal: the engine went idle with {} requests in flight", queued.len());
        }
        for f in finished {
            let Some((id, prompt_tokens, line)) = queued.remove(&f.key) else {
                anyhow::bail!("the engine finished unknown request {}", f.key);
            };
            match f.result {
                Ok(token_ids) => {
                    let text = m.tokenizer.decode_generated(&token_ids).map_err(|e| anyhow::anyhow!("{e}"))?;
                    let row = json!({
                        "id": id,
                        "prompt_tokens": prompt_tokens,
                        "token_ids": token_ids,
                        "text": text,
                        "finish_reason": f.finish_reason.as_str(),
                    });
                    pending.push(PendingRow { index: f.key, line: row.to_string(), is_error: false });
                    done += 1;
                    eprintln!("[{done}/{total}] done");
                }
                // A request the engine refused (e.g. longer than the KV cache) is its row's error.
                Err(msg) => {
                    pending.push(error_row(f.key, id, line, msg));
                    done += 1;
                }
            }
        }
        if pending.len() >= job.commit_rows.max(1) || last_commit.elapsed() >= Duration::from_secs(5) {
            ck.commit(std::mem::take(&mut pending)).with_context(committing)?;
            last_commit = Instant::now();
        }
    }
    // Interrupted or not, what finished is kept; in-flight requests are recomputed on resume.
    ck.commit(pending).with_context(committing)?;
    let error_rows = ck.committed_errors();
    let rows = ck.committed_rows();
    let exit = if !queued.is_empty() || !todo.is_empty() {
        ExitCode::Interrupted
    } else {
        ck.finish(output, total, false)
            .with_context(|| format!("writing the output {} from its checkpoint", output.display()))?;
        if error_rows > 0 {
            ExitCode::RecordErrors
        } else {
            ExitCode::Ok
        }
    };
    let metrics = gen.metrics_json().unwrap_or(Value::Null);
    Ok(BatchResult { error_rows, rows, resumed_rows: resumed, exit, metrics })
}

/// Interactive mode: streams the completion of one prompt to stdout.
pub fn run_prompt<B: Backend + ?Sized>(
    m: &LoadedModel,
    b: &mut B,
    prompt: &str,
    chat: bool,
    opt: &GenOptions,
) -> Result<()> {
    let p = prepare(m, &json!({"id": "prompt", "prompt": prompt, "chat": chat})).map_err(anyhow::Error::msg)?;
    let mut sampler = Sampler::new(opt.sampling_for("prompt"));
    let mut dec = StreamDecoder::new(&m.tokenizer);
    let mut stdout = std::io::stdout();
    let mut err = None;
    let out =
        generate_one(b, &p.prompt_ids, opt.max_tokens, &mut sampler, m.tokenizer.eos_ids(), |t| match dec.push(t) {
            Ok(s) => {
                let _ = stdout.write_all(s.as_bytes());
                let _ = stdout.flush();
            }
            Err(e) => err = Some(e),
        })?;
    if let Some(e) = err {
        return Err(anyhow::anyhow!("detokenizing: {e}"));
    }
    let tail = dec.finish().map_err(|e| anyhow::anyhow!("detokenizing: {e}"))?;
    println!("{tail}");
    let n = out.token_ids.len();
    let pf = out.prefill_time.as_secs_f64();
    let dc = out.decode_time.as_secs_f64();
    eprintln!(
        "\n[{}] prompt {} tokens, prefill {:.1} tok/s; generated {} tokens, decode {:.1} tok/s; finish: {}",
        b.describe(),
        p.prompt_ids.len(),
        p.prompt_ids.len() as f64 / pf.max(1e-9),
        n,
        if n > 1 { (n - 1) as f64 / dc.max(1e-9) } else { 0.0 },
        out.finish_reason.as_str()
    );
    Ok(())
}
