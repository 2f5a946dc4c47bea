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
//! where a tap reads the normed input, in hybrid layers and before a mixture-of-experts FFN.

use cudarc::driver::{CudaSlice, CudaStream};
use rayon::prelude::*;

use super::backend::CudaBackend;
use super::dmat::Linear;
use super::gemm_tc::{tc64_part_len, TC_MAX_TOKENS};
use super::gemv_f16::GemvSwiglu;
use super::graph::{GraphKey, StepGraphs};
use super::kernels::Kernels;
use super::kv_cache::QkvPost;
use super::launch::Dev;
use super::matmul::{packed_gemv, tc_min_tokens, Mm, Product};
use super::ops as l;
use super::prefill::{PrefillAttention, PrefillSplit};
use super::profile::Profiler;
use super::qlaunch::EmbeddingQ;
use super::step_norm::{norm_product, norm_swiglu, NormIn};
use super::tap::TapPoint;
use super::workspace::{grow, layout, ptr, Work};
use super::CudaError;
use crate::backend::BackendError;
use crate::engine::plan::{PlanLimits, StepPlan};
use crate::model::config::RopeStyle;

/// The shape of one step (its inputs are in `CudaBackend::host_meta`).
///
/// Tokens are laid out with the one-token chunks (decode) first: the split attention kernel
/// takes tokens `0..n_single`, the tensor-core prefill attention the tiles of the longer
/// chunks after them. Logit rows stay in plan order.
pub(super) struct Flat {
    pub n_tok: usize,
    pub n_seqs: usize,
    /// Chunks that want logits.
    pub m: usize,
    /// Tokens for the split attention kernel (the first ones).
    pub n_single: usize,
    /// Longest sequence among those tokens.
    pub max_len: usize,
    /// Attention splits launched for them, and positions per split.
    pub splits: usize,
    pub split_len: usize,
    /// Prefill attention tiles (16 tokens at most each) over the other tokens.
    pub n_tiles: usize,
    /// Their splits (1: no partials) and positions per split.
    pub pf_splits: usize,
    pub pf_split_len: usize,
    /// Shared-prefix pass over the decode tokens: tiles, rows, splits, positions per split
    /// (no tiles: none).
    pub casc_tiles: usize,
    pub casc_rows: usize,
    pub casc_splits: usize,
    pub casc_split_len: usize,
}

impl Flat {
    /// Partial (token, head) slots of the decode tokens (splits, then shared-prefix slots).
    fn dec_slots(&self) -> usize {
        self.splits + self.casc_splits
    }

    /// Partial rows (token x head x slot) of the step: decode, then prefill.
    fn part_rows(&self, n_heads: usize) -> usize {
        let pf = if self.pf_splits > 1 { (self.n_tok - self.n_single) * self.pf_splits } else { 0 };
        (self.n_single * self.dec_slots() + pf) * n_heads
    }
}

fn graph_key(f: &Flat) -> GraphKey {
    (f.n_tok, f.m, f.splits, f.n_single, f.n_tiles, f.split_len, f.pf_splits)
}

impl CudaBackend {
    /// Splits of `split_len` positions of the split attention pass: rounded up to a power of
    /// two for graph-sized steps (`n_tok` tokens in all).
    fn splits_for(n_tok: usize, split_len: usize, max_len: usize) -> usize {
        let need = max_len.div_ceil(split_len).max(1);
        if n_tok <= TC_MAX_TOKENS {
            need.next_power_of_two()
        } else {
            need
        }
    }

    /// Work buffers for `n_tok` tokens, `part` attention partial rows (token x head x slot),
    /// and `m` logit rows.
    fn ensure_work(&mut self, n_tok: usize, part: usize, m: usize) -> Result<(), CudaError> {
        let c = &self.cfg;
        let s = &self.dev.stream;
        let w = &mut self.work;
        let mut grew = false;
        if n_tok > w.cap_tok {
            let cap = n_tok.next_power_of_two();
            let qkv = c.q_dim() + 2 * c.kv_dim();
            grew |= grow(s, &mut w.x, cap * c.dim, "residual")?;
            grew |= grow(s, &mut w.h, cap * c.dim, "normed input")?;
            grew |= grow(s, &mut w.qkv, cap * qkv, "qkv")?;
            grew |= grow(s, &mut w.att, cap * c.q_dim(), "attention output")?;
            grew |= grow(s, &mut w.gu, cap * 2 * c.ffn_dim, "gate/up")?;
            grew |= grow(s, &mut w.act, cap * c.ffn_dim, "ffn activation")?;
            // At least 16 rows: the tensor-core GEMM reads its input in tiles of 16 tokens.
            let widest = c.dim.max(c.q_dim()).max(c.ffn_dim);
            grew |= grow(s, &mut w.x16, cap.max(16) * widest, "f16 GEMM input")?;
            grew |= grow(s, &mut w.meta, layout(cap).bt + cap * self.bt_stride, "step inputs")?;
            let (qd, kvd) = (c.q_dim(), c.kv_dim());
            let shapes = [(qd + 2 * kvd, c.dim), (c.dim, qd), (2 * c.ffn_dim, c.dim), (c.dim, c.ffn_dim)];
            let part = shapes.iter().map(|&(r, k)| tc64_part_len(r, k, cap.min(TC_MAX_TOKENS))).max().unwrap_or(0);
            grew |= grow(s, &mut w.tc_part, part, "GEMM partial sums")?;
            if let Some(m) = &c.moe {
                grew |= w.moe.grow(s, cap, c.dim, m)?;
            }
            let shared = self.layers.iter().filter_map(|l| l.moe.as_ref()?.shared.as_ref().map(|x| x.ffn)).max();
            if let Some(f) = shared {
                grew |= w.shexp.grow(s, cap, c.dim, f)?;
            }
            if let Some(hy) = &mut self.hybrid {
                grew |= hy.ensure(s, c, cap)?;
            }
            w.cap_tok = cap;
        }
        let part = part.max(c.n_heads);
        if part > w.cap_part {
            grew |= grow(s, &mut w.part_o, part * c.head_dim, "attention partials")?;
            grew |= grow(s, &mut w.part_ml, part * 2, "attention statistics")?;
            w.cap_part = part;
        }
        if m > w.cap_logits {
            grew |= grow(s, &mut w.hn, m * c.dim, "final norm")?;
            grew |= grow(s, &mut w.logits, m * c.vocab_size, "logits")?;
            grew |= grow(s, &mut w.argmax, m, "arg-max ids")?;
            // Plain page-locked memory (no write-combining: the host reads it).
            // SAFETY: the buffer is only read after a download into it has completed (as_slice
            // waits on the copy's event), and only its first m x vocab values are read.
            let pinned = unsafe { self.dev.ctx.alloc_pinned_with_flags::<f32>(m * c.vocab_size, 0) };
            w.host_logits = Some(pinned.map_err(CudaError::driver("allocating pinned logits"))?);
            w.cap_logits = m;
        }
        if grew {
            self.graphs.clear(); // they hold the old addresses
            self.note_memory();
        }
        Ok(())
    }

    /// Checks the plan, sizes the work buffers and writes the step inputs to `host_meta`.
    pub(super) fn flatten(&mut self, plan: &StepPlan) -> Result<Flat, BackendError> {
        let n = plan.n_tokens();
        let bs = self.block_size;
        let lim = PlanLimits {
            block_size: bs,
            num_blocks: self.num_blocks,
            vocab_size: self.cfg.vocab_size,
            max_pos: Some(self.max_pos),
        };
        plan.validate(&lim)?;
        let mut m = 0;
        let (nh, nkv, hd) = (self.cfg.n_heads, self.cfg.n_kv_heads, self.cfg.head_dim);
        // Chunks of several tokens go to the prefill attention where the shape allows it.
        let tiled = super::prefill::prefill_supported(nh, nkv, hd);
        let single = |len: usize| !tiled || len == 1;
        let (mut n_single, mut max_len, mut n_tiles, mut max_end) = (0, 1, 0, 0);
        for c in &plan.chunks {
            let end = c.start_pos + c.tokens.len();
            m += usize::from(c.want_logits);
            if single(c.tokens.len()) {
                n_single += c.tokens.len();
                max_len = max_len.max(end);
            } else {
                n_tiles += c.tokens.len().div_ceil(super::prefill::TILE_TOKENS);
                max_end = max_end.max(end);
            }
        }
        let graph = n <= TC_MAX_TOKENS;
        let split_len = l::decode_split_len(n_single, max_len, nh, nkv, hd);
        let (pf_splits, pf_split_len) =
            super::prefill::prefill_splits(n_tiles, n - n_single, max_end, nh, nkv, hd, graph);
        let mut f = Flat {
            n_tok: n,
            n_seqs: plan.chunks.len(),
            m,
            n_single,
            max_len,
            splits: Self::splits_for(n, split_len, max_len),
            split_len,
            n_tiles,
            pf_splits,
            pf_split_len,
            casc_tiles: 0,
            casc_rows: 0,
            casc_splits: 0,
            casc_split_len: 0,
        };
        if n == 0 {
            return Ok(f);
        }
        // Shared prefixes among the decode tokens (not in graph-sized steps: a graph would
        // have to be captured per grouping).
        let cascade = if !graph && tiled && n_single >= 2 && super::tuning::tuning().cascade {
            let toks: Vec<super::cascade::DecodeTok> = plan
                .chunks
                .iter()
                .enumerate()
                .filter(|(_, c)| single(c.tokens.len()))
                .enumerate()
                .map(|(token, (ci, c))| super::cascade::DecodeTok {
                    token,
                    bt_row: ci,
                    table: &c.block_table,
                    pos: c.start_pos,
                })
                .collect();
            super::cascade::plan(&toks, n_single, bs)
        } else {
            None
        };
        if let Some(c) = &cascade {
            f.casc_tiles = c.tiles.len() / 4;
            f.casc_rows = c.rows.len();
            (f.casc_splits, f.casc_split_len) = super::cascade::splits(f.casc_tiles, c.max_shared, nh, nkv, hd);
        }
        self.ensure_work(n, f.part_rows(nh), m)?;
        let lay = layout(self.work.cap_tok);
        let bts = self.bt_stride;
        let meta = &mut self.host_meta;
        meta.clear();
        meta.resize(lay.bt + plan.chunks.len() * bts, 0);
        let mut t = 0;
        let (mut tiles, mut tile_rows) = (Vec::new(), Vec::new());
        let mut last_tok = vec![0usize; plan.chunks.len()];
        // Two passes: one-token chunks, then the rest (see `Flat`).
        for pass_single in [true, false] {
            for (ci, c) in plan.chunks.iter().enumerate() {
                if single(c.tokens.len()) != pass_single {
                    continue;
                }
                // Entries past bt_stride cover positions beyond max_pos, which no chunk reaches.
                for (i, &b) in c.block_table.iter().take(bts).enumerate() {
                    meta[lay.bt + ci * bts + i] = b as i32;
                }
                if !pass_single {
                    super::prefill::push_tiles(&mut tiles, &mut tile_rows, t, c.tokens.len(), c.start_pos, ci);
                }
                for (i, &tok) in c.tokens.iter().enumerate() {
                    let p = c.start_pos + i;
                    meta[lay.ids + t] = tok as i32;
                    meta[lay.pos + t] = p as i32;
                    meta[lay.slots + t] = (c.block_table[p / bs] as usize * bs + p % bs) as i32;
                    meta[lay.tok_seq + t] = ci as i32;
                    t += 1;
                }
                last_tok[ci] = t - 1;
            }
        }
        let mut r = 0;
        for (ci, c) in plan.chunks.iter().enumerate() {
            if c.want_logits {
                meta[lay.rows + r] = last_tok[ci] as i32;
                r += 1;
            }
        }
        debug_assert_eq!(tiles.len(), 4 * f.n_tiles);
        meta[lay.tiles..lay.tiles + tiles.len()].copy_from_slice(&tiles);
        meta[lay.tile_rows..lay.tile_rows + tile_rows.len()].copy_from_slice(&tile_rows);
        if let Some(c) = &cascade {
            meta[lay.casc_tiles..lay.casc_tiles + c.tiles.len()].copy_from_slice(&c.tiles);
            meta[lay.casc_rows..lay.casc_rows + c.rows.len()].copy_from_slice(&c.rows);
            meta[lay.kv_begin..lay.kv_begin + c.kv_begin.len()].copy_from_slice(&c.kv_begin);
        }
        if let Some(hy) = &mut self.hybrid {
            // Recurrent states: checked, reset at position 0, chunk table uploaded.
            if hy.begin_step(&self.dev.stream, plan, &last_tok)? {
                self.graphs.clear(); // the state pool moved
            }
        }
        Ok(f)
    }

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
        } else if self.tap.is_none() && f.n_tok <= TC_MAX_TOKENS && self.graphs.wanted(&graph_key(f)) {
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
        let (pos, slots) = (meta.offset(lay.pos), meta.offset(lay.slots));
        let k = &mut self.kernels;
        let wide = self.wide.as_ref().map(|b| Dev::of(b, s));
        let mut mm = Mm { s, blas: &self.blas, x16: ptr(&w.x16, s), part: ptr(&w.tc_part, s), wide };
        let n_slots = self.num_blocks * self.block_size;
        if let Some(p) = prof.as_mut() {
            p.begin(s, n)?;
        }
        let mut mark = |class: &'static str| prof.as_mut().map_or(Ok(()), |p| p.mark(s, class));

        let ids = meta.offset(lay.ids).cast::<u32>();
        let embd = &self.embd.parts[0];
        match (embd.f16(s), embd.quant(s)) {
            (Some(table), _) => l::Embedding { table, ids, out: x, vocab: c.vocab_size, n_tok: n, dim }.launch(k, s)?,
            (None, Some(table)) => EmbeddingQ { table, ids, out: x, n_tok: n }.launch(k, s)?,
            (None, None) => unreachable!("a matrix is F16 or quantized"),
        }
        mark("embedding")?;
        let norm = |x: Dev<f32>, wt: Dev<f32>, out: Dev<f32>| l::RmsNorm {
            x,
            w: wt,
            out,
            rows: None,
            n_src_rows: n,
            n_outer: n,
            n_inner: 1,
            dim,
            in_stride: dim,
            out_stride: dim,
            eps: c.rms_eps,
        };
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
            slots,
            block_tables: meta.offset(lay.bt),
            tok_seq: meta.offset(lay.tok_seq),
            n_tok: n,
            n_seqs: f.n_seqs,
            n_slots,
            block_size: self.block_size,
            bt_stride: self.bt_stride,
        });
        // Norms folded into the products that read them (step_norm.rs), except where a tap
        // reads the normed input.
        let fuse = self.fuse_norm && self.tap.is_none();
        let norm_in = |wt: &CudaSlice<f32>| NormIn { x, w: Dev::of(wt, s), h, n, dim, eps: c.rms_eps };
        for (li, lw) in self.layers.iter().enumerate() {
            if !fuse || self.hybrid.is_some() {
                norm(x, Dev::of(&lw.attn_norm, s), h).launch(k, s)?;
                mark("rmsnorm")?;
            }
            if let (Some(hy), Some(io)) = (&self.hybrid, &hybrid_io) {
                // Qwen3.5: Gated DeltaNet or gated attention, then the dense FFN as below.
                hy.mixer(li, lw, c, k, &mut mm, io)?;
                mark(if c.has_kv(li) { "hybrid attention" } else { "deltanet" })?;
                norm(x, Dev::of(&lw.ffn_norm, s), h).launch(k, s)?;
                mark("rmsnorm")?;
                if let Some(moe) = &lw.moe {
                    // Qwen3.5-MoE / Qwen3-Next: routed experts, then the gated shared expert.
                    super::moe::moe_ffn(k, s, moe, &w.moe, h, x, n)?;
                    mark("moe ffn")?;
                    if let Some(sh) = &moe.shared {
                        super::shared_expert::shared_expert_ffn(k, &mut mm, sh, &w.shexp, h, x, n)?;
                        mark("shared expert")?;
                    }
                    continue;
                }
                swiglu(k, &mut mm, &lw.wgu, h, n, gu, act, ffn)?;
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
            let (kc, vc) = (Dev::of(&lw.k_cache, s), Dev::of(&lw.v_cache, s));
            QkvPost {
                qkv,
                q_norm: lw.q_norm.as_ref().map(|v| Dev::of(v, s)),
                k_norm: lw.k_norm.as_ref().map(|v| Dev::of(v, s)),
                pos,
                cos: Dev::of(&self.rope_cos, s),
                sin: Dev::of(&self.rope_sin, s),
                max_pos: self.max_pos,
                k_cache: kc,
                v_cache: vc,
                slots,
                n_slots,
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
                block_tables: meta.offset(lay.bt),
                tok_seq: meta.offset(lay.tok_seq),
                pos,
                out: att,
                n_slots,
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
            mm.run(k, Product { lin: &lw.wo, bias: None, x: att, n, out: x, accumulate: true })?;
            mark("o matmul")?;
            if !fuse || lw.moe.is_some() {
                norm(x, Dev::of(&lw.ffn_norm, s), h).launch(k, s)?;
                mark("rmsnorm")?;
            }
            if let Some(moe) = &lw.moe {
                super::moe::moe_ffn(k, s, moe, &w.moe, h, x, n)?;
                mark("moe ffn")?;
                continue;
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
            mm.run(k, Product { lin: &lw.wdown, bias: None, x: act, n, out: x, accumulate: true })?;
            mark("down matmul")?;
        }
        if let Some(t) = self.tap.as_mut() {
            // The head's input for every token (h is free now), not only the logit rows.
            norm(x, Dev::of(&self.output_norm, s), h).launch(k, s)?;
            t.head_input(&self.dev.stream, &w.h, n, dim)?;
        }
        if f.m == 0 {
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

/// `act[t, r] = silu(gate) * up` of the stacked gate/up weights `[2 ffn, dim]` for `n` tokens:
/// one fused GEMV where the weights are one part (F16 at 1 token, a block format at 1..=8),
/// else the product into `gu` and `silu_mul`.
#[allow(clippy::too_many_arguments)]
pub(super) fn swiglu(
    k: &mut Kernels,
    mm: &mut Mm,
    wgu: &Linear,
    h: Dev<f32>,
    n: usize,
    gu: Dev<f32>,
    act: Dev<f32>,
    ffn: usize,
) -> Result<(), CudaError> {
    let s = mm.s;
    let dim = wgu.cols();
    if let [m] = &wgu.parts[..] {
        if let (Some(w), true) = (m.f16(s), n < tc_min_tokens()) {
            let g = GemvSwiglu { w, x: h, out: act, ffn, cols: dim, n_tok: n, x_stride: dim, out_stride: ffn };
            return g.launch(k, s);
        }
        if let (Some(w), true) = (m.quant(s), packed_gemv(m, n)) {
            return mm.swiglu_q(k, w, h, n, act, ffn);
        }
    }
    mm.run(k, Product { lin: wgu, bias: None, x: h, n, out: gu, accumulate: false })?;
    l::SiluMul { gu, out: act, n_tok: n, ffn }.launch(k, s)
}

/// Where the step's attention reads its tables and writes its partials: everything but the
/// layer's Q and K/V, shared by the plain layers and the hybrid models' attention layers.
#[derive(Clone, Copy)]
pub(super) struct AttnIo {
    pub f: FlatAttn,
    pub meta: Dev<i32>,
    pub kv_begin: usize,
    pub casc_tiles: usize,
    pub casc_rows: usize,
    pub tiles: usize,
    pub tile_rows: usize,
    pub part_o: Dev<f32>,
    pub part_ml: Dev<f32>,
}

/// The attention numbers of [`Flat`] (Copy, so a layer can hold them).
#[derive(Clone, Copy)]
pub(super) struct FlatAttn {
    n_tok: usize,
    n_single: usize,
    max_len: usize,
    splits: usize,
    split_len: usize,
    n_tiles: usize,
    pf_splits: usize,
    pf_split_len: usize,
    casc_tiles: usize,
    casc_rows: usize,
    casc_splits: usize,
    casc_split_len: usize,
}

impl FlatAttn {
    fn of(f: &Flat) -> Self {
        FlatAttn {
            n_tok: f.n_tok,
            n_single: f.n_single,
            max_len: f.max_len,
            splits: f.splits,
            split_len: f.split_len,
            n_tiles: f.n_tiles,
            pf_splits: f.pf_splits,
            pf_split_len: f.pf_split_len,
            casc_tiles: f.casc_tiles,
            casc_rows: f.casc_rows,
            casc_splits: f.casc_splits,
            casc_split_len: f.casc_split_len,
        }
    }

    fn dec_slots(&self) -> usize {
        self.splits + self.casc_splits
    }
}

impl AttnIo {
    /// Decode tokens through the split kernel (with the shared-prefix pass where the step has
    /// groups), then the prefill tiles; `paged` names the layer's Q, caches and output.
    pub fn launch(
        &self,
        k: &mut Kernels,
        s: &CudaStream,
        paged: l::PagedAttn,
        mark: &mut dyn FnMut(&'static str) -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        let (f, meta, n, hd) = (&self.f, self.meta, self.f.n_tok, paged.head_dim);
        let n_heads = paged.n_heads;
        let lay = self;
        let (part_o, part_ml) = (self.part_o, self.part_ml);
        if f.n_single > 0 {
            // The one-token chunks come first in the step (see `Flat`).
            let paged = l::PagedAttn { n_tok: f.n_single, ..paged };
            let prefix = (f.casc_tiles > 0).then(|| l::SharedPrefix {
                kv_begin: meta.offset(lay.kv_begin),
                attn: PrefillAttention {
                    paged,
                    tiles: meta.offset(lay.casc_tiles),
                    rows: meta.offset(lay.casc_rows),
                    n_rows: f.casc_rows,
                    n_tiles: f.casc_tiles,
                    split: Some(PrefillSplit {
                        part_o,
                        part_ml,
                        split_len: f.casc_split_len,
                        n_splits: f.casc_splits,
                        n_slots: f.dec_slots(),
                        slot0: f.splits,
                        tok0: 0,
                        n_part_tok: f.n_single,
                        merge: false,
                    }),
                },
            });
            l::Attention {
                paged,
                part_o,
                part_ml,
                max_len: f.max_len,
                n_splits: f.splits,
                split_len: f.split_len,
                onepass: None,
                prefix,
            }
            .launch(k, s)?;
            mark("attention split")?;
        }
        // The prefill tokens' partials follow the decode tokens'.
        let dec = f.n_single * f.dec_slots() * n_heads;
        let split = (f.pf_splits > 1).then_some(PrefillSplit {
            part_o: part_o.offset(dec * hd),
            part_ml: part_ml.offset(dec * 2),
            split_len: f.pf_split_len,
            n_splits: f.pf_splits,
            n_slots: f.pf_splits,
            slot0: 0,
            tok0: f.n_single,
            n_part_tok: n - f.n_single,
            merge: true,
        });
        let (tiles, rows) = (meta.offset(lay.tiles), meta.offset(lay.tile_rows));
        PrefillAttention { paged, tiles, rows, n_rows: n - f.n_single, n_tiles: f.n_tiles, split }.launch(k, s)?;
        if f.n_tiles > 0 {
            mark("attention prefill")?;
        }
        Ok(())
    }
}
