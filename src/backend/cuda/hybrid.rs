//! Hybrid models (Qwen3.5, `qwen35`) on the CUDA backend: the Gated DeltaNet layers and the
//! gated partial-RoPE attention layers, and each sequence's recurrent state on the device.
//!
//! State: one slot per running sequence in a device pool `[n_slots, per_seq]` f32, laid out
//! as the CPU's (per linear layer: conv window `[K - 1, C]`, then the delta-rule matrices
//! `[n_v, d_k, d_v]`). The pool holds the sequences the backend was planned for
//! (`CudaOptions::max_seqs`), allocated once, so the memory plan is what the device holds and
//! the pool never moves under a captured graph; a sequence beyond it is refused as out of
//! memory (the engine then runs fewer at once). Prefix-reuse snapshots are device copies of a
//! slot, keyed by the prefix's chain hash, at most `CudaOptions::max_snapshots` of them (the
//! engine evicts before it saves beyond them).
//!
//! Per step the host writes the chunk table (per chunk: first token, tokens, slot) and
//! uploads it into a buffer of fixed address, so a captured decode graph stays valid.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::deltanet::{
    DnChunked, DnConv, DnConvPrep, DnGatedNorm, DnPrep, DnRecur, DnRecurNorm, StatePool, DN_AB_ROW, DN_CH,
};
use super::device::{up, zeros};
use super::dmat::Linear;
use super::hybrid_attn::{GateMul, HybQkvPost};
use super::kernels::Kernels;
use super::kv_cache::RopeStore;
use super::launch::{allocated, Dev};
use super::layer::LayerW;
use super::matmul::{input_form, Mm, Product, XForm};
use super::paged_attn::PagedAttn;
use super::step_norm::{norm_product, NormIn};
use super::CudaError;
use crate::backend::{snapshot_room, BackendError};
use crate::engine::plan::{SeqId, StepPlan};
use crate::model::config::ModelConfig;
use crate::model::hybrid::{HeadGrouping, HybridConfig, HybridLayer};
use crate::model::rope::rope_table;
use crate::model::weights::{LayerWeights, Tensor};

/// One Gated DeltaNet layer on the device (`C` q|k|v channels, `V = n_v d_v`).
pub(super) struct LinearW {
    /// `[C + V + 2 n_v, dim]`: `w_qkv`, `w_z`, `w_b`, `w_a` stacked (one read of the input).
    pub proj: Linear,
    pub conv: CudaSlice<f32>,    // [C, K]
    pub neg_a: CudaSlice<f32>,   // [n_v]
    pub dt_bias: CudaSlice<f32>, // [n_v]
    pub norm: CudaSlice<f32>,    // [d_v]
    pub out: Linear,             // [dim, V]
    /// Its number among the linear layers (its place in a state slot).
    pub index: usize,
}

/// Where the step's per-token inputs and shared buffers are (built by `step.rs`).
pub(super) struct StepIo {
    pub x: Dev<f32>,   // [tok, dim] residual
    pub h: Dev<f32>,   // [tok, dim] normed input
    pub att: Dev<f32>, // [tok, q_dim]
    /// The step's attention tables and partials (step.rs).
    pub attn: super::step_attn::AttnIo,
    pub pos: Dev<i32>,
    pub kv_rows: Dev<i32>,
    pub block_tables: Dev<i32>,
    pub tok_seq: Dev<i32>,
    pub n_tok: usize,
    pub n_seqs: usize,
    pub cache_rows: usize,
    pub block_size: usize,
    pub bt_stride: usize,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    index: usize,
    pos: usize,
}

/// The hybrid part of `CudaBackend`.
pub struct HybridCuda {
    h: HybridConfig,
    pub(super) layers: Vec<Option<LinearW>>,
    rope_cos: CudaSlice<f32>, // [max_pos, rotary_dim / 2]
    rope_sin: CudaSlice<f32>,
    max_pos: usize,
    /// f32 values of one sequence's state.
    per_seq: usize,
    pool: CudaSlice<f32>, // [cap_slots, per_seq]
    cap_slots: usize,
    slots: HashMap<SeqId, Slot>,
    free: Vec<usize>,
    snapshots: HashMap<[u8; 32], (CudaSlice<f32>, usize)>,
    /// Most snapshots held at once (the plan's snapshot pool).
    pub(super) max_snapshots: usize,
    /// Chunk table of the current step: `[1 + 3 * cap_tok]`.
    host_chunks: Vec<i32>,
    chunks: Option<CudaSlice<i32>>,
    pub(super) cap_tok: usize,
    proj: Option<CudaSlice<f32>>,  // [cap, proj width]: either projection of a layer
    mixed: Option<CudaSlice<f32>>, // [cap, C] conv output
    core: Option<CudaSlice<f32>>,  // [cap, max(V, q_dim)]: delta-rule output / queries
    ab: Option<CudaSlice<f32>>,    // [cap, n_v, DN_AB_ROW]: the chunked form's sub-chunk table
    /// The step form's delta rule with the gated norm (and the out projection's int8 input)
    /// in one launch.
    recur_norm: bool,
    /// The shared expert's gate folded into its down product's int8 input.
    pub(super) fold_shexp_gate: bool,
}

/// Whether a linear layer runs conv + L2 norm + gates as one kernel (`DUSTOFF_DN_FUSED=0`:
/// as `dn_conv_silu_f32` then `dn_prep_f32`, for comparison).
fn fused_conv_prep() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::sys::env::get("DUSTOFF_DN_FUSED").is_none_or(|v| v != "0"))
}

/// Whether the step form of the delta rule normalizes its output in the same launch
/// (`dn_recur_norm_f32`; `DUSTOFF_DN_RECUR_NORM=0`: `dn_recur_f32` then `dn_gated_norm_f32`).
fn recur_norm_fused() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::sys::env::get("DUSTOFF_DN_RECUR_NORM").is_none_or(|v| v != "0"))
}

/// The profiler's mark: the work launched since the previous one belongs to the named class.
pub(super) type Mark<'a> = &'a mut dyn FnMut(&'static str) -> Result<(), CudaError>;

/// What a layer's token mixer (`HybridCuda::mixer`) runs with: the model's shape, the kernels,
/// the products, the step's buffers and the profiler's mark. With `pre` the layer's norm is not
/// applied yet: the first product folds it in (`io.h` receives it).
pub(super) struct MixerCx<'a, 'm> {
    pub c: &'a ModelConfig,
    pub k: &'a mut Kernels,
    pub mm: &'a mut Mm<'m>,
    pub io: &'a StepIo,
    pub pre: Option<NormIn>,
    pub mark: Mark<'a>,
}

/// Fewest tokens of one chunk that take the chunked delta rule (in steps that are not
/// replayed as graphs); `DUSTOFF_DN_CHUNK_MIN` overrides the default of one sub-chunk
/// (`DN_CH`); 0 turns the chunked form off.
fn chunked_min_tokens() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| crate::sys::env::get("DUSTOFF_DN_CHUNK_MIN").and_then(|v| v.parse().ok()).unwrap_or(DN_CH))
}

/// Width of the widest projection row a step writes into `proj`: a linear layer's stacked
/// q|k|v, z, b, a, or an attention layer's q (with its gate), k, v.
fn proj_width(c: &ModelConfig, h: &HybridConfig) -> usize {
    let lin = h.conv_channels() + h.value_dim() + 2 * h.n_v_heads;
    let q = if h.attn_output_gate { 2 * c.q_dim() } else { c.q_dim() };
    lin.max(q + 2 * c.kv_dim())
}

/// Bytes of the step buffers of `HybridCuda::ensure` for `cap` tokens (the memory plan).
pub fn workspace_bytes(c: &ModelConfig, h: &HybridConfig, cap: usize) -> u64 {
    let f32s = proj_width(c, h) + h.conv_channels() + h.value_dim().max(c.q_dim()) + h.n_v_heads * DN_AB_ROW;
    (cap * f32s * 4 + (1 + 3 * cap) * 4) as u64
}

impl HybridCuda {
    /// Uploads the linear layers of `w` (the attention layers use the plain `LayerW` fields).
    pub(super) fn new(
        s: &Arc<CudaStream>,
        c: &ModelConfig,
        h: &HybridConfig,
        layers: &[LayerWeights],
        f16: bool,
        (max_pos, seqs): (usize, super::seqs::SeqPlan),
        clamped: &mut u64,
    ) -> Result<Self, CudaError> {
        let mut out = Vec::with_capacity(layers.len());
        let mut index = 0;
        for (i, lw) in layers.iter().enumerate() {
            match &lw.hybrid {
                Some(HybridLayer::Linear(d)) => {
                    let name = |x: &str| format!("layer {i} {x}");
                    let (proj, c1) = Linear::upload(s, &[&d.w_qkv, &d.w_z, &d.w_b, &d.w_a], f16, &name("linear in"))?;
                    let (o, c2) = Linear::upload(s, &[&d.w_out], f16, &name("linear out"))?;
                    *clamped += c1 + c2;
                    out.push(Some(LinearW {
                        proj,
                        conv: up(s, &d.conv, &name("conv1d"))?,
                        neg_a: up(s, &d.neg_a, &name("ssm_a"))?,
                        dt_bias: up(s, &d.dt_bias, &name("dt_bias"))?,
                        norm: up(s, &d.norm, &name("ssm_norm"))?,
                        out: o,
                        index,
                    }));
                    index += 1;
                }
                Some(HybridLayer::Attention) | None => out.push(None),
            }
        }
        Self::from_layers(s, c, h, out, max_pos, seqs)
    }

    /// The hybrid part around uploaded linear layers (`None` for attention layers).
    pub(super) fn from_layers(
        s: &Arc<CudaStream>,
        c: &ModelConfig,
        h: &HybridConfig,
        out: Vec<Option<LinearW>>,
        max_pos: usize,
        seqs: super::seqs::SeqPlan,
    ) -> Result<Self, CudaError> {
        let index = out.iter().flatten().count();
        let max_pos = max_pos.max(1);
        let positions: Vec<usize> = (0..max_pos).collect();
        let (cos, sin) = rope_table(&positions, &h.rope_inv_freq(c.rope_theta));
        let per_seq = index * h.state_len_per_layer();
        let cap_slots = seqs.running.max(1);
        Ok(HybridCuda {
            h: h.clone(),
            layers: out,
            rope_cos: up(s, &cos, "partial RoPE cos table")?,
            rope_sin: up(s, &sin, "partial RoPE sin table")?,
            max_pos,
            per_seq,
            pool: zeros(s, cap_slots * per_seq, "recurrent state pool")?,
            cap_slots,
            slots: HashMap::new(),
            free: (0..cap_slots).rev().collect(),
            snapshots: HashMap::new(),
            max_snapshots: seqs.snapshots,
            host_chunks: Vec::new(),
            chunks: None,
            cap_tok: 0,
            proj: None,
            mixed: None,
            core: None,
            ab: None,
            recur_norm: recur_norm_fused(),
            fold_shexp_gate: super::shared_expert::gate_folded(),
        })
    }

    /// The fused decode launches on, or their separate launches (`CudaBackend::set_hybrid_fusion`).
    pub(super) fn set_fusion(&mut self, on: bool) {
        self.recur_norm = on;
        self.fold_shexp_gate = on;
    }

    /// Bytes of one sequence's recurrent state on the device.
    pub fn state_bytes_per_seq(&self) -> usize {
        self.per_seq * 4
    }

    /// Bytes of weight matrices a decode step reads in the linear layers.
    pub(super) fn matrix_bytes(&self) -> u64 {
        self.layers.iter().flatten().map(|l| l.proj.bytes() + l.out.bytes()).sum()
    }

    /// Buffers for `cap` tokens; true when any was (re)allocated (graphs hold the old ones).
    pub(super) fn ensure(&mut self, s: &Arc<CudaStream>, c: &ModelConfig, cap: usize) -> Result<bool, CudaError> {
        if cap <= self.cap_tok {
            return Ok(false);
        }
        let h = &self.h;
        self.proj = None;
        self.proj = Some(zeros(s, cap * proj_width(c, h), "hybrid projection")?);
        self.mixed = None;
        self.mixed = Some(zeros(s, cap * h.conv_channels(), "conv output")?);
        self.core = None;
        self.core = Some(zeros(s, cap * h.value_dim().max(c.q_dim()), "delta-rule output")?);
        self.ab = None;
        self.ab = Some(zeros(s, cap * h.n_v_heads * DN_AB_ROW, "chunked delta-rule table")?);
        self.chunks = None;
        self.chunks = Some(zeros(s, 1 + 3 * cap, "chunk table")?);
        self.cap_tok = cap;
        Ok(true)
    }

    /// A zeroed slot for `seq` (its own again when it has one: a restart from position 0).
    fn reset(&mut self, s: &Arc<CudaStream>, seq: SeqId) -> Result<(), CudaError> {
        let index = match self.slots.get(&seq) {
            Some(sl) => sl.index,
            None => self.free.pop().ok_or_else(|| {
                CudaError::OutOfMemory(format!(
                    "sequence {seq}: the recurrent-state pool holds the {} sequences the backend was planned for",
                    self.cap_slots
                ))
            })?,
        };
        let r = index * self.per_seq..(index + 1) * self.per_seq;
        s.memset_zeros(&mut self.pool.slice_mut(r)).map_err(CudaError::driver("zeroing a recurrent state"))?;
        self.slots.insert(seq, Slot { index, pos: 0 });
        Ok(())
    }

    /// Checks that every chunk continues its sequence's state exactly (as the CPU backend
    /// does), gives chunks at position 0 a zeroed slot, and uploads the chunk table. `last_tok`:
    /// the flat index of each chunk's last token.
    pub(super) fn begin_step(
        &mut self,
        s: &Arc<CudaStream>,
        plan: &StepPlan,
        last_tok: &[usize],
    ) -> Result<(), BackendError> {
        for c in plan.chunks.iter().filter(|c| c.start_pos > 0) {
            match self.slots.get(&c.seq) {
                Some(sl) if sl.pos == c.start_pos => {}
                found => {
                    return Err(BackendError::Plan(format!(
                        "sequence {} continues at position {}, but its recurrent state {} (a hybrid model's \
                         sequence must run from position 0 without gaps)",
                        c.seq,
                        c.start_pos,
                        found.map_or("does not exist".to_string(), |sl| format!("holds {} tokens", sl.pos)),
                    )))
                }
            }
        }
        for c in plan.chunks.iter().filter(|c| c.start_pos == 0) {
            self.reset(s, c.seq)?;
        }
        let t = &mut self.host_chunks;
        t.clear();
        t.push(plan.chunks.len() as i32);
        for (c, &last) in plan.chunks.iter().zip(last_tok) {
            let slot = self.slots.get(&c.seq).map_or(0, |sl| sl.index);
            t.extend([(last + 1 - c.tokens.len()) as i32, c.tokens.len() as i32, slot as i32]);
        }
        let dev = self.chunks.as_mut().ok_or_else(|| BackendError::Plan("chunk table not allocated".into()))?;
        s.memcpy_htod(&self.host_chunks, &mut dev.slice_mut(0..self.host_chunks.len()))
            .map_err(CudaError::driver("uploading the chunk table"))?;
        Ok(())
    }

    /// Records that the step's chunks were absorbed into their states.
    pub(super) fn end_step(&mut self, plan: &StepPlan) {
        for c in &plan.chunks {
            if let Some(sl) = self.slots.get_mut(&c.seq) {
                sl.pos = c.start_pos + c.tokens.len();
            }
        }
    }

    pub(super) fn release(&mut self, seq: SeqId) {
        if let Some(sl) = self.slots.remove(&seq) {
            self.free.push(sl.index);
        }
    }

    /// A device copy of `seq`'s state under `key`.
    pub(super) fn save(&mut self, s: &Arc<CudaStream>, seq: SeqId, key: &[u8; 32]) -> Result<(), BackendError> {
        let sl = self.slots.get(&seq).copied().ok_or_else(|| BackendError::no_state_slot(seq))?;
        snapshot_room(seq, !self.snapshots.contains_key(key), self.snapshots.len(), self.max_snapshots)?;
        let r = sl.index * self.per_seq..(sl.index + 1) * self.per_seq;
        let copy = s.clone_dtod(&self.pool.slice(r)).map_err(CudaError::driver("copying a state snapshot"))?;
        self.snapshots.insert(*key, (copy, sl.pos));
        Ok(())
    }

    /// Gives `seq` the state saved under `key`, which must follow exactly `pos` tokens.
    pub(super) fn restore(&mut self, s: &Arc<CudaStream>, seq: SeqId, key: &[u8; 32], pos: usize) -> bool {
        match self.snapshots.get(key) {
            Some((_, at)) if *at == pos => {}
            _ => return false,
        }
        if self.reset(s, seq).is_err() {
            return false;
        }
        let Some(sl) = self.slots.get_mut(&seq) else { return false };
        sl.pos = pos;
        let r = sl.index * self.per_seq..(sl.index + 1) * self.per_seq;
        let Some((snap, _)) = self.snapshots.get(key) else { return false };
        s.memcpy_dtod(snap, &mut self.pool.slice_mut(r)).is_ok()
    }

    pub(super) fn drop_snapshot(&mut self, key: &[u8; 32]) {
        self.snapshots.remove(key);
    }

    fn buf(b: &Option<CudaSlice<f32>>, s: &CudaStream) -> Result<Dev<f32>, CudaError> {
        allocated(b, s, "hybrid", "work buffers")
    }

    /// Layer `li`'s token mixer: `io.h` (normed input) -> `io.x += mixer(h)`.
    pub(super) fn mixer(&self, li: usize, lw: &LayerW, cx: MixerCx) -> Result<(), CudaError> {
        match self.layers.get(li).and_then(Option::as_ref) {
            Some(d) => self.linear(d, cx),
            None => self.attention(lw, cx),
        }
    }

    /// The input projection of a layer (`p.x` is `io.h`), its norm folded in where `pre` says.
    fn first_product(k: &mut Kernels, mm: &mut Mm, pre: Option<NormIn>, p: Product) -> Result<(), CudaError> {
        match pre {
            Some(a) => norm_product(k, mm, a, p),
            None => mm.run(k, p),
        }
    }

    fn linear(&self, d: &LinearW, cx: MixerCx) -> Result<(), CudaError> {
        let MixerCx { c, k, mm, io, pre, mark } = cx;
        let s = mm.s;
        let h = &self.h;
        let n = io.n_tok;
        let (ch, vd, nv, kk) = (h.conv_channels(), h.value_dim(), h.n_v_heads, h.conv_kernel);
        let width = d.proj.rows();
        let (proj, mixed, core) = (Self::buf(&self.proj, s)?, Self::buf(&self.mixed, s)?, Self::buf(&self.core, s)?);
        let p = Product { lin: &d.proj, bias: None, x: io.h, n, out: proj, accumulate: false };
        Self::first_product(k, mm, pre, p)?;
        mark("dn in proj")?;
        // Graph-sized steps launch for every token as a possible chunk (the table says how
        // many there are), so a graph serves any split of its tokens into chunks.
        let max_chunks = if n <= super::gemm_tc::TC_MAX_TOKENS { n } else { io.n_seqs };
        let pool = StatePool {
            state: Dev::of(&self.pool, s),
            slot_stride: self.per_seq,
            layer_off: d.index * h.state_len_per_layer(),
            chunks: allocated(&self.chunks, s, "hybrid", "chunk table")?,
            max_chunks,
        };
        let conv = DnConv {
            x: proj,
            x_stride: width,
            out: mixed,
            w: Dev::of(&d.conv, s),
            pool,
            n_tok: n,
            channels: ch,
            kernel: kk,
        };
        let (b_off, a_off) = (ch + vd, ch + vd + nv);
        let prep = DnPrep {
            mixed,
            proj,
            neg_a: Dev::of(&d.neg_a, s),
            dt_bias: Dev::of(&d.dt_bias, s),
            n_tok: n,
            n_k: h.n_k_heads,
            d_k: h.d_k,
            n_v: nv,
            channels: ch,
            proj_stride: width,
            b_off,
            a_off,
        };
        // Conv, L2 norms and gates in one launch; `DUSTOFF_DN_FUSED=0`: the two kernels.
        if fused_conv_prep() {
            DnConvPrep { conv: &conv, prep: &prep }.launch(k, s)?;
        } else {
            conv.launch(k, s)?;
            prep.launch(k, s)?;
        }
        mark("dn conv+prep")?;
        let recur = DnRecur {
            mixed,
            proj,
            out: core,
            pool,
            conv_len: (kk - 1) * ch,
            n_tok: n,
            n_k: h.n_k_heads,
            n_v: nv,
            d_k: h.d_k,
            d_v: h.d_v,
            channels: ch,
            proj_stride: width,
            b_off,
            a_off,
            tiled: h.grouping == HeadGrouping::Tiled,
        };
        // Prompt chunks take the chunked form (more blocks, fewer serial steps); graph-sized
        // steps keep the step form, whose launch does not depend on the chunk lengths.
        let longest = self.host_chunks.iter().skip(2).step_by(3).copied().max().unwrap_or(0).max(0) as usize;
        let min = chunked_min_tokens();
        let norm = DnGatedNorm {
            o: core,
            z: proj.offset(ch),
            z_stride: width,
            w: Dev::of(&d.norm, s),
            n_tok: n,
            n_v: nv,
            d_v: h.d_v,
            eps: c.rms_eps,
        };
        if n > super::gemm_tc::TC_MAX_TOKENS && min > 0 && longest >= min {
            DnChunked { recur: &recur, ab: Self::buf(&self.ab, s)?, max_count: longest }.launch(k, s)?;
            mark("dn recurrence")?;
            norm.launch(k, s)?;
            mark("dn gated norm")?;
        } else if self.recur_norm {
            // The out projection's int8 input written by the same launch where its GEMV reads one.
            let q8 = matches!(&d.out.parts[..], [m] if input_form(m, n) == XForm::Q8) && vd.is_multiple_of(32);
            let xq = q8.then(|| mm.x16.bytes());
            DnRecurNorm { recur: &recur, norm: &norm, xq }.launch(k, s)?;
            mark("dn recur+norm")?;
            let out = Product { lin: &d.out, bias: None, x: core, n, out: io.x, accumulate: true };
            mm.run_with(k, out, if q8 { XForm::Q8 } else { XForm::None })?;
            return mark("dn out proj");
        } else {
            recur.launch(k, s)?;
            mark("dn recurrence")?;
            norm.launch(k, s)?;
            mark("dn gated norm")?;
        }
        mm.run(k, Product { lin: &d.out, bias: None, x: core, n, out: io.x, accumulate: true })?;
        mark("dn out proj")
    }

    fn attention(&self, lw: &LayerW, cx: MixerCx) -> Result<(), CudaError> {
        let MixerCx { c, k, mm, io, pre, mark } = cx;
        let s = mm.s;
        let n = io.n_tok;
        let (qd, hd) = (c.q_dim(), c.head_dim);
        let gated = self.h.attn_output_gate;
        let width = lw.wqkv.rows();
        let (proj, q) = (Self::buf(&self.proj, s)?, Self::buf(&self.core, s)?);
        let p = Product { lin: &lw.wqkv, bias: None, x: io.h, n, out: proj, accumulate: false };
        Self::first_product(k, mm, pre, p)?;
        mark("attn qkv proj")?;
        let (kc, vc, kv_scales) = lw.kv_dev(s);
        HybQkvPost {
            proj,
            stride: width,
            q,
            store: RopeStore {
                q_norm: lw.q_norm.as_ref().map(|v| Dev::of(v, s)),
                k_norm: lw.k_norm.as_ref().map(|v| Dev::of(v, s)),
                pos: io.pos,
                cos: Dev::of(&self.rope_cos, s),
                sin: Dev::of(&self.rope_sin, s),
                max_pos: self.max_pos,
                k_cache: kc,
                v_cache: vc,
                kv_scales,
                kv_rows: io.kv_rows,
                cache_rows: io.cache_rows,
            },
            n_tok: n,
            n_heads: c.n_heads,
            n_kv: c.n_kv_heads,
            head_dim: hd,
            rot: self.h.rotary_dim,
            gated,
            eps: c.rms_eps,
        }
        .launch(k, s)?;
        mark("attn qkv_post")?;
        let paged = PagedAttn {
            q,
            k_cache: kc,
            v_cache: vc,
            kv_scales,
            block_tables: io.block_tables,
            tok_seq: io.tok_seq,
            pos: io.pos,
            out: io.att,
            cache_rows: io.cache_rows,
            n_seqs: io.n_seqs,
            n_tok: n,
            n_heads: c.n_heads,
            n_kv: c.n_kv_heads,
            head_dim: hd,
            block_size: io.block_size,
            bt_stride: io.bt_stride,
            q_stride: qd,
            out_stride: qd,
        };
        io.attn.launch(k, s, paged, mark)?;
        if gated {
            GateMul { att: io.att, proj, stride: width, n_tok: n, n_heads: c.n_heads, head_dim: hd }.launch(k, s)?;
            mark("attn gate")?;
        }
        mm.run(k, Product { lin: &lw.wo, bias: None, x: io.att, n, out: io.x, accumulate: true })?;
        mark("attn o proj")
    }
}

/// The matrices of a hybrid layer the CUDA backend uploads beside the plain ones (the linear
/// layers' projections), for the shape checks and the memory plan.
pub fn hybrid_matrices(lw: &LayerWeights) -> Vec<&Tensor> {
    match &lw.hybrid {
        Some(HybridLayer::Linear(d)) => vec![&d.w_qkv, &d.w_z, &d.w_b, &d.w_a, &d.w_out],
        _ => Vec::new(),
    }
}
