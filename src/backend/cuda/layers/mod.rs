//! The layer walker of the CUDA backend: every layer is norm, mixer, residual, norm, FFN,
//! residual, whatever its kind (`model::layer`); each mixer and FFN kind is one file here, on
//! the launchers of `cuda/` (the kernels are not here). What must hold for every kind is a hook
//! of the walker ([`Hooks`]) around every block:
//! - the norm before a block: launched on its own, or handed to the block to fold into the
//!   launch that prepares (or performs) its first product (`step::norm`, `moe_ffn_normed`)
//!   when no tap reads the normed input;
//! - the calibration tap: the input of every matrix a block multiplies (`tap.rs`);
//! - profiler marks (`DUSTOFF_PROFILE`);
//! - the tensor-parallel all-reduce after each block (a rank's partial output summed over the
//!   ranks; rank 0 alone adds the residual, `tp/rank.rs`).
//!
//! Logits only for the last token of chunks that want them (the output head after the walk).

mod attention;
mod deltanet;
mod dense_ffn;
mod moe_ffn;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::compile::kernels::Kernels;
use super::layer::{FfnW, MixerW};
use super::matmul::{Mm, Product};
use super::model::CudaBackend;
use super::ops as l;
use super::ops::launch::Dev;
use super::ops::qlaunch::EmbeddingQ;
use super::profile::Profiler;
use super::step::attn::{AttnIo, FlatAttn};
use super::step::flat::Flat;
use super::step::norm::NormIn;
use super::step::workspace::{layout, ptr, Work};
use super::tap::{CudaTap, ExpertRows, TapPoint};
use super::tp::rank::CudaRank;
use super::CudaError;
use crate::model::config::ModelConfig;
use crate::model::layer::MixerKind;

/// Where the step's per-token inputs and shared buffers are.
pub(super) struct StepIo {
    pub x: Dev<f32>,   // [tok, dim] residual
    pub h: Dev<f32>,   // [tok, dim] normed input
    pub qkv: Dev<f32>, // [tok, q_dim + 2 kv_dim]
    pub att: Dev<f32>, // [tok, q_dim]
    pub gu: Dev<f32>,  // [tok, 2 ffn]
    pub act: Dev<f32>, // [tok, ffn]
    /// The step's attention tables and partials.
    pub attn: AttnIo,
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

/// What a block runs with: the model's shape, the kernels, the products, the step's buffers
/// and the layer's number. With `pre` the block's norm is not applied yet: its first launch
/// folds it in (`io.h` receives the normed input where a product reads it in f32).
pub(super) struct Cx<'a, 'm> {
    pub c: &'a ModelConfig,
    pub k: &'a mut Kernels,
    pub mm: &'a mut Mm<'m>,
    pub io: &'a StepIo,
    pub work: &'a Work,
    pub li: usize,
    pub pre: Option<NormIn>,
}

/// The hooks around every block.
pub(super) struct Hooks<'a> {
    pub s: &'a Arc<CudaStream>,
    tap: Option<&'a mut CudaTap>,
    prof: &'a mut Option<Profiler>,
    tp: Option<&'a mut CudaRank>,
    /// Norms folded into the launches after them (no tap reads the normed input).
    fuse: bool,
}

impl Hooks<'_> {
    /// The work launched since the previous mark belongs to `class` (profiling only).
    pub fn mark(&mut self, class: &'static str) -> Result<(), CudaError> {
        match self.prof.as_mut() {
            Some(p) => p.mark(self.s, class),
            None => Ok(()),
        }
    }

    /// A tap is set: blocks take their plainest launches (the normed input in `h`, products
    /// apart) so that every matrix input exists in a buffer.
    pub fn tapped(&self) -> bool {
        self.tap.is_some()
    }

    /// `buf` (`[n, cols]`) is the input of `point` in layer `li`.
    pub fn input(&mut self, li: usize, point: TapPoint, buf: Dev<f32>, n: usize, cols: usize) -> Result<(), CudaError> {
        match self.tap.as_deref_mut() {
            Some(t) => t.layer_input(self.s, li, point, buf, n, cols),
            None => Ok(()),
        }
    }

    /// The routed experts of layer `li` read what `rows` says (the grouped walk's buffers).
    pub fn experts(&mut self, li: usize, rows: &ExpertRows) -> Result<(), CudaError> {
        match self.tap.as_deref_mut() {
            Some(t) => t.experts(self.s, li, rows),
            None => Ok(()),
        }
    }

    /// Whether a block adds the residual into its output product (every rank but tensor-parallel
    /// ranks above 0, whose partial outputs the all-reduce adds).
    pub fn adds_residual(&self) -> bool {
        self.tp.as_ref().is_none_or(|r| r.adds_residual())
    }

    /// The norm before a block: folded into the block's first launch (returned for it to
    /// fold), or launched here into `a.h`.
    fn norm(&mut self, k: &mut Kernels, a: NormIn) -> Result<Option<NormIn>, CudaError> {
        if self.fuse {
            return Ok(Some(a));
        }
        a.plain().launch(k, self.s)?;
        self.mark("rmsnorm")?;
        Ok(None)
    }

    /// Before a block whose launches add its output into `x` in place (the experts' weighted
    /// sums, the shared expert): a tensor-parallel rank above 0 hands on its partial output
    /// alone, so the block's norm runs now (into `h`, not folded) and `x` starts from zero (the
    /// all-reduce after the block counts rank 0's residual once). Other ranks: `pre` as it was.
    fn partial_only(
        &mut self,
        k: &mut Kernels,
        pre: Option<NormIn>,
        x: Dev<f32>,
        len: usize,
    ) -> Result<Option<NormIn>, CudaError> {
        if self.adds_residual() {
            return Ok(pre);
        }
        if let Some(a) = pre {
            a.plain().launch(k, self.s)?;
        }
        super::ops::launch::need("tensor parallel", "residual", x, len)?;
        // SAFETY: `x` holds at least `len` f32 (checked above) on this stream's device.
        unsafe { cudarc::driver::result::memset_d8_async(x.ptr, 0, len * 4, self.s.cu_stream()) }
            .map_err(CudaError::driver("tensor parallel: zeroing a partial output"))?;
        Ok(None)
    }

    /// After a block added its output into `x` (`[n, dim]`, the first `len` values): a
    /// tensor-parallel rank sums it over the ranks.
    fn residual(&mut self, x: Dev<f32>, len: usize) -> Result<(), CudaError> {
        let Some(r) = self.tp.as_deref_mut() else { return Ok(()) };
        r.all_reduce(x, len, self.s)?;
        self.mark("all-reduce")
    }
}

impl CudaBackend {
    /// Every kernel of a step: the embedding, the layers, the output head (logits stay on the
    /// device).
    pub(super) fn run_layers(&mut self, w: &Work, f: &Flat, prof: &mut Option<Profiler>) -> Result<(), CudaError> {
        let c = &self.cfg;
        let s: &Arc<CudaStream> = &self.dev.stream;
        let n = f.n_tok;
        let dim = c.dim;
        let x = ptr(&w.x, s);
        let meta = ptr(&w.meta, s);
        let lay = layout(w.cap_tok);
        let k = &mut self.kernels;
        let wide = self.wide.as_ref().map(|b| Dev::of(b, s));
        let mut mm = Mm { s, blas: self.blas.as_ref(), x16: ptr(&w.x16, s), part: ptr(&w.tc_part, s), wide };
        if let Some(p) = prof.as_mut() {
            p.begin(s, n)?;
        }
        // Norms folded into the products that read them (step/norm.rs), except where a tap
        // reads the normed input.
        let fuse = self.fuse_norm && self.tap.is_none();
        // The output head is replicated: rank 0 alone computes the logits.
        let head = f.m > 0 && self.tp.as_ref().is_none_or(|r| r.rank == 0);
        let mut hooks = Hooks { s, tap: self.tap.as_mut(), prof, tp: self.tp.as_mut(), fuse };

        let ids = meta.offset(lay.ids).cast::<u32>();
        let embd = &self.embd.parts[0];
        match (embd.f16(s), embd.quant(s)) {
            (Some(table), _) => l::Embedding { table, ids, out: x, vocab: c.vocab_size, n_tok: n, dim }.launch(k, s)?,
            (None, Some(table)) => EmbeddingQ { table, ids, out: x, n_tok: n }.launch(k, s)?,
            (None, None) => unreachable!("a matrix is F16 or quantized"),
        }
        hooks.mark("embedding")?;
        let io = StepIo {
            x,
            h: ptr(&w.h, s),
            qkv: ptr(&w.qkv, s),
            att: ptr(&w.att, s),
            gu: ptr(&w.gu, s),
            act: ptr(&w.act, s),
            attn: AttnIo {
                f: FlatAttn::of(f),
                meta,
                kv_begin: lay.kv_begin,
                casc_tiles: lay.casc_tiles,
                casc_rows: lay.casc_rows,
                tiles: lay.tiles,
                tile_rows: lay.tile_rows,
                part_o: ptr(&w.part_o, s),
                part_ml: ptr(&w.part_ml, s),
            },
            pos: meta.offset(lay.pos),
            kv_rows: meta.offset(lay.kv_rows),
            block_tables: meta.offset(lay.bt),
            tok_seq: meta.offset(lay.tok_seq),
            n_tok: n,
            n_seqs: f.n_seqs,
            cache_rows: self.num_blocks * self.block_size,
            block_size: self.block_size,
            bt_stride: self.bt_stride,
        };
        let norm_in = |wt: &CudaSlice<f32>| NormIn { x, w: Dev::of(wt, s), h: io.h, n, dim, eps: c.rms_eps };
        let rope = attention::Rope { cos: &self.rope_cos, sin: &self.rope_sin, max_pos: self.max_pos };
        for (li, lw) in self.layers.iter().enumerate() {
            let pre = hooks.norm(k, norm_in(&lw.attn_norm))?;
            let cx = Cx { c, k: &mut *k, mm: &mut mm, io: &io, work: w, li, pre };
            match (&lw.mixer, &self.recurrent) {
                (MixerW::DeltaNet(d), Some(hy)) => deltanet::run(hy, d, cx, &mut hooks)?,
                (MixerW::DeltaNet(_), None) => {
                    return Err(CudaError::Weights(format!(
                        "layer {li} is Gated DeltaNet, but the model has no recurrent-state pool"
                    )))
                }
                // The hybrid models' attention: partial RoPE, the output gate where the model has it.
                (MixerW::Attention(a), Some(hy)) => {
                    let gated = c.layer_kind(li).mixer == MixerKind::GatedAttention;
                    attention::hybrid(hy, a, gated, &rope, cx, &mut hooks)?
                }
                (MixerW::Attention(a), None) => attention::full(a, &rope, cx, &mut hooks)?,
            }
            hooks.residual(x, n * dim)?;
            // A folded norm: each FFN kind folds it its own way (dense_ffn.rs, moe_ffn.rs).
            let mut pre = hooks.norm(k, norm_in(&lw.ffn_norm))?;
            if let FfnW::Moe(_) = lw.ffn {
                pre = hooks.partial_only(k, pre, x, n * dim)?;
            }
            let cx = Cx { c, k: &mut *k, mm: &mut mm, io: &io, work: w, li, pre };
            match &lw.ffn {
                FfnW::Moe(moe) => moe_ffn::run(moe, self.fold_shexp_gate, cx, &mut hooks)?,
                FfnW::Dense { wgu, wdown } => dense_ffn::run((wgu, wdown), cx, &mut hooks)?,
            }
            hooks.residual(x, n * dim)?;
        }
        let h = io.h;
        if let Some(t) = hooks.tap.as_deref_mut() {
            // The head's input for every token (h is free now), not only the logit rows.
            l::RmsNorm::plain(x, Dev::of(&self.output_norm, s), h, n, dim, c.rms_eps).launch(k, s)?;
            t.head_input(s, h, n, dim)?;
        }
        if !head {
            return Ok(());
        }
        let (hn, logits) = (ptr(&w.hn, s), ptr(&w.logits, s));
        l::RmsNorm {
            x,
            w: Dev::of(&self.output_norm, s),
            out: hn,
            rows: Some(meta.offset(lay.rows)),
            n_src_rows: n,
            n_outer: f.m,
            n_inner: 1,
            dim,
            in_stride: dim,
            out_stride: dim,
            eps: c.rms_eps,
        }
        .launch(k, s)?;
        let head = self.output.as_ref().unwrap_or(&self.embd);
        mm.run(k, Product { lin: head, bias: None, x: hn, n: f.m, out: logits, accumulate: false })?;
        hooks.mark("output head")
    }
}
