//! One forward step of `CudaBackend`: the plan flattened into one per-step input buffer
//! (uploaded in one copy), the kernels of every layer, and the logits copied back.
//!
//! Steps of up to 64 tokens (decode of up to 64 sequences) run as a replayed CUDA graph, captured
//! once per shape (`GraphKey`): every pointer a kernel reads is fixed (work buffers, the
//! step-input buffer with a fixed block-table stride), and the attention split count is rounded
//! up to a power of two (extra splits exit at once), so one graph serves a growing sequence. A
//! shape whose capture fails (a cuBLAS call that cannot be captured) runs without a graph.
//!
//! Matrix products: 1 token (below `tc_min_tokens`): f32 GEMV; 2..=16 tokens
//! (`tc_max_tokens`): the tensor-core GEMM (input cast to F16, each weight read once for all
//! tokens); more: cuBLAS (faster there on the H200).
//!
//! Attention: one-token chunks (decode) take the split kernel, longer chunks (prefill) the
//! tensor-core prefill kernel in 16-token tiles (`prefill`, split along the context when the
//! tiles alone do not fill the GPU), where the head shape allows it. In steps above the graph
//! size, decode tokens whose block tables share leading blocks read them once per group
//! (`cascade`).
//!
//! Per layer: rmsnorm -> qkv matmul (+bias) -> qkv_post (q/k head norm, RoPE, K/V store) ->
//! attention -> o matmul (+= residual) -> rmsnorm -> gate/up matmul with SwiGLU -> down matmul
//! (+= residual). Logits only for the last token of chunks that want them. The two norms run
//! inside the launch that prepares (or performs) the product after them (`step_norm`), except
//! where a tap reads the normed input and before a plain mixture-of-experts FFN. Hybrid layers
//! fold the mixer's norm into its input projection, and the FFN norm before routed experts
//! writes the shared expert's input form beside `h` (the experts read `h` in f32).

use cudarc::driver::{CudaSlice, CudaStream};
use rayon::prelude::*;

use super::gemm_tc::TC_MAX_TOKENS;
use super::graph::StepGraphs;
use super::kv_cache::{QkvPost, RopeStore};
use super::launch::Dev;
use super::matmul::{swiglu, Mm, Product};
use super::model::CudaBackend;
use super::ops as l;
use super::profile::Profiler;
use super::qlaunch::EmbeddingQ;
use super::step_attn::{AttnIo, FlatAttn};
use super::step_flat::Flat;
use super::step_inputs::graph_key;
use super::step_norm::{norm_product, norm_swiglu, NormIn};
use super::tap::TapPoint;
use super::workspace::{layout, ptr, Work};
use super::CudaError;
use crate::model::config::RopeStyle;

impl CudaBackend {
    /// Uploads the step inputs and runs (or replays) the layers; the logits stay on the device.
    pub(super) fn run_step(&mut self, w: &mut Work, f: &Flat) -> Result<(), CudaError> {
        let meta = w.meta.as_mut().expect("step inputs allocated by ensure_work");
        let mut view = meta.slice_mut(0..self.host_meta.len());
        if let Some(t) = self.step_times.as_mut() {
            t.begin(&self.dev.stream, f.n_tok)?;
        }
        self.dev.stream.memcpy_htod(&self.host_meta, &mut view).map_err(CudaError::driver("uploading step inputs"))?;
        self.launch_step(w, f)?;
        if let Some(t) = self.step_times.as_mut() {
            t.end(&self.dev.stream)?;
        }
        Ok(())
    }

    /// The step's kernels: profiled, replayed from a graph, or launched one by one.
    fn launch_step(&mut self, w: &mut Work, f: &Flat) -> Result<(), CudaError> {
        if self.prof.is_some() {
            let mut prof = self.prof.take();
            let r = self.run_layers(w, f, &mut prof);
            self.prof = prof;
            r?;
            self.prof.as_mut().map_or(Ok(()), |p| p.end())?;
        } else if self.tap.is_none()
            && self.tp.is_none()
            && f.n_tok <= TC_MAX_TOKENS
            && self.graphs.wanted(&graph_key(f))
        {
            if !self.replay(w, f)? {
                self.run_layers(w, f, &mut None)?;
            }
        } else {
            self.run_layers(w, f, &mut None)?;
        }
        Ok(())
    }

    /// Runs the step and returns the logits of the chunks that want them.
    pub(super) fn forward(&mut self, f: &Flat) -> Result<Vec<Vec<f32>>, CudaError> {
        let mut w = std::mem::take(&mut self.work);
        let r = (|| {
            self.run_step(&mut w, f)?;
            if f.m == 0 {
                return Ok(Vec::new());
            }
            let v = self.cfg.vocab_size;
            let all = w.logits.as_ref().expect("logits allocated by ensure_work").slice(0..f.m * v);
            let pinned = w.host_logits.as_mut().expect("pinned logits allocated by ensure_work");
            let host = pinned.as_mut_slice().map_err(CudaError::driver("mapping the pinned logits"))?;
            let host = &mut host[..f.m * v];
            // A plain host slice: the copy is asynchronous, so wait for the stream before reading.
            self.dev.stream.memcpy_dtoh(&all, host).map_err(CudaError::driver("downloading logits"))?;
            self.dev.stream.synchronize().map_err(CudaError::driver("waiting for the logits"))?;
            // One vector per sequence, split across threads (64 x 600 KB a step at 64 slots).
            Ok(host.par_chunks(v).map(|r| r.to_vec()).collect())
        })();
        self.work = w;
        r
    }

    /// Runs the step and returns the arg-max id of each logits row, chosen on the device.
    pub(super) fn forward_greedy(&mut self, f: &Flat) -> Result<Vec<u32>, CudaError> {
        let mut w = std::mem::take(&mut self.work);
        let r = (|| {
            self.run_step(&mut w, f)?;
            if f.m == 0 {
                return Ok(Vec::new());
            }
            let s: &CudaStream = &self.dev.stream;
            let ids = w.argmax.as_ref().expect("arg-max buffer allocated by ensure_work");
            l::ArgmaxRows { x: ptr(&w.logits, s), out: Dev::of(ids, s), rows: f.m, n: self.cfg.vocab_size }
                .launch(&mut self.kernels, s)?;
            let got =
                self.dev.stream.clone_dtoh(&ids.slice(0..f.m)).map_err(CudaError::driver("downloading arg-max ids"))?;
            // The copy is asynchronous by API (pageable memory makes it synchronous in practice):
            // wait before reading.
            self.dev.stream.synchronize().map_err(CudaError::driver("waiting for the arg-max ids"))?;
            Ok(got.into_iter().map(|i| i as u32).collect())
        })();
        self.work = w;
        r
    }

    /// Launches the captured graph of this step shape, capturing it first if needed. `false`:
    /// the step could not be captured (nothing ran; the caller launches it directly, and this
    /// shape is not tried again).
    fn replay(&mut self, w: &Work, f: &Flat) -> Result<bool, CudaError> {
        let key = graph_key(f);
        if !self.graphs.contains(&key) {
            // Module loads are not stream work; do them all before capturing.
            self.kernels.load_all()?;
            let s = self.dev.stream.clone();
            StepGraphs::begin_capture(&s)?;
            let ran = self.run_layers(w, f, &mut None);
            if !self.graphs.end_capture(&s, key, f.n_tok, ran)? {
                return Ok(false);
            }
            self.note_memory();
        }
        self.graphs.launch(&key)?;
        Ok(true)
    }

    fn run_layers(&mut self, w: &Work, f: &Flat, prof: &mut Option<Profiler>) -> Result<(), CudaError> {
        let c = &self.cfg;
        let s: &CudaStream = &self.dev.stream;
        let n = f.n_tok;
        let (dim, qd, kvd, hd, ffn) = (c.dim, c.q_dim(), c.kv_dim(), c.head_dim, c.ffn_dim);
        let qkv_w = qd + 2 * kvd;
        let (x, h, qkv, att, gu, act) =
            (ptr(&w.x, s), ptr(&w.h, s), ptr(&w.qkv, s), ptr(&w.att, s), ptr(&w.gu, s), ptr(&w.act, s));
        let meta = ptr(&w.meta, s);
        let lay = layout(w.cap_tok);
        let (pos, kv_rows) = (meta.offset(lay.pos), meta.offset(lay.kv_rows));
        let k = &mut self.kernels;
        let wide = self.wide.as_ref().map(|b| Dev::of(b, s));
        let mut mm = Mm { s, blas: self.blas.as_ref(), x16: ptr(&w.x16, s), part: ptr(&w.tc_part, s), wide };
        let cache_rows = self.num_blocks * self.block_size;
        if let Some(p) = prof.as_mut() {
            p.begin(s, n)?;
        }
        let mut mark = |class: &'static str| prof.as_mut().map_or(Ok(()), |p| p.mark(s, class));
        // Tensor parallel: rank 0 adds the residual into its partial output projections, the
        // others write theirs alone; the all-reduce after each sums them (tp_rank.rs).
        let mut tp = self.tp.as_mut();
        let add_residual = tp.as_ref().is_none_or(|r| r.adds_residual());

        let ids = meta.offset(lay.ids).cast::<u32>();
        let embd = &self.embd.parts[0];
        match (embd.f16(s), embd.quant(s)) {
            (Some(table), _) => l::Embedding { table, ids, out: x, vocab: c.vocab_size, n_tok: n, dim }.launch(k, s)?,
            (None, Some(table)) => EmbeddingQ { table, ids, out: x, n_tok: n }.launch(k, s)?,
            (None, None) => unreachable!("a matrix is F16 or quantized"),
        }
        mark("embedding")?;
        let norm = |x: Dev<f32>, wt: Dev<f32>, out: Dev<f32>| l::RmsNorm::plain(x, wt, out, n, dim, c.rms_eps);
        let attn_io = AttnIo {
            f: FlatAttn::of(f),
            meta,
            kv_begin: lay.kv_begin,
            casc_tiles: lay.casc_tiles,
            casc_rows: lay.casc_rows,
            tiles: lay.tiles,
            tile_rows: lay.tile_rows,
            part_o: ptr(&w.part_o, s),
            part_ml: ptr(&w.part_ml, s),
        };
        let hybrid_io = self.hybrid.as_ref().map(|_| super::hybrid::StepIo {
            x,
            h,
            att,
            attn: attn_io,
            pos,
            kv_rows,
            block_tables: meta.offset(lay.bt),
            tok_seq: meta.offset(lay.tok_seq),
            n_tok: n,
            n_seqs: f.n_seqs,
            cache_rows,
            block_size: self.block_size,
            bt_stride: self.bt_stride,
        });
        // Norms folded into the products that read them (step_norm.rs), except where a tap
        // reads the normed input.
        let fuse = self.fuse_norm && self.tap.is_none();
        let norm_in = |wt: &CudaSlice<f32>| NormIn { x, w: Dev::of(wt, s), h, n, dim, eps: c.rms_eps };
        for (li, lw) in self.layers.iter().enumerate() {
            if !fuse {
                norm(x, Dev::of(&lw.attn_norm, s), h).launch(k, s)?;
                mark("rmsnorm")?;
            }
            if let (Some(hy), Some(io)) = (&self.hybrid, &hybrid_io) {
                // Qwen3.5: Gated DeltaNet or gated attention, then the dense FFN as below; the
                // norms folded into the products that read them as for the plain layers.
                let pre = fuse.then(|| norm_in(&lw.attn_norm));
                hy.mixer(li, lw, super::hybrid::MixerCx { c, k, mm: &mut mm, io, pre, mark: &mut mark })?;
                if let Some(moe) = &lw.moe {
                    // One-stream steps: the shared expert inside the routed experts' launches
                    // (moe_shexp.rs), which read h in f32.
                    let in_pairs = super::moe_shexp::shared_pairs(moe, &w.moe, n, s);
                    // The FFN norm also writes the shared expert's int8 input where its gate/up
                    // reads one (the routed experts read h in f32 and leave x16 alone).
                    let have = match &moe.shared {
                        Some(sh) if fuse && in_pairs.is_none() => super::step_norm::prepare(
                            k,
                            &mut mm,
                            norm_in(&lw.ffn_norm),
                            super::matmul::input_form(&sh.gu.parts[0], n),
                        )?,
                        _ => {
                            norm(x, Dev::of(&lw.ffn_norm, s), h).launch(k, s)?;
                            super::matmul::XForm::None
                        }
                    };
                    mark("rmsnorm")?;
                    if let Some(t) = self.tap.as_mut() {
                        t.layer_input(&self.dev.stream, li, TapPoint::Router, &w.h, n, dim)?;
                    }
                    if let Some(sh) = &in_pairs {
                        super::moe_shexp::moe_ffn_shared(k, s, moe, &w.moe, sh, h, x, n)?;
                        mark("moe ffn")?;
                        continue;
                    }
                    // Qwen3.5-MoE / Qwen3-Next: routed experts, then the gated shared expert.
                    super::moe::moe_ffn(k, s, moe, &w.moe, h, x, n)?;
                    mark("moe ffn")?;
                    if let Some(sh) = &moe.shared {
                        let fold = hy.fold_shexp_gate;
                        super::shared_expert::shared_expert_ffn_with(k, &mut mm, sh, &w.shexp, h, x, n, have, fold)?;
                        mark("shared expert")?;
                    }
                    continue;
                }
                if fuse {
                    norm_swiglu(k, &mut mm, norm_in(&lw.ffn_norm), &lw.wgu, gu, act, ffn)?;
                } else {
                    norm(x, Dev::of(&lw.ffn_norm, s), h).launch(k, s)?;
                    mark("rmsnorm")?;
                    swiglu(k, &mut mm, &lw.wgu, h, n, gu, act, ffn)?;
                }
                mark("gate/up matmul")?;
                mm.run(k, Product { lin: &lw.wdown, bias: None, x: act, n, out: x, accumulate: true })?;
                mark("down matmul")?;
                continue;
            }
            if let Some(t) = self.tap.as_mut() {
                t.layer_input(&self.dev.stream, li, TapPoint::Qkv, &w.h, n, dim)?;
            }
            let bias = lw.bqkv.as_ref().map(|b| Dev::of(b, s));
            let qkv_p = Product { lin: &lw.wqkv, bias, x: h, n, out: qkv, accumulate: false };
            if fuse {
                norm_product(k, &mut mm, norm_in(&lw.attn_norm), qkv_p)?;
                mark("norm+qkv matmul")?;
            } else {
                mm.run(k, qkv_p)?;
                mark("qkv matmul")?;
            }
            let (kc, vc, kv_scales) = lw.kv_dev(s);
            QkvPost {
                qkv,
                store: RopeStore {
                    q_norm: lw.q_norm.as_ref().map(|v| Dev::of(v, s)),
                    k_norm: lw.k_norm.as_ref().map(|v| Dev::of(v, s)),
                    pos,
                    cos: Dev::of(&self.rope_cos, s),
                    sin: Dev::of(&self.rope_sin, s),
                    max_pos: self.max_pos,
                    k_cache: kc,
                    v_cache: vc,
                    kv_scales,
                    kv_rows,
                    cache_rows,
                },
                n_tok: n,
                n_heads: c.n_heads,
                n_kv: c.n_kv_heads,
                head_dim: hd,
                stride: qkv_w,
                halves: c.rope_style == RopeStyle::Halves,
                eps: c.rms_eps,
            }
            .launch(k, s)?;
            mark("qkv_post")?;
            let paged = l::PagedAttn {
                q: qkv,
                k_cache: kc,
                v_cache: vc,
                kv_scales,
                block_tables: meta.offset(lay.bt),
                tok_seq: meta.offset(lay.tok_seq),
                pos,
                out: att,
                cache_rows,
                n_seqs: f.n_seqs,
                n_tok: n,
                n_heads: c.n_heads,
                n_kv: c.n_kv_heads,
                head_dim: hd,
                block_size: self.block_size,
                bt_stride: self.bt_stride,
                q_stride: qkv_w,
                out_stride: qd,
            };
            attn_io.launch(k, s, paged, &mut mark)?;
            if let Some(t) = self.tap.as_mut() {
                t.layer_input(&self.dev.stream, li, TapPoint::O, &w.att, n, qd)?;
            }
            mm.run(k, Product { lin: &lw.wo, bias: None, x: att, n, out: x, accumulate: add_residual })?;
            if let Some(r) = tp.as_mut() {
                r.all_reduce(x, n * dim, s)?;
            }
            mark("o matmul")?;
            if let Some(moe) = &lw.moe {
                if let Some(t) = self.tap.as_mut() {
                    // The tap reads the normed input the router sees, so the norm runs first.
                    norm(x, Dev::of(&lw.ffn_norm, s), h).launch(k, s)?;
                    t.layer_input(&self.dev.stream, li, TapPoint::Router, &w.h, n, dim)?;
                    super::moe::moe_ffn(k, s, moe, &w.moe, h, x, n)?;
                } else {
                    // The norm runs inside the MoE launch where a one-stream step allows (moe.rs).
                    super::moe::moe_ffn_normed(k, s, moe, &w.moe, x, Dev::of(&lw.ffn_norm, s), c.rms_eps, h, n)?;
                }
                mark("moe ffn")?;
                continue;
            }
            if !fuse {
                norm(x, Dev::of(&lw.ffn_norm, s), h).launch(k, s)?;
                mark("rmsnorm")?;
            }
            if let Some(t) = self.tap.as_mut() {
                t.layer_input(&self.dev.stream, li, TapPoint::GateUp, &w.h, n, dim)?;
            }
            if fuse {
                norm_swiglu(k, &mut mm, norm_in(&lw.ffn_norm), &lw.wgu, gu, act, ffn)?;
                mark("norm+gate/up matmul")?;
            } else {
                swiglu(k, &mut mm, &lw.wgu, h, n, gu, act, ffn)?;
                mark("gate/up matmul")?;
            }
            if let Some(t) = self.tap.as_mut() {
                t.layer_input(&self.dev.stream, li, TapPoint::Down, &w.act, n, ffn)?;
            }
            mm.run(k, Product { lin: &lw.wdown, bias: None, x: act, n, out: x, accumulate: add_residual })?;
            if let Some(r) = tp.as_mut() {
                r.all_reduce(x, n * dim, s)?;
            }
            mark("down matmul")?;
        }
        if let Some(t) = self.tap.as_mut() {
            // The head's input for every token (h is free now), not only the logit rows.
            norm(x, Dev::of(&self.output_norm, s), h).launch(k, s)?;
            t.head_input(&self.dev.stream, &w.h, n, dim)?;
        }
        // The output head is replicated: rank 0 alone computes the logits.
        if f.m == 0 || self.tp.as_ref().is_some_and(|r| r.rank > 0) {
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
        mark("output head")
    }
}
