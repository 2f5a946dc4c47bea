//! Arguments of the job commands: run, generate, tokenize, merge, and the model and engine
//! flags they share.

use std::path::PathBuf;

use clap::Args;

use crate::backend::cuda::plan::budget::MemoryCap;
use crate::backend::kv_type::KvChoice;
use crate::commands::device_choice;
use crate::commands::placement;
use crate::commands::slots::Slots;
use crate::model::loader::SAMPLE_MODEL;

#[derive(Args)]
pub struct RunCliArgs {
    /// Pipeline name (summarize, extract-entities) or a path to a pipeline TOML. Leave it out
    /// for OpenAI Batch API input files (custom_id, body.messages...). Names are looked up, in
    /// order, in: --pipelines DIR; the folders of DUSTOFF_PIPELINES (separated by ':');
    /// pipelines/ beside the dustoff binary; pipelines/ in the current folder. A name found
    /// nowhere is refused listing every place looked.
    pub pipeline: Option<String>,
    /// A folder of pipeline files, searched first for the pipeline name (see PIPELINE).
    #[arg(long, value_name = "DIR")]
    pub pipelines: Option<PathBuf>,
    /// Input files or globs: .jsonl, .parquet, or OpenAI batch .jsonl.
    #[arg(long, required = true, num_args = 1..)]
    pub input: Vec<String>,
    /// Output file: .jsonl or .parquet. A report is written beside it (<output>.report.json).
    #[arg(long)]
    pub output: PathBuf,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Data parallel: one engine per listed GPU (`all`, or ordinals like 0,1; `0,0` runs two
    /// engines on cuda:0). Default: every GPU with --device auto or cuda, the one of cuda:N.
    #[arg(long)]
    pub devices: Option<String>,
    /// Engines per device (with --device cpu: N CPU engines in one process).
    #[arg(long, default_value_t = 1)]
    pub engines: usize,
    /// Discard an existing checkpoint of this output, or a finished output of a different job,
    /// and compute every record again.
    #[arg(long)]
    pub restart: bool,
    /// Over a finished output of the same model, pipeline and parameters whose input grew or
    /// changed: compute only records whose id is new or whose content changed, take every
    /// other row unchanged from the output, and rewrite it atomically (for nightly runs over a
    /// growing archive). Without a finished output, every record is computed.
    #[arg(long, conflicts_with = "restart")]
    pub incremental: bool,
    /// Abort (resumably, exit code 3) once more than this many records have failed.
    #[arg(long)]
    pub max_errors: Option<u64>,
    /// A completed job with at most this many error rows exits 0 (the report, the summary and
    /// <output>.errors.jsonl still list them). With --max-error-rate, either suffices.
    #[arg(long)]
    pub allow_errors: Option<u64>,
    /// A completed job whose error rows are at most this share of its rows (0 to 1; 0.01 = 1%)
    /// exits 0. With --allow-errors, either suffices.
    #[arg(long)]
    pub max_error_rate: Option<f64>,
    /// Process only shard K of N (0-based), records picked by a stable hash of the id. Default:
    /// SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT or JOB_COMPLETION_INDEX with --shard-count.
    #[arg(long)]
    pub shard: Option<String>,
    /// Number of shards when the index comes from JOB_COMPLETION_INDEX (Kubernetes) or a Slurm
    /// array (it beats SLURM_ARRAY_TASK_COUNT: a resubmitted task of a larger array); with
    /// --shard it must agree; without either index it is an error.
    #[arg(long)]
    pub shard_count: Option<u32>,
    /// Read, render and tokenize everything and make the run's checks (lock, finished output,
    /// checkpoint) without the model; print what would run and fail, and exit as the run would
    /// (3 when records would fail beyond the error tolerance).
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run: print the report as JSON instead of the summary.
    #[arg(long, requires = "dry_run")]
    pub json: bool,
    /// No progress output.
    #[arg(long)]
    pub quiet: bool,
    /// Append every line the run writes to stderr to this file too, each with a UTC timestamp
    /// (stderr's lines get one as well when stderr is not a terminal: cron, systemd, a
    /// scheduler's log). With it, progress is a periodic line instead of a bar.
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
    /// OpenAI batch input (no pipeline): max_tokens for requests that give none (default 256).
    /// A pipeline sets its own (generation.max_tokens): given with one, it is refused.
    #[arg(long)]
    pub default_max_tokens: Option<u32>,
}

#[derive(Args)]
pub struct MergeArgs {
    /// The merged output (.jsonl or .parquet).
    #[arg(long)]
    pub output: PathBuf,
    /// The shard outputs, in any order.
    #[arg(required = true)]
    pub shards: Vec<PathBuf>,
}

#[derive(Args)]
pub struct ModelArgs {
    /// Model: a GGUF file or a Hugging Face directory. Without --model: DUSTOFF_MODEL, else the
    /// sample model (a path relative to the current folder: set DUSTOFF_MODEL for cron).
    #[arg(long, env = "DUSTOFF_MODEL", default_value = SAMPLE_MODEL)]
    pub model: PathBuf,
    /// cpu, cuda, cuda:N, or auto (the first GPU when usable, else the CPU).
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Load precompiled PTX kernels from this folder (from `dustoff kernels`) instead of
    /// compiling them with NVRTC. Also read from DUSTOFF_PTX_DIR; without either, a `ptx/`
    /// folder beside the binary is used when it exists.
    #[arg(long)]
    pub ptx_dir: Option<PathBuf>,
}

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// JSONL input: {"id","prompt"} or {"id","prompt_ids":[...]}, optional "chat": true.
    #[arg(long, requires = "output", conflicts_with = "prompt")]
    pub input: Option<PathBuf>,
    /// JSONL output: {"id","prompt_tokens","token_ids","text","finish_reason"} per line (a line
    /// that fails: {"id","line","error"}, exit 3), in input order. Runs on `run`'s job loop:
    /// checkpointed beside the output (after SIGINT/SIGTERM, exit 4, or a kill the same command
    /// resumes), progress lines, and the report and errors file beside it.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// With --input: discard an existing checkpoint of this output and start over.
    #[arg(long)]
    pub restart: bool,
    /// One prompt, streamed to the terminal.
    #[arg(long)]
    pub prompt: Option<String>,
    /// Wrap --prompt in the model's chat template as one user turn.
    #[arg(long)]
    pub chat: bool,
    /// Maximum tokens generated per prompt.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling threshold (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Job seed; each record's seed is derived from it and the record id.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// KV cache capacity in tokens per sequence (prompt + generated).
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Args)]
pub struct EngineArgs {
    /// Sequences decoded together (parallel decode slots): a count, or auto: on a GPU as many
    /// as the memory plan fits for the job's context (at most 128, said in the log), on the CPU
    /// 8. On a GPU more slots mean more throughput while their KV cache fits (H200, 8B model: 8
    /// slots ~1,100 tok/s, 64 slots ~5,800); a count that does not fit is refused with numbers.
    #[arg(long, default_value = "auto")]
    pub slots: Slots,
    /// Token budget of one engine step (decode tokens plus chunks of prefill); on a GPU the
    /// memory plan reserves workspace for steps of this size. Default: 2048 on a GPU (larger
    /// prefill chunks give each expert of a MoE more tokens per grouped product: H200, nightly
    /// job benchmark, +7% documents an hour over 512), 512 on the CPU. A MoE job on a GPU with
    /// memory to spare may take 4096 (H100, the same benchmark: +2.2%, ~0.56 GB more workspace
    /// for a Qwen3-30B-A3B, so fewer slots within a cap).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_batch_tokens: Option<usize>,
    /// Compute every prompt in full (no reuse of shared prefixes), for comparison.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Split the model over N ranks (tensor parallel): each holds 1/N of the attention heads,
    /// KV cache and FFN columns, and the ranks sum their outputs after every block's two output
    /// projections. On GPUs one rank per GPU (cuda:K..K+N, or the GPUs of `run --devices`;
    /// NCCL between them); on the CPU N threads. N must divide the KV heads (and a hybrid
    /// model's linear-attention key heads). Dense, mixture-of-experts and hybrid models split
    /// on GPUs and on the CPU. See docs/CLUSTER.md.
    #[arg(long)]
    pub tensor_parallel: Option<usize>,
    /// The most memory the job may take on each GPU (e.g. 32GB = 32e9 bytes, 30GiB = 30 x 2^30),
    /// its CUDA context included: for a card shared with other services. Weights, KV cache,
    /// workspace and the plan's 5% headroom are planned within it; --slots auto and the KV
    /// cache are sized from it (when the slots' full contexts do not fit, the KV cache takes
    /// what does and sequences wait or are preempted). A model that does not fit is refused
    /// with the numbers.
    #[arg(long)]
    pub max_gpu_memory: Option<MemoryCap>,
    /// KV cache type: f16, q8 (8-bit values with one F16 scale per 32: 1.88x the positions in
    /// the same memory; quality in docs/KV_CACHE.md) or auto: on a GPU F16 when the job's
    /// sequences fit in F16, else q8, said in the log (--slots auto: a mixture-of-experts model
    /// with full attention (Qwen3-MoE) takes q8 whenever it fits more sequences, since every
    /// step reads nearly all experts and more sequences share them; a dense or hybrid model
    /// keeps F16 once it fits 32: past that, twice the sequences in 8-bit measured no faster,
    /// and F16 is exact); on the CPU and for data-parallel engines F16. On a V100, where a
    /// step's KV bytes weigh more, try q8 on long documents with dense models too
    /// (docs/KV_CACHE.md).
    #[arg(long, default_value = "auto")]
    pub kv_cache: KvChoice,
}

impl EngineArgs {
    pub fn memory(&self) -> placement::MemoryFlags {
        placement::MemoryFlags { max_gpu_memory: self.max_gpu_memory, kv_cache: self.kv_cache }
    }

    /// `--max-batch-tokens`, or the default of `device`.
    pub fn max_batch_tokens(&self, device: &device_choice::Device) -> usize {
        self.max_batch_tokens.unwrap_or_else(|| crate::engine::batch::default_max_batch_tokens(device.is_gpu()))
    }
}

#[derive(Args)]
pub struct TokenizeArgs {
    /// Model (GGUF file or Hugging Face directory) whose tokenizer is used. Defaults to the sample model.
    #[arg(long, default_value = SAMPLE_MODEL)]
    pub model: PathBuf,
    /// JSONL lines {"id", "text", "add_bos", "parse_special"} (only "text" is required).
    #[arg(long)]
    pub input: PathBuf,
    /// JSONL lines {"id", "ids"} (or {"id", "line", "error"}), one per input line, in input order.
    #[arg(long)]
    pub output: PathBuf,
}
