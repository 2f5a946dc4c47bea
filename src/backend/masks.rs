//! Greedy steps under grammar masks. While a step runs, the engine writes the packed allow-bits
//! of each constrained logit row into [`MaskRows`]; the backend then picks, per row, the arg-max
//! over the allowed tokens (`sampler::masked_argmax`; rows without a mask: `sampler::argmax`).
//! A device backend does it on the device from the uploaded bits, with no logits download
//! (cuda/step/masked.rs); [`host_step_greedy_masked`] is the same rule on the host, used by the CPU
//! backend.
//!
//! Mask layout (as `engine::constraint` produces it): `words = ceil(vocab / 32)` `u32` words a
//! row, bit `t % 32` of word `t / 32` set when token `t` is allowed.

use std::time::{Duration, Instant};

use super::{Backend, BackendError};
use crate::engine::plan::StepPlan;
use crate::engine::sampler::{argmax, masked_argmax};

/// `MaskRows::mask_of` of a row without a mask.
pub const NO_MASK: u32 = u32::MAX;

/// The masks of one step's logit rows (chunks with `want_logits`, in plan order), written by
/// the engine. Masks are stored compactly, in the order they are claimed: a mixed step uploads
/// only the rows that have one.
pub struct MaskRows<'a> {
    words: usize,
    /// `[rows]`: the index of the row's mask in `bits`, or `NO_MASK`.
    mask_of: &'a mut [u32],
    /// `[room, words]`, the first `used` masks claimed.
    bits: &'a mut [u32],
    used: usize,
}

impl<'a> MaskRows<'a> {
    /// Over `mask_of` (`[rows]`) and `bits` (room for `bits.len() / words` masks); every row starts
    /// without a mask.
    pub fn new(words: usize, mask_of: &'a mut [u32], bits: &'a mut [u32]) -> Self {
        mask_of.fill(NO_MASK);
        MaskRows { words, mask_of, bits, used: 0 }
    }

    /// Logit rows of the step.
    pub fn rows(&self) -> usize {
        self.mask_of.len()
    }

    /// Words per mask: `ceil(vocab / 32)` of the model's vocabulary.
    pub fn words(&self) -> usize {
        self.words
    }

    /// Masks claimed so far (they occupy `bits[..used * words]`).
    pub fn used(&self) -> usize {
        self.used
    }

    /// Gives each of `rows` (distinct logit rows) a mask of `words` zeroed words to fill in,
    /// returned in the order given. Refused (nothing claimed) for a row out of range or
    /// claimed before, or more masks than there is room for.
    pub fn claim(&mut self, rows: &[usize]) -> Result<Vec<&mut [u32]>, BackendError> {
        let n = self.mask_of.len();
        let room = self.bits.len().checked_div(self.words).unwrap_or(0);
        let mut seen = vec![false; n];
        for &r in rows {
            if r >= n || self.mask_of[r] != NO_MASK || std::mem::replace(&mut seen[r], true) {
                return Err(BackendError::Plan(format!("mask for logit row {r}: out of range or given twice")));
            }
        }
        if self.used + rows.len() > room {
            return Err(BackendError::Plan(format!(
                "{} masks for a step with room for {room}",
                self.used + rows.len()
            )));
        }
        for (k, &r) in rows.iter().enumerate() {
            self.mask_of[r] = (self.used + k) as u32;
        }
        let start = self.used * self.words;
        self.used += rows.len();
        let claimed = &mut self.bits[start..self.used * self.words];
        claimed.fill(0);
        Ok(if self.words == 0 {
            rows.iter().map(|_| Default::default()).collect()
        } else {
            claimed.chunks_mut(self.words).collect()
        })
    }

    /// Row `r`'s mask, if it has one.
    pub fn get(&self, r: usize) -> Option<&[u32]> {
        let s = *self.mask_of.get(r)?;
        (s != NO_MASK).then(|| &self.bits[s as usize * self.words..][..self.words])
    }
}

/// Writes the masks of a step's rows (see [`MaskRows`]); called once per step, while the model
/// runs (on a worker thread, or on the calling thread after the device work is queued).
pub type FillMasks<'f> = dyn FnMut(&mut MaskRows<'_>) -> Result<(), BackendError> + Send + 'f;

/// The result of `Backend::step_greedy_masked`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MaskedGreedy {
    /// The greedy choice of every logit row, in plan order.
    pub ids: Vec<u32>,
    /// How long the model's results waited for the masks (what the overlap did not hide).
    pub mask_wait: Duration,
}

/// The host rule of `Backend::step_greedy_masked`: the masks are filled on a worker thread while
/// `b.step` computes the logits, then each row takes `masked_argmax` of its logits (rows
/// without a mask: `argmax`), exactly as `Sampler::sample_masked` chooses greedily.
pub fn host_step_greedy_masked<B: Backend + ?Sized>(
    b: &mut B,
    plan: &StepPlan,
    fill: &mut FillMasks<'_>,
) -> Result<MaskedGreedy, BackendError> {
    use rayon::prelude::*;
    let rows = plan.chunks.iter().filter(|c| c.want_logits).count();
    let words = b.config().vocab_size.div_ceil(32);
    let mut mask_of = vec![NO_MASK; rows];
    let mut bits = vec![0u32; rows * words];
    let mut filled = Ok(());
    let (logits, step_done) = rayon::in_place_scope(|s| {
        let (mask_of, bits, filled) = (&mut mask_of, &mut bits, &mut filled);
        s.spawn(move |_| *filled = fill(&mut MaskRows::new(words, mask_of, bits)));
        let logits = b.step(plan);
        (logits, Instant::now())
    });
    let mask_wait = step_done.elapsed();
    let logits = logits?;
    filled?;
    if logits.len() != rows {
        return Err(BackendError::Plan(format!("the step returned {} logit rows for {rows}", logits.len())));
    }
    let masks = MaskRows { words, mask_of: &mut mask_of, bits: &mut bits, used: 0 };
    let ids = logits
        .par_iter()
        .enumerate()
        .map(|(r, l)| masks.get(r).map_or_else(|| argmax(l), |m| masked_argmax(l, m)))
        .collect();
    Ok(MaskedGreedy { ids, mask_wait })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claimed_masks_are_compact_and_rows_without_one_have_none() {
        let (mut mask_of, mut bits) = (vec![7u32; 4], vec![9u32; 3 * 2]);
        let mut m = MaskRows::new(2, &mut mask_of, &mut bits);
        let mut got = m.claim(&[3, 1]).unwrap();
        got[0][0] = 0b100;
        got[1][1] = 1;
        assert_eq!(m.used(), 2);
        assert_eq!(m.get(3), Some(&[0b100, 0][..]));
        assert_eq!(m.get(1), Some(&[0, 1][..]));
        assert_eq!((m.get(0), m.get(2), m.get(9)), (None, None, None));
        assert!(m.claim(&[1]).is_err(), "a row claimed twice");
        assert!(m.claim(&[0, 0]).is_err(), "a row listed twice");
        assert!(m.claim(&[4]).is_err(), "out of range");
        assert!(m.claim(&[0, 2]).is_err(), "room for 3 masks only");
        assert_eq!(m.claim(&[2]).unwrap().len(), 1);
        assert_eq!(mask_of, vec![NO_MASK, 1, 2, 0]);
    }
}
