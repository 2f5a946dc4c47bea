//! dustoff command line. Parsing only; the work is in `dustoff::commands`. Every command ends
//! in one exit funnel, `main`, with the codes of `dustoff::job::exit`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use dustoff::backend::cuda::plan::budget::MemoryCap;
use dustoff::backend::kv_type::KvChoice;
use dustoff::commands::common::{self, Device, Slots};
use dustoff::commands::{generate, tokenize};
use dustoff::job::exit::{self, ExitCode as Code, UsageError};
use dustoff::model::loader::SAMPLE_MODEL;

/// The tokenizer allocates many small strings per record; mimalloc halves the time glibc's
/// allocator took in a dry run over 100k records (malloc/free were ~45% of the profile).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "dustoff", version, about = "Batch LLM text processing on old GPU servers (V100 and newer) and CPUs")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Where CPU threads run: auto (on a multi-socket machine, the cores and memory of the
    /// GPU's NUMA node), off (every core), or a node number.
    #[arg(long, global = true, default_value = "auto")]
    numa: String,
    /// CPU threads (default: one per CPU of the chosen node, or of the machine).
    #[arg(long, global = true)]
    threads: Option<usize>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text: JSONL prompts in, JSONL completions out, or one --prompt streamed.
    Generate(GenerateArgs),
    /// Tokenize JSONL lines {"id","text","add_bos","parse_special"} into {"id","ids"}.
    Tokenize(TokenizeArgs),
    /// Benchmark: one stream (TTFT, prefill and decode tok/s, bandwidth share), --batch, or --shared-prefix.
    Bench(BenchArgs),
    /// Compile every CUDA kernel to PTX for an architecture (e.g. compute_70 for the V100) with
    /// NVRTC; the folder can be passed to --ptx-dir on a machine without NVRTC 12.
    Kernels(KernelsArgs),
    /// Run a batch job: records in (JSONL, Parquet, OpenAI batch), one result row per record out,
    /// with checkpoints; the same command resumes a killed job.
    Run(RunCliArgs),
    /// Convert a Hugging Face model directory (BF16/F16/F32 safetensors, sharded or not) to F16,
    /// as a GGUF file (output ends in .gguf; the tensor names, keys and layouts of llama.cpp's
    /// converter, Qwen3.5 / Qwen3.5-MoE / Qwen3-Next and their vision-language releases
    /// included) or a safetensors directory; values F16 cannot hold are clamped and counted per
    /// tensor in <output>.report.json. A GGUF --model is converted to another GGUF of --dtype
    /// (f16, or a quantize --type), quantized input allowed. Unsupported models exit 2.
    Convert(ConvertCliArgs),
    /// Quantize a model (HF directory or F16/BF16/F32 GGUF) to a GGUF of --type, optionally
    /// calibrated with an importance matrix; <output>.report.json is written beside it.
    #[command(long_about = QUANTIZE_HELP)]
    Quantize(QuantizeCliArgs),
    /// Perplexity of models on a text, and their KL divergence and top-1 agreement against a
    /// --reference (what quantization cost), as a table or JSON.
    Eval(EvalCliArgs),
    /// Merge the outputs of the shards of one job (`run --shard K/N`) into one, in input order.
    Merge(MergeArgs),
    /// Check this machine: GPUs, driver, NVRTC, cuBLAS, CPU sockets / NUMA / AVX2 / AVX-512 and
    /// the CPU kernel path, copy bandwidth, and with --model the memory plan and a projected
    /// decode rate. Exit 1 when the device --device auto picks cannot run (or, with
    /// --require-gpu, when no GPU can); the CPU backend always counts as usable.
    Doctor(DoctorCliArgs),
    /// Write a random-weight GGUF of a real model's shape (e.g. qwen3-30b-a3b in q4_k_m): the
    /// tensor names, formats and sizes of the real file, so jobs, benchmarks and memory plans
    /// can run before (or without) the real weights. The text it generates is noise.
    Synth(SynthCliArgs),
}

#[derive(Args)]
struct SynthCliArgs {
    /// Shape name (as `bench --synthetic`): qwen3-8b, qwen3-30b-a3b, llama3-8b, qwen3.5-9b,
    /// qwen3.5-27b, qwen3.6-35b-a3b, ... (the hybrids in llama.cpp's qwen35 / qwen35moe layout).
    #[arg(long)]
    shape: String,
    /// Storage mix, as `quantize --type`: q4_k_m, q4_k_s, q5_k_m, q6_k, q8_0, q4_0, f16.
    #[arg(long = "type", default_value = "q4_k_m")]
    qtype: String,
    /// Hugging Face directory whose tokenizer.json (byte-level BPE), tokenizer_config.json and
    /// chat template go into the file; its vocabulary is padded to the shape's with unused tokens.
    #[arg(long)]
    tokenizer: PathBuf,
    /// Output GGUF file (written as <output>.partial, renamed when complete).
    #[arg(long)]
    output: PathBuf,
    /// Seed of the random weights (the same seed writes the same file).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Replace an existing output file.
    #[arg(long)]
    force: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
    /// Keep only the shape's first N layers (every width as the real model's; a hybrid keeps
    /// its pattern of linear and full-attention layers): a file of the real widths that a CPU
    /// can quantize and score in minutes. Default: every layer.
    #[arg(long, value_name = "N")]
    layers: Option<usize>,
}

#[derive(Args)]
struct DoctorCliArgs {
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// A model (GGUF file or Hugging Face directory) to plan memory and project decode for.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Context per sequence for the memory plan.
    #[arg(long, default_value_t = 4096)]
    ctx: usize,
    /// Parallel sequences for the memory plan.
    #[arg(long, default_value_t = 8)]
    slots: usize,
    /// Precompiled PTX folder (see `dustoff kernels`): GPUs count as usable without NVRTC.
    #[arg(long)]
    ptx_dir: Option<PathBuf>,
    /// Skip the timed parts (copy bandwidth, the model's GEMV pass).
    #[arg(long)]
    no_measure: bool,
    /// Exit 1 unless at least one GPU is usable (for a GPU server's setup check).
    #[arg(long)]
    require_gpu: bool,
}

#[derive(Args)]
struct RunCliArgs {
    /// Pipeline name (summarize, extract-entities) or a path to a pipeline TOML. Leave it out
    /// for OpenAI Batch API input files (custom_id, body.messages...). Names are looked up, in
    /// order, in: --pipelines DIR; the folders of DUSTOFF_PIPELINES (separated by ':');
    /// pipelines/ beside the dustoff binary; pipelines/ in the current folder. A name found
    /// nowhere is refused listing every place looked.
    pipeline: Option<String>,
    /// A folder of pipeline files, searched first for the pipeline name (see PIPELINE).
    #[arg(long, value_name = "DIR")]
    pipelines: Option<PathBuf>,
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
    /// Data parallel: one engine per listed GPU (`all`, or ordinals like 0,1; `0,0` runs two
    /// engines on cuda:0). Default: every GPU with --device auto or cuda, the one of cuda:N.
    #[arg(long)]
    devices: Option<String>,
    /// Engines per device (with --device cpu: N CPU engines in one process).
    #[arg(long, default_value_t = 1)]
    engines: usize,
    /// Discard an existing checkpoint of this output, or a finished output of a different job,
    /// and compute every record again.
    #[arg(long)]
    restart: bool,
    /// Over a finished output of the same model, pipeline and parameters whose input grew or
    /// changed: compute only records whose id is new or whose content changed, take every
    /// other row unchanged from the output, and rewrite it atomically (for nightly runs over a
    /// growing archive). Without a finished output, every record is computed.
    #[arg(long, conflicts_with = "restart")]
    incremental: bool,
    /// Abort (resumably, exit code 3) once more than this many records have failed.
    #[arg(long)]
    max_errors: Option<u64>,
    /// A completed job with at most this many error rows exits 0 (the report, the summary and
    /// <output>.errors.jsonl still list them). With --max-error-rate, either suffices.
    #[arg(long)]
    allow_errors: Option<u64>,
    /// A completed job whose error rows are at most this share of its rows (0 to 1; 0.01 = 1%)
    /// exits 0. With --allow-errors, either suffices.
    #[arg(long)]
    max_error_rate: Option<f64>,
    /// Process only shard K of N (0-based), records picked by a stable hash of the id. Default:
    /// SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT or JOB_COMPLETION_INDEX with --shard-count.
    #[arg(long)]
    shard: Option<String>,
    /// Number of shards when the index comes from JOB_COMPLETION_INDEX (Kubernetes).
    #[arg(long)]
    shard_count: Option<u32>,
    /// Read, render and tokenize everything and make the run's checks (lock, finished output,
    /// checkpoint) without the model; print what would run and fail, and exit as the run would
    /// (3 when records would fail beyond the error tolerance).
    #[arg(long)]
    dry_run: bool,
    /// With --dry-run: print the report as JSON instead of the summary.
    #[arg(long, requires = "dry_run")]
    json: bool,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
    /// Append every line the run writes to stderr to this file too, each with a UTC timestamp
    /// (stderr's lines get one as well when stderr is not a terminal: cron, systemd, a
    /// scheduler's log). With it, progress is a periodic line instead of a bar.
    #[arg(long, value_name = "PATH")]
    log_file: Option<PathBuf>,
    /// OpenAI batch input: max_tokens for requests that give none.
    #[arg(long, default_value_t = 256)]
    default_max_tokens: u32,
}

#[derive(Args)]
struct ConvertCliArgs {
    /// The Hugging Face model directory (config.json, tokenizer.json, *.safetensors), or a GGUF
    /// file (GGUF -> GGUF type change).
    #[arg(long)]
    model: PathBuf,
    /// Output: *.gguf writes a GGUF file, any other path a safetensors directory.
    #[arg(long)]
    output: PathBuf,
    /// Target weight type: f16 for an HF directory; for a GGUF --model also a quantize --type.
    #[arg(long, default_value = "f16")]
    dtype: String,
    /// Write the output even when a tensor loses more than --max-lossy-fraction of its values.
    #[arg(long)]
    allow_lossy: bool,
    /// A tensor whose clamped + underflowed values exceed this fraction (or that holds NaN/inf)
    /// counts as lossy.
    #[arg(long, default_value_t = 1e-4)]
    max_lossy_fraction: f64,
    /// Re-read every tensor of the output and compare a greedy generation of the source (BF16
    /// computed in f32) with the converted model's.
    #[arg(long)]
    verify: bool,
    /// Tokens generated by --verify.
    #[arg(long, default_value_t = 16)]
    verify_tokens: usize,
    /// Prompt of --verify.
    #[arg(long, default_value = "The capital of France is")]
    verify_prompt: String,
    /// --verify also scores the output against the source (KL divergence on a short built-in
    /// text); exit 1 when the mean KL exceeds this (implies --verify).
    #[arg(long)]
    verify_max_kl: Option<f64>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

const QUANTIZE_HELP: &str = "Quantize a model to a GGUF file that dustoff and llama.cpp load.

Models: llama, qwen2, qwen2moe (Qwen1.5-MoE, Qwen2-57B-A14B), qwen3, qwen3moe (Qwen3-30B-A3B), qwen35 (Qwen3.5/3.6 9B, 27B), qwen35moe
(Qwen3.5/3.6-35B-A3B) and qwen3next. Input: a Hugging Face directory (BF16/F16/F32
safetensors, sharded or not, the vision-language releases included: their text model is
converted, the vision tower and MTP layers skipped and counted; converted to F16 first, exactly
as `dustoff convert` does, in llama.cpp's GGUF layout) or an F16/BF16/F32 GGUF. An already
quantized GGUF is refused unless --allow-requantize (its rounding error adds to the new one).

Types and their mix (the conventions of llama.cpp's quantizer):
  q4_k_m (default)  Q4_K; attn_v-like (attn_v, DeltaNet attn_qkv) and ffn_down (dense, experts,
                    shared expert) of the first and last eighth of the layers and of every third
                    layer between them Q6_K; output head Q6_K
  q4_k_s            Q4_K; attn_v-like of layers 0-3 and ffn_down of the first eighth Q5_K; head Q6_K
  q5_k_m            Q5_K; attn_v-like / ffn_down as q4_k_m get Q6_K; head Q6_K
  q6_k              Q6_K everywhere
  q8_0              Q8_0 everywhere (head included)
  q4_0              Q4_0; with calibration ffn_down of the first eighth Q4_1; output head Q6_K
  f16               every matrix F16 (a reference copy of a quantized model)
Models of exactly 8 experts: attn_v-like and attn_k Q8_0, attn_output Q5_K (q4_k_s/m). The
output head is output.weight, or token_embd.weight when the embedding is tied; an untied
token_embd gets the base type. Norms, biases, MoE routers and DeltaNet conv taps stay F32.
Rows whose length a K type cannot hold (not a multiple of 256) fall back: Q4_K -> Q5_0,
Q5_K -> Q5_1, Q6_K -> Q8_0; the summary and the report list them.

Calibration: --calibration FILE (JSONL with a \"text\" field, or plain text) runs up to
--calibration-tokens tokens through the model (--device auto: on the GPU when one is usable and
the CUDA backend taps the model's layers (dense models), else on the CPU) and records, for every
matrix, the mean squared activation of each input column over the tokens that reach it (the
importance matrix): every expert from the tokens routed to it, the shared expert, attention and
DeltaNet projections. An expert no token was routed to falls back (gate/up: its layer's router
input; down: uniform weights), counted on the console and listed in the report; the console
names every matrix left without importance. With --pipeline P, FILE holds that pipeline's job
records (JSONL or Parquet): each is rendered and tokenized exactly as `dustoff run P` would
feed it (system prompt, instruction, chat template), one window per record. Scales and mins are
then chosen by weighted least squares with those weights. --imatrix-out F saves it (llama.cpp's
imatrix layout), --imatrix F reuses it. Without calibration the same search runs with uniform
weights (plain least squares); Q4_0 also weights each element by its magnitude.

Report: <output>.report.json beside the output (types, fallbacks, errors, importance, verify).
Exit codes: 0 done; 1 failed (I/O, --verify-max-kl exceeded); 2 bad arguments or an
unsupported model (the architecture or config key is named). Details: docs/QUANTIZE.md.";

#[derive(Args)]
struct QuantizeCliArgs {
    /// Source model: a Hugging Face directory or an F16/BF16/F32 GGUF file.
    #[arg(long)]
    model: PathBuf,
    /// Output GGUF file (must not exist).
    #[arg(long)]
    output: PathBuf,
    /// q4_k_m, q4_k_s, q5_k_m, q6_k, q8_0, q4_0 or f16 (see the mix rules above).
    #[arg(long = "type", default_value = "q4_k_m")]
    qtype: String,
    /// Calibration text: JSONL records with a "text" field, or a plain text file.
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// Tokens of calibration text to run (in windows of --calibration-ctx).
    #[arg(long, default_value_t = 100_000)]
    calibration_tokens: usize,
    /// Window length of the calibration runs.
    #[arg(long, default_value_t = 512)]
    calibration_ctx: usize,
    /// Reuse an importance matrix saved by --imatrix-out (instead of --calibration).
    #[arg(long)]
    imatrix: Option<PathBuf>,
    /// Save the importance matrix computed from --calibration.
    #[arg(long)]
    imatrix_out: Option<PathBuf>,
    /// Quantize a GGUF whose matrices are already quantized (quality is lost twice).
    #[arg(long)]
    allow_requantize: bool,
    /// Afterwards, score the output against the source on a short built-in text (KL divergence,
    /// top-1 agreement, perplexities); recorded in <output>.report.json.
    #[arg(long)]
    verify: bool,
    /// Exit 1 when the verification's mean KL divergence exceeds this (implies --verify).
    #[arg(long)]
    verify_max_kl: Option<f64>,
    /// --calibration holds this pipeline's job records: calibrate on the prompts it renders.
    #[arg(long)]
    pipeline: Option<String>,
    /// Where calibration runs: cpu, cuda, cuda:N, or auto (the GPU when usable).
    #[arg(long, default_value = "auto")]
    device: String,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct EvalCliArgs {
    /// The model(s) to score (GGUF files or HF directories); repeat to score several at once.
    #[arg(long, required = true, num_args = 1..)]
    model: Vec<PathBuf>,
    /// The reference model (e.g. the F16 source): adds KL divergence and top-1 agreement.
    #[arg(long)]
    reference: Option<PathBuf>,
    /// Text to score: JSONL with a "text" field or plain text (default: a short built-in text).
    #[arg(long)]
    text: Option<PathBuf>,
    /// Window length; the second half of every window is scored.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Tokens of text to use at most.
    #[arg(long, default_value_t = 32_768)]
    max_tokens: usize,
    /// KV cache of the --model runs: f16 (the full cache; f32 on the CPU) or q8 (the 8-bit
    /// cache's values); the --reference keeps the full one. `--model M --reference M --kv-cache
    /// q8` measures what the 8-bit cache costs.
    #[arg(long, default_value = "f16")]
    kv_cache: KvChoice,
    /// Where the windows run: cpu, cuda, cuda:N, or auto (the GPU when usable). Each model is
    /// placed on its own (the reference first); the head and the statistics run on the host.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Precompiled PTX folder (see `dustoff kernels`); also DUSTOFF_PTX_DIR, else NVRTC.
    #[arg(long)]
    ptx_dir: Option<PathBuf>,
    /// Windows run at once, as the sequences of one batched prefill (steps of up to 2,048
    /// tokens; each window keeps its own KV cache of --ctx positions). The numbers do not
    /// depend on it on the CPU; on the GPU within F16 rounding.
    #[arg(long, default_value_t = dustoff::commands::eval::DEFAULT_BATCH_WINDOWS)]
    batch_windows: usize,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
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
    /// Model (GGUF file or Hugging Face directory). Defaults to the sample model unless --synthetic is given.
    #[arg(long, default_value = SAMPLE_MODEL, conflicts_with = "synthetic")]
    model: PathBuf,
    /// A real architecture's shape filled with random weights: qwen3-8b, qwen2.5-7b, llama3-8b,
    /// smollm2-135m, qwen3-0.6b, qwen3-30b-a3b (MoE), qwen3.5-9b and qwen3.6-35b-a3b (hybrid, GPU only).
    #[arg(long)]
    synthetic: Option<String>,
    /// Weight type of a synthetic model: f16, q8_0, q4_0, q4_1, q4_k... (on a GPU also q4_k_m,
    /// llama.cpp's mix of Q4_K and Q6_K).
    #[arg(long, default_value = "f16")]
    dtype: String,
    /// GPU weights: `native` keeps block formats packed (quantized kernels); `f16` widens them
    /// to F16 at load (the older path, for comparison).
    #[arg(long, default_value = "native", value_parser = ["native", "f16"])]
    weights: String,
    /// cpu, cuda, cuda:N, or auto.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Precompiled PTX folder (see `dustoff kernels`); also DUSTOFF_PTX_DIR, else `ptx/` beside the binary.
    #[arg(long)]
    ptx_dir: Option<PathBuf>,
    /// Prompt length of each sequence (the batched modes: of each of the --batch sequences).
    /// One stream takes a comma-separated list (e.g. 8192,16384: long-context rows, decode
    /// after each prompt); the other modes take the first value.
    #[arg(long, value_delimiter = ',', default_value = "768")]
    prompt_tokens: Vec<usize>,
    /// Tokens generated by each sequence (decode tok/s counts them).
    #[arg(long, default_value_t = 200)]
    gen_tokens: usize,
    /// Timed runs (after one warm-up); medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// Batched decode instead of one stream: a comma-separated list of sequence counts
    /// (e.g. 1,2,4,8,16,32,64), each with its own prompt of --prompt-tokens.
    #[arg(long, value_delimiter = ',')]
    batch: Vec<usize>,
    /// The shared-prefix job instead: REQUESTS,SHARED,UNIQUE (default 256 requests of a
    /// 1,000-token shared prefix + 300 unique tokens), --gen-tokens each, with the prefix cache
    /// on and then off.
    #[arg(long, value_delimiter = ',', num_args = 0..=3, default_missing_value = "256,1000,300")]
    shared_prefix: Option<Vec<usize>>,
    /// Slots of the shared-prefix job.
    #[arg(long, default_value_t = 32)]
    slots: usize,
    /// The cost of constrained decoding: each --batch size (default 32) decoded under this
    /// pipeline's output grammar, then unconstrained for the same token counts; mask time per
    /// token (median, p99). Needs a model with a tokenizer (not --synthetic).
    #[arg(long, conflicts_with = "synthetic")]
    constrained: Option<String>,
    /// Token budget per engine step for the batched modes.
    #[arg(long, default_value_t = 2048)]
    max_batch_tokens: usize,
    /// Print the CUDA memory plan of the mode's sequences (weights, KV, recurrent states,
    /// workspace) and whether it fits --plan-free-gb, then exit; nothing is loaded.
    #[arg(long)]
    plan: bool,
    /// Free GPU memory in GB (1e9 bytes) the --plan is judged against (default: a
    /// V100-SXM2-32GB after its context: 32,510 MiB less 512 MiB = 33.55 GB).
    #[arg(long)]
    plan_free_gb: Option<f64>,
    /// Split the model over N ranks (see `run --help`) and time the split: one rank per GPU
    /// from --device cuda:K, or the GPUs of --devices; on the CPU N threads. Needs --model (for
    /// a synthetic shape, write it first with `dustoff synth`). With --plan: one GPU's share.
    #[arg(long)]
    tensor_parallel: Option<usize>,
    /// GPUs of the --tensor-parallel ranks, one per rank (e.g. 0,1; 0,0 puts two ranks on one
    /// GPU: a test of the split, not a speed-up).
    #[arg(long, requires = "tensor_parallel")]
    devices: Option<String>,
    /// The most GPU memory the bench may take (e.g. 32GB = 32e9 bytes, 30GiB), its CUDA
    /// context included: a V100's 32 GB on a larger card. A mode that does not fit is refused
    /// with the numbers. With --plan: the plan is judged against it (less 512 MiB for the
    /// context) where that is less than --plan-free-gb.
    #[arg(long)]
    max_gpu_memory: Option<MemoryCap>,
    /// KV cache type: f16 or q8 (8-bit values with one F16 scale per 32 values; see `run
    /// --help`); auto is f16 here (a benchmark names what it measures).
    #[arg(long, default_value = "auto")]
    kv_cache: KvChoice,
}

#[derive(Args)]
struct ModelArgs {
    /// Model: a GGUF file or a Hugging Face directory. Without --model: DUSTOFF_MODEL, else the
    /// sample model (a path relative to the current folder: set DUSTOFF_MODEL for cron).
    #[arg(long, env = "DUSTOFF_MODEL", default_value = SAMPLE_MODEL)]
    model: PathBuf,
    /// cpu, cuda, cuda:N, or auto (the first GPU when usable, else the CPU).
    #[arg(long, default_value = "auto")]
    device: String,
    /// Load precompiled PTX kernels from this folder (from `dustoff kernels`) instead of
    /// compiling them with NVRTC. Also read from DUSTOFF_PTX_DIR; without either, a `ptx/`
    /// folder beside the binary is used when it exists.
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
    /// JSONL output: {"id","prompt_tokens","token_ids","text","finish_reason"} per line (a line
    /// that fails: {"id","line","error"}, exit 3), in input order. Runs on `run`'s job loop:
    /// checkpointed beside the output (after SIGINT/SIGTERM, exit 4, or a kill the same command
    /// resumes), progress lines, and the report and errors file beside it.
    #[arg(long)]
    output: Option<PathBuf>,
    /// With --input: discard an existing checkpoint of this output and start over.
    #[arg(long)]
    restart: bool,
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
    /// Sequences decoded together (parallel decode slots): a count, or auto: on a GPU as many
    /// as the memory plan fits for the job's context (at most 128, said in the log), on the CPU
    /// 8. On a GPU more slots mean more throughput while their KV cache fits (H200, 8B model: 8
    /// slots ~1,100 tok/s, 64 slots ~5,800); a count that does not fit is refused with numbers.
    #[arg(long, default_value = "auto")]
    slots: Slots,
    /// Token budget of one engine step (decode tokens plus chunks of prefill); on a GPU the
    /// memory plan reserves workspace for steps of this size. Default: 2048 on a GPU (larger
    /// prefill chunks give each expert of a MoE more tokens per grouped product: H200, nightly
    /// job benchmark, +7% documents an hour over 512), 512 on the CPU.
    #[arg(long)]
    max_batch_tokens: Option<usize>,
    /// Compute every prompt in full (no reuse of shared prefixes), for comparison.
    #[arg(long)]
    no_prefix_cache: bool,
    /// Split the model over N ranks (tensor parallel): each holds 1/N of the attention heads,
    /// KV cache and FFN columns, and the ranks sum their outputs after every block's two output
    /// projections. On GPUs one rank per GPU (cuda:K..K+N, or the GPUs of `run --devices`;
    /// NCCL between them); on the CPU N threads. N must divide the KV heads (and a hybrid
    /// model's linear-attention key heads). Dense, mixture-of-experts and hybrid models split
    /// on GPUs and on the CPU. See docs/CLUSTER.md.
    #[arg(long)]
    tensor_parallel: Option<usize>,
    /// The most memory the job may take on each GPU (e.g. 32GB = 32e9 bytes, 30GiB = 30 x 2^30),
    /// its CUDA context included: for a card shared with other services. Weights, KV cache,
    /// workspace and the plan's 5% headroom are planned within it; --slots auto and the KV
    /// cache are sized from it (when the slots' full contexts do not fit, the KV cache takes
    /// what does and sequences wait or are preempted). A model that does not fit is refused
    /// with the numbers.
    #[arg(long)]
    max_gpu_memory: Option<MemoryCap>,
    /// KV cache type: f16, q8 (8-bit values with one F16 scale per 32: 1.88x the positions in
    /// the same memory; quality in docs/KV_CACHE.md) or auto: on a GPU F16 when the job's
    /// sequences fit in F16 (--slots auto: when F16 fits 32 sequences or as many as 8-bit:
    /// batches that large run faster in F16 than twice as many in 8-bit), else q8, said in
    /// the log; on the CPU and for data-parallel engines F16.
    #[arg(long, default_value = "auto")]
    kv_cache: KvChoice,
}

impl EngineArgs {
    fn memory(&self) -> common::MemoryFlags {
        common::MemoryFlags { max_gpu_memory: self.max_gpu_memory, kv_cache: self.kv_cache }
    }

    /// `--max-batch-tokens`, or the default of `device`.
    fn max_batch_tokens(&self, device: &common::Device) -> usize {
        self.max_batch_tokens.unwrap_or_else(|| dustoff::engine::batch::default_max_batch_tokens(device.is_gpu()))
    }
}

#[derive(Args)]
struct TokenizeArgs {
    /// Model (GGUF file or Hugging Face directory) whose tokenizer is used. Defaults to the sample model.
    #[arg(long, default_value = SAMPLE_MODEL)]
    model: PathBuf,
    #[arg(long)]
    input: PathBuf,
    #[arg(long)]
    output: PathBuf,
}

/// The one exit funnel: every command's result becomes one exit code of `dustoff::job::exit`
/// (listed at the end of `--help`), and an error is printed once, each cause once.
fn main() -> ExitCode {
    // A closed pipe (`dustoff run ... --dry-run | head -1`) ends the process quietly, as it
    // does other Unix tools, instead of a panic in `println!` (exit 101). A job killed this way
    // resumes from its checkpoint like after any other kill.
    #[cfg(unix)]
    // SAFETY: sets the default disposition of one signal before any thread exists; no Rust
    // state is touched.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Before any thread exists (it changes the process environment).
    dustoff::backend::cuda::plan::memory::default_cublas_workspace();
    let matches = Cli::command().after_help(exit::help()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Unattended jobs (run, generate --input): timestamps on stderr's lines when it is not a
    // terminal, and run's --log-file. Held to the end of main, so the error line below goes
    // through it too.
    let log_file = match &cli.cmd {
        Cmd::Run(a) => Some(a.log_file.as_deref()),
        Cmd::Generate(a) if a.input.is_some() => Some(None),
        _ => None,
    };
    let _log = match log_file {
        Some(file) => {
            use std::io::IsTerminal;
            match dustoff::job::log::LogTee::start(!std::io::stderr().is_terminal(), file) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("error: {e}");
                    return Code::Usage.into();
                }
            }
        }
        None => None,
    };
    match place_threads(&cli).and_then(|()| run(cli)) {
        Ok(code) => code.into(),
        Err(e) => {
            eprintln!("error: {}", exit::describe(&e));
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::StorageFull)
            }) {
                eprintln!(
                    "the disk is full: free some space, then run the same command; a job resumes from its checkpoint"
                );
            }
            exit::code_of(&e).into()
        }
    }
}

/// `DUSTOFF_CPU_PATH`, `--numa` and `--threads`: checked, applied (pinning, the rayon pool)
/// before any work, and logged for the commands that compute. Bad values are usage errors.
fn place_threads(cli: &Cli) -> Result<()> {
    dustoff::sys::cpu::check_path_env().map_err(|e| UsageError::new(e.to_string()))?;
    let device = match &cli.cmd {
        Cmd::Generate(a) => Some(a.model.device.as_str()),
        Cmd::Run(a) if !a.dry_run => Some(a.model.device.as_str()),
        Cmd::Bench(a) => Some(a.device.as_str()),
        _ => None,
    };
    let ordinal = match device.map(common::parse_device) {
        Some(Ok(Device::Cuda(n))) => Some(n),
        _ => None,
    };
    match dustoff::sys::threads::setup_cli(&cli.numa, cli.threads, ordinal) {
        Ok(p) => {
            if device.is_some() {
                eprintln!("{}", p.describe());
            }
            Ok(())
        }
        // The message alone, as it was printed before the funnel took these errors.
        Err(e) if e.is_usage() => Err(UsageError::new(e.to_string()).into()),
        Err(e) => Err(anyhow::anyhow!("{e}")),
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

/// A command's summary on stdout: JSON with `--json`, else its text form.
fn print_report<T: serde::Serialize>(json: bool, value: &T, text: String) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{text}");
    }
    Ok(())
}

/// `quantize`, and `convert` of a GGUF: the summary printed, exit 1 when verification failed.
fn quantize(args: &dustoff::commands::quantize::QuantizeArgs, json: bool) -> Result<Code> {
    let summary = dustoff::commands::quantize::run(args)?;
    print_report(json, &summary, summary.to_text())?;
    Ok(if summary.passed() { Code::Ok } else { Code::Failure })
}

fn run(cli: Cli) -> Result<Code> {
    match cli.cmd {
        Cmd::Tokenize(a) => {
            // Checked before the model loads: tokenize writes its rows as they are made.
            dustoff::job::outputs::check_output(&a.output, &[&a.input, &a.model])?;
            let t = common::load_tokenizer(&a.model)?;
            let errors = tokenize::run(&t.tokenizer, &a.input, &a.output)?;
            Ok(if errors > 0 { Code::RecordErrors } else { Code::Ok })
        }
        Cmd::Run(a) => {
            let device = pick_device(&a.model.device)?;
            let max_batch_tokens = a.engine.max_batch_tokens(&device);
            let args = dustoff::commands::run::RunArgs {
                pipeline: a.pipeline,
                pipelines_dir: a.pipelines,
                inputs: a.input,
                output: a.output,
                model: a.model.model,
                device,
                device_flag: a.model.device,
                devices: a.devices,
                engines: a.engines,
                tensor_parallel: a.engine.tensor_parallel,
                ptx_dir: a.model.ptx_dir,
                memory: a.engine.memory(),
                slots: a.engine.slots,
                max_batch_tokens,
                prefix_cache: !a.engine.no_prefix_cache,
                restart: a.restart,
                incremental: a.incremental,
                max_errors: a.max_errors,
                tolerance: dustoff::job::tolerance::ErrorTolerance::new(a.allow_errors, a.max_error_rate)?,
                shard: a.shard,
                shard_count: a.shard_count,
                dry_run: a.dry_run,
                json: a.json,
                quiet: a.quiet,
                default_max_tokens: a.default_max_tokens,
            };
            dustoff::commands::run::run(&args)
        }
        Cmd::Convert(a) if a.model.is_file() => {
            // GGUF -> GGUF: a type change of every matrix (e.g. a quantized model to an F16
            // reference), done by the quantizer with its mix rules for --dtype.
            let args = dustoff::commands::quantize::QuantizeArgs {
                model: a.model,
                output: a.output,
                qtype: a.dtype,
                allow_requantize: true,
                verify: a.verify,
                verify_max_kl: a.verify_max_kl,
                threads: cli.threads,
                ..Default::default()
            };
            quantize(&args, a.json)
        }
        Cmd::Convert(a) => {
            let args = dustoff::commands::convert::ConvertArgs {
                model: a.model,
                output: a.output,
                dtype: a.dtype,
                allow_lossy: a.allow_lossy,
                max_lossy_fraction: a.max_lossy_fraction,
                verify: a.verify || a.verify_max_kl.is_some(),
                verify_tokens: a.verify_tokens,
                verify_prompt: a.verify_prompt,
                verify_max_kl: a.verify_max_kl,
            };
            let summary = dustoff::commands::convert::run(args)?;
            print_report(a.json, &summary, summary.to_text())?;
            Ok(if summary.passed() { Code::Ok } else { Code::Failure })
        }
        Cmd::Doctor(a) => {
            let args = dustoff::commands::doctor::DoctorArgs {
                model: a.model,
                ctx: a.ctx,
                slots: a.slots,
                ptx_dir: a.ptx_dir,
                numa: cli.numa,
                threads: cli.threads,
                measure: !a.no_measure,
                require_gpu: a.require_gpu,
            };
            let report = dustoff::commands::doctor::run(&args)?;
            print_report(a.json, &report, report.to_text())?;
            Ok(report.exit)
        }
        Cmd::Quantize(a) => {
            let args = dustoff::commands::quantize::QuantizeArgs {
                model: a.model,
                output: a.output,
                qtype: a.qtype,
                calibration: a.calibration,
                calibration_tokens: a.calibration_tokens,
                calibration_ctx: a.calibration_ctx,
                imatrix: a.imatrix,
                imatrix_out: a.imatrix_out,
                allow_requantize: a.allow_requantize,
                threads: cli.threads,
                verify: a.verify,
                verify_max_kl: a.verify_max_kl,
                pipeline: a.pipeline,
                device: a.device,
            };
            quantize(&args, a.json)
        }
        Cmd::Eval(a) => {
            let args = dustoff::commands::eval::EvalArgs {
                models: a.model,
                reference: a.reference,
                text: a.text,
                ctx: a.ctx,
                max_tokens: a.max_tokens,
                kv_type: a.kv_cache.or_f16(),
                device: a.device,
                ptx_dir: a.ptx_dir,
                batch_windows: a.batch_windows,
            };
            let summary = dustoff::commands::eval::run(&args)?;
            print_report(a.json, &summary, summary.to_text())?;
            Ok(Code::Ok)
        }
        Cmd::Synth(a) => {
            // A missing tokenizer is a missing input (exit 2), found before any work.
            if !a.tokenizer.join("tokenizer.json").is_file() {
                return Err(UsageError::new(format!(
                    "--tokenizer {}: no tokenizer.json there (give a Hugging Face model directory)",
                    a.tokenizer.display()
                ))
                .into());
            }
            let o = dustoff::model::synth_gguf::SynthOptions {
                shape: a.shape,
                qtype: a.qtype,
                tokenizer: a.tokenizer,
                output: a.output,
                seed: a.seed,
                force: a.force,
                layers: a.layers,
            };
            let summary = dustoff::commands::synth::run(&o, a.quiet)?;
            print_report(a.json, &summary, format!("{}\n", summary.to_text()))?;
            Ok(Code::Ok)
        }
        Cmd::Merge(a) => {
            dustoff::commands::run::merge(&a.output, &a.shards)?;
            Ok(Code::Ok)
        }
        Cmd::Kernels(a) => {
            let files = dustoff::commands::kernels::compile_all(&a.arch, &a.out)?;
            for f in &files {
                println!("{}", f.display());
            }
            Ok(Code::Ok)
        }
        Cmd::Bench(a) => {
            let opts = dustoff::commands::bench_modes::BenchOptions {
                device: pick_device(&a.device)?,
                model: a.model,
                synthetic: a.synthetic,
                dtype: a.dtype,
                f16_weights: a.weights == "f16",
                ptx_dir: a.ptx_dir,
                prompt_tokens: a.prompt_tokens,
                gen_tokens: a.gen_tokens,
                runs: a.runs,
                json: a.json,
                batch: a.batch,
                shared_prefix: a.shared_prefix,
                slots: a.slots,
                constrained: a.constrained,
                max_batch_tokens: a.max_batch_tokens,
                plan: a.plan,
                plan_free_gb: a.plan_free_gb,
                tensor_parallel: a.tensor_parallel,
                devices: a.devices,
                max_gpu_memory: a.max_gpu_memory,
                kv_type: a.kv_cache.or_f16(),
            };
            dustoff::commands::bench_modes::run(&opts)
        }
        Cmd::Generate(a) => {
            if a.max_tokens == 0 {
                return Err(UsageError::new("--max-tokens 0 would generate nothing; give at least 1").into());
            }
            if a.ctx == 0 {
                return Err(UsageError::new("--ctx 0 leaves no room for a prompt; give at least 1").into());
            }
            let opt = generate::GenOptions {
                max_tokens: a.max_tokens,
                temperature: a.temperature,
                top_k: a.top_k,
                top_p: a.top_p,
                seed: a.seed,
            };
            match (a.prompt, a.input, a.output) {
                (Some(p), _, _) => {
                    let device = pick_device(&a.model.device)?;
                    let m = common::load(&a.model.model)?;
                    let step = dustoff::engine::single::PREFILL_CHUNK;
                    let place = common::Placement {
                        ptx_dir: a.model.ptx_dir.clone(),
                        f16_weights: false,
                        max_gpu_memory: a.engine.max_gpu_memory,
                        kv_type: a.engine.kv_cache.or_f16(),
                        max_seq_positions: None,
                    };
                    let mut b = dustoff::commands::tensor_parallel::backend_for(
                        &m.config,
                        &m.weights,
                        &device,
                        a.engine.tensor_parallel,
                        None,
                        a.ctx,
                        (step, 1),
                        &place,
                    )?;
                    generate::run_prompt(&m, b.as_mut(), &p, a.chat, &opt)?;
                    Ok(Code::Ok)
                }
                (None, Some(i), Some(o)) => {
                    if dustoff::job::writer::OutputFormat::from_path(&o) != dustoff::job::writer::OutputFormat::Jsonl {
                        return Err(UsageError::new(format!(
                            "generate writes JSONL: {} is not a .jsonl path",
                            o.display()
                        ))
                        .into());
                    }
                    let device = pick_device(&a.model.device)?;
                    // Before the model loads: an output that would overwrite the input, or a
                    // second run of this job, is refused at once.
                    dustoff::job::outputs::check_output(&o, &[&i, &a.model.model])?;
                    let lock = dustoff::job::lock::JobLock::acquire(&o)?;
                    let job = generate::BatchJob {
                        model_path: &a.model.model,
                        input: &i,
                        output: &o,
                        ctx: a.ctx,
                        restart: a.restart,
                        commit_rows: common::commit_rows(),
                    };
                    dustoff::job::checkpoint::Checkpoint::verify(&o, &generate::fingerprint(&job, &opt)?, a.restart)
                        .map_err(|e| {
                            anyhow::anyhow!(e).context(format!("opening the checkpoint of {}", o.display()))
                        })?;
                    let m = common::load(&a.model.model)?;
                    let max_batch_tokens = a.engine.max_batch_tokens(&device);
                    let (slots, kv_type) = dustoff::commands::tensor_parallel::slots_for(
                        a.engine.slots,
                        &device,
                        (&m.config, &m.weights),
                        a.engine.tensor_parallel,
                        (a.ctx, max_batch_tokens),
                        a.engine.memory(),
                    )?;
                    let cfg = dustoff::engine::batch::EngineConfig::new(
                        slots,
                        max_batch_tokens,
                        !a.engine.no_prefix_cache,
                        m.fingerprint,
                    );
                    let place = common::Placement {
                        ptx_dir: a.model.ptx_dir.clone(),
                        f16_weights: false,
                        max_gpu_memory: a.engine.max_gpu_memory,
                        kv_type,
                        // Each line runs within --ctx positions.
                        max_seq_positions: Some(a.ctx),
                    };
                    let tokens = match a.engine.tensor_parallel {
                        None => common::kv_positions(
                            &device,
                            (&m.config, &m.weights),
                            (slots, a.ctx),
                            cfg.max_batch_tokens,
                            &place,
                        )?,
                        Some(_) => a.ctx * slots,
                    };
                    let backend = dustoff::commands::tensor_parallel::backend_for(
                        &m.config,
                        &m.weights,
                        &device,
                        a.engine.tensor_parallel,
                        None,
                        tokens,
                        (cfg.max_batch_tokens, slots),
                        &place,
                    )?;
                    let engine = dustoff::engine::batch::Engine::new(backend, cfg)?;
                    let stop = dustoff::job::runner::StopFlag::with_signals().unwrap_or_default();
                    let mut gen = dustoff::job::adapters::EngineGenerate::new(engine, m.tokenizer.eos_ids().to_vec())
                        .with_stop(stop.clone());
                    let r = generate::run_jsonl(&m, &mut gen, &job, &opt, &lock, &stop)?;
                    eprintln!("metrics: {}", serde_json::to_string(&r.metrics)?);
                    eprintln!(
                        "{} rows committed ({} from an earlier run), {} error rows",
                        r.rows, r.resumed_rows, r.error_rows
                    );
                    if r.exit == Code::Interrupted {
                        eprintln!("interrupted: run the same command again to resume");
                    }
                    Ok(r.exit)
                }
                _ => Err(UsageError::new("give either --prompt TEXT or --input IN.jsonl --output OUT.jsonl").into()),
            }
        }
    }
}
