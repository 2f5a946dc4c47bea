//! Pieces shared by the subcommands: device choice, model loading with a log line, JSONL I/O.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::backend::cpu::CpuBackend;
use crate::backend::Backend;
use crate::model::loader::{load_model, LoadedModel};

/// Where to run the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
}

/// Parses `cpu`, `cuda`, `cuda:N` or `auto`. `auto` is the first GPU when one is usable, else
/// the CPU (said in the log by the caller).
pub fn parse_device(s: &str) -> Result<Device> {
    match s {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(0)),
        "auto" => Ok(if cuda_usable() { Device::Cuda(0) } else { Device::Cpu }),
        _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => Ok(Device::Cuda(n)),
            _ => bail!("unknown device '{s}': use cpu, cuda, cuda:N or auto"),
        },
    }
}

/// Whether a CUDA device can be used (a driver is loadable and reports a device).
pub fn cuda_usable() -> bool {
    crate::backend::cuda::device::device_count() > 0
}

/// Places a model on `device` with room for `tokens` cached positions.
pub fn make_backend(
    cfg: &crate::model::config::ModelConfig,
    w: &crate::model::weights::ModelWeights,
    device: &Device,
    tokens: usize,
    ptx_dir: Option<&Path>,
) -> Result<Box<dyn Backend>> {
    make_backend_weights(cfg, w, device, tokens, ptx_dir, false)
}

/// As [`make_backend`]; `f16_weights`: on a GPU, widen block-format weights to F16 at load
/// (`bench --weights f16`) instead of keeping them packed.
pub fn make_backend_weights(
    cfg: &crate::model::config::ModelConfig,
    w: &crate::model::weights::ModelWeights,
    device: &Device,
    tokens: usize,
    ptx_dir: Option<&Path>,
    f16_weights: bool,
) -> Result<Box<dyn Backend>> {
    let blocks = tokens.div_ceil(BLOCK_SIZE).max(1);
    match *device {
        Device::Cpu => Ok(Box::new(CpuBackend::new(cfg.clone(), w.clone(), blocks, BLOCK_SIZE))),
        Device::Cuda(ordinal) => {
            let n = crate::backend::cuda::device::device_count();
            if ordinal >= n {
                bail!("device cuda:{ordinal} requested, but {n} CUDA device(s) are usable here; use --device cpu");
            }
            let opts = crate::backend::cuda::CudaOptions { f16_weights, ..cuda_options(ordinal, blocks, ptx_dir) };
            let b = crate::backend::cuda::backend::CudaBackend::new(cfg.clone(), w, &opts)
                .with_context(|| format!("placing the model on cuda:{ordinal}"))?;
            Ok(Box::new(b))
        }
    }
}

/// The tokenizer alone (vocab-only GGUFs work): for commands that run no model.
pub fn load_tokenizer(path: &Path) -> Result<crate::model::loader::LoadedTokenizer> {
    let t = crate::model::loader::load_tokenizer(path).context("loading the tokenizer")?;
    eprintln!("tokenizer: {} (vocab {})", path.display(), t.tokenizer.vocab_size());
    Ok(t)
}

pub fn load(path: &Path) -> Result<LoadedModel> {
    let t = std::time::Instant::now();
    let m = load_model(path).context("loading the model")?;
    let c = &m.config;
    eprintln!(
        "model: {} ({}, {} layers, width {}, {} heads / {} KV heads, vocab {}) loaded in {:.2}s",
        path.display(),
        c.arch.name(),
        c.n_layers,
        c.dim,
        c.n_heads,
        c.n_kv_heads,
        c.vocab_size,
        t.elapsed().as_secs_f64()
    );
    Ok(m)
}

fn cuda_options(ordinal: usize, blocks: usize, ptx_dir: Option<&Path>) -> crate::backend::cuda::CudaOptions {
    crate::backend::cuda::CudaOptions {
        ordinal,
        num_blocks: blocks,
        block_size: BLOCK_SIZE,
        ptx_dir: ptx_dir.map(Path::to_path_buf),
        // RoPE tables cover every position the KV cache can hold.
        max_positions: blocks * BLOCK_SIZE,
        f16_weights: false,
    }
}

/// A random-weight model of a named shape on `device`, weights of type `dtype` (`f16`, `q8_0`,
/// ..., or on a GPU also `q4_k_m`, llama.cpp's mix). On a GPU the weights are generated there,
/// so an 8B shape takes seconds, not a 16 GB host buffer.
pub fn make_synthetic_backend(
    shape: &str,
    dtype: &str,
    device: &Device,
    tokens: usize,
    ptx_dir: Option<&Path>,
) -> Result<Box<dyn Backend>> {
    let cfg = crate::model::shapes::shape(shape).ok_or_else(|| {
        anyhow::anyhow!("unknown shape '{shape}'; known: {}", crate::model::shapes::SHAPES.join(", "))
    })?;
    match *device {
        Device::Cpu => {
            let w = crate::model::synth::random_weights(&cfg, parse_dtype(dtype)?, 1);
            make_backend(&cfg, &w, device, tokens, ptx_dir)
        }
        Device::Cuda(ordinal) => {
            use crate::backend::cuda::WeightMix;
            let mix = WeightMix::parse(dtype).ok_or_else(|| {
                anyhow::anyhow!("--dtype {dtype}: synthetic GPU weights are f16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k or q4_k_m")
            })?;
            let opts = cuda_options(ordinal, tokens.div_ceil(BLOCK_SIZE).max(1), ptx_dir);
            let b = crate::backend::cuda::backend::CudaBackend::synthetic_mix(cfg, mix, 1, &opts)
                .with_context(|| format!("making a synthetic {shape} on cuda:{ordinal}"))?;
            Ok(Box::new(b))
        }
    }
}

/// Parses a weight type name (`f16`, `q8_0`, `q4_k`...).
pub fn parse_dtype(s: &str) -> Result<crate::model::quant::GgmlType> {
    use crate::model::quant::GgmlType as T;
    Ok(match s.to_ascii_lowercase().as_str() {
        "f32" => T::F32,
        "f16" => T::F16,
        "bf16" => T::BF16,
        "q4_0" => T::Q4_0,
        "q4_1" => T::Q4_1,
        "q5_0" => T::Q5_0,
        "q5_1" => T::Q5_1,
        "q8_0" => T::Q8_0,
        "q4_k" => T::Q4K,
        "q5_k" => T::Q5K,
        "q6_k" => T::Q6K,
        _ => bail!("unknown weight type '{s}' (f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k)"),
    })
}

/// KV block size (tokens) of every backend.
pub const BLOCK_SIZE: usize = 16;

/// Reads a JSONL file line by line: `(1-based line number, parsed value or error message)`.
/// Blank lines are skipped.
pub fn read_jsonl(path: &Path) -> Result<Vec<(usize, std::result::Result<serde_json::Value, String>)>> {
    let f = File::open(path).with_context(|| format!("opening input {}", path.display()))?;
    let mut out = Vec::new();
    let mut r = BufReader::new(f);
    let mut buf = Vec::new();
    let mut line_no = 0;
    loop {
        buf.clear();
        let n = r.read_until(b'\n', &mut buf).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let text = match std::str::from_utf8(&buf) {
            Ok(t) => t.trim(),
            Err(e) => {
                out.push((line_no, Err(format!("line is not valid UTF-8: {e}"))));
                continue;
            }
        };
        if text.is_empty() {
            continue;
        }
        out.push((line_no, serde_json::from_str(text).map_err(|e| format!("malformed JSON: {e}"))));
    }
    Ok(out)
}

/// A JSONL writer that flushes on drop.
pub struct JsonlWriter(BufWriter<File>);

impl JsonlWriter {
    pub fn create(path: &Path) -> Result<Self> {
        let f = File::create(path).with_context(|| format!("creating output {}", path.display()))?;
        Ok(JsonlWriter(BufWriter::new(f)))
    }
    pub fn write(&mut self, v: &serde_json::Value) -> Result<()> {
        serde_json::to_writer(&mut self.0, v)?;
        self.0.write_all(b"\n")?;
        Ok(())
    }
    pub fn finish(mut self) -> Result<()> {
        self.0.flush()?;
        self.0.get_ref().sync_all()?;
        Ok(())
    }
}
