//! The grammar state of one sequence: which tokens may come next, and the tokens the grammar
//! forces (only one continuation possible), which the engine appends without sampling.

use std::time::{Duration, Instant};

use llguidance::api::StopReason;
use llguidance::Matcher;
use toktrie::SimpleVob;

pub struct SeqConstraint {
    matcher: Matcher,
    /// Tokens the mask covers (the tokenizer's vocabulary; a model's padded ids beyond it are
    /// never allowed).
    vocab: usize,
    /// The mask for the token being sampled now: computed after the last commit, cleared by
    /// the next one. `[ceil(vocab / 32)]` words.
    mask: Option<SimpleVob>,
}

impl SeqConstraint {
    pub(super) fn new(matcher: Matcher, vocab: usize) -> Self {
        SeqConstraint { matcher, vocab, mask: None }
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The tokens forced from the current state, consumed: appended to the sequence as they are.
    /// Empty when the next token is a real choice (or the grammar has ended).
    pub fn take_forced(&mut self) -> Vec<u32> {
        if self.matcher.is_stopped() {
            return Vec::new();
        }
        self.matcher.consume_ff_tokens()
    }

    /// Computes the mask of the next token; returns how long it took. A parser error leaves no
    /// mask and shows in `error`.
    pub fn compute_mask(&mut self) -> Duration {
        let t = Instant::now();
        self.mask = self.matcher.compute_mask().ok();
        t.elapsed()
    }

    /// The packed allowed-token bits of the next token (`[ceil(vocab / 32)]`), once computed.
    pub fn mask(&self) -> Option<&[u32]> {
        self.mask.as_ref().map(SimpleVob::as_slice)
    }

    /// Advances the grammar over a sampled (non end-of-sequence) token, then over the tokens it
    /// forces; returns those forced tokens. On a parser error nothing is forced (see `error`).
    pub fn commit(&mut self, token: u32) -> Vec<u32> {
        self.mask = None;
        if self.matcher.consume_token(token).is_err() {
            return Vec::new();
        }
        self.take_forced()
    }

    /// The grammar is complete and allows nothing more: the sequence ends here.
    pub fn ended(&self) -> bool {
        !self.matcher.is_error()
            && matches!(self.matcher.stop_reason(), StopReason::NoExtension | StopReason::EndOfSentence)
    }

    /// The parser failed: no mask, nothing forced; the sequence should end.
    pub fn failed(&self) -> bool {
        self.matcher.is_error()
    }

    /// Why the parser failed (a token it rejected, an internal limit), if it did.
    pub fn error(&self) -> Option<String> {
        self.matcher.get_error()
    }
}

/// Computes the next-token masks of `cons` (logit row, grammar state) in parallel and writes
/// them into `out`, the step's mask rows (cut or zero-padded to the model's vocabulary: ids
/// past the tokenizer's are never allowed). A grammar whose mask fails gets no row mask (the
/// plain arg-max, as the host path without a mask; its parser error ends the sequence at the
/// commit). Returns each mask's time.
pub fn fill_masks(
    cons: &mut [(usize, &mut SeqConstraint)],
    out: &mut crate::backend::masks::MaskRows<'_>,
) -> Result<Vec<Duration>, crate::backend::BackendError> {
    use rayon::prelude::*;
    let times = cons.par_iter_mut().map(|(_, c)| c.compute_mask()).collect();
    let rows: Vec<usize> = cons.iter().filter(|(_, c)| c.mask.is_some()).map(|(r, _)| *r).collect();
    let dst = out.claim(&rows)?;
    let mut work: Vec<(&mut [u32], &mut SeqConstraint)> =
        dst.into_iter().zip(cons.iter_mut().filter(|(_, c)| c.mask.is_some()).map(|(_, c)| &mut **c)).collect();
    work.par_iter_mut().for_each(|(d, c)| {
        let src = c.mask().unwrap_or_default();
        let k = src.len().min(d.len());
        d[..k].copy_from_slice(&src[..k]);
    });
    Ok(times)
}

#[cfg(test)]
mod tests {
    use super::super::OutputConstraint;
    use llguidance::ParserFactory;
    use toktrie::ApproximateTokEnv;

    /// A parser over llguidance's single-byte test vocabulary (token id = byte).
    fn seq(c: &OutputConstraint) -> super::SeqConstraint {
        let env = ApproximateTokEnv::single_byte_env();
        let mut f = ParserFactory::new_simple(&env).unwrap();
        f.quiet();
        let vocab = env.tok_trie().vocab_size();
        super::SeqConstraint::new(llguidance::Matcher::new(f.create_parser(c.grammar())), vocab)
    }

    fn allowed(s: &super::SeqConstraint) -> Vec<u8> {
        let m = s.mask().unwrap();
        (0..256u32).filter(|&t| m[t as usize / 32] >> (t % 32) & 1 == 1).map(|t| t as u8).collect()
    }

    #[test]
    fn choice_masks_then_forces_the_rest_and_ends() {
        let mut s = seq(&OutputConstraint::Choice(vec!["apple".into(), "avocado".into(), "kiwi".into()]));
        assert!(s.take_forced().is_empty(), "three labels: nothing forced at the start");
        s.compute_mask();
        assert_eq!(allowed(&s), b"ak".to_vec());
        // After 'a', 'p' and 'v' are both possible; after "av" the rest of "avocado" is forced.
        assert!(s.commit(b'a' as u32).is_empty());
        s.compute_mask();
        assert_eq!(allowed(&s), b"pv".to_vec());
        let forced = s.commit(b'v' as u32);
        assert_eq!(forced.iter().map(|&t| t as u8).collect::<Vec<u8>>(), b"ocado".to_vec());
        assert!(s.ended() && s.error().is_none());
    }

    #[test]
    fn a_rejected_token_is_an_error_not_a_panic() {
        let mut s = seq(&OutputConstraint::Regex("[0-9]+".into()));
        s.compute_mask();
        assert!(s.commit(b'x' as u32).is_empty());
        assert!(!s.ended());
        assert!(s.error().is_some());
    }
}
