//! One sequence, run straight through the backend: the simplest generation loop. Used by the
//! interactive `generate --prompt` mode and by reference tests that need every step's logits.

use std::time::{Duration, Instant};

use super::finish::FinishReason;
use super::plan::{SeqChunk, SeqId, StatePlan, StepPlan};
use super::sampler::Sampler;
use crate::backend::{Backend, BackendError};

/// Prefill chunk length (defined beside `Backend::prefill_chunk`, whose default it is).
pub use crate::backend::PREFILL_CHUNK;

#[derive(Clone, Debug)]
pub struct SingleOutput {
    pub token_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub prefill_time: Duration,
    /// From the first generated token to the last.
    pub decode_time: Duration,
}

/// A sequence on its own: blocks `0..n` of the pool, in order, and (hybrid models) recurrent
/// state slot 0.
pub struct SingleSeq {
    seq: SeqId,
    table: Vec<u32>,
    pos: usize,
    block_size: usize,
    /// The backend keeps a recurrent state per sequence.
    recurrent: bool,
}

impl SingleSeq {
    pub fn new<B: Backend + ?Sized>(b: &B, seq: SeqId, max_len: usize) -> Result<Self, BackendError> {
        let need = max_len.div_ceil(b.block_size());
        if need > b.num_blocks() {
            return Err(BackendError::Plan(format!(
                "a sequence of {max_len} tokens needs {need} KV blocks; the cache has {}",
                b.num_blocks()
            )));
        }
        let recurrent = b.state_slots().running > 0;
        Ok(SingleSeq { seq, table: (0..need as u32).collect(), pos: 0, block_size: b.block_size(), recurrent })
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Runs `tokens` (in chunks) and returns the logits after the last one.
    pub fn feed<B: Backend + ?Sized>(&mut self, b: &mut B, tokens: &[u32]) -> Result<Vec<f32>, BackendError> {
        if tokens.is_empty() {
            return Err(BackendError::Plan("cannot run an empty prompt".into()));
        }
        if (self.pos + tokens.len()).div_ceil(self.block_size) > self.table.len() {
            return Err(BackendError::Plan(format!(
                "sequence {} outgrew its {} KV blocks",
                self.seq,
                self.table.len()
            )));
        }
        let mut last = Vec::new();
        let step = b.prefill_chunk().max(1);
        let n_chunks = tokens.len().div_ceil(step);
        for (i, chunk) in tokens.chunks(step).enumerate() {
            let want = i + 1 == n_chunks;
            let mut plan = StepPlan::new(vec![SeqChunk {
                seq: self.seq,
                tokens: chunk.to_vec(),
                start_pos: self.pos,
                block_table: self.table.clone(),
                want_logits: want,
            }]);
            if self.recurrent {
                plan.state = StatePlan::single(self.pos);
            }
            let mut out = b.step(&plan)?;
            self.pos += chunk.len();
            if want {
                last = out.pop().ok_or_else(|| BackendError::Plan("backend returned no logits".into()))?;
            }
        }
        Ok(last)
    }
}

/// Generates up to `max_tokens` after `prompt`; `on_token` sees each token as it is sampled.
pub fn generate_one<B: Backend + ?Sized>(
    b: &mut B,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    stop_ids: &[u32],
    mut on_token: impl FnMut(u32),
) -> Result<SingleOutput, BackendError> {
    let mut seq = SingleSeq::new(b, 0, prompt.len() + max_tokens)?;
    let t0 = Instant::now();
    let mut logits = seq.feed(b, prompt)?;
    let prefill_time = t0.elapsed();
    let t1 = Instant::now();
    let mut out = Vec::new();
    let mut finish = FinishReason::Length;
    while out.len() < max_tokens {
        let tok = sampler.sample(&logits);
        if stop_ids.contains(&tok) {
            finish = FinishReason::Stop;
            break;
        }
        out.push(tok);
        on_token(tok);
        if out.len() == max_tokens {
            break;
        }
        logits = seq.feed(b, &[tok])?;
    }
    Ok(SingleOutput { token_ids: out, finish_reason: finish, prefill_time, decode_time: t1.elapsed() })
}
