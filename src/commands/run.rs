//! `dustoff run`: the batch job. Wires the job loop (crate::job) to the model, tokenizer and
//! slot engine on the chosen device.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::device_choice::{self, Device};
use super::job_settings;
use super::model_load;
use super::placement::{MemoryFlags, Placement};
use super::slots::{self, Slots};
use crate::backend::Backend;
use crate::engine::batch::{Engine, EngineConfig, BLOCK_SIZE};
use crate::engine::constraint::{ConstraintError, ConstraintFactory, Grammar};
use crate::job::adapters::{EngineGenerate, TokenizerCodec};
use crate::job::exit::ExitCode;
use crate::job::identity::{self, Decision};
use crate::job::lock::JobLock;
use crate::job::pipeline::{Pipeline, PipelineError};
use crate::job::runner::{self, Generate, JobKind, RunOptions, StopFlag};
use crate::job::shard::ShardSpec;

#[derive(Clone, Debug)]
pub struct RunArgs {
    /// Pipeline name or path; `None`: the input is an OpenAI batch file.
    pub pipeline: Option<String>,
    /// `--pipelines DIR`: the first folder names are looked up in (see `job::search_path`).
    pub pipelines_dir: Option<PathBuf>,
    pub inputs: Vec<String>,
    pub output: PathBuf,
    pub model: PathBuf,
    pub device: Device,
    /// `--device` as written (`auto`/`cuda`: a GPU run uses every GPU; `cuda:N` that one).
    pub device_flag: String,
    /// `--devices`: `all` or GPU ordinals, one engine each (`0,0`: two engines on cuda:0).
    pub devices: Option<String>,
    /// `--engines`: engines per device (N CPU engines with `--device cpu`).
    pub engines: usize,
    /// `--tensor-parallel N`: one engine whose model is split over N ranks (the GPUs of
    /// `--devices`, else cuda:K..K+N; N threads on the CPU).
    pub tensor_parallel: Option<usize>,
    pub ptx_dir: Option<PathBuf>,
    /// `--max-gpu-memory`, `--kv-cache`.
    pub memory: MemoryFlags,
    pub slots: Slots,
    pub max_batch_tokens: usize,
    pub prefix_cache: bool,
    pub restart: bool,
    /// `--incremental`: over a finished output of the same model, pipeline and parameters,
    /// compute only new and changed records and reuse the other rows.
    pub incremental: bool,
    pub max_errors: Option<u64>,
    /// `--allow-errors`, `--max-error-rate`: error rows a completed job may hold and exit 0.
    pub tolerance: crate::job::tolerance::ErrorTolerance,
    pub shard: Option<String>,
    pub shard_count: Option<u32>,
    pub dry_run: bool,
    /// `--json`: the dry run's report as JSON instead of the summary.
    pub json: bool,
    pub quiet: bool,
    /// OpenAI batch: the `max_tokens` of requests that name none.
    pub default_max_tokens: u32,
}

/// Whether an error is the user's to fix in the command line (exit code 2, see
/// [`crate::job::exit`]).
pub fn is_usage_error(e: &anyhow::Error) -> bool {
    crate::job::exit::is_usage_error(e)
}

/// Runs (or resumes) the job. Usage errors come back as errors; `main` maps them to exit code 2
/// with `is_usage_error`.
pub fn run(a: &RunArgs) -> Result<ExitCode> {
    let job = match &a.pipeline {
        Some(p) => {
            // A mistyped folder fell through to the other places and ran another pipeline.
            if let Some(d) = a.pipelines_dir.as_deref().filter(|d| !d.is_dir()) {
                return Err(
                    crate::job::exit::UsageError::new(format!("--pipelines {} is not a folder", d.display())).into()
                );
            }
            let dirs = crate::job::search_path::pipeline_dirs(a.pipelines_dir.as_deref());
            JobKind::Pipeline(Box::new(Pipeline::resolve_in(p, &dirs)?))
        }
        None => JobKind::OpenAi {
            model_name: a.model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
            default_max_tokens: a.default_max_tokens,
            max_input_tokens: 4096,
        },
    };
    let inputs = crate::job::reader::expand_inputs(&a.inputs)?;
    crate::job::input_kind::check_first_record(&job, &inputs)?;
    let shard = ShardSpec::resolve(a.shard.as_deref(), a.shard_count, crate::sys::env::get)?;
    if let Some(s) = shard {
        eprintln!("shard {s} (records picked by a stable hash of their id)");
    }
    // Before anything is loaded or written: an output that would overwrite an input (or the
    // model, or the pipeline) is refused, and so is a second run of this job.
    let mut read: Vec<&Path> = inputs.iter().map(PathBuf::as_path).collect();
    read.push(&a.model);
    if let JobKind::Pipeline(p) = &job {
        read.push(&p.path);
        use crate::job::writer::OutputFormat;
        if let (Some(f), OutputFormat::Parquet) = (p.thinking_field(), OutputFormat::from_path(&a.output)) {
            return Err(crate::job::exit::UsageError::new(format!(
                "{}: output.thinking_field = \"{f}\" is written to JSONL outputs only (the Parquet schema has no such \
                 column); write a .jsonl output or drop thinking_field",
                p.path.display()
            ))
            .into());
        }
    }
    crate::job::outputs::check_output(&a.output, &read)?;
    // A dry run makes the same checks as the run (lock, finished output, checkpoint), then
    // stops before the model: its exit code says whether the run would pass.
    let lock = JobLock::acquire(&a.output)?;
    // Rows do not depend on slots, device or batch size (greedy and seeded outputs are the
    // same across them), so none of those flags is part of the fingerprint. An 8-bit KV cache
    // asked for by name does change them (its values are quantized): a run with it is another job.
    let overrides = match a.memory.kv_cache {
        crate::backend::kv_type::KvChoice::Fixed(crate::backend::kv_type::KvType::Q8) => r#"{"kv_cache":"q8"}"#,
        _ => "{}",
    };
    if !a.model.exists() {
        return Err(anyhow::Error::new(crate::model::loader::LoadError::NotFound(a.model.clone()))
            .context(model_not_found_hint(&a.model)));
    }
    let mut fingerprint = runner::job_fingerprint(&job, &a.model, &inputs, shard, overrides)?;
    // The finished output in place: the same job (nothing to do), a different one (refused
    // unless --restart), or the base of an --incremental run.
    let unfinished = crate::job::checkpoint::has_started_job(&a.output);
    // This job complete in its checkpoint, its output in place, stopped before the checkpoint
    // went: finished from it as it is (an --incremental run's base included).
    let no_base = |f: &crate::job::fingerprint::JobFingerprint| crate::job::fingerprint::JobFingerprint {
        base: None,
        ..f.clone()
    };
    let completed = crate::job::checkpoint::completed_live(&a.output)
        .filter(|ck| !a.restart && no_base(ck) == no_base(&fingerprint));
    let decision = match completed {
        Some(ck) => {
            eprintln!("finishing the job from its checkpoint: its output was written before the last run stopped");
            fingerprint = ck;
            Decision::Run
        }
        None => identity::decide(&a.output, &fingerprint, a.restart, a.incremental, unfinished)?,
    };
    match decision {
        Decision::NothingToDo(f) => {
            // What a run killed while removing its finished checkpoint left (its report was
            // written before): removed here, under the lock.
            if !a.dry_run {
                if let Err(e) = crate::job::checkpoint::remove_leftover(&a.output) {
                    eprintln!("warning: the finished job's leftover checkpoint stays: {e}");
                }
            }
            let same = "model, pipeline, parameters and inputs";
            return Ok(crate::job::exit::nothing_to_do(&a.output, &f, &a.tolerance, same));
        }
        Decision::Incremental(f) => {
            eprintln!(
                "incremental: building on the finished output {} ({} rows); only new and changed records are computed",
                a.output.display(),
                f.rows
            );
            fingerprint.base = Some(f.output_blake3);
        }
        Decision::Run if a.incremental && !unfinished => {
            eprintln!("incremental: no finished output of this job at {}: every record is computed", a.output.display())
        }
        Decision::Run => {}
    }
    // A different job's checkpoint is refused before the model loads (minutes for a large one).
    crate::job::checkpoint::Checkpoint::verify(&a.output, &fingerprint, a.restart)
        .with_context(|| format!("opening the checkpoint of {}", a.output.display()))?;
    if a.dry_run {
        drop(lock);
        return dry_run(a, &job, &inputs, shard);
    }
    let m = model_load::load(&a.model)?;
    let codec = TokenizerCodec(&m.tokenizer);
    let grammar = match &job {
        JobKind::Pipeline(p) => output_grammar(p, &m.tokenizer)?,
        JobKind::OpenAi { .. } => None,
    };

    // KV room: every slot can hold its longest prompt and its generation.
    let (max_in, max_out) = match &job {
        JobKind::Pipeline(p) => (p.spec.limits.max_input_tokens as usize, p.spec.generation.max_tokens as usize),
        JobKind::OpenAi { max_input_tokens, default_max_tokens, .. } => {
            (*max_input_tokens as usize, *default_max_tokens as usize)
        }
    };
    let per_seq = (max_in + max_out + BLOCK_SIZE).min(m.config.max_context.max(256));
    // What a sequence holds on average: `--slots auto` sizes the slots and the KV pool by it, the
    // paged pool admits a prompt only when its blocks are free, and the longest record still
    // fits (`per_seq` bounds the tables of every sequence).
    let pool_seq = match a.slots {
        Slots::Auto => pool_positions(&job, &inputs, shard, &codec, per_seq)?,
        Slots::Count(_) => per_seq,
    };
    let gpus = if a.device == Device::Cpu { 0 } else { crate::backend::cuda::device::device_count() };
    let devs = match a.tensor_parallel {
        // One engine over the ranks' devices (the group is built below from devs[0] and --devices).
        Some(_) if a.engines != 1 => {
            return Err(crate::job::exit::UsageError::new(
                "--tensor-parallel runs one engine over its ranks: leave out --engines",
            )
            .into())
        }
        Some(_) => vec![a.device.clone()],
        None => super::devices::engine_devices(&a.device, &a.device_flag, a.devices.as_deref(), a.engines, gpus)?,
    };
    let stop = StopFlag::with_signals().unwrap_or_default();
    let eos = m.tokenizer.eos_ids().to_vec();
    let mut place = Placement {
        ptx_dir: a.ptx_dir.clone(),
        f16_weights: false,
        max_gpu_memory: a.memory.max_gpu_memory,
        kv_type: a.memory.kv_cache.or_f16(),
        max_seq_positions: Some(per_seq),
    };
    let (mut gen, slots): (Box<dyn Generate>, usize) = if devs.len() == 1 {
        let (slots, kv_type) = super::tensor_parallel::slots_for(
            a.slots,
            &devs[0],
            (&m.config, &m.weights),
            a.tensor_parallel,
            (pool_seq, a.max_batch_tokens),
            a.memory,
        )?;
        place.kv_type = kv_type;
        // Measured before the weights are placed: one GPU engine (tensor-parallel ranks and data-
        // parallel engines share devices and are not tallied).
        let bound_rates = if a.tensor_parallel.is_none() { device_choice::step_bound_rates(&devs[0]) } else { None };
        let cfg = EngineConfig::new(slots, a.max_batch_tokens, a.prefix_cache, m.fingerprint);
        let step = cfg.max_batch_tokens;
        let tokens = match a.tensor_parallel {
            None => slots::kv_positions(&devs[0], (&m.config, &m.weights), (slots, pool_seq), step, &place)?,
            Some(_) => slots * pool_seq,
        }
        .max(per_seq);
        let backend = super::tensor_parallel::backend_for(
            &m.config,
            &m.weights,
            &devs[0],
            a.tensor_parallel,
            a.devices.as_deref(),
            tokens,
            (step, slots),
            &place,
        )?;
        // The CPU backend keeps the full cache in f32 (`--kv-cache f16` names the GPU's type).
        let kv = match (&devs[0], place.kv_type) {
            (Device::Cpu, crate::backend::kv_type::KvType::F16) => "f32",
            (_, t) => t.name(),
        };
        eprintln!("backend: {}; {slots} slots, KV room for {tokens} tokens ({kv})", backend.describe());
        let mut engine = Engine::new(backend, cfg)?;
        if let Some(rates) = bound_rates {
            engine = engine.with_step_bound(rates);
        }
        (Box::new(EngineGenerate::new(engine, eos).with_stop(stop.clone()).with_grammar(grammar)), slots)
    } else {
        // Data parallel: one engine per entry, each built in its own thread over shared weights.
        let slots =
            super::devices::engine_slots(a.slots, &devs, &m.config, &m.weights, per_seq, a.max_batch_tokens, a.memory)?;
        let pc = super::devices::PoolConfig {
            model: std::sync::Arc::new((m.config.clone(), m.weights.clone())),
            model_fingerprint: m.fingerprint,
            per_seq,
            max_batch_tokens: a.max_batch_tokens,
            prefix_cache: a.prefix_cache,
            place: place.clone(),
            eos,
            grammar,
            stop: stop.clone(),
        };
        let pool = super::devices::start_pool(&pc, &devs, &slots)?;
        eprintln!(
            "data parallel: {} engines ({}), {} slots in all",
            pool.engines(),
            pool.labels().join(", "),
            pool.total_slots()
        );
        let total = pool.total_slots();
        (Box::new(pool), total)
    };
    if let Some(summary) = m.config.state_summary() {
        let all = (m.config.state_bytes_per_seq() * slots) as f64 / 1e6;
        eprintln!("memory: {summary}; {all:.2} MB for {slots} slots");
    }

    let opts = RunOptions {
        inputs,
        output: a.output.clone(),
        fingerprint,
        restart: a.restart,
        max_errors: a.max_errors,
        tolerance: a.tolerance,
        shard,
        commit_rows: job_settings::commit_rows(),
        commit_interval: std::time::Duration::from_secs(5),
        progress_interval: job_settings::progress_interval(),
        quiet: a.quiet,
        model_label: a.model.display().to_string(),
    };
    let res = runner::run_job(&job, &opts, &lock, &codec, gen.as_mut(), &stop)?;
    eprint!("{}", res.report.human_summary());
    if let Some(mj) = gen.metrics_json() {
        let computed = mj["prompt_tokens_computed"].as_u64().unwrap_or(0);
        let total = mj["prompt_tokens"].as_u64().unwrap_or(0);
        eprintln!(
            "engine: {slots} slots, prompt tokens computed {computed} of {total} ({:.0}% reused from the prefix cache), {} preemptions, {} out-of-memory recoveries, KV blocks peak {}/{}",
            if total > 0 { 100.0 * (total - computed.min(total)) as f64 / total as f64 } else { 0.0 },
            mj["preemptions"],
            mj["oom_recoveries"],
            mj["kv_blocks_peak"],
            mj["kv_blocks_total"],
        );
    }
    if let Some(line) = gen.metrics_json().and_then(|mj| device_line(&mj)) {
        eprintln!("{line}");
    }
    for e in gen.metrics_json().and_then(|mj| mj["engines"].as_array().cloned()).unwrap_or_default() {
        let r = &e["routing"];
        eprintln!(
            "  engine {}: finished {} requests (routed {}, {} of them by a shared prefix; stole {}), prompt tokens computed {} of {}, {} generated",
            e["device"].as_str().unwrap_or("?"),
            r["finished"],
            r["routed"],
            r["routed_by_prefix"],
            r["stolen"],
            e["prompt_tokens_computed"],
            e["prompt_tokens"],
            e["generated_tokens"],
        );
    }
    if let Some(c) = gen.metrics_json().map(|mj| mj["constraint"].clone()).filter(|c| c["constrained_requests"] != 0) {
        eprintln!(
            "constrained: {} requests, {} forced tokens, {} masks (median {:.0} us, p99 {:.0} us, {:.3} s waited after steps)",
            c["constrained_requests"],
            c["forced_tokens"],
            c["masks"],
            c["mask_us_median"].as_f64().unwrap_or(0.0),
            c["mask_us_p99"].as_f64().unwrap_or(0.0),
            c["mask_wait_seconds"].as_f64().unwrap_or(0.0),
        );
    }
    match res.exit {
        ExitCode::Interrupted => eprintln!("interrupted: run the same command again to resume"),
        ExitCode::RecordErrors if res.report.outcome == crate::job::report::Outcome::Aborted => eprintln!(
            "aborted past --max-errors ({} error rows committed; the checkpoint is kept). To go on with \
             these rows, run the same command with a higher --max-errors. If you fix the input \
             instead, run the same command: a checkpoint holding only error rows is replaced; one \
             holding successful rows names what changed and needs --restart, which discards them",
            res.report.error_rows
        ),
        _ => {}
    }
    Ok(res.exit)
}

/// Where a missing model was looked for: `--model`, `DUSTOFF_MODEL` or the sample's default
/// path, relative to the current folder (cron runs in `$HOME`).
fn model_not_found_hint(model: &Path) -> String {
    let cwd = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_else(|_| "?".into());
    let from = match crate::sys::env::get_os("DUSTOFF_MODEL") {
        Some(m) if Path::new(&m) == model => "from DUSTOFF_MODEL".to_string(),
        _ if model == Path::new(crate::model::loader::SAMPLE_MODEL) => {
            "the default: --model not given, DUSTOFF_MODEL unset".to_string()
        }
        _ => "from --model".to_string(),
    };
    let place = if model.is_absolute() { String::new() } else { format!(", relative to the current folder {cwd}") };
    format!("the model {} ({from}{place}) does not exist; give --model PATH or set DUSTOFF_MODEL", model.display())
}

/// `--dry-run`: reads, renders and tokenizes every record (only the tokenizer is loaded: a
/// vocab-only GGUF works), prints a summary (JSON with `--json`) and exits as the run would:
/// 3 when the records that would fail are over the error tolerance.
fn dry_run(a: &RunArgs, job: &JobKind, inputs: &[PathBuf], shard: Option<ShardSpec>) -> Result<ExitCode> {
    let t = model_load::load_tokenizer(&a.model)?;
    let mut r = crate::job::dry_run::dry_run(job, inputs, shard, &TokenizerCodec(&t.tokenizer), BLOCK_SIZE)?;
    // The model's metadata (not its weights), when the file has any: a hybrid model's
    // per-sequence state belongs to the plan.
    let cfg = crate::model::loader::load_config(&a.model).ok();
    if let Some((c, summary)) = cfg.as_ref().and_then(|c| Some((c, c.state_summary()?))) {
        eprintln!("model: {summary}");
        r.recurrent_state_bytes_per_sequence = Some(c.state_bytes_per_seq() as u64);
    }
    if let Some(c) = &cfg {
        use crate::backend::kv_type::KvType;
        let per =
            |kv: KvType| (kv.name().to_string(), crate::backend::cuda::plan::memory::kv_bytes_per_position(c, kv));
        let mut kinds = vec![per(KvType::F16)];
        if KvType::Q8.refusal(c.head_dim).is_none() {
            kinds.push(per(KvType::Q8));
        }
        r.kv_cache_bytes_per_position = Some(kinds.into_iter().collect());
    }
    if !a.restart {
        r.resumed_rows = crate::job::checkpoint::Checkpoint::committed_totals(&a.output).0;
    }
    let code = crate::job::exit::of_completed(&a.tolerance, r.errors, r.records);
    r.exit_code = code.code();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", r.human_summary(&a.output.display().to_string()));
        if code != ExitCode::Ok {
            println!(
                "the run would exit {}: {} records would fail, over the tolerance ({})",
                code.code(),
                r.errors,
                a.tolerance.describe()
            );
        }
    }
    Ok(code)
}

/// The pipeline's output grammar compiled for the model's vocabulary (`None`: free text). The
/// pipeline already compiled it against a byte vocabulary when it loaded; a failure here is
/// still the pipeline's (exit 2).
fn output_grammar(p: &Pipeline, tok: &crate::tokenizer::Tokenizer) -> Result<Option<Grammar>> {
    let Some(c) = p.constraint() else { return Ok(None) };
    let invalid = |e: ConstraintError| PipelineError::Invalid { path: p.path.clone(), message: format!("output: {e}") };
    let factory = ConstraintFactory::new(tok).map_err(invalid)?;
    Ok(Some(factory.compile(c).map_err(invalid)?))
}

/// `dustoff merge`: shard outputs into one, in input order.
/// `dustoff merge`: the shards checked against their reports, the output against what it may
/// replace, under the output's job lock (`job::merge_guard`); exit 3 when the shards hold error
/// rows, as their runs did.
pub fn merge(output: &Path, shards: &[PathBuf]) -> Result<ExitCode> {
    use crate::job::{merge_guard, shard};
    let context = || format!("merging into {}", output.display());
    let given = shard::shard_outputs(shards);
    let (mut job, mut error_rows, mut first) = (None, 0u64, None);
    // Shards that are not there are named by `shard::merge`, with the missing shard numbers.
    for p in given.iter().filter(|p| p.is_file()) {
        let id = shard::shard_job(p).with_context(context)?;
        let c = merge_guard::check_shard(p).with_context(context)?;
        error_rows += c.error_rows;
        job.get_or_insert(id);
        first.get_or_insert(c);
    }
    let inputs = first.as_ref().map_or(&[][..], |c| &c.inputs[..]);
    merge_guard::check_paths(output, &given, inputs).with_context(context)?;
    let _lock = crate::job::lock::JobLock::acquire(output)?;
    if let Some(job) = &job {
        merge_guard::check_existing(output, job).with_context(context)?;
    }
    // The report first, from the complete merged file, then the file takes the output's name:
    // an output in place always has the report that lets the next merge replace it.
    let report = |partial: &Path, rows: u64| {
        let io = |source| crate::job::writer::WriteError::Io { path: partial.to_path_buf(), source };
        let merged = merge_guard::Merged {
            job: job.clone().unwrap_or_default(),
            shards: given.clone(),
            rows,
            error_rows,
            output_blake3: crate::job::identity::file_blake3(partial).map_err(io)?,
        };
        merge_guard::write_report(output, merged).map_err(io)
    };
    let s = shard::merge_with(&given, output, report).with_context(context)?;
    eprintln!("merged {} shards, {} rows -> {}", s.shards, s.rows, output.display());
    if error_rows > 0 {
        eprintln!(
            "{error_rows} of the rows are error rows (the rows with an \"error\" field; each shard's errors file lists its own)"
        );
    }
    let tolerance = first.map(|c| c.tolerance).unwrap_or_default();
    Ok(crate::job::exit::of_completed(&tolerance, error_rows, s.rows))
}

/// The job's peak device memory and its steps against their bound (`engine::step_cost`), from
/// the engine's metrics; `None` on the CPU.
fn device_line(mj: &serde_json::Value) -> Option<String> {
    let peak = mj["peak_device_bytes"].as_f64()?;
    let mut s = format!("device: peak memory {:.2} GB", peak / 1e9);
    let b = &mj["step_bound"];
    if let (Some(share), Some(steps)) = (b["share"].as_f64(), b["steps"].as_u64()) {
        s += &format!(
            "; {steps} steps at {:.1}% of their bound ({:.2} s of {:.2} s: weights {:.2} GB, KV {:.2} GB, {:.2} TFLOP a step; {} steps bound by arithmetic)",
            100.0 * share,
            b["bound_seconds"].as_f64().unwrap_or(0.0),
            b["measured_seconds"].as_f64().unwrap_or(0.0),
            b["weight_gb_per_step"].as_f64().unwrap_or(0.0),
            b["kv_gb_per_step"].as_f64().unwrap_or(0.0),
            b["tflop_per_step"].as_f64().unwrap_or(0.0),
            b["flop_bound_steps"],
        );
    }
    if let Some(v100) = b["v100_bound_seconds"].as_f64().filter(|&v| v > 0.0) {
        s += &format!("; on a V100 (900 GB/s, 125 TFLOP/s) these steps take at least {v100:.2} s");
    }
    Some(s)
}

/// Records `--slots auto` reads ahead to size the KV pool (a second or less to tokenize).
const SIZING_RECORDS: u64 = 512;

/// KV positions per slot for `--slots auto`: from the job's first [`SIZING_RECORDS`] records,
/// the positions a running sequence holds on average (its prompt beyond the prefix it shares
/// with earlier records, and its whole `max_tokens`), at most `per_seq` (the pipeline's
/// longest prompt and generation). Sized by the worst case, a job of 1,500-token documents
/// under `max_input_tokens = 2400` left a third of its KV pool unused (docs/BENCHMARKS.md,
/// nightly job). A record longer than the mean waits for blocks, and a pool that runs short
/// while sequences decode preempts the newest (computed again later): both said in the report.
fn pool_positions(
    job: &JobKind,
    inputs: &[PathBuf],
    shard: Option<ShardSpec>,
    codec: &TokenizerCodec,
    per_seq: usize,
) -> Result<usize> {
    let r = crate::job::dry_run::sample(job, inputs, shard, codec, BLOCK_SIZE, SIZING_RECORDS)?;
    let Some(mean) = r.expected_positions(BLOCK_SIZE) else { return Ok(per_seq) };
    let n = mean.min(per_seq);
    if n < per_seq {
        eprintln!(
            "KV sizing: {n} positions a sequence (the mean of the first {} records: prompt beyond the shared prefix + max_tokens; the longest allowed is {per_seq})",
            r.ok
        );
    }
    Ok(n)
}
