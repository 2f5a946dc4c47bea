//! dustoff command line. Parsing only; the work is in `dustoff::commands`.
//!
//! Exit codes: 0 success; 1 error (message on stderr); 2 usage error; 3 some records failed
//! (error rows were written, everything else finished); 4 interrupted (resumable).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use dustoff::commands::common::{self, Device};
use dustoff::commands::{generate, tokenize};
use dustoff::model::loader::SAMPLE_MODEL;

#[derive(Parser)]
#[command(name = "dustoff", version, about = "Batch LLM text processing on old GPU servers (V100 and newer) and CPUs")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text: JSONL prompts in, JSONL completions out, or one --prompt streamed.
    Generate(GenerateArgs),
    /// Tokenize JSONL lines {"id","text","add_bos","parse_special"} into {"id","ids"}.
    Tokenize(TokenizeArgs),
    /// Benchmark one stream: time to first token, prefill and decode tok/s, bandwidth share.
    Bench(BenchArgs),
    /// Compile every CUDA kernel to PTX for an architecture (e.g. compute_70 for the V100) with
    /// NVRTC; the folder can be passed to --ptx-dir on a machine without NVRTC 12.
    Kernels(KernelsArgs),
    /// Run a batch job: records in (JSONL, Parquet, OpenAI batch), one result row per record out,
    /// with checkpoints; the same command resumes a killed job.
    Run(RunCliArgs),
    /// Merge the outputs of the shards of one job (`run --shard K/N`) into one, in input order.
    Merge(MergeArgs),
}

#[derive(Args)]
struct RunCliArgs {
    /// Pipeline name in pipelines/ (summarize, extract-entities) or a path to a pipeline TOML.
    /// Leave it out for OpenAI Batch API input files (custom_id, body.messages...).
    pipeline: Option<String>,
    /// Input files or globs: .jsonl, .parquet, or OpenAI batch .jsonl.
    #[arg(long, required = true, num_args = 1..)]
    input: Vec<String>,
    /// Output file: .jsonl or .parquet. A report is written beside it (<output>.report.json).
    #[arg(long)]
    output: PathBuf,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    engine: EngineArgs,
    /// Discard an existing checkpoint of this output and start over.
    #[arg(long)]
    restart: bool,
    /// Abort (resumably, exit code 3) once more than this many records have failed.
    #[arg(long)]
    max_errors: Option<u64>,
    /// Process only shard K of N (0-based), records picked by a stable hash of the id. Default:
    /// SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT or JOB_COMPLETION_INDEX with --shard-count.
    #[arg(long)]
    shard: Option<String>,
    /// Number of shards when the index comes from JOB_COMPLETION_INDEX (Kubernetes).
    #[arg(long)]
    shard_count: Option<u32>,
    /// Read, render and tokenize everything, report counts and prefix reuse, run no model.
    #[arg(long)]
    dry_run: bool,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
    /// OpenAI batch input: max_tokens for requests that give none.
    #[arg(long, default_value_t = 256)]
    default_max_tokens: u32,
}

#[derive(Args)]
struct MergeArgs {
    /// The merged output (.jsonl or .parquet).
    #[arg(long)]
    output: PathBuf,
    /// The shard outputs, in any order.
    #[arg(required = true)]
    shards: Vec<PathBuf>,
}

#[derive(Args)]
struct KernelsArgs {
    /// Virtual architecture, e.g. compute_70 (V100), compute_80, compute_90.
    #[arg(long, default_value = "compute_70")]
    arch: String,
    /// Output folder for the .ptx files.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct BenchArgs {
    /// Model file (GGUF). Defaults to the sample model unless --synthetic is given.
    #[arg(long, default_value = SAMPLE_MODEL, conflicts_with = "synthetic")]
    model: PathBuf,
    /// A real architecture's shape filled with random weights: qwen3-8b, qwen2.5-7b, llama3-8b,
    /// smollm2-135m, qwen3-0.6b.
    #[arg(long)]
    synthetic: Option<String>,
    /// Weight type of a synthetic model: f16, q8_0, q4_0, q4_1, q4_k...
    #[arg(long, default_value = "f16")]
    dtype: String,
    /// cpu, cuda, cuda:N, or auto.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Precompiled PTX folder (see `dustoff kernels`); also DUSTOFF_PTX_DIR.
    #[arg(long)]
    ptx_dir: Option<PathBuf>,
    #[arg(long, default_value_t = 768)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 200)]
    gen_tokens: usize,
    /// Timed runs (after one warm-up); medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ModelArgs {
    /// Model file (GGUF). Defaults to the sample model.
    #[arg(long, default_value = SAMPLE_MODEL)]
    model: PathBuf,
    /// cpu, cuda, cuda:N, or auto (the first GPU when usable, else the CPU).
    #[arg(long, default_value = "auto")]
    device: String,
    /// Load precompiled PTX kernels from this folder (from `dustoff kernels`) instead of
    /// compiling them with NVRTC. Also read from DUSTOFF_PTX_DIR.
    #[arg(long)]
    ptx_dir: Option<PathBuf>,
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// JSONL input: {"id","prompt"} or {"id","prompt_ids":[...]}, optional "chat": true.
    #[arg(long, requires = "output", conflicts_with = "prompt")]
    input: Option<PathBuf>,
    /// JSONL output: {"id","prompt_tokens","token_ids","text","finish_reason"} per line.
    #[arg(long)]
    output: Option<PathBuf>,
    /// One prompt, streamed to the terminal.
    #[arg(long)]
    prompt: Option<String>,
    /// Wrap --prompt in the model's chat template as one user turn.
    #[arg(long)]
    chat: bool,
    /// Maximum tokens generated per prompt.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Nucleus sampling threshold (1 = off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Job seed; each record's seed is derived from it and the record id.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// KV cache capacity in tokens per sequence (prompt + generated).
    #[arg(long, default_value_t = 4096)]
    ctx: usize,
    #[command(flatten)]
    engine: EngineArgs,
}

#[derive(Args)]
struct EngineArgs {
    /// Sequences decoded together (parallel decode slots).
    #[arg(long, default_value_t = 8)]
    slots: usize,
    /// Token budget of one engine step (decode tokens plus chunks of prefill).
    #[arg(long, default_value_t = 512)]
    max_batch_tokens: usize,
    /// Compute every prompt in full (no reuse of shared prefixes), for comparison.
    #[arg(long)]
    no_prefix_cache: bool,
}

#[derive(Args)]
struct TokenizeArgs {
    /// Model file (GGUF) whose tokenizer is used. Defaults to the sample model.
    #[arg(long, default_value = SAMPLE_MODEL)]
    model: PathBuf,
    #[arg(long)]
    input: PathBuf,
    #[arg(long)]
    output: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn pick_device(s: &str) -> Result<Device> {
    let d = common::parse_device(s)?;
    if s == "auto" {
        match d {
            Device::Cpu => eprintln!("device: cpu (no usable CUDA device)"),
            Device::Cuda(n) => eprintln!("device: cuda:{n}"),
        }
    }
    Ok(d)
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.cmd {
        Cmd::Tokenize(a) => {
            let m = common::load(&a.model)?;
            let errors = tokenize::run(&m.tokenizer, &a.input, &a.output)?;
            Ok(if errors > 0 { ExitCode::from(3) } else { ExitCode::SUCCESS })
        }
        Cmd::Run(a) => {
            let device = pick_device(&a.model.device)?;
            let default_slots = if device == Device::Cpu { 8 } else { 32 };
            let args = dustoff::commands::run::RunArgs {
                pipeline: a.pipeline,
                inputs: a.input,
                output: a.output,
                model: a.model.model,
                device,
                ptx_dir: a.model.ptx_dir,
                slots: if a.engine.slots == 0 { default_slots } else { a.engine.slots },
                max_batch_tokens: a.engine.max_batch_tokens,
                prefix_cache: !a.engine.no_prefix_cache,
                restart: a.restart,
                max_errors: a.max_errors,
                shard: a.shard,
                shard_count: a.shard_count,
                dry_run: a.dry_run,
                quiet: a.quiet,
                default_max_tokens: a.default_max_tokens,
            };
            let code = dustoff::commands::run::run(&args)?;
            Ok(ExitCode::from(code as u8))
        }
        Cmd::Merge(a) => {
            dustoff::commands::run::merge(&a.output, &a.shards)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Kernels(a) => {
            let files = dustoff::commands::kernels::compile_all(&a.arch, &a.out)?;
            for f in &files {
                println!("{}", f.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench(a) => {
            let device = pick_device(&a.device)?;
            let ctx = a.prompt_tokens + a.gen_tokens;
            let (cfg, w, name) = match &a.synthetic {
                Some(shape) => {
                    let cfg = dustoff::model::shapes::shape(shape).ok_or_else(|| {
                        anyhow::anyhow!("unknown shape '{shape}'; known: {}", dustoff::model::shapes::SHAPES.join(", "))
                    })?;
                    let dtype = common::parse_dtype(&a.dtype)?;
                    eprintln!("making random {dtype} weights of shape {shape}...");
                    let w = dustoff::model::synth::random_weights(&cfg, dtype, 1);
                    (cfg, w, format!("synthetic {shape} {dtype}"))
                }
                None => {
                    let m = common::load(&a.model)?;
                    (m.config, m.weights, a.model.display().to_string())
                }
            };
            let mut b = common::make_backend(&cfg, &w, &device, ctx, a.ptx_dir.as_deref())?;
            drop(w);
            let b = b.as_mut();
            let r = dustoff::commands::bench::bench(b, &name, a.prompt_tokens, a.gen_tokens, a.runs)?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                r.print_human();
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Generate(a) => {
            let device = pick_device(&a.model.device)?;
            let m = common::load(&a.model.model)?;
            let opt = generate::GenOptions {
                max_tokens: a.max_tokens,
                temperature: a.temperature,
                top_k: a.top_k,
                top_p: a.top_p,
                seed: a.seed,
            };
            match (a.prompt, a.input, a.output) {
                (Some(p), _, _) => {
                    let mut b = common::make_backend(&m.config, &m.weights, &device, a.ctx, a.model.ptx_dir.as_deref())?;
                    generate::run_prompt(&m, b.as_mut(), &p, a.chat, &opt)?;
                    Ok(ExitCode::SUCCESS)
                }
                (None, Some(i), Some(o)) => {
                    let cfg = dustoff::engine::engine::EngineConfig {
                        slots: a.engine.slots.max(1),
                        max_batch_tokens: a.engine.max_batch_tokens.max(a.engine.slots),
                        prefix_cache: !a.engine.no_prefix_cache,
                        model_fingerprint: m.fingerprint,
                    };
                    let backend = common::make_backend(&m.config, &m.weights, &device, a.ctx * a.engine.slots.max(1), a.model.ptx_dir.as_deref())?;
                    let mut engine = dustoff::engine::engine::Engine::new(backend, cfg)?;
                    let (errors, metrics) = generate::run_jsonl(&m, &mut engine, &i, &o, &opt)?;
                    eprintln!("metrics: {}", serde_json::to_string(&metrics)?);
                    Ok(if errors > 0 { ExitCode::from(3) } else { ExitCode::SUCCESS })
                }
                _ => anyhow::bail!("give either --prompt TEXT or --input IN.jsonl --output OUT.jsonl"),
            }
        }
    }
}
