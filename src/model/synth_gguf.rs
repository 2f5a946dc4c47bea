//! A random-weight GGUF file of a real model's shape (`dustoff synth`): a model to run jobs,
//! benchmarks and memory plans on before the real weights are downloaded (or on machines that
//! may not hold them), with the same tensor names, formats, byte counts and loader path as a
//! file of that model quantized by `dustoff quantize` or llama.cpp.
//!
//! Weights: each matrix is made of blocks drawn (by a hash of the seed, the tensor and the
//! block's position) from a pool of 4,096 blocks quantized from values uniform in
//! +-sqrt(3 / cols), so outputs have about unit variance for unit-variance inputs, as in
//! `synth::random_weights`; the token embedding has unit-variance elements and the attention
//! output projection 1 / sqrt(layers) of the matrices' scale (`Scale`: what keeps each token's
//! own part of the residual stream). Norms are 1, biases and the router (F32, as llama.cpp keeps
//! `ffn_gate_inp`) are uniform, so a chunk's tokens spread over the experts as a trained model's
//! do (`DUSTOFF_ROUTE_STATS=1` prints the spread). The text such a model writes is noise; its
//! speed and memory are those of the real model.

use std::collections::HashMap;
use std::path::PathBuf;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use super::config::ModelConfig;
use super::gguf::Value;
use super::gguf_writer::{model_kv_with, tokenizer_kv, write_gguf, GgufWriteError, KvExtras, TensorOut};
use super::hf::{tensor_plan, HfExtras};
use super::hf_hybrid::{hybrid_outputs, HfLayout};
use super::quant::{quantize_row, GgmlType};
use super::shapes::{shape, SHAPES};
use super::synth_scale::{scale_of, Scale};
use crate::quantize::mix::{choose_in, MixModel, QuantType, TYPE_NAMES};

/// Blocks in each (format, row length) pool.
const POOL_BLOCKS: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("unknown shape '{0}' (known: {known})", known = SHAPES.join(", "))]
    UnknownShape(String),
    #[error("unknown --type '{0}' (known: {TYPE_NAMES})")]
    UnknownType(String),
    #[error("--layers {given}: the shape {shape} has {has} layers (give 1..={has})")]
    Layers { given: usize, shape: String, has: usize },
    #[error("{0} exists; pass --force to replace it")]
    Exists(PathBuf),
    #[error(transparent)]
    Write(#[from] GgufWriteError),
}

impl SynthError {
    /// Errors of the arguments (exit status 2), as opposed to failures while writing.
    pub fn is_usage(&self) -> bool {
        !matches!(self, SynthError::Write(GgufWriteError::Io { .. } | GgufWriteError::Interrupted(_)))
    }
}

pub struct SynthOptions {
    /// A name of `shapes::SHAPES`.
    pub shape: String,
    /// A `dustoff quantize --type` name.
    pub qtype: String,
    /// A Hugging Face directory whose `tokenizer.json` (byte-level BPE) is written into the file,
    /// its token list padded to the shape's vocabulary with unused tokens.
    pub tokenizer: PathBuf,
    pub output: PathBuf,
    pub seed: u64,
    pub force: bool,
    /// Keep only the shape's first `n` layers (every width as the shape's; a hybrid keeps its
    /// pattern of linear and full-attention layers): a file of the real widths small enough for a
    /// CPU, e.g. for quantization-quality runs. `None`: every layer.
    pub layers: Option<usize>,
}

#[derive(Debug, serde::Serialize)]
pub struct SynthSummary {
    pub output: PathBuf,
    pub shape: String,
    pub qtype: String,
    pub tensors: usize,
    pub file_bytes: u64,
    /// Bytes of tensor data per storage format.
    pub bytes_by_type: Vec<(String, u64)>,
}

impl SynthSummary {
    pub fn to_text(&self) -> String {
        let by: Vec<String> =
            self.bytes_by_type.iter().map(|(t, b)| format!("{t} {:.2} GB", *b as f64 / 1e9)).collect();
        format!(
            "wrote {} ({} {}, random weights): {} tensors, {:.2} GB ({})",
            self.output.display(),
            self.shape,
            self.qtype,
            self.tensors,
            self.file_bytes as f64 / 1e9,
            by.join(", ")
        )
    }
}

/// What one tensor of the file holds.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fill {
    Ones,
    /// Uniform in +-amplitude (F32 vectors and the router).
    Uniform(f32),
    /// Uniform in `[lo, hi)` (a DeltaNet decay `ssm_a`, negative).
    Range(f32, f32),
    /// Blocks from the pool of (format, row length, scale).
    Blocks(Scale),
}

/// The tensors of shape `c` in GGUF order (experts stacked as `[n_experts, rows, cols]`), with
/// the storage type `qtype` gives each and what fills it.
fn file_tensors(c: &ModelConfig, qtype: QuantType) -> Vec<(TensorOut, Fill)> {
    if c.hybrid.is_some() {
        return hybrid_file_tensors(c, qtype);
    }
    let extras = HfExtras { hf_arch: String::new(), qkv_bias: c.arch.family().attention.qkv_bias };
    let mut out: Vec<(TensorOut, Fill)> = Vec::new();
    for p in tensor_plan(c, &extras) {
        let name = p.gguf;
        if p.expert.is_some() {
            // One stacked tensor per layer and projection, met first at expert 0.
            if let Some((t, _)) = out.iter_mut().find(|(t, _)| t.name == name) {
                t.shape[0] += 1;
                continue;
            }
        }
        let shape = match p.expert {
            Some(_) => [vec![1], p.shape].concat(),
            None => p.shape,
        };
        let (dtype, fill) = if shape.len() == 1 {
            let bias = name.ends_with(".bias");
            (GgmlType::F32, if bias { Fill::Uniform(0.1) } else { Fill::Ones })
        } else {
            // The shared expert's gate row stays F32 as the converter writes it (as in the
            // hybrid files below); the router is kept F32 by `choose`. Both as values, every
            // matrix else as blocks.
            let gate_row = name.ends_with("ffn_gate_inp_shexp.weight");
            let dtype = if gate_row { GgmlType::F32 } else { choose_in(qtype, &name, &shape, &mix_model(c)).dtype };
            let router = name.ends_with("ffn_gate_inp.weight") || gate_row;
            let fill = if router {
                Fill::Uniform((3.0 / c.dim as f32).sqrt())
            } else {
                Fill::Blocks(scale_of(&name, c.n_layers))
            };
            (dtype, fill)
        };
        out.push((TensorOut { name, dtype, shape }, fill));
    }
    out
}

/// What the type mix rules read of shape `c` (no importance matrix: random weights).
fn mix_model(c: &ModelConfig) -> MixModel {
    MixModel {
        tied_head: c.tied_embeddings,
        n_layers: c.n_layers,
        n_experts: c.moe.as_ref().map_or(0, |m| m.n_experts),
        has_imatrix: false,
    }
}

/// The tensors a synthetic file of shape `c` in the `qtype` mix holds (names, shapes and
/// types as llama.cpp's converter and quantizer would write them).
pub fn synthetic_tensors(c: &ModelConfig, qtype: QuantType) -> Vec<TensorOut> {
    file_tensors(c, qtype).into_iter().map(|(t, _)| t).collect()
}

/// The architecture metadata of a synthetic file of shape `c` (without the tokenizer's).
pub fn synthetic_kv(c: &ModelConfig, qtype: QuantType, name: &str) -> Vec<(String, Value)> {
    let extras = KvExtras { shared_ffn: HfLayout::native(c).shared_ffn, rope_sections: None };
    let mut kv = model_kv_with(c, name, &extras);
    for (k, v) in kv.iter_mut() {
        if k == "general.file_type" {
            *v = Value::U32(qtype.file_type());
        }
    }
    kv
}

/// The tensors of hybrid shape `c`: llama.cpp's converter's list (`hf_hybrid`), matrices in
/// the `qtype` mix, the converter's F32 tensors kept F32: norms 1, `ssm_a` negative (a decay),
/// conv taps, biases, the router and the shared expert's gate uniform.
fn hybrid_file_tensors(c: &ModelConfig, qtype: QuantType) -> Vec<(TensorOut, Fill)> {
    hybrid_outputs(c, &HfLayout::native(c))
        .into_iter()
        .map(|t| {
            let mut out = t.out;
            let name = out.name.clone();
            let fill = if out.dtype != GgmlType::F32 {
                out.dtype = choose_in(qtype, &name, &out.shape, &mix_model(c)).dtype;
                Fill::Blocks(scale_of(&name, c.n_layers))
            } else if name.ends_with("norm.weight") {
                Fill::Ones
            } else if name.ends_with(".ssm_a") {
                Fill::Range(-8.0, -0.5)
            } else {
                let cols = *out.shape.last().unwrap_or(&1);
                Fill::Uniform((3.0 / cols as f32).sqrt().min(0.5))
            };
            (out, fill)
        })
        .collect()
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

type PoolKey = (GgmlType, usize, Scale);

/// A pool of `POOL_BLOCKS` units of `unit` elements of `dtype`, quantized from values uniform in
/// +-`scale`'s amplitude for rows of `cols` elements.
fn pool(dtype: GgmlType, cols: usize, scale: Scale, unit: usize, seed: u64) -> Vec<u8> {
    let a = scale.amplitude(cols);
    // The matrices' pools as before the other scales existed (the same seed, the same blocks).
    let salt = if scale == Scale::Matrix { 0 } else { splitmix64(a.to_bits() as u64) };
    let mut rng = StdRng::seed_from_u64(seed ^ (cols as u64) << 8 ^ dtype as u64 ^ salt);
    let vals: Vec<f32> = (0..POOL_BLOCKS * unit).map(|_| rng.random_range(-a..a)).collect();
    quantize_row(dtype, &vals)
}

/// Elements per pool unit: the format's block, at least 32 elements where rows allow it.
fn unit_of(dtype: GgmlType, cols: usize) -> usize {
    let b = dtype.block_size();
    if b < 32 && cols.is_multiple_of(32) {
        32
    } else {
        b
    }
}

fn tensor_bytes(t: &TensorOut, fill: Fill, idx: usize, seed: u64, pools: &HashMap<PoolKey, Vec<u8>>) -> Vec<u8> {
    let n: usize = t.shape.iter().product();
    match fill {
        Fill::Ones => (0..n).flat_map(|_| 1f32.to_le_bytes()).collect(),
        Fill::Uniform(a) => {
            let mut rng = StdRng::seed_from_u64(seed ^ splitmix64(idx as u64));
            (0..n).flat_map(|_| rng.random_range(-a..a).to_le_bytes()).collect()
        }
        Fill::Range(lo, hi) => {
            let mut rng = StdRng::seed_from_u64(seed ^ splitmix64(idx as u64));
            (0..n).flat_map(|_| rng.random_range(lo..hi).to_le_bytes()).collect()
        }
        Fill::Blocks(scale) => {
            let cols = *t.shape.last().unwrap_or(&1);
            let unit = unit_of(t.dtype, cols);
            let ub = t.dtype.row_bytes(unit).unwrap_or(0);
            let pool = &pools[&(t.dtype, cols, scale)];
            let mut out = vec![0u8; n / unit * ub];
            let key = splitmix64(seed ^ splitmix64(idx as u64 + 1));
            out.par_chunks_mut(ub * 1024).enumerate().for_each(|(c, chunk)| {
                for (j, u) in chunk.chunks_mut(ub).enumerate() {
                    let pick = (splitmix64(key ^ (c * 1024 + j) as u64) % POOL_BLOCKS as u64) as usize;
                    u.copy_from_slice(&pool[pick * ub..(pick + 1) * ub]);
                }
            });
            out
        }
    }
}

/// Writes the file (complete or not at all: `write_gguf` renames it into place at the end).
/// `progress(done, total)` is called after each tensor with bytes of tensor data.
pub fn write_synthetic_gguf(o: &SynthOptions, mut progress: impl FnMut(u64, u64)) -> Result<SynthSummary, SynthError> {
    let mut c = shape(&o.shape).ok_or_else(|| SynthError::UnknownShape(o.shape.clone()))?;
    let qtype = QuantType::parse(&o.qtype).ok_or_else(|| SynthError::UnknownType(o.qtype.clone()))?;
    let mut cut = String::new();
    if let Some(n) = o.layers {
        if n == 0 || n > c.n_layers {
            return Err(SynthError::Layers { given: n, shape: o.shape.clone(), has: c.n_layers });
        }
        cut = format!(", first {n} of {} layers", c.n_layers);
        c.keep_first_layers(n);
    }
    let name = format!("synthetic {} ({}{cut})", o.shape, qtype.name());
    if o.output.exists() && !o.force {
        return Err(SynthError::Exists(o.output.clone()));
    }
    let tensors = file_tensors(&c, qtype);
    let mut kv = synthetic_kv(&c, qtype, &name);
    kv.extend(tokenizer_kv(&o.tokenizer, c.vocab_size)?);

    let mut pools: HashMap<PoolKey, Vec<u8>> = HashMap::new();
    for (t, fill) in &tensors {
        let cols = *t.shape.last().unwrap_or(&1);
        if let Fill::Blocks(scale) = *fill {
            pools
                .entry((t.dtype, cols, scale))
                .or_insert_with(|| pool(t.dtype, cols, scale, unit_of(t.dtype, cols), o.seed));
        }
    }
    let sizes: Vec<u64> = tensors.iter().map(|(t, _)| t.n_bytes() as u64).collect();
    let total: u64 = sizes.iter().sum();
    let mut done = 0u64;
    let outs: Vec<TensorOut> = tensors.iter().map(|(t, _)| t.clone()).collect();
    write_gguf::<SynthError>(&o.output, &kv, &outs, |i| {
        let (t, fill) = &tensors[i];
        let b = tensor_bytes(t, *fill, i, o.seed, &pools);
        done += sizes[i];
        progress(done, total);
        Ok(b)
    })?;
    let mut by: Vec<(String, u64)> = Vec::new();
    for (t, s) in outs.iter().zip(&sizes) {
        match by.iter_mut().find(|(n, _)| *n == t.dtype.name()) {
            Some((_, b)) => *b += s,
            None => by.push((t.dtype.name().to_string(), *s)),
        }
    }
    let file_bytes = std::fs::metadata(&o.output).map(|m| m.len()).unwrap_or(0);
    Ok(SynthSummary {
        output: o.output.clone(),
        shape: o.shape.clone(),
        qtype: qtype.name().into(),
        tensors: outs.len(),
        file_bytes,
        bytes_by_type: by,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_30b_a3b_q4_k_m_has_the_llama_cpp_mix_and_size() {
        let c = shape("qwen3-30b-a3b").unwrap();
        let t = file_tensors(&c, QuantType::Q4KM);
        let find = |n: &str| t.iter().find(|(x, _)| x.name == n).unwrap().0.clone();
        let down0 = find("blk.0.ffn_down_exps.weight");
        assert_eq!((down0.shape.clone(), down0.dtype), (vec![128, 2048, 768], GgmlType::Q6K));
        assert_eq!(find("blk.6.ffn_down_exps.weight").dtype, GgmlType::Q4K);
        assert_eq!(find("blk.6.ffn_gate_exps.weight").shape, vec![128, 768, 2048]);
        assert_eq!(find("blk.3.ffn_gate_inp.weight").dtype, GgmlType::F32);
        assert_eq!(find("output.weight").dtype, GgmlType::Q6K);
        // 3 stacked expert tensors, router, q/k/v/o, 4 norms per layer; embedding, head, norm.
        assert_eq!(t.len(), 48 * 12 + 3);
        let total: u64 = t.iter().map(|(x, _)| x.n_bytes() as u64).sum();
        // llama.cpp's Q4_K_M file of this shape is 18.56 GB.
        assert!((18.3e9..18.8e9).contains(&(total as f64)), "{total}");
    }

    #[test]
    fn pool_blocks_fill_whole_rows() {
        let t = TensorOut { name: "blk.0.attn_q.weight".into(), dtype: GgmlType::Q4K, shape: vec![3, 512] };
        let key = (GgmlType::Q4K, 512, Scale::Matrix);
        let pools = HashMap::from([(key, pool(GgmlType::Q4K, 512, Scale::Matrix, 256, 1))]);
        let fill = Fill::Blocks(Scale::Matrix);
        let b = tensor_bytes(&t, fill, 0, 7, &pools);
        assert_eq!(b.len(), t.n_bytes());
        assert_ne!(b, tensor_bytes(&t, fill, 1, 7, &pools), "tensors draw different blocks");
        assert_eq!(b, tensor_bytes(&t, fill, 0, 7, &pools), "the same seed gives the same file");
    }
}
