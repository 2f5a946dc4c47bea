//! The command line: clap's definitions of every command's arguments (`--help` is written
//! here) and the dispatch from parsed arguments to `crate::commands`. The binary (main.rs)
//! parses, starts the log, places threads and turns results into exit codes.
//!
//! Files: `job_args` (run, generate, tokenize, merge and the model / engine flags they share),
//! `model_args` (synth, convert, quantize, eval), `machine_args` (doctor, kernels, bench),
//! `dispatch` (each command's arguments to its `commands` call), `generate_cmd` (the `generate`
//! command's two forms).

mod dispatch;
mod generate_cmd;
pub mod job_args;
pub mod machine_args;
pub mod model_args;

pub use dispatch::run;

use anyhow::Result;
use clap::{Parser, Subcommand};

use self::{job_args::*, machine_args::*, model_args::*};
use crate::commands::device_choice::{self, Device};

#[derive(Parser)]
#[command(name = "dustoff", version, about = "Batch LLM text processing on old GPU servers (V100 and newer) and CPUs")]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
    /// Where CPU threads run: auto (on a multi-socket machine, the cores and memory of the
    /// GPU's NUMA node), off (every core), or a node number.
    #[arg(long, global = true, default_value = "auto")]
    pub numa: String,
    /// CPU threads (default: one per CPU of the chosen node, or of the machine).
    #[arg(long, global = true)]
    pub threads: Option<usize>,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Generate text: JSONL prompts in, JSONL completions out, or one --prompt streamed.
    Generate(GenerateArgs),
    /// Tokenize JSONL lines {"id","text","add_bos","parse_special"} into {"id","ids"}.
    Tokenize(TokenizeArgs),
    /// Benchmark: one stream (TTFT, prefill and decode tok/s, bandwidth share), --batch, or --shared-prefix.
    Bench(BenchArgs),
    /// Compile every CUDA kernel to PTX for an architecture (e.g. compute_70 for the V100) with
    /// NVRTC; the folder can be passed to --ptx-dir on a machine without NVRTC 12. Each start
    /// loads from it only the kernels of its model's weight formats and head size (the driver
    /// compiles those on a GPU's first start: ~20-30 s, cached for later starts).
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
    /// --require-gpu, when no GPU can) or when the --model given cannot be read; the CPU backend
    /// always counts as usable.
    Doctor(DoctorCliArgs),
    /// Write a random-weight GGUF of a real model's shape (e.g. qwen3-30b-a3b in q4_k_m): the
    /// tensor names, formats and sizes of the real file, so jobs, benchmarks and memory plans
    /// can run before (or without) the real weights. The text it generates is noise.
    Synth(SynthCliArgs),
}

/// The `--device` flag parsed; `auto` says on stderr which device it chose.
pub fn pick_device(s: &str) -> Result<Device> {
    let d = device_choice::parse_device(s)?;
    if s == "auto" {
        match d {
            Device::Cpu => eprintln!("device: cpu (no usable CUDA device)"),
            Device::Cuda(n) => eprintln!("device: cuda:{n}"),
        }
    }
    Ok(d)
}
