//! The job loop: reader -> pipeline render -> tokenizer -> engine -> rows -> checkpoint, then the
//! final output in input order. The engine and tokenizer come in through two small traits
//! ([`Generate`], [`TextCodec`]) so this file knows nothing about tensors.
//!
//! How a job ends becomes one of the codes of [`super::exit`] ([`RunResult`]'s `exit`).

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::checkpoint::{Checkpoint, PendingRow};
use super::fingerprint::{file_identity, model_identity, JobFingerprint};
use super::incremental::{DigestsWriter, Reuse, ReuseIndex};
use super::lock::JobLock;
use super::pipeline::{Pipeline, TextCodec};
use super::progress::{Progress, ProgressStats};
use super::reader::{ReaderConfig, RecordReader};
use super::record::{ChatMessage, ErrorKind, Item, OpenAiEndpoint, OpenAiRequest, RecordBody, RecordError};
use super::report::{Counts, JobReport, Outcome, Tokens};
use super::shard::ShardSpec;
use super::spans::{differing_range, fill_markers, marker, marker_head};
use super::writer::{error_row, ok_row_with, openai_error_row, openai_ok_row};
use crate::engine::sampler::{derive_seed, SamplingParams};

use super::exit::ExitCode;

/// Set when the job should stop taking records: SIGINT/SIGTERM, or by the caller.
#[derive(Clone, Debug, Default)]
pub struct StopFlag {
    flag: Arc<AtomicBool>,
    signals: bool,
}

impl StopFlag {
    pub fn new() -> Self {
        Self::default()
    }

    /// A flag that is also set by SIGINT/SIGTERM (a second signal exits at once with code 4).
    /// Returns `None` where handlers cannot be installed.
    pub fn with_signals() -> Option<Self> {
        crate::sys::interrupt::install().then(|| StopFlag { flag: Arc::default(), signals: true })
    }

    pub fn set(&self) {
        self.flag.store(true, Ordering::SeqCst);
    }

    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::Relaxed) || (self.signals && crate::sys::interrupt::requested())
    }
}

/// Why generation ended (the engine's own type).
use crate::engine::finish::FinishReason;

/// One generation request. `key` is the record's input index.
#[derive(Clone, Debug, PartialEq)]
pub struct GenRequest {
    pub key: u64,
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    pub sampling: SamplingParams,
}

/// A finished request.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    pub key: u64,
    /// Generated token ids (without the end-of-sequence token), or the engine's per-request error.
    pub result: Result<Vec<u32>, String>,
    pub finish_reason: FinishReason,
    /// Prompt tokens served by the prefix cache.
    pub cached_prompt_tokens: u32,
}

/// The engine as the job loop needs it (`job::adapters::EngineGenerate` over one
/// `crate::engine::batch::Engine`, `parallel::EnginePool` over several).
pub trait Generate {
    /// How many requests may be submitted and unfinished at once.
    fn capacity(&self) -> usize;
    /// How many of those run at once (the rest wait in the engine's queue). An engine pool
    /// steals work for an engine only while it has fewer than this many.
    fn slots(&self) -> usize {
        self.capacity()
    }
    fn submit(&mut self, req: GenRequest) -> anyhow::Result<()>;
    /// Runs engine steps until at least one request finishes (returns at once with nothing when
    /// none is pending). An `Err` is a whole-job failure.
    fn poll(&mut self) -> anyhow::Result<Vec<Finished>>;
    /// Engine metrics for the final report (slots, prefix reuse, KV use, preemptions).
    fn metrics_json(&self) -> Option<serde_json::Value> {
        None
    }
}

/// What a job runs.
pub enum JobKind {
    Pipeline(Box<Pipeline>),
    /// OpenAI batch input: the request says the messages and parameters.
    OpenAi {
        /// Echoed as `model` in the output lines.
        model_name: String,
        default_max_tokens: u32,
        max_input_tokens: u32,
    },
}

/// What a job makes of its records: how they are read, which request each becomes, and the row
/// a finished request (or a failed record) writes. [`JobKind`] (pipelines, OpenAI batch input)
/// and `generate --input`'s prompt lines (`super::prompts::PromptLines`) run on the one loop
/// of [`run_job`].
pub trait JobRows {
    fn reader_config(&self) -> ReaderConfig;
    /// The job's name in the report.
    fn name(&self) -> String;
    /// Rows are the pipeline's JSON objects: a Parquet output takes their fields as columns.
    fn json_output(&self) -> bool {
        false
    }
    /// Whether the rows may go to a Parquet output (else the output path must be `.jsonl`).
    fn parquet_output(&self) -> bool {
        true
    }
    fn prepare(&self, codec: &dyn TextCodec, item: &Item) -> Prepared;
    /// The row of a finished request: (line, its error kind if it is an error row, generated
    /// tokens).
    fn finished_row(&self, codec: &dyn TextCodec, fl: &InFlight, f: &Finished) -> (String, Option<ErrorKind>, u32);
    /// The row of a record that failed before or in the engine.
    fn error_row(&self, item_id: Option<&str>, line: u64, e: &RecordError) -> String;
}

impl JobRows for JobKind {
    fn reader_config(&self) -> ReaderConfig {
        JobKind::reader_config(self)
    }
    fn name(&self) -> String {
        JobKind::name(self)
    }
    fn json_output(&self) -> bool {
        JobKind::json_output(self)
    }
    fn parquet_output(&self) -> bool {
        !matches!(self, JobKind::OpenAi { .. })
    }
    fn prepare(&self, codec: &dyn TextCodec, item: &Item) -> Prepared {
        prepare(self, codec, item)
    }
    fn finished_row(&self, codec: &dyn TextCodec, fl: &InFlight, f: &Finished) -> (String, Option<ErrorKind>, u32) {
        finished_row(self, codec, fl, f)
    }
    fn error_row(&self, item_id: Option<&str>, line: u64, e: &RecordError) -> String {
        JobKind::error_row(self, item_id, line, e)
    }
}

impl JobKind {
    pub fn reader_config(&self) -> ReaderConfig {
        match self {
            JobKind::Pipeline(p) => {
                let f: Vec<&str> = p.spec.input.fields.iter().map(String::as_str).collect();
                let mut c = ReaderConfig::new(&p.spec.input.id_field, &f);
                c.document_field = Some(p.document_field().to_string());
                c
            }
            JobKind::OpenAi { .. } => ReaderConfig::openai(),
        }
    }

    fn json_output(&self) -> bool {
        matches!(self, JobKind::Pipeline(p) if p.spec.output.kind == super::pipeline::OutputKind::Json)
    }

    fn name(&self) -> String {
        match self {
            JobKind::Pipeline(p) => p.path.display().to_string(),
            JobKind::OpenAi { .. } => "openai-batch".to_string(),
        }
    }

    fn error_row(&self, item_id: Option<&str>, line: u64, e: &RecordError) -> String {
        match self {
            JobKind::Pipeline(_) => error_row(item_id, line, e),
            JobKind::OpenAi { .. } => openai_error_row(item_id, line, e),
        }
    }
}

/// The fingerprint of a job (see `checkpoint`). `overrides`: canonical JSON of any command-line
/// setting that changes rows.
pub fn job_fingerprint(
    job: &JobKind,
    model: &std::path::Path,
    inputs: &[PathBuf],
    shard: Option<ShardSpec>,
    overrides: &str,
) -> anyhow::Result<JobFingerprint> {
    let model = model_identity(model).with_context(|| format!("reading model {}", model.display()))?;
    let mut ids = Vec::new();
    for p in inputs {
        ids.push(file_identity(p).with_context(|| format!("reading input {}", p.display()))?);
    }
    let (pipeline, params) = match job {
        JobKind::Pipeline(p) => (p.source_hash.clone(), overrides.to_string()),
        JobKind::OpenAi { default_max_tokens, max_input_tokens, .. } => (
            "openai-batch".to_string(),
            format!("{{\"default_max_tokens\":{default_max_tokens},\"max_input_tokens\":{max_input_tokens},\"overrides\":{overrides:?}}}"),
        ),
    };
    Ok(JobFingerprint { model, pipeline, params, inputs: ids, shard, base: None })
}

/// Settings of one run.
pub struct RunOptions {
    pub inputs: Vec<PathBuf>,
    pub output: PathBuf,
    pub fingerprint: JobFingerprint,
    pub restart: bool,
    /// Abort (resumably) once more than this many error rows exist.
    pub max_errors: Option<u64>,
    /// Error rows a completed job may hold and exit 0 (`--allow-errors`, `--max-error-rate`).
    pub tolerance: super::tolerance::ErrorTolerance,
    pub shard: Option<ShardSpec>,
    /// Commit a batch at this many finished rows...
    pub commit_rows: usize,
    /// ...or after this long, whichever comes first.
    pub commit_interval: Duration,
    pub progress_interval: Duration,
    pub quiet: bool,
    pub model_label: String,
}

/// The result of a run: the report (also written beside the output) and the exit code.
pub struct RunResult {
    pub report: JobReport,
    pub exit: ExitCode,
}

/// A record in the engine: what its row needs when the request finishes.
pub struct InFlight {
    /// The record's id as the reader gave it.
    pub id: String,
    pub line: u64,
    pub prompt_tokens: u32,
    /// The prompt was cut to `limits.max_input_tokens` (the row's `input_truncated`).
    pub truncated: bool,
    pub openai: Option<OpenAiEndpoint>,
}

/// A record made ready for the engine (the request, its [`InFlight`], whether the prompt was
/// cut), or its error row.
pub enum Prepared {
    Request(GenRequest, InFlight, bool),
    Row(RecordError),
}

pub(super) fn prepare(job: &JobKind, codec: &dyn TextCodec, item: &Item) -> Prepared {
    let id = item.id.as_deref().unwrap_or_default();
    let body = match &item.body {
        Ok(b) => b,
        Err(e) => return Prepared::Row(e.clone()),
    };
    let (prompt, truncated, max_tokens, sampling, openai) = match (job, body) {
        (JobKind::Pipeline(p), RecordBody::Fields(f)) => match p.prompt_ids(codec, id, f) {
            Ok(pi) => (pi.ids, pi.truncated, p.spec.generation.max_tokens, p.sampling(id), None),
            Err(e) => return Prepared::Row(e),
        },
        (JobKind::OpenAi { default_max_tokens, max_input_tokens, .. }, RecordBody::OpenAi(r)) => {
            let ids = match openai_prompt_ids(codec, r) {
                Ok(ids) => ids,
                Err(e) => return Prepared::Row(e),
            };
            if ids.len() > *max_input_tokens as usize {
                let m = format!("prompt has {} tokens, over the limit of {max_input_tokens}", ids.len());
                return Prepared::Row(RecordError::new(ErrorKind::InputTooLong, m));
            }
            let sampling = SamplingParams {
                temperature: r.temperature.unwrap_or(0.0).max(0.0),
                top_k: 0,
                top_p: r.top_p.unwrap_or(1.0).clamp(f32::MIN_POSITIVE, 1.0),
                seed: r.seed.unwrap_or_else(|| derive_seed(0, id)),
            };
            (ids, false, r.max_tokens.unwrap_or(*default_max_tokens), sampling, Some(r.endpoint))
        }
        _ => return Prepared::Row(RecordError::new(ErrorKind::WrongType, "record does not match the job kind")),
    };
    let fl = InFlight { id: id.to_string(), line: item.line, prompt_tokens: prompt.len() as u32, truncated, openai };
    Prepared::Request(GenRequest { key: item.index, prompt, max_tokens, sampling }, fl, truncated)
}

/// The prompt ids of an OpenAI batch request, as `dustoff run` submits them.
///
/// Chat requests: the model's chat template over the messages, tokenized so that each message's
/// content is plain text (`TextCodec::encode_prompt` over the ranges from
/// [`chat_prompt_with_spans`]): a message that contains `<|im_start|>` or `<|endoftext|>` cannot
/// open a turn or end the text, while the template's own special tokens stay special. A request
/// without special-token text in its contents gets exactly the ids of the whole prompt
/// tokenized with special tokens parsed.
///
/// Completion requests: the prompt is the caller's whole prompt text (no template around it) and
/// is tokenized as given, special tokens parsed (`TextCodec::encode`).
pub fn openai_prompt_ids(codec: &dyn TextCodec, req: &OpenAiRequest) -> Result<Vec<u32>, RecordError> {
    let tok_err = |e: String| RecordError::new(ErrorKind::Template, format!("tokenizer: {e}"));
    match req.endpoint {
        OpenAiEndpoint::Chat => {
            let (text, plain) = chat_prompt_with_spans(codec, &req.messages)
                .map_err(|e| RecordError::new(ErrorKind::Template, format!("chat template: {e}")))?;
            codec.encode_prompt(&text, &plain).map_err(tok_err)
        }
        OpenAiEndpoint::Completion => codec.encode(&req.prompt).map_err(tok_err),
    }
}

/// The chat prompt of `messages` (`TextCodec::chat_prompt`) and the byte ranges in it that hold
/// the messages' contents: the text to tokenize as plain text.
///
/// As in `Pipeline::prompt_with_spans`, the prompt is rendered a second time with a marker in
/// place of each non-empty content: private-use characters around a hash of the messages and the
/// message's index (a content cannot contain the marker made from its own hash, and special
/// tokens contain no private-use characters). When cutting that rendering at the markers and
/// putting the contents back gives the real prompt exactly, each content's place is known.
/// Templates that transform a content (`| trim`, as Llama 3's does) or branch on it fail that
/// check; then each message is rendered once more with a marker for its content alone, and its
/// range is where that rendering and the real prompt differ. Either way a range covers all of
/// the content's text in the prompt (at worst more), so special-token text in a content is never
/// parsed as a special token.
pub fn chat_prompt_with_spans(
    codec: &dyn TextCodec,
    messages: &[ChatMessage],
) -> Result<(String, Vec<Range<usize>>), String> {
    let text = codec.chat_prompt(messages)?;
    let head = marker_head(messages.iter().flat_map(|m| [m.role.as_str(), m.content.as_str()]));
    let mut marked = messages.to_vec();
    for (i, m) in marked.iter_mut().enumerate() {
        if !m.content.is_empty() {
            m.content = marker(&head, Some(i));
        }
    }
    let contents: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
    if let Some(spans) = codec.chat_prompt(&marked).ok().and_then(|r| fill_markers(&r, &head, &contents, &text)) {
        return Ok((text, spans));
    }
    let mut spans = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        if m.content.is_empty() {
            continue;
        }
        let mut one = messages.to_vec();
        one[i].content = marker(&head, None);
        let r = differing_range(&text, &codec.chat_prompt(&one)?);
        if r.start < r.end {
            spans.push(r);
        }
    }
    Ok((text, spans))
}

/// The row of a finished request.
fn finished_row(job: &JobKind, codec: &dyn TextCodec, fl: &InFlight, f: &Finished) -> (String, Option<ErrorKind>, u32) {
    let fail = |e: RecordError| (job.error_row(Some(&fl.id), fl.line, &e), Some(e.kind), 0);
    let tokens = match &f.result {
        Ok(t) => t,
        Err(m) => return fail(RecordError::new(ErrorKind::Generation, m.clone())),
    };
    let n = tokens.len() as u32;
    // A generation cut at max_tokens may end inside a character: those bytes are dropped.
    let text = match codec.decode_generated(tokens) {
        Ok(t) => t,
        Err(e) => return fail(RecordError::new(ErrorKind::Generation, format!("detokenize: {e}"))),
    };
    let fr = f.finish_reason.as_str();
    match job {
        JobKind::Pipeline(p) => match p.parse_row(&text, f.finish_reason) {
            Ok(out) => {
                let thinking = p.thinking_field().map(|field| (field, out.reasoning.as_deref()));
                (ok_row_with(&fl.id, &out.output, thinking, fr, fl.prompt_tokens, n, fl.truncated), None, n)
            }
            Err(e) => (job.error_row(Some(&fl.id), fl.line, &e), Some(e.kind), n),
        },
        JobKind::OpenAi { model_name, .. } => {
            let ep = fl.openai.unwrap_or(OpenAiEndpoint::Chat);
            (openai_ok_row(&fl.id, ep, model_name, &text, fr, fl.prompt_tokens, n), None, n)
        }
    }
}

fn push_row(pending: &mut Vec<PendingRow>, counts: &mut Counts, index: u64, line: String, err: Option<ErrorKind>) {
    match err {
        Some(k) => {
            counts.error += 1;
            *counts.errors_by_kind.entry(k).or_insert(0) += 1;
        }
        None => counts.ok += 1,
    }
    pending.push(PendingRow { index, line, is_error: err.is_some() });
}

/// Runs (or resumes) a job to completion, interruption or abort. `Err`: a whole-job failure.
/// `lock` is this output's [`JobLock`], taken by the caller before any expensive start-up (model
/// loading) so that a second run is refused at once.
pub fn run_job(
    job: &dyn JobRows,
    opts: &RunOptions,
    lock: &JobLock,
    codec: &dyn TextCodec,
    engine: &mut dyn Generate,
    stop: &StopFlag,
) -> anyhow::Result<RunResult> {
    if lock.path() != JobLock::path_for(&opts.output) {
        anyhow::bail!("internal: the job lock {} is not the lock of {}", lock.path().display(), opts.output.display());
    }
    let started = Instant::now();
    let committing = || format!("committing finished rows to the checkpoint of {}", opts.output.display());
    let json_output = job.json_output();
    if !job.parquet_output()
        && super::writer::OutputFormat::from_path(&opts.output) == super::writer::OutputFormat::Parquet
    {
        anyhow::bail!("{} output is JSONL: use an output path ending in .jsonl", job.name());
    }
    let mut ck = Checkpoint::open(&opts.output, &opts.fingerprint, opts.restart)
        .with_context(|| format!("opening the checkpoint of {}", opts.output.display()))?;
    if let Some(note) = ck.replaced() {
        eprintln!("{note}");
    }
    let mut cfg = job.reader_config();
    cfg.shard = opts.shard;
    let total = super::reader::count_hint(&opts.inputs, &cfg).map(|t| t / u64::from(opts.shard.map_or(1, |s| s.count)));
    let sizes = opts.fingerprint.inputs.iter().map(|i| i.size).collect();
    let mut reader = RecordReader::new(opts.inputs.clone(), cfg).with_byte_limits(sizes);
    let mut progress = Progress::new(total, opts.progress_interval, opts.quiet);
    // --incremental: the finished output's rows, by id, for the unchanged records.
    let mut reuse = match &opts.fingerprint.base {
        Some(_) => Some(
            ReuseIndex::open(&opts.output)
                .with_context(|| format!("reading the finished output {} to reuse its rows", opts.output.display()))?,
        ),
        None => None,
    };
    let mut digests = DigestsWriter::create(&opts.output)?;

    let mut counts = Counts::default();
    let mut tokens = Tokens::default();
    let mut model_secs = 0.0f64;
    let mut in_flight: HashMap<u64, InFlight> = HashMap::new();
    let mut pending: Vec<PendingRow> = Vec::new();
    let mut last_commit = Instant::now();
    let mut reader_done = false;
    let mut aborted = false;
    let max_errors = opts.max_errors.unwrap_or(u64::MAX);

    loop {
        // Admit records while the engine has room.
        while !reader_done && !aborted && !stop.is_set() && in_flight.len() < engine.capacity().max(1) {
            let Some(item) = reader.next() else {
                reader_done = true;
                break;
            };
            let item = item?;
            counts.records += 1;
            digests.push(&item)?;
            if ck.is_done(item.index) {
                counts.skipped_done += 1;
                if let Some(r) = reuse.as_mut() {
                    r.skip(&item);
                }
                continue;
            }
            if let Some(Reuse::Row(line, is_error)) = reuse.as_mut().map(|r| r.lookup(&item)).transpose()? {
                counts.reused += 1;
                pending.push(PendingRow { index: item.index, line, is_error });
                continue;
            }
            match job.prepare(codec, &item) {
                Prepared::Row(e) => {
                    let line = job.error_row(item.id.as_deref(), item.line, &e);
                    push_row(&mut pending, &mut counts, item.index, line, Some(e.kind));
                }
                Prepared::Request(req, fl, truncated) => {
                    tokens.prompt_total += u64::from(fl.prompt_tokens);
                    tokens.truncated_records += u64::from(truncated);
                    let t = Instant::now();
                    engine.submit(req).context("submitting a request to the engine")?;
                    model_secs += t.elapsed().as_secs_f64();
                    in_flight.insert(item.index, fl);
                }
            }
            if ck.committed_errors() + pending.iter().filter(|r| r.is_error).count() as u64 > max_errors {
                aborted = true;
            }
            // A long run of bad records never reaches the engine: commit them here too.
            if pending.len() >= opts.commit_rows.max(1) {
                ck.commit(std::mem::take(&mut pending)).with_context(committing)?;
                last_commit = Instant::now();
            }
        }
        if in_flight.is_empty() && (reader_done || aborted || stop.is_set()) {
            break;
        }
        if stop.is_set() {
            // In-flight records are dropped, not committed: the resume recomputes them.
            break;
        }
        let t = Instant::now();
        let finished = engine.poll().context("running the model")?;
        model_secs += t.elapsed().as_secs_f64();
        for f in finished {
            let Some(fl) = in_flight.remove(&f.key) else {
                anyhow::bail!("the engine finished unknown request {}", f.key);
            };
            tokens.prompt_computed += u64::from(fl.prompt_tokens.saturating_sub(f.cached_prompt_tokens));
            let (line, err, n) = job.finished_row(codec, &fl, &f);
            tokens.generated += u64::from(n);
            push_row(&mut pending, &mut counts, f.key, line, err);
        }
        if ck.committed_errors() + pending.iter().filter(|r| r.is_error).count() as u64 > max_errors {
            aborted = true;
        }
        if pending.len() >= opts.commit_rows.max(1) || last_commit.elapsed() >= opts.commit_interval {
            ck.commit(std::mem::take(&mut pending)).with_context(committing)?;
            last_commit = Instant::now();
        }
        progress.update(&ProgressStats {
            done: counts.ok + counts.error + counts.skipped_done + counts.reused,
            carried: counts.skipped_done + counts.reused,
            errors: counts.error,
            prompt_tokens: tokens.prompt_total,
            prompt_computed: tokens.prompt_computed,
            generated_tokens: tokens.generated,
        });
    }
    ck.commit(std::mem::take(&mut pending)).with_context(committing)?;
    progress.finish();

    // Past the limit stays past the limit on a rerun with the same flags (exit 3 again).
    aborted |= ck.committed_errors() > max_errors;
    let complete = reader_done && in_flight.is_empty() && !aborted;
    let error_rows = ck.committed_errors();
    let errors_file = super::errors_file::errors_path(&opts.output);
    let writing_errors = || format!("writing {}", errors_file.display());
    let mut row_stats = None;
    let mut finished_checkpoint = None;
    let (outcome, exit, finished) = if complete {
        let (rows, done) = ck
            .finish(&opts.output, counts.records, json_output)
            .with_context(|| format!("writing the output {} from its checkpoint", opts.output.display()))?;
        finished_checkpoint = Some(done);
        digests.finish()?;
        let (entries, stats) = super::row_stats::scan_output(&opts.output).with_context(writing_errors)?;
        row_stats = Some(stats);
        super::errors_file::write(&opts.output, entries).with_context(writing_errors)?;
        let identity = JobFingerprint { base: None, ..opts.fingerprint.clone() };
        let finished = super::identity::finished_now(&opts.output, &identity, rows, error_rows)?;
        (Outcome::Completed, super::exit::of_completed(&opts.tolerance, error_rows, rows), Some(finished))
    } else {
        digests.abandon();
        let entries = ck.committed_error_entries().with_context(writing_errors)?;
        super::errors_file::write(&opts.output, entries).with_context(writing_errors)?;
        let earlier = super::identity::carried_over(&opts.output);
        if aborted {
            (Outcome::Aborted, ExitCode::RecordErrors, earlier)
        } else {
            (Outcome::Interrupted, ExitCode::Interrupted, earlier)
        }
    };
    let mut report = JobReport {
        format_version: super::report::REPORT_FORMAT_VERSION,
        outcome,
        pipeline: job.name(),
        model: opts.model_label.clone(),
        inputs: opts.inputs.iter().map(|p| p.display().to_string()).collect(),
        output: opts.output.display().to_string(),
        shard: opts.shard.map(|s| s.to_string()),
        counts,
        error_rows,
        tokens,
        wall_seconds: started.elapsed().as_secs_f64(),
        model_seconds: model_secs,
        records_per_second: 0.0,
        generated_tokens_per_second: 0.0,
        engine: engine.metrics_json(),
        finished,
        incremental: reuse.as_ref().map(ReuseIndex::finish_counts),
        tolerance: opts.tolerance,
        rows: row_stats,
    };
    report.finalize_rates();
    report
        .write(&JobReport::path_for(&opts.output))
        .with_context(|| format!("writing the report beside {}", opts.output.display()))?;
    // Last: until here a failure leaves the checkpoint, and the same command finishes the job.
    if let Some(done) = finished_checkpoint {
        done.remove().with_context(|| format!("removing the finished checkpoint of {}", opts.output.display()))?;
    }
    Ok(RunResult { report, exit })
}
