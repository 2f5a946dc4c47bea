//! Token windows through one model, several at a time: `batch` windows run as `batch`
//! sequences of one batched prefill (each its own KV blocks, fed in chunks of the step's token
//! budget), and the output head's input at every scored position is kept. The head itself
//! runs later, on the host (`stats.rs`), for the CPU and the GPU alike.

use crate::backend::cpu::tap::ActivationTap;
use crate::backend::Backend;
use crate::engine::plan::{SeqChunk, StatePlan, StepPlan};
use crate::quantize::calibrate::Progress;
use crate::quantize::QuantizeError;

/// Tokens of one batched step at most (the GPU's workspace is planned for it): every window of
/// a batch gets `STEP_TOKENS / batch` of them per step (at least [`MIN_CHUNK`]).
pub const STEP_TOKENS: usize = 2048;
const MIN_CHUNK: usize = 16;

/// Tokens per window per step for `batch` windows.
pub fn chunk_tokens(batch: usize) -> usize {
    (STEP_TOKENS / batch.max(1)).max(MIN_CHUNK)
}

/// The positions of a window whose next token is scored: the second half (the first is
/// context, as llama.cpp's perplexity tool does). Position j predicts token j + 1.
pub fn scored_from(len: usize) -> usize {
    len / 2
}

/// Captures the output head's input (every token's final-normed hidden state, `[n_tok, dim]`).
pub struct HeadInput {
    pub head: String,
    pub rows: Vec<f32>,
}

impl ActivationTap for HeadInput {
    fn matmul_input(&mut self, names: &[&str], x: &[f32], n_tok: usize) {
        if names.first() == Some(&self.head.as_str()) {
            let cols = x.len() / n_tok.max(1);
            self.rows.extend_from_slice(&x[..n_tok * cols]);
        }
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

/// A model placed on a device, with a tap on its head's input (`scorer_cpu`, `scorer_cuda`).
pub trait HeadSource {
    fn backend(&mut self) -> &mut dyn Backend;
    /// Sets a fresh head tap for the next step.
    fn arm(&mut self);
    /// Takes the tap out: the head input of every token of the steps since [`HeadSource::arm`]
    /// (`[n_tok, dim]`, in the step's token order); `None` when no tap was set.
    fn disarm(&mut self) -> Option<Vec<f32>>;
}

/// The head input at the scored positions of every window (`[len - 1 - from, dim]` each, from
/// = [`scored_from`]), `batch` windows at a time through `src`. Windows are at most `ctx`
/// tokens; sequence `i` of a batch takes KV blocks `i * per .. (i + 1) * per`,
/// `per = ctx / block_size` rounded up (the backend must hold `batch * per`).
pub fn head_rows(
    src: &mut dyn HeadSource,
    windows: &[&[u32]],
    ctx: usize,
    batch: usize,
    pb: &mut Progress,
) -> Result<Vec<Vec<f32>>, QuantizeError> {
    let mut out = Vec::with_capacity(windows.len());
    for group in windows.chunks(batch.max(1)) {
        out.extend(batch_rows(src, group, ctx, chunk_tokens(batch))?);
        pb.inc(group.len() as u64);
    }
    Ok(out)
}

/// One batch: every window from position 0 in chunks of `chunk` tokens, all windows in each
/// step until each is fed.
pub(super) fn batch_rows(
    src: &mut dyn HeadSource,
    windows: &[&[u32]],
    ctx: usize,
    chunk: usize,
) -> Result<Vec<Vec<f32>>, QuantizeError> {
    let (bs, dim) = (src.backend().block_size(), src.backend().config().dim);
    let per = ctx.div_ceil(bs);
    if windows.len() * per > src.backend().num_blocks() {
        return Err(QuantizeError::Usage(format!(
            "eval: {} windows of {ctx} tokens need {} KV blocks; the backend has {}",
            windows.len(),
            windows.len() * per,
            src.backend().num_blocks()
        )));
    }
    if let Some(w) = windows.iter().find(|w| w.len() > ctx || w.len() < 2) {
        return Err(QuantizeError::Usage(format!("eval: a window of {} tokens (2..={ctx} expected)", w.len())));
    }
    let tables: Vec<Vec<u32>> =
        (0..windows.len()).map(|i| ((i * per) as u32..((i + 1) * per) as u32).collect()).collect();
    let mut pos = vec![0usize; windows.len()];
    let mut rows: Vec<Vec<f32>> =
        windows.iter().map(|w| Vec::with_capacity((w.len() - 1 - scored_from(w.len())) * dim)).collect();
    while pos.iter().zip(windows).any(|(&p, w)| p < w.len()) {
        let mut chunks: Vec<(usize, SeqChunk)> = Vec::new();
        for (i, w) in windows.iter().enumerate().filter(|(i, w)| pos[*i] < w.len()) {
            let end = (pos[i] + chunk).min(w.len());
            let c = SeqChunk {
                seq: i as u64,
                tokens: w[pos[i]..end].to_vec(),
                start_pos: pos[i],
                block_table: tables[i].clone(),
                want_logits: false,
            };
            chunks.push((i, c));
        }
        // NOTE: the GPU lays a step's one-token chunks out first (`step_flat::Flat`); with them
        // first in the plan too, the tapped rows are in plan order on every backend.
        chunks.sort_by_key(|(_, c)| c.tokens.len() != 1);
        let mut plan = StepPlan::new(chunks.iter().map(|(_, c)| c.clone()).collect());
        if src.backend().state_slots().running > 0 {
            // Hybrid models: window `i` on recurrent-state slot `i`.
            plan.state = StatePlan::fixed(&plan.chunks, |c| c.seq as u32);
        }
        src.arm();
        let stepped = src.backend().step(&plan);
        let tapped = src.disarm();
        stepped?;
        let n = plan.n_tokens();
        let h = tapped
            .filter(|h| h.len() == n * dim)
            .ok_or_else(|| QuantizeError::Usage("eval: the head input was not captured".into()))?;
        let mut t = 0;
        for (i, c) in &chunks {
            let (from, last) = (scored_from(windows[*i].len()), windows[*i].len() - 1);
            for p in c.start_pos..c.start_pos + c.tokens.len() {
                if (from..last).contains(&p) {
                    rows[*i].extend_from_slice(&h[t * dim..(t + 1) * dim]);
                }
                t += 1;
            }
            pos[*i] += c.tokens.len();
        }
    }
    Ok(rows)
}
