//! `CudaBackend`: the forward pass on one GPU. Weights F16 or in their packed block formats
//! (QKV and gate/up stacked so one launch reads the shared input once), f32 residual stream and
//! activations, F16 paged KV cache; each matrix product's kernel is chosen by (format, tokens
//! in the step) in `matmul` (GEMV, tensor-core GEMM, cuBLAS).
//! Construction (from loaded weights, or random weights made on the GPU) and the `Backend`
//! entry points live here; the step itself in `step::inputs` (the plan flattened into the step
//! inputs), `step::run` (the layers' kernels, graph replay) and `step::attn` (the step's attention).

use std::path::PathBuf;

use cudarc::cublas::CudaBlas;
use cudarc::driver::CudaSlice;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::compile::kernels::{Kernels, PtxSource};
use super::compile::model_entries::ModelEntries;
use super::device::{up, zeros, CudaDevice};
use super::dmat::{DevMat, Linear};
use super::layer::{AttnW, FfnW, LayerW, MixerW};
use super::plan::memory::{
    device_matrices, device_weight_bytes, f16_matrix_bytes, plan_memory_for, prefill_chunk, wide_len,
};
use super::plan::seqs::SeqPlan;
use super::qformat::{check_tensor, QFormat};
use super::step::graph::StepGraphs;
use super::step::workspace::Work;
use super::synth::mix::{synthetic_experts, synthetic_matrix_bytes, synthetic_shapes, WeightMix};
use super::tap::CudaTap;
use super::CudaError;
use crate::backend::kv_type::KvType;
use crate::backend::{Backend, BackendError};
use crate::engine::plan::StepPlan;
use crate::model::config::ModelConfig;
use crate::model::layer::{AttentionWeights, Ffn, Mixer};
use crate::model::quant::GgmlType;
use crate::model::rope::rope_table;
use crate::model::synth_scale::Scale;
use crate::model::weights::{ModelWeights, Tensor};

/// How to place a model on a GPU.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    pub ordinal: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    /// Precompiled PTX folder (`--ptx-dir`); `None`: `DUSTOFF_PTX_DIR`, else NVRTC.
    pub ptx_dir: Option<PathBuf>,
    /// Positions the RoPE tables cover (the longest sequence a plan may reach).
    pub max_positions: usize,
    /// Tokens of the largest step the memory plan reserves workspace for (the engine's
    /// `max_batch_tokens`); steps past it grow the buffers beyond the plan.
    pub max_batch_tokens: usize,
    /// `--weights f16`: widen block-format weights to F16 at load (the path before quantized
    /// kernels, kept for comparison) instead of keeping them packed.
    pub f16_weights: bool,
    /// Sequences that run at once (the engine's slots): the recurrent-state pool of hybrid
    /// models and the logits rows of a step are planned for them.
    pub max_seqs: usize,
    /// Hybrid models: prefix-reuse state snapshots kept at once (the engine evicts its least
    /// recently used beyond them); [`SeqPlan::new`] gives the default.
    pub max_snapshots: usize,
    /// `--max-gpu-memory`: the plan is checked against the smaller of the free memory and this
    /// cap less the CUDA context (`budget::available`); `None`: the free memory.
    pub max_memory: Option<super::plan::budget::MemoryCap>,
    /// `--kv-cache`: the element type of the paged KV cache.
    pub kv_type: KvType,
    /// Load cuBLAS for prefill-sized products when the library is present ([`cublas_wanted`]:
    /// unless `DUSTOFF_CUBLAS=0`); false: dustoff's tensor-core GEMM in 64-token slices.
    pub cublas: bool,
}

impl CudaOptions {
    /// The sequences the plan and the state pool are sized for.
    pub fn seqs(&self) -> SeqPlan {
        SeqPlan { running: self.max_seqs.max(1), snapshots: self.max_snapshots }
    }
}

/// The environment variable that turns CUDA-graph replay of decode steps off (`0`).
pub const GRAPHS_ENV: &str = "DUSTOFF_CUDA_GRAPHS";

pub struct CudaBackend {
    pub(super) cfg: ModelConfig,
    pub(super) dev: CudaDevice,
    pub(super) kernels: Kernels,
    /// cuBLAS for prefill-sized F16 products; None when the library is absent (or
    /// `DUSTOFF_CUBLAS=0`): then they run on dustoff's tensor-core GEMM in 64-token slices.
    pub(super) blas: Option<CudaBlas>,
    pub(super) layers: Vec<LayerW>,
    pub(super) embd: Linear,           // [vocab, dim], one part
    pub(super) output: Option<Linear>, // [vocab, dim]; None: tied to embd
    /// F16 scratch `[largest layer matrix]` that quantized matrices are widened into for steps
    /// of more than 8 tokens (None when every matrix is F16).
    pub(super) wide: Option<CudaSlice<u16>>,
    pub(super) output_norm: CudaSlice<f32>, // [dim]
    pub(super) rope_cos: CudaSlice<f32>,    // [max_pos, rotary_dim / 2] (ModelConfig::rope_rotation)
    pub(super) rope_sin: CudaSlice<f32>,
    pub(super) max_pos: usize,
    pub(super) block_size: usize,
    pub(super) num_blocks: usize,
    /// Columns of the device block-table matrix: fixed (covers `max_pos`), so a captured graph
    /// stays valid as sequences grow.
    pub(super) bt_stride: usize,
    pub(super) work: Work,
    /// Host staging of the per-step inputs (same layout as `Work::meta`).
    pub(super) host_meta: Vec<i32>,
    /// Captured decode steps by shape.
    pub(super) graphs: StepGraphs,
    /// Layer norms folded into the products that read them (fused_norm.rs; `DUSTOFF_FUSE_NORM=0`
    /// or [`CudaBackend::set_fuse_norm`] turns it off).
    pub(super) fuse_norm: bool,
    /// `DUSTOFF_PROFILE=1`: per-kernel-class GPU times (graphs off).
    pub(super) prof: Option<super::profile::Profiler>,
    /// `DUSTOFF_STEP_TIMES=1`: GPU time against period per step size (graphs on).
    pub(super) step_times: Option<super::profile::StepTimes>,
    /// Weight values clamped to the F16 range at load.
    pub clamped_weights: u64,
    /// Bytes of weights on the device.
    pub weight_bytes: usize,
    /// Matrices per weight format (`Q4_K: 217`, ...), for the log line.
    pub formats: Vec<(crate::model::quant::GgmlType, usize)>,
    /// Bytes of weights one decode step reads (every matrix, the head, one embedding row).
    pub(super) decode_bytes: u64,
    /// Most device memory seen in use (total - free), read after every allocation.
    pub(super) peak_used: u64,
    /// Hybrid models (Qwen3.5, Qwen3.5-MoE, Qwen3-Next): the recurrent-state pool and the step
    /// buffers of their layers (`hybrid.rs`).
    pub(super) recurrent: Option<super::hybrid::RecurrentCuda>,
    /// Calibration: every matrix input goes to the host (`tap.rs`); `None` in normal runs.
    pub(super) tap: Option<super::tap::CudaTap>,
    /// A tensor-parallel rank (`tensor_parallel`): its place and its all-reduce.
    pub(super) tp: Option<super::tp::rank::CudaRank>,
    /// The shared expert's gate folded into its down product's int8 input (`DUSTOFF_SHEXP_FUSED`).
    pub(super) fold_shexp_gate: bool,
}

/// Weights on the device, before the backend is assembled.
pub(super) struct Parts {
    pub layers: Vec<LayerW>,
    pub embd: Linear,
    pub output: Option<Linear>,
    pub output_norm: CudaSlice<f32>,
    pub rope_freq_factors: Option<Vec<f32>>,
    pub clamped: u64,
    pub recurrent: Option<super::hybrid::RecurrentCuda>,
}

/// Device, kernels and cuBLAS, after the memory plan (`matrix_bytes` of weight matrices on the
/// device) was checked against the free memory.
pub(super) fn open(
    cfg: &ModelConfig,
    opts: &CudaOptions,
    matrix_bytes: u64,
) -> Result<(CudaDevice, Kernels, Option<CudaBlas>), CudaError> {
    if let Some(why) = opts.kv_type.refusal(cfg.head_dim) {
        return Err(CudaError::Weights(why));
    }
    let dev = CudaDevice::new(opts.ordinal)?;
    let wide = if matrix_bytes < f16_matrix_bytes(cfg) { wide_len(cfg) as u64 * 2 } else { 0 };
    let (blocks, bs) = (opts.num_blocks, opts.block_size);
    // One sequence's prompt may run in steps of `prefill_chunk` tokens (SingleSeq::feed).
    let (tok, pos) = (opts.max_batch_tokens.max(prefill_chunk(cfg, wide)), opts.max_positions);
    let plan =
        plan_memory_for(cfg, matrix_bytes, wide, blocks, bs, tok, pos, opts.seqs()).with_kv_type(cfg, opts.kv_type);
    let (free, _) = dev.mem_info()?;
    let avail = super::plan::budget::available(opts.max_memory, free as u64);
    let device = super::plan::budget::label(&dev.describe(), opts.max_memory);
    plan.check(avail, &device, opts.num_blocks * opts.block_size, cfg).map_err(CudaError::OutOfMemory)?;
    let kernels = Kernels::new(dev.ctx.clone(), dev.arch(), PtxSource::resolve(opts.ptx_dir.clone()));
    super::device::log_memory(&dev.stream, "CUDA context", 0);
    let blas = open_cublas(&dev, opts.cublas)?;
    Ok((dev, kernels, blas))
}

/// The environment variable that keeps cuBLAS unloaded (`0`): prefill products then run on
/// dustoff's own tensor-core GEMM, as on a server whose driver came without the CUDA libraries.
pub const CUBLAS_ENV: &str = "DUSTOFF_CUBLAS";

/// Whether the environment lets dustoff load cuBLAS (`DUSTOFF_CUBLAS` is not `0`).
pub fn cublas_wanted() -> bool {
    crate::sys::env::get(CUBLAS_ENV).is_none_or(|v| v != "0")
}

/// cuBLAS when it can be loaded and `wanted`; else None, said on stderr when it is missing. A
/// server with only the NVIDIA driver has no libcublas: dustoff then needs nothing but libcuda
/// and the PTX of `dustoff kernels`.
fn open_cublas(dev: &CudaDevice, wanted: bool) -> Result<Option<CudaBlas>, CudaError> {
    if !wanted {
        return Ok(None);
    }
    // SAFETY: only tries to dlopen the candidate names; CudaBlas::new would panic without one.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        eprintln!(
            "note: cuBLAS (libcublas) not found: prefill products run on dustoff's tensor-core GEMM \
             (64-token slices; slower prompts, same F32 accumulation)"
        );
        return Ok(None);
    }
    let blas = CudaBlas::new(dev.stream.clone())
        .map_err(|source| CudaError::Cublas { what: "creating a handle".into(), source })?;
    super::device::log_memory(&dev.stream, "cuBLAS handle", 0);
    Ok(Some(blas))
}

/// Uploads tensors stacked as one matrix (a name for errors).
type UploadFn<'a> = dyn FnMut(&[&Tensor], &str) -> Result<Linear, CudaError> + 'a;

/// A layer's FFN on the device: experts (their clamped values added to `moe_clamped`) or the
/// dense gate/up and down through `put`.
fn upload_ffn(
    s: &std::sync::Arc<cudarc::driver::CudaStream>,
    ffn: Ffn,
    f16: bool,
    put: &mut UploadFn,
    moe_clamped: &mut u64,
    name: &dyn Fn(&str) -> String,
) -> Result<FfnW, CudaError> {
    Ok(match ffn {
        Ffn::Moe(m) => {
            let (m, c) = super::moe::MoeLayerW::upload(s, m, f16, &name("experts"))?;
            *moe_clamped += c;
            FfnW::Moe(Box::new(m))
        }
        Ffn::Dense(d) => {
            FfnW::Dense { wgu: put(&[d.gate, d.up], &name("gate/up"))?, wdown: put(&[d.down], &name("w_down"))? }
        }
    })
}

/// The Q/K/V biases of `a` as one `[q_dim + 2 kv_dim]` vector (zeros for an absent one), or
/// `None` when the layer has none.
fn qkv_bias(c: &ModelConfig, a: &AttentionWeights) -> Option<Vec<f32>> {
    if a.bq.is_none() && a.bk.is_none() && a.bv.is_none() {
        return None;
    }
    let or_zeros = |b: Option<&[f32]>, n: usize| b.map_or_else(|| vec![0.0; n], <[f32]>::to_vec);
    let mut b = or_zeros(a.bq, c.q_dim());
    b.extend(or_zeros(a.bk, c.kv_dim()));
    b.extend(or_zeros(a.bv, c.kv_dim()));
    Some(b)
}

impl CudaBackend {
    pub fn new(cfg: ModelConfig, w: &ModelWeights, opts: &CudaOptions) -> Result<Self, CudaError> {
        // Every matrix is checked (shape, bytes, row length) before anything is allocated.
        for t in device_matrices(&cfg, w) {
            check_tensor(t)?;
        }
        for m in w.layers.iter().filter_map(|l| l.typed().ffn.experts()) {
            super::moe::check_layer(m)?;
        }
        let matrix_bytes = device_weight_bytes(&cfg, w, opts.f16_weights).matrices;
        let (dev, kernels, blas) = open(&cfg, opts, matrix_bytes)?;
        let s = &dev.stream;
        let f16 = opts.f16_weights;
        let mut clamped = 0u64;
        let mut moe_clamped = 0u64;
        let mut put = |ts: &[&Tensor], what: &str| -> Result<Linear, CudaError> {
            let (l, c) = Linear::upload(s, ts, f16, what)?;
            clamped += c;
            Ok(l)
        };
        let c = &cfg;
        // Values of one layer's K (and of its V) cache: [num_blocks, block_size, kv_dim].
        let cache_len = opts.num_blocks * opts.block_size * c.kv_dim();
        let mut layers = Vec::with_capacity(w.layers.len());
        let (mut n_linear, mut linear_clamped) = (0, 0u64);
        for (i, lw) in w.layers.iter().enumerate() {
            let name = |s: &str| format!("layer {i} {s}");
            let layer = lw.typed();
            if layer.kind().has_kv() != c.has_kv(i) {
                return Err(CudaError::Weights(format!(
                    "layer {i} is {:?} by the model's configuration, but its weights are of a {:?} layer",
                    c.layer_kind(i).mixer,
                    layer.kind().mixer
                )));
            }
            let mixer = match layer.mixer {
                Mixer::Attention(a) | Mixer::GatedAttention(a) => {
                    let bqkv = qkv_bias(c, &a).map(|b| up(s, &b, &name("qkv bias"))).transpose()?;
                    let (k_cache, v_cache, kv_scales) = super::layer::kv_caches(s, opts.kv_type, cache_len, &name)?;
                    MixerW::Attention(AttnW {
                        wqkv: put(&[a.wq, a.wk, a.wv], &name("wqkv"))?,
                        bqkv,
                        q_norm: a.q_norm.map(|v| up(s, v, &name("q_norm"))).transpose()?,
                        k_norm: a.k_norm.map(|v| up(s, v, &name("k_norm"))).transpose()?,
                        wo: put(&[a.wo], &name("wo"))?,
                        k_cache,
                        v_cache,
                        kv_scales,
                    })
                }
                // A linear-attention layer: no KV cache; its state lives in the recurrent-state pool (`RecurrentCuda`).
                Mixer::DeltaNet(d) => {
                    let d = super::hybrid::upload_linear(s, i, d, n_linear, f16, &mut linear_clamped)?;
                    n_linear += 1;
                    MixerW::DeltaNet(d)
                }
            };
            layers.push(LayerW {
                attn_norm: up(s, layer.attn_norm, &name("attn_norm"))?,
                mixer,
                ffn_norm: up(s, layer.ffn_norm, &name("ffn_norm"))?,
                ffn: upload_ffn(s, layer.ffn, f16, &mut put, &mut moe_clamped, &name)?,
            });
        }
        let embd = put(&[&w.token_embd], "token_embd")?;
        let output = if c.tied_embeddings { None } else { Some(put(&[&w.output], "output")?) };
        let output_norm = up(s, &w.output_norm, "output_norm")?;
        let clamped = clamped + moe_clamped + linear_clamped;
        let recurrent = super::hybrid::RecurrentCuda::for_model(s, c, n_linear, opts.seqs())?;
        let rope_freq_factors = w.rope_freq_factors.clone();
        let parts = Parts { layers, embd, output, output_norm, rope_freq_factors, clamped, recurrent };
        Self::assemble(cfg, dev, kernels, blas, parts, opts)
    }

    /// A model of shape `cfg` with random F16 weights made on the GPU (uniform in
    /// +-sqrt(3 / cols), like `model::synth`; norms 1; Qwen2 biases in +-0.1), so benchmarks of
    /// 8B shapes need no host copy of the weights. Deterministic for a seed and device.
    pub fn synthetic(cfg: ModelConfig, seed: u64, opts: &CudaOptions) -> Result<Self, CudaError> {
        Self::synthetic_mix(cfg, WeightMix::Uniform(GgmlType::F16), seed, opts)
    }

    /// As [`CudaBackend::synthetic`], with the weight formats of `mix`: block formats get random
    /// codes and realistic scales (`DevMat::synthetic`), kept packed on the GPU.
    pub fn synthetic_mix(cfg: ModelConfig, mix: WeightMix, seed: u64, opts: &CudaOptions) -> Result<Self, CudaError> {
        let c = &cfg;
        if c.has_hybrid_mixers() {
            return Self::synthetic_hybrid(cfg, mix, seed, opts);
        }
        let shapes = synthetic_shapes(c, mix);
        let matrix_bytes = synthetic_matrix_bytes(c, mix);
        let (dev, mut kernels, blas) = open(&cfg, opts, matrix_bytes)?;
        let s = &dev.stream;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut n_mat = 0u64;
        let mut shape_iter = shapes.into_iter();
        // Parts of one format stack into one matrix, as `Linear::upload` stacks loaded tensors.
        let mut lin = |kernels: &mut Kernels, n: usize, scale: Scale, what: &str| -> Result<Linear, CudaError> {
            let mut parts: Vec<DevMat> = Vec::new();
            let mut pending: Vec<(GgmlType, usize, usize)> = (0..n).filter_map(|_| shape_iter.next()).collect();
            while !pending.is_empty() {
                let t = pending[0].0;
                let k = pending.iter().take_while(|p| p.0 == t).count();
                let rows = pending[..k].iter().map(|p| p.1).sum();
                let cols = pending[0].2;
                n_mat += 1;
                let seed = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(n_mat);
                parts.push(DevMat::synthetic(s, kernels, t, rows, cols, (scale, seed), what)?);
                pending.drain(..k);
            }
            Ok(Linear { parts })
        };
        let ones = |n: usize, what: &str| up(s, &vec![1.0f32; n], what);
        // f16 elements of one layer's K (and of its V) cache: [num_blocks, block_size, kv_dim].
        let cache_len = opts.num_blocks * opts.block_size * c.kv_dim();
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let name = |s: &str| format!("layer {i} {s}");
            let bqkv = if c.arch.family().attention.qkv_bias {
                let b: Vec<f32> = (0..c.q_dim() + 2 * c.kv_dim()).map(|_| rng.random_range(-0.1..0.1)).collect();
                Some(up(s, &b, &name("qkv bias"))?)
            } else {
                None
            };
            let qk = c.arch.family().attention.qk_norm;
            let wqkv = lin(&mut kernels, 3, Scale::Matrix, &name("wqkv"))?;
            let wo = lin(&mut kernels, 1, Scale::Residual(c.n_layers as u32), &name("wo"))?;
            let ffn = match synthetic_experts(s, &mut kernels, c, mix, i, seed)? {
                Some(w) => FfnW::Moe(Box::new(w)),
                None => FfnW::Dense {
                    wgu: lin(&mut kernels, 2, Scale::Matrix, &name("gate/up"))?,
                    wdown: lin(&mut kernels, 1, Scale::Matrix, &name("w_down"))?,
                },
            };
            let attn = AttnW::synthetic(s, c.head_dim, i, (cache_len, opts.kv_type), (wqkv, bqkv, wo), qk)?;
            layers.push(LayerW::synthetic(s, c.dim, i, MixerW::Attention(attn), ffn)?);
        }
        let embd = lin(&mut kernels, 1, Scale::Unit, "token_embd")?;
        let output = if c.tied_embeddings { None } else { Some(lin(&mut kernels, 1, Scale::Matrix, "output")?) };
        let output_norm = ones(c.dim, "output_norm")?;
        dev.synchronize()?;
        let parts = Parts { layers, embd, output, output_norm, rope_freq_factors: None, clamped: 0, recurrent: None };
        Self::assemble(cfg, dev, kernels, blas, parts, opts)
    }

    pub(super) fn assemble(
        cfg: ModelConfig,
        dev: CudaDevice,
        mut kernels: Kernels,
        blas: Option<CudaBlas>,
        p: Parts,
        opts: &CudaOptions,
    ) -> Result<Self, CudaError> {
        let c = &cfg;
        let s = &dev.stream;
        // Every attention layer's rotation (partial for the hybrid models): `[max_pos, rotary_dim / 2]`.
        let (inv_freq, _) = c.rope_rotation(p.rope_freq_factors.as_deref());
        let max_pos = opts.max_positions.max(1);
        let positions: Vec<usize> = (0..max_pos).collect();
        let (cos, sin) = rope_table(&positions, &inv_freq);
        let rope_cos = up(s, &cos, "RoPE cos table")?;
        let rope_sin = up(s, &sin, "RoPE sin table")?;
        // What a decode step reads: every layer matrix, the head, one embedding row.
        let embd_m = &p.embd.parts[0];
        let head = p.output.as_ref().map_or(embd_m.bytes(), Linear::bytes);
        // A sparse layer: its router and the n_used experts one token reads (of all it holds).
        let dense: u64 = p
            .layers
            .iter()
            .flat_map(|l| l.mixer.mats().into_iter().chain(l.ffn.dense_mats()))
            .map(Linear::bytes)
            .sum::<u64>();
        let moe = p.layers.iter().filter_map(|l| l.ffn.experts());
        let (moe_all, moe_active) = moe.fold((0, 0), |(a, b), m| (a + m.bytes(), b + m.active_bytes()));
        let decode_bytes = dense + moe_active + head + embd_m.row_bytes();
        let weight_bytes = (dense + moe_all + embd_m.bytes() + p.output.as_ref().map_or(0, Linear::bytes)) as usize;
        let mut formats: Vec<(GgmlType, usize)> = Vec::new();
        let all = p
            .layers
            .iter()
            .flat_map(|l| l.mixer.mats().into_iter().chain(l.ffn.dense_mats()))
            .chain([&p.embd])
            .chain(p.output.as_ref());
        let shared = p.layers.iter().filter_map(|l| l.ffn.experts()?.shared.as_ref()).flat_map(|x| x.mats());
        let slabs = p.layers.iter().filter_map(|l| l.ffn.experts()).flat_map(|m| m.slabs()).chain(shared);
        for m in all.flat_map(|l| &l.parts).chain(slabs) {
            match formats.iter_mut().find(|f| f.0 == m.format()) {
                Some(f) => f.1 += 1,
                None => formats.push((m.format(), 1)),
            }
        }
        kernels.hold_only(ModelEntries::new(formats.iter().map(|f| f.0), c.head_dim));
        let quantized = formats.iter().any(|f| QFormat::of(f.0).is_some());
        let wide = if quantized && wide_len(c) > 0 {
            Some(zeros::<u16>(s, wide_len(c), "F16 scratch of widened weights")?)
        } else {
            None
        };
        let use_graphs = crate::sys::env::get(GRAPHS_ENV).is_none_or(|v| v != "0");
        let mut b = CudaBackend {
            cfg,
            kernels,
            blas,
            layers: p.layers,
            embd: p.embd,
            output: p.output,
            wide,
            output_norm: p.output_norm,
            rope_cos,
            rope_sin,
            max_pos,
            block_size: opts.block_size.max(1),
            num_blocks: opts.num_blocks,
            bt_stride: max_pos.div_ceil(opts.block_size.max(1)),
            work: Work::default(),
            host_meta: Vec::new(),
            graphs: StepGraphs::new(use_graphs),
            fuse_norm: super::tuning::tuning().fuse_norm,
            prof: super::profile::profiling_requested().then(|| super::profile::Profiler::new(dev.ctx.clone())),
            step_times: super::profile::step_times_requested().then(|| super::profile::StepTimes::new(dev.ctx.clone())),
            clamped_weights: p.clamped,
            weight_bytes,
            formats,
            decode_bytes,
            peak_used: 0,
            recurrent: p.recurrent,
            tap: None,
            tp: None,
            fold_shexp_gate: super::ops::shared_expert::gate_folded(),
            dev,
        };
        b.note_memory();
        super::device::log_memory(&b.dev.stream, "ready (weights, KV, tables)", 0);
        Ok(b)
    }

    /// Sets the tap that sees every matrix input from the next step on.
    pub fn set_tap(&mut self, tap: CudaTap) {
        self.tap = Some(tap);
    }

    /// Removes the tap (and with it the extra work per step).
    pub fn take_tap(&mut self) -> Option<CudaTap> {
        self.tap.take()
    }

    pub fn device(&self) -> &CudaDevice {
        &self.dev
    }

    /// Compiles (or loads) every kernel now, so that it stays out of timings.
    pub fn load_kernels(&mut self) -> Result<(), CudaError> {
        self.kernels.load_all()
    }

    /// Folds the layer norms into the products that read them, or launches them on their own
    /// (for same-process comparisons; the default comes from `DUSTOFF_FUSE_NORM`).
    pub fn set_fuse_norm(&mut self, on: bool) {
        self.fuse_norm = on;
        self.graphs.clear(); // captured with the other kernels
    }

    /// Hybrid models: the fused decode launches of the linear layers (delta rule + gated norm +
    /// the out projection's int8 input) and of the shared expert (its gate folded into the down
    /// product's int8 input) on, or their separate launches (same-process comparisons; the
    /// defaults come from `DUSTOFF_DN_RECUR_NORM` and `DUSTOFF_SHEXP_FUSED`).
    pub fn set_hybrid_fusion(&mut self, on: bool) {
        if let Some(h) = self.recurrent.as_mut() {
            h.set_fusion(on);
        }
        self.fold_shexp_gate = on;
        self.graphs.clear();
    }

    /// Starts `DUSTOFF_PROFILE`'s per-class GPU timing from the next step (graphs are skipped
    /// while it runs), or stops it and prints what it gathered (stderr).
    pub fn set_profile(&mut self, on: bool) {
        self.prof = on.then(|| super::profile::Profiler::new(self.dev.ctx.clone()));
    }

    /// Turns CUDA-graph replay of decode steps on or off (on by default unless
    /// `DUSTOFF_CUDA_GRAPHS=0`). Both paths launch the same kernels with the same arguments.
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs.on = on && super::step::graph::graphs_supported();
        if !on {
            self.graphs.clear();
        }
    }

    /// KV cache bytes per token position (all layers with a KV cache, K and V, F16).
    pub fn kv_bytes_per_token(cfg: &ModelConfig) -> usize {
        cfg.n_kv_layers() * 2 * cfg.kv_dim() * 2
    }

    /// The KV cache's element type (the 8-bit cache keeps scales beside its layers' caches).
    pub fn kv_type(&self) -> KvType {
        if self.layers.iter().any(|l| l.mixer.attention().is_some_and(|a| a.kv_scales.is_some())) {
            KvType::Q8
        } else {
            KvType::F16
        }
    }

    /// Bytes of one sequence's recurrent state on the device (hybrid models; 0 for others).
    pub fn state_bytes_per_seq(&self) -> usize {
        self.cfg.state_bytes_per_seq()
    }

    /// After a step ran: the recurrent states absorbed its chunks; the plan's `after` orders
    /// (hybrid models; nothing for others). Every step path ends with it.
    pub(super) fn end_state(&mut self, plan: &StepPlan) -> Result<(), BackendError> {
        match &mut self.recurrent {
            Some(h) => Ok(h.end_step(&self.dev.stream, plan)?),
            None => Ok(()),
        }
    }

    /// Records the device memory in use now (after allocations, not every step: the query
    /// costs a driver call).
    pub(super) fn note_memory(&mut self) {
        if let Ok((free, total)) = self.dev.mem_info() {
            self.peak_used = self.peak_used.max(total.saturating_sub(free) as u64);
        }
    }
}

impl Backend for CudaBackend {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    fn block_size(&self) -> usize {
        self.block_size
    }
    fn num_blocks(&self) -> usize {
        self.num_blocks
    }
    fn max_seq_positions(&self) -> usize {
        self.max_pos
    }
    fn describe(&self) -> String {
        let formats: Vec<String> = self.formats.iter().map(|(t, n)| format!("{n} {t}")).collect();
        let kv = if self.kv_type() == KvType::Q8 { "; KV cache q8" } else { "" };
        format!("{} [{}; matrices: {}{kv}]", self.dev.describe(), self.kernels.source().describe(), formats.join(", "))
    }
    fn step(&mut self, plan: &StepPlan) -> Result<Vec<Vec<f32>>, BackendError> {
        let f = self.flatten(plan)?;
        if f.n_tok == 0 {
            return Ok(Vec::new());
        }
        let out = self.forward(&f)?;
        self.end_state(plan)?;
        Ok(out)
    }
    fn state_slots(&self) -> crate::backend::StateSlots {
        self.recurrent.as_ref().map(|h| h.slots).unwrap_or_default()
    }
    fn prepare(&mut self) -> Result<(), BackendError> {
        Ok(self.load_kernels()?)
    }
    fn prefill_chunk(&self) -> usize {
        let wide = self.wide.as_ref().map_or(0, |w| w.len() as u64 * 2);
        prefill_chunk(&self.cfg, wide)
    }
    fn step_greedy(&mut self, plan: &StepPlan) -> Result<Vec<u32>, BackendError> {
        let f = self.flatten(plan)?;
        if f.n_tok == 0 {
            return Ok(Vec::new());
        }
        let out = self.forward_greedy(&f)?;
        self.end_state(plan)?;
        Ok(out)
    }
    fn step_greedy_masked(
        &mut self,
        plan: &StepPlan,
        fill: &mut crate::backend::masks::FillMasks<'_>,
    ) -> Result<crate::backend::masks::MaskedGreedy, BackendError> {
        let f = self.flatten(plan)?;
        if f.n_tok == 0 {
            return Ok(Default::default());
        }
        let out = self.forward_greedy_masked(&f, fill)?;
        // As `step` and `step_greedy`: the recurrent states absorbed the step's chunks.
        self.end_state(plan)?;
        Ok(out)
    }
    fn decode_weight_bytes(&self) -> u64 {
        self.decode_bytes
    }
    fn kv_bytes_per_position(&self) -> u64 {
        super::plan::memory::kv_bytes_per_position(&self.cfg, self.kv_type())
    }
    fn peak_memory_bytes(&self) -> Option<u64> {
        // Also what is held now: memory taken between the samples (cuBLAS allocates its
        // workspace and loads its kernels at the first GEMM) still counts.
        let now = self.dev.mem_info().map_or(0, |(free, total)| total.saturating_sub(free) as u64);
        super::device::log_memory(&self.dev.stream, "at the peak query", 0);
        Some(self.peak_used.max(now))
    }
    fn last_step_weight_bytes(&self, n_tok: usize) -> Option<u64> {
        self.touched_weight_bytes(n_tok)
    }
    fn tensor_flops(&self) -> Option<f64> {
        super::device::tensor_flops(&self.dev.name, self.dev.cc)
    }
    fn measure_copy_bandwidth(&mut self) -> Option<f64> {
        // 1 GiB each way when there is room (several times any L2), else a quarter of the free memory.
        let free = self.dev.mem_info().ok()?.0;
        let bytes = (1usize << 30).min(free / 4);
        self.dev.copy_bandwidth(bytes, 10).ok()
    }
}
