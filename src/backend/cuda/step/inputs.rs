//! The plan of one step flattened for the device: `Flat` (the step's shape) and the step
//! inputs written to `CudaBackend::host_meta` in the layout of `workspace::layout`, with the
//! work buffers grown to fit (`ensure_work`). `step` runs what this prepares.

use super::flat::Flat;
use super::graph::GraphKey;
use super::workspace::{grow, layout};
use crate::backend::cuda::model::CudaBackend;
use crate::backend::cuda::ops;
use crate::backend::cuda::ops::gemm_tc::TC_MAX_TOKENS;
use crate::backend::cuda::tuning;
use crate::backend::cuda::CudaError;
use crate::backend::BackendError;
use crate::engine::plan::{PlanLimits, StepPlan};

pub(in crate::backend::cuda) fn graph_key(f: &Flat) -> GraphKey {
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

    /// Work buffers for `n_tok` tokens, `part` attention partial rows (token x head x partial),
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
            let part = crate::backend::cuda::plan::memory::tc_part_len(c, cap);
            grew |= grow(s, &mut w.tc_part, part, "GEMM partial sums")?;
            if let Some(m) = self.layers.iter().find_map(|l| l.ffn.experts()) {
                grew |= w.experts.grow(s, cap, m)?;
            }
            let shared = self.layers.iter().filter_map(|l| l.ffn.experts()?.shared.as_ref().map(|x| x.ffn)).max();
            if let Some(f) = shared {
                grew |= w.shexp.grow(s, cap, c.dim, f)?;
            }
            if let Some(hy) = &mut self.recurrent {
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
    pub(in crate::backend::cuda) fn flatten(&mut self, plan: &StepPlan) -> Result<Flat, BackendError> {
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
        let tiled = ops::prefill::prefill_supported(nh, nkv, hd);
        // NOTE: decode tokens stay with the split kernel: as one-row prefill tiles they measured
        // 7% slower in the nightly job's mixed steps (H200, compute_70 PTX, docs/BENCHMARKS.md).
        let single = |len: usize| !tiled || len == 1;
        let (mut n_single, mut max_len, mut n_tiles, mut max_end) = (0, 1, 0, 0);
        for c in &plan.chunks {
            let end = c.start_pos + c.tokens.len();
            m += usize::from(c.want_logits);
            if single(c.tokens.len()) {
                n_single += c.tokens.len();
                max_len = max_len.max(end);
            } else {
                n_tiles += c.tokens.len().div_ceil(ops::prefill::TILE_TOKENS);
                max_end = max_end.max(end);
            }
        }
        let graph = n <= TC_MAX_TOKENS;
        let split_len = ops::attention::decode_split_len(n_single, max_len, nh, nkv, hd);
        let (pf_splits, pf_split_len) =
            ops::prefill::prefill_splits(n_tiles, n - n_single, max_end, nh, nkv, hd, graph);
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
        let cascade = if !graph && tiled && n_single >= 2 && tuning::tuning().cascade {
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
                    ops::prefill::push_tiles(&mut tiles, &mut tile_rows, t, c.tokens.len(), c.start_pos, ci);
                }
                for (i, &tok) in c.tokens.iter().enumerate() {
                    let p = c.start_pos + i;
                    meta[lay.ids + t] = tok as i32;
                    meta[lay.pos + t] = p as i32;
                    meta[lay.kv_rows + t] = (c.block_table[p / bs] as usize * bs + p % bs) as i32;
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
        if let Some(hy) = &mut self.recurrent {
            // Recurrent states: checked, reset at position 0, chunk table uploaded.
            hy.begin_step(&self.dev.stream, plan, &last_tok)?;
        }
        Ok(f)
    }
}
