//! `dustoff eval`: what quantization cost, measured on text. Every model (and the reference)
//! runs over the same token windows on the CPU backend; the logits of every position of the
//! second half of each window (the first half is context, as llama.cpp's perplexity and
//! KL-divergence tools do) give each model's perplexity and, against the reference, the
//! KL divergence `KL(P_ref || P_model)` per position (mean, median, p99, max) and the share of
//! positions whose top-1 token agrees. `--kv-cache q8` runs the `--model`s with the 8-bit KV
//! cache (the CPU twin of the GPU's: `backend::kv_type`) and the reference with the full one, so
//! the same file as model and reference measures what the 8-bit cache costs.

use std::path::PathBuf;

use serde::Serialize;

use crate::backend::cpu::matmul::matmul;
use crate::backend::cpu::tap::ActivationTap;
use crate::backend::cpu::CpuBackend;
use crate::backend::kv_type::KvType;
use crate::engine::batch::BLOCK_SIZE;
use crate::engine::single::SingleSeq;
use crate::model::loader::{load_model, LoadedModel};
use crate::model::weights::Tensor;
use crate::quantize::calibrate::{read_texts, token_windows, Progress};
use crate::quantize::QuantizeError;

/// The text `--verify` scores when no file is given (prose written for dustoff).
pub const BUILTIN_TEXT: &str = "The old server had stood in the corner of the laboratory for seven years. \
Nobody remembered who had ordered it, and the label on its front had faded to a pale grey. Every night \
its fans spun up at two o'clock, when the backup began, and every morning they fell quiet again before \
the first students arrived. One winter the department decided to use it for something better. A student \
wrote a small program that read the archive of meeting notes, one document at a time, and asked a \
language model to summarize each of them in three sentences. The first night the program processed \
four hundred documents. The second night, after the student learned to reuse the shared instructions \
at the start of every prompt, it processed nine hundred. By the end of the month the whole archive, \
twenty years of notes about budgets, experiments, broken pumps and visiting speakers, had a short \
summary that anyone could search. The model was small and made mistakes: it confused two professors \
with the same family name, and it believed that a conference in Lisbon had taken place in Madrid. \
But the summaries were good enough to find the right document, and that was all anyone had asked for. \
When the head of the department saw the result, she asked how much the new hardware had cost. The \
student explained that there was no new hardware. The machine in the corner had done it, at night, \
while the building was empty, using the electricity it had always used to copy files nobody read. \
The following year three other groups borrowed the program. One of them translated old field reports, \
another extracted the names of chemicals from handwritten inventories, and the third simply counted \
how often the word \"urgent\" appeared in email subjects, which turned out to be more often than anyone \
had expected.";

#[derive(Clone, Debug)]
pub struct EvalArgs {
    pub models: Vec<PathBuf>,
    pub reference: Option<PathBuf>,
    /// JSONL (`text` field) or plain text; `None`: [`BUILTIN_TEXT`].
    pub text: Option<PathBuf>,
    pub ctx: usize,
    pub max_tokens: usize,
    /// The KV cache of the scored models (the reference keeps the full one).
    pub kv_type: KvType,
}

#[derive(Clone, Debug, Serialize)]
pub struct KlStats {
    pub mean: f64,
    pub median: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModelScore {
    pub model: PathBuf,
    pub perplexity: f64,
    /// Against the reference (absent without one).
    pub kl_divergence: Option<KlStats>,
    pub top1_agreement: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct EvalSummary {
    pub text: String,
    pub ctx: usize,
    pub windows: usize,
    pub scored_positions: usize,
    pub reference: Option<ModelScore>,
    pub models: Vec<ModelScore>,
}

impl EvalSummary {
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "eval on {} ({} windows of up to {} tokens, {} scored positions)\n",
            self.text, self.windows, self.ctx, self.scored_positions
        );
        s += &format!(
            "{:<48} {:>10} {:>10} {:>10} {:>10} {:>8}\n",
            "model", "PPL", "KL mean", "KL median", "KL p99", "top-1"
        );
        let row = |m: &ModelScore, tag: &str| {
            let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.5}"));
            format!(
                "{:<48} {:>10.4} {:>10} {:>10} {:>10} {:>8}\n",
                format!("{}{tag}", m.model.display()),
                m.perplexity,
                f(m.kl_divergence.as_ref().map(|k| k.mean)),
                f(m.kl_divergence.as_ref().map(|k| k.median)),
                f(m.kl_divergence.as_ref().map(|k| k.p99)),
                m.top1_agreement.map_or("-".to_string(), |v| format!("{:.2}%", 100.0 * v)),
            )
        };
        if let Some(r) = &self.reference {
            s += &row(r, " (reference)");
        }
        for m in &self.models {
            s += &row(m, "");
        }
        s
    }
}

/// Captures the output head's input (every token's final-normed hidden state).
struct HeadInput {
    head: String,
    rows: Vec<f32>, // [n_tok, dim]
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

/// One model on the CPU backend, giving log-probabilities at every position of a window.
struct Scorer {
    path: PathBuf,
    backend: CpuBackend,
    head: Tensor,
    dim: usize,
    vocab: usize,
}

impl Scorer {
    fn new(m: LoadedModel, ctx: usize, kv: KvType) -> Result<Self, QuantizeError> {
        let (dim, vocab) = (m.config.dim, m.config.vocab_size);
        let head = m.weights.output.clone();
        let backend = CpuBackend::new(m.config, m.weights, ctx.div_ceil(BLOCK_SIZE) + 1, BLOCK_SIZE)
            .with_kv_type(kv)
            .map_err(|e| QuantizeError::Usage(format!("{}: {e}", m.path.display())))?;
        Ok(Scorer { path: m.path, backend, head, dim, vocab })
    }

    /// `[len - 1 - from, vocab]`: log-softmax of the logits at positions `from..len-1` of `w`
    /// (position j predicts token j + 1).
    fn log_probs(&mut self, w: &[u32], from: usize) -> Result<Vec<f32>, QuantizeError> {
        self.backend.set_tap(Box::new(HeadInput { head: self.head.name.clone(), rows: Vec::new() }));
        let mut seq = SingleSeq::new(&self.backend, 0, w.len())?;
        let fed = seq.feed(&mut self.backend, w);
        let tap = self.backend.take_tap();
        fed?;
        let rows = tap
            .and_then(|t| t.into_any().downcast::<HeadInput>().ok())
            .map(|h| h.rows)
            .filter(|r| r.len() == w.len() * self.dim)
            .ok_or_else(|| QuantizeError::Usage("eval: the head input was not captured".into()))?;
        let m = w.len() - 1 - from;
        let mut logits = vec![0f32; m * self.vocab];
        matmul(&self.head, &rows[from * self.dim..(w.len() - 1) * self.dim], m, &mut logits);
        for row in logits.chunks_exact_mut(self.vocab) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let lse = max as f64 + row.iter().map(|&v| ((v - max) as f64).exp()).sum::<f64>().ln();
            row.iter_mut().for_each(|v| *v = (*v as f64 - lse) as f32);
        }
        Ok(logits)
    }
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

pub fn run(a: &EvalArgs) -> anyhow::Result<EvalSummary> {
    if a.models.is_empty() {
        return Err(QuantizeError::Usage("give at least one --model".into()).into());
    }
    if a.ctx < 8 {
        return Err(QuantizeError::Usage("--ctx must be at least 8".into()).into());
    }
    let (docs, text_name) = match &a.text {
        Some(p) => (read_texts(p)?, p.display().to_string()),
        None => (vec![BUILTIN_TEXT.to_string()], "the built-in text".to_string()),
    };
    let mut scorers = Vec::new();
    let mut windows = None;
    for p in a.reference.iter().chain(&a.models) {
        let m = load_model(p)?;
        if let Some(first) = scorers.first() {
            let f: &Scorer = first;
            if f.vocab != m.config.vocab_size {
                return Err(QuantizeError::Usage(format!(
                    "{} has a vocabulary of {}, {} of {}: not the same model family",
                    p.display(),
                    m.config.vocab_size,
                    f.path.display(),
                    f.vocab
                ))
                .into());
            }
        }
        if windows.is_none() {
            windows = Some(token_windows(&m.tokenizer, &docs, a.ctx, a.max_tokens)?);
        }
        // The reference (first when given) keeps the full cache.
        let kv = if a.reference.is_some() && scorers.is_empty() { KvType::F16 } else { a.kv_type };
        scorers.push(Scorer::new(m, a.ctx, kv)?);
    }
    let windows = windows.unwrap_or_default();
    let has_ref = a.reference.is_some();
    let n = scorers.len();
    let (mut nll, mut kl, mut agree) = (vec![0f64; n], vec![Vec::<f64>::new(); n], vec![0usize; n]);
    let mut scored = 0usize;
    let mut pb = Progress::new(windows.len() as u64, "windows");
    for w in windows.iter().filter(|w| w.len() >= 4) {
        let from = w.len() / 2;
        let m = w.len() - 1 - from;
        let mut ref_lp: Option<Vec<f32>> = None;
        for (i, s) in scorers.iter_mut().enumerate() {
            let lp = s.log_probs(w, from)?;
            let vocab = s.vocab;
            for (j, row) in lp.chunks_exact(vocab).enumerate() {
                let next = w[from + j + 1] as usize;
                nll[i] -= f64::from(row.get(next).copied().unwrap_or(f32::NEG_INFINITY));
                if let Some(r) = &ref_lp {
                    let rr = &r[j * vocab..(j + 1) * vocab];
                    let d: f64 = rr
                        .iter()
                        .zip(row)
                        .map(|(&lr, &lq)| {
                            let p = f64::from(lr).exp();
                            if p > 0.0 {
                                p * (f64::from(lr) - f64::from(lq))
                            } else {
                                0.0
                            }
                        })
                        .sum();
                    kl[i].push(d.max(0.0));
                    agree[i] += usize::from(argmax(rr) == argmax(row));
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
    if scored == 0 {
        return Err(QuantizeError::Usage(format!("{text_name} is too short to score (no window of 4+ tokens)")).into());
    }
    let mut scores: Vec<ModelScore> = scorers
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let with_ref = has_ref && i > 0;
            let mut k = std::mem::take(&mut kl[i]);
            k.sort_by(f64::total_cmp);
            ModelScore {
                model: s.path.clone(),
                perplexity: (nll[i] / scored as f64).exp(),
                kl_divergence: with_ref.then(|| KlStats {
                    mean: k.iter().sum::<f64>() / k.len().max(1) as f64,
                    median: quantile(&k, 0.5),
                    p99: quantile(&k, 0.99),
                    max: k.last().copied().unwrap_or(0.0),
                }),
                top1_agreement: with_ref.then(|| agree[i] as f64 / scored as f64),
            }
        })
        .collect();
    let reference = if has_ref { Some(scores.remove(0)) } else { None };
    Ok(EvalSummary {
        text: text_name,
        ctx: a.ctx,
        windows: windows.len(),
        scored_positions: scored,
        reference,
        models: scores,
    })
}
