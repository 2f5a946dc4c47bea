//! `dustoff generate`: JSONL prompts in, JSONL completions out; or one `--prompt` streamed to the
//! terminal with prefill and decode speed at the end.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::backend::Backend;
use crate::engine::sampler::{derive_seed, Sampler, SamplingParams};
use crate::engine::single::generate_one;
use crate::job::adapters::TokenizerCodec;
use crate::job::exit::ExitCode;
use crate::job::fingerprint::{file_identity, model_identity, JobFingerprint};
use crate::job::lock::JobLock;
use crate::job::pipeline::TextCodec;
#[cfg(doc)]
use crate::job::reader::InputFormat;
use crate::job::reader::ReaderConfig;
use crate::job::record::{ErrorKind, Item, RecordBody, RecordError};
use crate::job::runner::{
    run_job, Finished, GenRequest, Generate, InFlight, JobRows, Prepared as Request, RunOptions, StopFlag,
};
use crate::job::tolerance::ErrorTolerance;
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

/// `generate --input` lines as a job of the run loop ([`run_job`]): each JSON object becomes a
/// request through [`prepare`] (its own tokenization rules: raw text with the model's BOS and no
/// control tokens, or the chat template), the rows are
/// `{"id","prompt_tokens","token_ids","text","finish_reason"}` and error rows
/// `{"id","line","error"}`, the id echoed as the line gave it (any JSON value, null when absent).
struct PromptLines<'a> {
    m: &'a LoadedModel,
    opt: &'a GenOptions,
}

/// The line's id from the reader's JSON text of it ([`InputFormat::Objects`]).
fn id_value(item_id: Option<&str>) -> Value {
    item_id.and_then(|s| serde_json::from_str(s).ok()).unwrap_or(Value::Null)
}

impl JobRows for PromptLines<'_> {
    fn reader_config(&self) -> ReaderConfig {
        ReaderConfig::objects("id")
    }
    fn name(&self) -> String {
        "generate".into()
    }
    fn parquet_output(&self) -> bool {
        false
    }
    fn prepare(&self, _codec: &dyn TextCodec, item: &Item) -> Request {
        let fields = match &item.body {
            Ok(RecordBody::Fields(f)) => f,
            Ok(RecordBody::OpenAi(_)) => {
                return Request::Row(RecordError::new(ErrorKind::WrongType, "not a prompt line"))
            }
            Err(e) => return Request::Row(e.clone()),
        };
        let p = match prepare(self.m, &Value::Object(fields.clone())) {
            Ok(p) => p,
            Err(msg) => return Request::Row(RecordError::new(ErrorKind::WrongType, msg)),
        };
        let sampling = self.opt.sampling_for(&id_key(&p.id));
        let max_tokens = u32::try_from(self.opt.max_tokens).unwrap_or(u32::MAX);
        let fl = InFlight {
            id: item.id.clone().unwrap_or_default(),
            line: item.line,
            prompt_tokens: p.prompt_ids.len() as u32,
            truncated: false,
            openai: None,
        };
        Request::Request(GenRequest { key: item.index, prompt: p.prompt_ids, max_tokens, sampling }, fl, false)
    }
    fn finished_row(&self, _codec: &dyn TextCodec, fl: &InFlight, f: &Finished) -> (String, Option<ErrorKind>, u32) {
        let fail = |e: RecordError| (self.error_row(Some(&fl.id), fl.line, &e), Some(e.kind), 0);
        let token_ids = match &f.result {
            Ok(t) => t,
            // A request the engine refused (e.g. longer than the KV cache) is its row's error.
            Err(m) => return fail(RecordError::new(ErrorKind::Generation, m.clone())),
        };
        let text = match self.m.tokenizer.decode_generated(token_ids) {
            Ok(t) => t,
            Err(e) => return fail(RecordError::new(ErrorKind::Generation, format!("detokenize: {e}"))),
        };
        let row = json!({
            "id": id_value(Some(&fl.id)),
            "prompt_tokens": fl.prompt_tokens,
            "token_ids": token_ids,
            "text": text,
            "finish_reason": f.finish_reason.as_str(),
        });
        (row.to_string(), None, token_ids.len() as u32)
    }
    fn error_row(&self, item_id: Option<&str>, line: u64, e: &RecordError) -> String {
        let msg = match e.kind {
            ErrorKind::MalformedJson => format!("malformed JSON: {}", e.message),
            _ => e.message.clone(),
        };
        json!({"id": id_value(item_id), "line": line, "error": msg}).to_string()
    }
}

/// JSONL mode on the job loop of `run` ([`run_job`] over [`PromptLines`]): finished rows are
/// committed to a checkpoint beside the output (`<output>.dustoff/`), so SIGINT or SIGTERM
/// (exit 4) or `kill -9` loses at most the rows in flight and the same command resumes; the
/// output, in input order, is written when every line has its row, with the job report and
/// errors file beside it. `lock` is the output's [`JobLock`], taken before the model was loaded.
pub fn run_jsonl<G: Generate>(
    m: &LoadedModel,
    gen: &mut G,
    job: &BatchJob,
    opt: &GenOptions,
    lock: &JobLock,
    stop: &StopFlag,
) -> Result<BatchResult> {
    let opts = RunOptions {
        inputs: vec![job.input.to_path_buf()],
        output: job.output.to_path_buf(),
        fingerprint: fingerprint(job, opt)?,
        restart: job.restart,
        max_errors: None,
        tolerance: ErrorTolerance::default(),
        shard: None,
        commit_rows: job.commit_rows,
        commit_interval: Duration::from_secs(5),
        progress_interval: super::job_settings::progress_interval(),
        quiet: false,
        model_label: job.model_path.display().to_string(),
    };
    let codec = TokenizerCodec(&m.tokenizer);
    let r = run_job(&PromptLines { m, opt }, &opts, lock, &codec, gen, stop)?;
    let c = &r.report.counts;
    Ok(BatchResult {
        error_rows: r.report.error_rows,
        rows: c.ok + c.error + c.skipped_done,
        resumed_rows: c.skipped_done,
        exit: r.exit,
        metrics: r.report.engine.clone().unwrap_or(Value::Null),
    })
}

/// Interactive mode: streams the completion of one prompt to stdout.
pub fn run_prompt<B: Backend + ?Sized>(
    m: &LoadedModel,
    b: &mut B,
    prompt: &str,
    chat: bool,
    opt: &GenOptions,
    ctx: usize,
) -> Result<()> {
    let p = prepare(m, &json!({"id": "prompt", "prompt": prompt, "chat": chat}))
        .map_err(|e| crate::job::exit::UsageError::new(format!("--prompt: {e}")))?;
    if p.prompt_ids.is_empty() {
        return Err(crate::job::exit::UsageError::new("--prompt is empty: nothing to continue from").into());
    }
    let need = p.prompt_ids.len().saturating_add(opt.max_tokens);
    if need > ctx {
        return Err(crate::job::exit::UsageError::new(format!(
            "the prompt ({} tokens) and --max-tokens {} need {need} positions; --ctx is {ctx}: lower --max-tokens, or raise --ctx up to the model's context",
            p.prompt_ids.len(),
            opt.max_tokens
        ))
        .into());
    }
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
