//! The statistics of `dustoff eval`, one code path for every device: from each model's head
//! input at the scored positions (`windows::head_rows`), the head on the host gives the
//! logits, their log-softmax each model's NLL (perplexity) and, against the reference, the KL
//! divergence `KL(P_ref || P_model)` per position and the top-1 agreement.

use std::path::PathBuf;

use rayon::prelude::*;

use super::windows::scored_from;
use super::{KlStats, ModelScore};
use crate::backend::cpu::matmul::matmul;
use crate::model::weights::Tensor;
use crate::quantize::calibrate::Progress;

/// One model's part: its head and its head input at the scored positions of every window.
pub struct Scored {
    pub path: PathBuf,
    /// `[vocab, dim]`.
    pub head: Tensor,
    /// Per window, `[len - 1 - from, dim]`.
    pub rows: Vec<Vec<f32>>,
}

/// `[m, vocab]`: the log-softmax of the logits `head . rows` (`rows`: `[m, dim]`).
pub fn log_probs(head: &Tensor, rows: &[f32], m: usize) -> Vec<f32> {
    let mut logits = vec![0f32; m * head.rows];
    matmul(head, rows, m, &mut logits);
    logits.par_chunks_exact_mut(head.rows).for_each(|row| {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = max as f64 + row.iter().map(|&v| ((v - max) as f64).exp()).sum::<f64>().ln();
        row.iter_mut().for_each(|v| *v = (*v as f64 - lse) as f32);
    });
    logits
}

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().fold(0, |b, (i, &x)| if x > v[b] { i } else { b })
}

/// `q`-quantile of sorted values (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// `KL(P_ref || P_model)` of one position from the two rows of log-probabilities.
fn kl(lr: &[f32], lq: &[f32]) -> f64 {
    let d: f64 = lr
        .iter()
        .zip(lq)
        .map(|(&lr, &lq)| {
            let p = f64::from(lr).exp();
            if p > 0.0 {
                p * (f64::from(lr) - f64::from(lq))
            } else {
                0.0
            }
        })
        .sum();
    d.max(0.0)
}

/// Scores of `models` (the reference first when `has_ref`) over `windows` (those the rows were
/// taken from, in order); also the number of scored positions. Window by window, so at most
/// two `[m, vocab]` rows of log-probabilities are held at once.
pub fn score(models: &[Scored], windows: &[&[u32]], has_ref: bool) -> (Vec<ModelScore>, usize) {
    let n = models.len();
    let (mut nll, mut kls, mut agree) = (vec![0f64; n], vec![Vec::<f64>::new(); n], vec![0usize; n]);
    let mut scored = 0usize;
    let mut pb = Progress::new(windows.len() as u64, "windows scored");
    for (k, w) in windows.iter().enumerate() {
        let from = scored_from(w.len());
        let m = w.len() - 1 - from;
        let mut ref_lp: Option<Vec<f32>> = None;
        for (i, s) in models.iter().enumerate() {
            let vocab = s.head.rows;
            let lp = log_probs(&s.head, &s.rows[k], m);
            // Per position: the target's log-probability and, against the reference, the KL
            // and whether the top-1 tokens agree; in parallel, then summed in position order.
            let per_pos: Vec<(f32, Option<(f64, bool)>)> = lp
                .par_chunks_exact(vocab)
                .enumerate()
                .map(|(j, row)| {
                    let target = row.get(w[from + j + 1] as usize).copied().unwrap_or(f32::NEG_INFINITY);
                    let cmp = ref_lp.as_ref().map(|r| {
                        let rr = &r[j * vocab..(j + 1) * vocab];
                        (kl(rr, row), argmax(rr) == argmax(row))
                    });
                    (target, cmp)
                })
                .collect();
            for (target, cmp) in per_pos {
                nll[i] -= f64::from(target);
                if let Some((d, same)) = cmp {
                    kls[i].push(d);
                    agree[i] += usize::from(same);
                }
            }
            if i == 0 && has_ref {
                ref_lp = Some(lp);
            }
        }
        scored += m;
        pb.inc(1);
    }
    pb.finish();
    let scores = models
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let with_ref = has_ref && i > 0;
            let mut k = std::mem::take(&mut kls[i]);
            k.sort_by(f64::total_cmp);
            ModelScore {
                model: s.path.clone(),
                perplexity: (nll[i] / scored.max(1) as f64).exp(),
                kl_divergence: with_ref.then(|| KlStats {
                    mean: k.iter().sum::<f64>() / k.len().max(1) as f64,
                    median: quantile(&k, 0.5),
                    p99: quantile(&k, 0.99),
                    max: k.last().copied().unwrap_or(0.0),
                }),
                top1_agreement: with_ref.then(|| agree[i] as f64 / scored.max(1) as f64),
            }
        })
        .collect();
    (scores, scored)
}
