//! Device memory planning before anything is loaded: weights + KV cache + recurrent states
//! (hybrid models) + step workspace, checked against the device's free memory with a 5% margin.
//! A model that does not fit is refused with the numbers and what would make it fit; there is
//! no silent fallback to the CPU.
//!
//! Units: every size is in bytes, printed in GB = 1e9 bytes; the free memory is the driver's
//! `cuMemGetInfo` figure (bytes) after the CUDA context exists. A V100-SXM2-32GB has 32,510 MiB
//! = 34.09e9 bytes ([`V100_32GB_FREE`] assumes 512 MiB of it taken by the context).

use crate::backend::kv_type::KvType;
use crate::model::config::ModelConfig;
use crate::model::layer::{Ffn, FfnKind, LayerKind, MixerKind};
use crate::model::weights::{ModelWeights, Tensor};

pub use super::seqs::{SeqPlan, DEFAULT_STATE_SNAPSHOTS};
use crate::backend::cuda::moe;
use crate::backend::cuda::qformat::QFormat;

use crate::backend::cuda::hybrid;
use crate::backend::cuda::matmul;
use crate::backend::cuda::ops;
use crate::backend::cuda::ops::attention::attn_splits;
use crate::backend::cuda::ops::gemm_tc::{tc64_part_len, TC_MAX_TOKENS};
use crate::backend::cuda::ops::qlaunch::GemmQ;

/// Bytes the backend will hold on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Every weight matrix (the bytes of its device form: F16, or a block format as repacked)
    /// and vector (norms f32).
    pub weights: u64,
    /// The paged KV cache: all layers, K and V, in `kv_type`.
    pub kv: u64,
    /// The KV cache's element type ([`MemoryPlan::with_kv_type`]; F16 unless set).
    pub kv_type: KvType,
    /// Step buffers for `max_batch_tokens` tokens, logits, attention partials, RoPE tables,
    /// the F16 scratch of widened quantized matrices and the cuBLAS workspace.
    pub workspace: u64,
    /// Hybrid models: the recurrent states of `seqs.running` sequences and `seqs.snapshots`
    /// prefix-reuse snapshots (f32, every linear-attention layer); 0 for other models.
    pub state: u64,
    /// Bytes of one recurrent state (0 for models without one).
    pub state_per_seq: u64,
    pub seqs: SeqPlan,
    pub total: u64,
    /// `workspace` item by item.
    pub parts: WorkspaceParts,
}

/// The workspace of a plan by buffer, as `DUSTOFF_MEMORY_LOG=1` itemizes the allocations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WorkspaceParts {
    /// Step buffers for the step capacity (`ensure_work`): residual, normed input, qkv,
    /// attention output, gate/up, FFN activation (f32), the F16 GEMM input, the 64-token GEMMs'
    /// split-K partial sums, the step inputs and block tables.
    pub step: u64,
    /// Split attention partials and statistics.
    pub attention: u64,
    /// Final norm, logits and arg-max of the logit rows.
    pub logits: u64,
    pub rope: u64,
    pub wide_scratch: u64,
    /// Mixture-of-experts, shared-expert and linear-attention step buffers.
    pub experts_linear: u64,
    pub cublas: u64,
}

/// The share of free memory a plan may use. The plan itemizes every buffer the backend
/// allocates (weights, KV, states, snapshots, step buffers, an allowance for cuBLAS), so the
/// margin covers only what it cannot see: allocation rounding, kernel images, graph
/// instances (measured on the H200 with the Qwen3.6-35B-A3B shape: docs/BENCHMARKS.md,
/// session 5). 5% of a 32 GB V100 is 1.7 GB.
pub const HEADROOM: f64 = 0.95;

/// Device memory a CUDA context takes before anything is allocated (an assumption: the plan
/// is checked against the free memory after the context, so it never counts it; `bench
/// --plan` adds it to compare with a measured peak, which reads total - free).
pub const CONTEXT_ASSUMED: u64 = 512 << 20;

/// Free bytes of a V100-SXM2-32GB after its CUDA context: 32,510 MiB less [`CONTEXT_ASSUMED`].
pub const V100_32GB_FREE: u64 = (32_510 << 20) - CONTEXT_ASSUMED;

/// Bytes cuBLAS may take for its workspace and handles: its handle measured 9 MB with the one
/// 4 MiB workspace buffer of [`CUBLAS_WORKSPACE`] (H200, docs/BENCHMARKS.md session 8).
const CUBLAS_ALLOWANCE: u64 = 16 << 20;

/// cuBLAS's workspace pool (`:KiB:count`), read by cuBLAS when a handle is made: one 4 MiB
/// buffer, cuBLAS's own default before Hopper (the V100's). Its Hopper default, 2 x 32 MiB, is
/// 63 MB more at the handle (H200) for dustoff's only cuBLAS calls: the prefill GEMMs of one
/// stream, outside graphs.
pub const CUBLAS_WORKSPACE: &str = ":4096:1";

/// Sets `CUBLAS_WORKSPACE_CONFIG` to [`CUBLAS_WORKSPACE`] unless the user set it. For `main`,
/// before any thread starts (the environment is not safe to change while other threads may
/// read it).
pub fn default_cublas_workspace() {
    if crate::sys::env::get_os("CUBLAS_WORKSPACE_CONFIG").is_none() {
        std::env::set_var("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE);
    }
}

/// Logit rows a step may return at most, for the workspace estimate.
const MAX_LOGIT_ROWS: usize = 256;

/// Bytes of every weight matrix (layers, embedding, untied head) in F16.
/// A sparse layer counts its experts in F16 and its router at its device size (f32, 2 x).
pub fn f16_matrix_bytes(c: &ModelConfig) -> u64 {
    let (dim, qd, kvd, ffn) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
    let ffn_elems = |k: LayerKind| match (k.ffn, &c.moe) {
        (FfnKind::Moe { .. }, Some(m)) => m.n_experts * (3 * m.expert_ffn_dim * dim + 2 * dim),
        _ => 3 * ffn * dim,
    };
    let mixer = |k: LayerKind| match (k.mixer, &c.hybrid) {
        // Gated DeltaNet: stacked q|k|v, z, b, a projection and the output projection.
        (MixerKind::DeltaNet, Some(h)) => {
            (h.conv_channels() + h.value_dim() + 2 * h.n_v_heads) * dim + dim * h.value_dim()
        }
        (MixerKind::GatedAttention, _) => (2 * qd + 2 * kvd) * dim + dim * qd,
        _ => (qd + 2 * kvd) * dim + dim * qd,
    };
    let layers: usize = c.layer_kinds().into_iter().map(|k| mixer(k) + ffn_elems(k)).sum();
    let heads = c.vocab_size * dim * if c.tied_embeddings { 1 } else { 2 };
    (layers + heads) as u64 * 2
}

/// What a model's weight matrices take on the device, as the CUDA backend keeps them: block
/// formats packed (their repacked bytes), F16/BF16/F32 as F16; and the F16 scratch that
/// quantized matrices are widened into for large steps (0 when nothing is packed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceWeightBytes {
    pub matrices: u64,
    pub wide_scratch: u64,
}

/// The matrices the backend puts on the device: embedding, untied head, every layer matrix.
pub fn device_matrices<'a>(cfg: &ModelConfig, w: &'a ModelWeights) -> Vec<&'a Tensor> {
    let mut mats: Vec<&Tensor> = vec![&w.token_embd];
    if !cfg.tied_embeddings {
        mats.push(&w.output);
    }
    for lw in &w.layers {
        let layer = lw.typed();
        mats.extend(layer.mixer.matrices());
        // A sparse layer's experts are counted by `moe`.
        if let Ffn::Dense(d) = layer.ffn {
            mats.extend([d.gate, d.up, d.down]);
        }
    }
    mats
}

/// Elements of the F16 scratch that quantized matrices are widened into (matmul.rs: 0 where
/// the packed GEMM takes every step).
pub fn wide_len(c: &ModelConfig) -> usize {
    matmul::wide_scratch_len(c)
}

/// Prefill chunk of one sequence's prompt (`Backend::prefill_chunk`) on a dense model whose
/// matrices are widened to F16 for prefill steps: every chunk widens every matrix once (a
/// Qwen3-8B Q4_K_M step writes ~14 GB of F16 scratch), so 1,024 tokens take the 768-token
/// benchmark prompt in one step instead of 512 + 256 (two widenings); step buffers for 1,024
/// tokens are ~0.25 GB on that shape.
pub const PACKED_PREFILL_CHUNK: usize = 1024;

/// The prefill chunk of one sequence for a model with `wide_scratch` bytes of widening scratch
/// (0: nothing is widened): [`PACKED_PREFILL_CHUNK`] for dense models that widen, else the
/// engine's default. Mixture-of-experts and hybrid models keep the default (their expert and
/// linear-attention kernels do not widen).
pub fn prefill_chunk(c: &ModelConfig, wide_scratch: u64) -> usize {
    let default = crate::engine::single::PREFILL_CHUNK;
    if wide_scratch > 0 && crate::model::layer::describe(&c.layer_kinds()).is_none() {
        PACKED_PREFILL_CHUNK.max(default)
    } else {
        default
    }
}

/// [`DeviceWeightBytes`] of a model; `f16_weights` widens every block format at load
/// (`--weights f16`). Sparse layers count their router (f32) and expert slabs as `moe` puts
/// them on the device.
pub fn device_weight_bytes(cfg: &ModelConfig, w: &ModelWeights, f16_weights: bool) -> DeviceWeightBytes {
    let dense: u64 = device_matrices(cfg, w)
        .iter()
        .map(|t| match QFormat::of(t.dtype).filter(|_| !f16_weights) {
            Some(f) => f.device_bytes(t.rows, t.cols).1 as u64,
            None => (t.rows * t.cols * 2) as u64,
        })
        .sum();
    let experts: u64 =
        w.layers.iter().filter_map(|l| l.typed().ffn.experts()).map(|m| moe::layer_bytes(m, f16_weights)).sum();
    let matrices = dense + experts;
    let wide_scratch = if matrices < f16_matrix_bytes(cfg) { wide_len(cfg) as u64 * 2 } else { 0 };
    DeviceWeightBytes { matrices, wide_scratch }
}

/// The plan for a model whose matrices take `matrices` bytes on the device, with a scratch of
/// `wide_scratch` bytes for widened quantized matrices (0 for F16 weights); one sequence may
/// hold every cached position.
pub fn plan_memory(
    cfg: &ModelConfig,
    matrices: u64,
    wide_scratch: u64,
    num_blocks: usize,
    block_size: usize,
    max_batch_tokens: usize,
    seqs: SeqPlan,
) -> MemoryPlan {
    let positions = num_blocks * block_size;
    plan_memory_for(cfg, matrices, wide_scratch, num_blocks, block_size, max_batch_tokens, positions, seqs)
}

/// [`plan_memory`] for a backend whose sequences reach at most `max_positions` positions
/// (`CudaOptions::max_positions`): the RoPE tables, block-table rows and attention partials
/// are sized by the longest sequence, not by the whole KV pool (64 sequences of 4,096
/// positions need the partials of one 4,096-position sequence per token, not of 262,144).
#[allow(clippy::too_many_arguments)]
pub fn plan_memory_for(
    cfg: &ModelConfig,
    matrices: u64,
    wide_scratch: u64,
    num_blocks: usize,
    block_size: usize,
    max_batch_tokens: usize,
    max_positions: usize,
    seqs: SeqPlan,
) -> MemoryPlan {
    let c = cfg;
    let (dim, qd, kvd, ffn, hd) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim, c.head_dim);
    let vectors = (c.n_layers * (2 * dim + 2 * hd + qd + 2 * kvd) + dim) as u64 * 4;
    let weights = matrices + vectors;

    let positions = (num_blocks * block_size) as u64;
    let kv = positions * (c.n_kv_layers() * 2 * kvd * 2) as u64;

    // The step buffers of `ensure_work` (step/inputs.rs) for its capacity of `tok` tokens.
    let tok = max_batch_tokens.max(1).next_power_of_two();
    let act_f32 = 2 * dim + (qd + 2 * kvd) + qd + 2 * ffn + ffn;
    let act_f16 = dim.max(qd).max(ffn);
    let activations = (tok * act_f32 * 4 + tok.max(16) * act_f16 * 2) as u64 + tc_part_len(c, tok) as u64 * 4;
    // One logits row per sequence of a step at most (its last token): final norm, logits, arg-max.
    let rows = tok.min(MAX_LOGIT_ROWS).min(seqs.running.max(1));
    let logits = (rows * (c.vocab_size + dim + 1) * 4) as u64;
    let max_pos = max_positions.max(1);
    let attn = (attn_part_rows(c, tok, max_pos, seqs.running) * (hd + 2) * 4) as u64;
    let rope = (2 * max_pos * hd / 2 * 4) as u64;
    let meta = (tok * (16 + max_pos.div_ceil(block_size.max(1))) * 4) as u64;
    let experts = c.moe.as_ref().map_or(0, |m| moe::workspace_bytes(tok, dim, m));
    // The shared experts' buffers, for their width (the config's shared width, else the routed
    // experts'; counted as at least the model width, as before the config carried it:
    // Qwen2-57B-A14B's is 20,480 against a width of 3,584).
    let shared = match &c.moe {
        Some(m) if c.layer_kinds().iter().any(|k| k.has_shared_expert()) => {
            let width = m.shared_ffn_dim.unwrap_or(m.expert_ffn_dim).max(dim);
            ops::shared_expert::SharedWork::bytes_for(tok, dim, width)
        }
        _ => 0,
    };
    let experts = experts + shared;
    // Hybrid models: the linear layers' step buffers (projections, conv output, delta-rule
    // output, chunk tables), sized for the step's tokens.
    let linear = c.hybrid.as_ref().map_or(0, |h| hybrid::workspace_bytes(c, h, tok));
    let parts = WorkspaceParts {
        step: activations + meta,
        attention: attn,
        logits,
        rope,
        wide_scratch,
        experts_linear: experts + linear,
        cublas: CUBLAS_ALLOWANCE,
    };
    let workspace = activations + logits + attn + rope + meta + wide_scratch + experts + linear + CUBLAS_ALLOWANCE;
    let state_per_seq = c.state_bytes_per_seq() as u64;
    let state = (seqs.running + seqs.snapshots) as u64 * state_per_seq;
    let total = weights + kv + workspace + state;
    MemoryPlan { weights, kv, kv_type: KvType::F16, workspace, state, state_per_seq, seqs, total, parts }
}

/// KV cache bytes of one position (every attention layer, K and V) in type `kv`.
pub fn kv_bytes_per_position(c: &ModelConfig, kv: KvType) -> u64 {
    (c.n_kv_layers() * 2 * kv.bytes(c.kv_dim())) as u64
}

/// Split-K partial sums of the 64-token GEMMs (`Work::tc_part`), f32 elements: the most any of
/// the four layer matrices takes, on the F16 tensor-core GEMM or the packed one.
pub fn tc_part_len(c: &ModelConfig, tok: usize) -> usize {
    let (qd, kvd) = (c.q_dim(), c.kv_dim());
    let shapes = [(qd + 2 * kvd, c.dim), (c.dim, qd), (2 * c.ffn_dim, c.dim), (c.dim, c.ffn_dim)];
    let n = tok.min(TC_MAX_TOKENS);
    shapes.iter().map(|&(r, k)| tc64_part_len(r, k, n).max(GemmQ::part_len(r, k, n))).max().unwrap_or(0)
}

/// Rows (token x head x slot) of attention partials a step of at most `tok` tokens can take
/// (`Flat::part_rows`, at least one per head), over sequences of at most `max_pos` positions:
/// the decode tokens (one per running sequence at most) at their split count, a power of two in
/// graph-sized steps, plus the shared-prefix slots; and the prefill tokens at the split count
/// `prefill_splits` gives one chunk of them reaching `max_pos` (one chunk has the fewest tiles,
/// so the most splits; none once its tiles fill the GPU: then the kernel writes its output
/// directly and takes no partials).
fn attn_part_rows(c: &ModelConfig, tok: usize, max_pos: usize, running: usize) -> usize {
    use crate::backend::cuda::ops::prefill::{prefill_splits, prefill_supported, TILE_TOKENS};
    let (nh, nkv, hd) = (c.n_heads, c.n_kv_heads, c.head_dim);
    // Shapes without the prefill kernel run every token through the decode attention.
    let tiled = prefill_supported(nh, nkv, hd);
    let most_dec = if tiled { tok.min(running.max(1)) } else { tok };
    let dec = (1..=most_dec)
        .map(|d| {
            let shared = if d >= 2 { max_pos.div_ceil(256) } else { 0 };
            d * (attn_splits(max_pos, d).next_power_of_two() + shared)
        })
        .max()
        .unwrap_or(0);
    let pf = (1..=if tiled { tok } else { 0 })
        .map(|p| {
            let graph = p <= TC_MAX_TOKENS;
            let splits = |g: bool| prefill_splits(p.div_ceil(TILE_TOKENS), p, max_pos, nh, nkv, hd, g).0;
            let most = splits(false).max(if graph { splits(true) } else { 1 });
            if most > 1 {
                p * most
            } else {
                0
            }
        })
        .max()
        .unwrap_or(0);
    ((dec + pf) * nh).max(nh)
}

fn gb(b: u64) -> String {
    format!("{:.2} GB", b as f64 / 1e9)
}

impl MemoryPlan {
    /// The same plan with its KV cache in type `kv` (the same positions).
    pub fn with_kv_type(mut self, c: &ModelConfig, kv: KvType) -> Self {
        let (from, to) = (kv_bytes_per_position(c, self.kv_type), kv_bytes_per_position(c, kv));
        let positions = self.kv.checked_div(from).unwrap_or(0);
        self.total = self.total - self.kv + positions * to;
        (self.kv, self.kv_type) = (positions * to, kv);
        self
    }

    /// `Ok` when the plan fits in `HEADROOM` of `free` bytes; else a message naming the numbers
    /// and concrete alternatives.
    pub fn check(&self, free: u64, device: &str, positions: usize, cfg: &ModelConfig) -> Result<(), String> {
        let budget = (free as f64 * HEADROOM) as u64;
        if self.total <= budget {
            return Ok(());
        }
        let over = self.total - budget;
        let kv_per_pos = if positions > 0 { self.kv / positions as u64 } else { 0 };
        let mut alts = Vec::new();
        if kv_per_pos > 0 && self.kv >= over {
            let fit = (self.kv - over) / kv_per_pos;
            alts.push(format!(
                "a shorter context or fewer parallel slots: at most {fit} cached positions in total fit ({} now)",
                positions
            ));
        }
        let (per, seqs) = (self.state_per_seq, self.seqs);
        if per > 0 {
            let snaps = seqs.snapshots as u64 * per;
            if seqs.snapshots > 0 && snaps >= over {
                alts.push(format!(
                    "fewer prefix snapshots: DUSTOFF_STATE_SNAPSHOTS={} fits ({} now, {} each)",
                    (snaps - over) / per,
                    seqs.snapshots,
                    gb(per)
                ));
            }
            // A sequence frees its recurrent state and its share of the KV cache.
            let each = per + kv_per_pos * (positions / seqs.running.max(1)) as u64;
            let fewer = over.div_ceil(each.max(1)) as usize;
            if seqs.running > 1 && fewer < seqs.running {
                alts.push(format!(
                    "fewer parallel sequences: {} fit ({} now; each holds a {} recurrent state and its KV blocks)",
                    seqs.running - fewer,
                    seqs.running,
                    gb(per)
                ));
            }
        }
        // The 8-bit KV cache, where the F16 one is what does not fit.
        if self.kv_type == KvType::F16 && KvType::Q8.refusal(cfg.head_dim).is_none() && self.kv > 0 {
            let q8 = self.with_kv_type(cfg, KvType::Q8);
            if q8.total <= budget {
                alts.push(format!("an 8-bit KV cache (--kv-cache q8: {}): the rest fits", gb(q8.kv)));
            }
        }
        // 4-bit weights (about 4.5 bits per matrix element: block formats with scales), where
        // that is clearly smaller than the weights as they are.
        let four_bit = f16_matrix_bytes(cfg) * 9 / 32;
        if four_bit + four_bit / 10 < self.weights {
            if self.total - self.weights + four_bit <= budget {
                alts.push(format!("4-bit weights (about {}): the rest fits", gb(four_bit)));
            } else {
                alts.push(format!("4-bit weights (about {}) together with a shorter context", gb(four_bit)));
            }
        }
        // Smaller steps: the step buffers grow with the step's tokens (`--max-batch-tokens`; a
        // GPU run's default is 2,048).
        let per_step = self.parts.step + self.parts.attention + self.parts.experts_linear;
        if per_step >= over {
            alts.push(format!("smaller engine steps (--max-batch-tokens 512; the step buffers take {})", gb(per_step)));
        }
        alts.push("a GPU with more memory".into());
        Err(format!(
            "the model does not fit on {device}: weights {} + KV cache {} ({positions} positions, {} layers, {}) + workspace {}{} = {}, but {:.0}% of the free {} is {}; options: {}",
            gb(self.weights),
            gb(self.kv),
            cfg.n_kv_layers(),
            self.kv_type,
            gb(self.workspace),
            if self.state > 0 {
                format!(
                    " + recurrent states {} ({} sequences + {} prefix snapshots)",
                    gb(self.state),
                    self.seqs.running,
                    self.seqs.snapshots
                )
            } else {
                String::new()
            },
            gb(self.total),
            HEADROOM * 100.0,
            gb(free),
            gb(budget),
            alts.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::shapes::shape;

    #[test]
    fn qwen3_8b_plan_matches_hand_count() {
        let c = shape("qwen3-8b").unwrap();
        let p = plan_memory(&c, f16_matrix_bytes(&c), 0, 61, 16, 512, SeqPlan::new(1));
        // 8.19e9 parameters at 2 bytes (untied head).
        assert!((p.weights as f64 / 1e9 - 16.38).abs() < 0.05, "{}", p.weights);
        // 976 positions x 36 layers x 2 x 1024 x 2 bytes.
        assert_eq!(p.kv, 976 * 36 * 2 * 1024 * 2);
        assert!(p.workspace > 64 << 20 && p.workspace < 1 << 30, "{}", p.workspace);
        assert_eq!(p.total, p.weights + p.kv + p.workspace);
    }

    /// Qwen3-30B-A3B in llama.cpp's Q4_K_M mix (18.56 GB file): weights, KV for 16,384
    /// positions and the step buffers fit a 32 GB V100; 131,072 positions do not, and the
    /// refusal names the numbers and how many positions would fit.
    #[test]
    fn qwen3_30b_a3b_q4_k_m_plan_on_a_32_gb_card() {
        use crate::backend::cuda::synth::mix::{synthetic_matrix_bytes, WeightMix};
        let c = shape("qwen3-30b-a3b").unwrap();
        let bytes = synthetic_matrix_bytes(&c, WeightMix::Q4KM);
        // The file's tensors as repacked, routers in f32 (25 MB): within 1% of the file.
        assert!((18.4e9..18.75e9).contains(&(bytes as f64)), "{bytes}");
        let wide = wide_len(&c) as u64 * 2;
        let v100_free = V100_32GB_FREE;
        let p = plan_memory(&c, bytes, wide, 1024, 16, 512, SeqPlan::new(4));
        assert_eq!(p.kv, 16_384 * 48 * 2 * 512 * 2);
        assert!(p.workspace < 1 << 30, "{}", p.workspace);
        assert!(p.check(v100_free, "cuda:0 V100 32 GB", 16_384, &c).is_ok(), "{p:?}");
        let p = plan_memory(&c, bytes, wide, 16_384, 16, 512, SeqPlan::new(4));
        let e = p.check(v100_free, "cuda:0 V100 32 GB", 262_144, &c).unwrap_err();
        for part in
            ["cuda:0 V100 32 GB", "weights 18.", "KV cache 25.77 GB", "cached positions in total fit", "free 33.55 GB"]
        {
            assert!(e.contains(part), "{part} missing from: {e}");
        }
    }

    /// Issue 11's 2 x 4,096 row as `bench --plan` plans it (Qwen3-8B, Q4_K_M mix, 2 sequences of
    /// 3,896 + 200 tokens in 2 x 257 blocks): each workspace item is what the backend allocates
    /// for those steps (`DUSTOFF_MEMORY_LOG=1`, docs/BENCHMARKS.md session 8): the step buffers
    /// of the step capacity, attention partials for 2 decode tokens and the prefill chunk with
    /// the most partial rows (none for a chunk whose tiles fill the GPU), the logits of 2 rows.
    #[test]
    fn qwen3_8b_two_sequences_of_4096_plan_itemized() {
        use crate::backend::cuda::synth::mix::{synthetic_matrix_bytes, WeightMix};
        let c = shape("qwen3-8b").unwrap();
        let (bytes, wide) = (synthetic_matrix_bytes(&c, WeightMix::Q4KM), wide_len(&c) as u64 * 2);
        for step in [512usize, 2048] {
            let p = plan_memory_for(&c, bytes, wide, 2 * 257, 16, step, 4096, SeqPlan::new(2));
            assert_eq!(p.kv, 2 * 4112 * 36 * 2 * 1024 * 2);
            // f32 [step, x] residual, normed input 4,096 each, qkv 6,144, attention 4,096,
            // gate/up 24,576, activation 12,288; the F16 GEMM input [step, 12,288]; split-K
            // partials of the 64-token GEMMs (gate/up: 2 splits x 64 x 24,576); step inputs
            // [step, 16 + 256 block-table entries].
            let f32s = 4096 + 4096 + 6144 + 4096 + 24_576 + 12_288;
            let want = step * f32s * 4 + step * 12_288 * 2 + 2 * 64 * 24_576 * 4 + step * (16 + 256) * 4;
            assert_eq!(p.parts.step, want as u64, "steps of {step}");
            // (2 decode tokens x (64 splits + 16 shared-prefix slots) + a 304-token chunk x 2
            // splits) x 32 heads, rows of 128 + 2 floats.
            assert_eq!(p.parts.attention, (2 * 80 + 304 * 2) * 32 * 130 * 4, "steps of {step}");
            assert_eq!(p.parts.logits, 2 * (151_936 + 4096 + 1) * 4);
            assert_eq!(p.parts.rope, 4096 * 128 * 4);
            assert_eq!(p.parts.wide_scratch, wide);
            let w = p.parts;
            let sum = w.step + w.attention + w.logits + w.rope + w.wide_scratch + w.experts_linear + w.cublas;
            assert_eq!(p.workspace, sum);
        }
    }

    #[test]
    fn qwen35_9b_plan_counts_its_8_kv_layers_and_the_recurrent_states() {
        let c = shape("qwen3.5-9b").unwrap();
        let h = c.hybrid.as_ref().unwrap();
        // The released model has 8.95e9 parameters (untied head): the matrices at 2 bytes.
        let params = f16_matrix_bytes(&c) as f64 / 2.0;
        assert!((8.9e9..9.0e9).contains(&params), "{params}");
        // 24 linear layers x (3 x 8192 conv inputs + 32 x 128 x 128 matrix values) x 4 bytes.
        assert_eq!(h.state_bytes_per_seq(), 24 * (3 * 8192 + 32 * 128 * 128) * 4);
        let p = plan_memory(&c, f16_matrix_bytes(&c), 0, 100, 16, 512, SeqPlan { running: 64, snapshots: 64 });
        assert_eq!(p.kv, 1600 * 8 * 2 * 1024 * 2, "only the 8 attention layers keep K/V");
        assert_eq!(p.state, 2 * 64 * h.state_bytes_per_seq() as u64);
        assert_eq!(p.total, p.weights + p.kv + p.workspace + p.state);
        let e = p.check(24_000_000_000, "cuda:0 X", 1600, &c).unwrap_err();
        assert!(
            e.contains("recurrent states 6.74 GB (64 sequences + 64 prefix snapshots)") && e.contains("8 layers"),
            "{e}"
        );
        assert!(e.contains("fewer prefix snapshots") && e.contains("fewer parallel sequences"), "{e}");
    }

    #[test]
    fn shared_expert_buffers_are_planned_at_the_shared_width() {
        // Qwen2-57B-A14B: a 20,480-wide shared expert beside 2,560-wide routed ones, width 3,584.
        let c = shape("qwen2-57b-a14b").unwrap();
        let m = c.moe.as_ref().unwrap();
        assert_eq!((m.shared_ffn_dim, c.dim), (Some(20480), 3584));
        let p = plan_memory(&c, f16_matrix_bytes(&c), 0, 64, 16, 512, SeqPlan::new(1));
        let shared = ops::shared_expert::SharedWork::bytes_for(512, c.dim, 20480);
        assert_eq!(p.parts.experts_linear, moe::workspace_bytes(512, c.dim, m) + shared);
    }

    #[test]
    fn refusal_names_numbers_and_alternatives() {
        let c = shape("qwen3-8b").unwrap();
        let p = plan_memory(&c, f16_matrix_bytes(&c), 0, 2048, 16, 512, SeqPlan::new(1));
        assert!(p.check(40_000_000_000, "cuda:0 X", 2048 * 16, &c).is_ok());
        let e = p.check(16_000_000_000, "cuda:0 X", 2048 * 16, &c).unwrap_err();
        for part in ["cuda:0 X", "weights 16.", "KV cache", "4-bit weights", "free 16.00 GB"] {
            assert!(e.contains(part), "{part} missing from: {e}");
        }
        let e = p.check(22_000_000_000, "cuda:0 X", 2048 * 16, &c).unwrap_err();
        assert!(e.contains("cached positions in total fit"), "{e}");
        // Steps of 4,096 tokens over a card their step buffers overfill: smaller steps are named;
        // the same card is refused without that option when the weights alone overfill it.
        let big = plan_memory(&c, f16_matrix_bytes(&c), 0, 64, 16, 4096, SeqPlan::new(1));
        let over = big.total - (big.total as f64 * 0.99) as u64;
        let free = ((big.total - over) as f64 / HEADROOM) as u64;
        let e = big.check(free, "cuda:0 X", 64 * 16, &c).unwrap_err();
        assert!(e.contains("smaller engine steps (--max-batch-tokens 512"), "{e}");
        let e = p.check(16_000_000_000, "cuda:0 X", 2048 * 16, &c).unwrap_err();
        assert!(!e.contains("smaller engine steps"), "{e}");
    }
}
