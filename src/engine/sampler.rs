//! Token sampling: greedy, temperature, top-k, top-p, optionally over the tokens a grammar
//! allows (`sample_masked`). Seeded per request, so the same seed gives the same text whatever
//! else runs in the same step.

use super::descending::Descending;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1.0 = all).
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self::default()
    }
}

/// Derives a request's seed from the job seed and the record id, so a resumed job draws the
/// same numbers for a record as an unbroken one.
pub fn derive_seed(job_seed: u64, record_key: &str) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(&job_seed.to_le_bytes());
    h.update(record_key.as_bytes());
    let d = h.finalize();
    u64::from_le_bytes(d.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// The per-request sampler: owns its random stream.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        Sampler { params, rng: StdRng::seed_from_u64(params.seed) }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether `sample` is `argmax` (draws no random numbers).
    pub fn is_greedy(&self) -> bool {
        self.params.temperature <= 0.0 || self.params.top_k == 1
    }

    /// Picks the next token from `logits` (`[vocab]`).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.sample_masked(logits, None)
    }

    /// Picks the next token from `logits` (`[vocab]`) among the tokens `mask` allows (packed
    /// bits, `[ceil(n / 32)]` words, bit `t % 32` of word `t / 32` for token `t`; ids past the
    /// mask are not allowed). Greedy and sampled alike: the masked tokens are simply not
    /// candidates, so the draw over the allowed ones is as without a mask. When no allowed
    /// token has a finite logit, the lowest allowed id.
    pub fn sample_masked(&mut self, logits: &[f32], mask: Option<&[u32]>) -> u32 {
        let p = self.params;
        if self.is_greedy() {
            return match mask {
                None => argmax(logits),
                Some(m) => masked_argmax(logits, m),
            };
        }
        // Candidates in descending order of logit, ties by id (walked lazily: `Descending`).
        let allowed = |i: usize| mask.is_none_or(|m| is_allowed(m, i));
        let cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|&(i, l)| l.is_finite() && allowed(i))
            .map(|(i, &l)| (i as u32, l))
            .collect();
        if cand.is_empty() {
            return mask.map_or(0, |m| first_allowed(m, logits.len()));
        }
        let mut cand = Descending::new(cand);
        if p.top_k > 0 {
            cand.keep_first(p.top_k);
        }
        let max = cand.unordered().iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1));
        let weight = |l: f32| (((l - max) / p.temperature) as f64).exp();
        // The softmax's denominator over every kept candidate (in no particular order: only
        // its last bits depend on the order), and the weight in each band of half a unit of
        // (max - logit) / temperature, which says how far the walks below will go.
        let band = |l: f32| ((((max - l) / p.temperature) * 2.0) as usize).min(BANDS - 1);
        let mut bands = [0.0f64; BANDS];
        let weights: Vec<f64> = cand.unordered().iter().map(|&(_, l)| weight(l)).collect();
        for (&w, &(_, l)) in weights.iter().zip(cand.unordered()) {
            bands[band(l)] += w;
        }
        let total: f64 = weights.iter().sum();
        let prob = |l: f32| weight(l) / total;
        let all_total: f64 = weights.iter().map(|w| w / total).sum();
        let u = self.rng.random::<f64>();
        // Sorted in one step: the bands that hold the probability the walks need (top-p's
        // share, or the draw's point when all are kept), one band more against rounding; a
        // walk past them extends the order by itself.
        let need = if p.top_p < 1.0 { p.top_p as f64 } else { u * all_total } * total;
        let mut acc = 0.0;
        let last = bands.iter().position(|&b| {
            acc += b;
            acc >= need
        });
        let last = last.map_or(BANDS - 1, |b| (b + 1).min(BANDS - 1));
        cand.sort_where(|l| band(l) <= last);
        // Top-p: the shortest prefix whose probability reaches top_p.
        let mut keep = cand.len();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for i in 0..cand.len() {
                acc += prob(cand.get(i).1);
                if acc >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        let kept_total: f64 = if keep == cand.len() { all_total } else { (0..keep).map(|i| prob(cand.get(i).1)).sum() };
        // The draw walks the kept tokens in order, most likely first.
        let mut r = u * kept_total;
        for i in 0..keep {
            let (id, l) = cand.get(i);
            r -= prob(l);
            if r <= 0.0 {
                return id;
            }
        }
        cand.get(keep - 1).0
    }
}

/// Bands of (max - logit) / temperature, half a unit each, that `sample_masked` sums the
/// weights in (the last one holds everything below e^-31.5 of the top token).
const BANDS: usize = 64;

/// Index of the largest logit; the lowest index wins a tie.
/// NaN never wins (all NaN: 0). Two passes the compiler vectorizes: the largest value in
/// 8 independent lanes, then its first position.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = logits.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            // `max` ignores a NaN operand.
            *m = m.max(v);
        }
    }
    let max = tail.iter().fold(lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)), |a, &b| a.max(b));
    logits.iter().position(|&v| v == max).unwrap_or(0) as u32
}

fn is_allowed(mask: &[u32], t: usize) -> bool {
    mask.get(t / 32).is_some_and(|w| w >> (t % 32) & 1 == 1)
}

/// The lowest allowed id below `n` (0 when none is).
fn first_allowed(mask: &[u32], n: usize) -> u32 {
    let t = mask.iter().position(|&w| w != 0).map_or(0, |i| i * 32 + mask[i].trailing_zeros() as usize);
    if t < n {
        t as u32
    } else {
        0
    }
}

/// `argmax` over the tokens `mask` allows (see `Sampler::sample_masked`): the largest finite
/// or infinite logit among them, lowest id among equals, never NaN; all NaN: the lowest
/// allowed id (0 when no id below `logits.len()` is allowed). Whole zero words (32 masked
/// tokens) are skipped at once: a grammar usually allows a small part of the vocabulary.
/// The device twin is `argmax_masked_rows_f32` (kernels/argmax.cu).
pub fn masked_argmax(logits: &[f32], mask: &[u32]) -> u32 {
    let mut best: Option<(u32, f32)> = None;
    for (w, &bits) in mask.iter().enumerate() {
        let mut bits = bits;
        while bits != 0 {
            let t = w * 32 + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let Some(&v) = logits.get(t) else { return best.map_or(first_allowed(mask, logits.len()), |b| b.0) };
            if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
                best = Some((t as u32, v));
            }
        }
    }
    best.map_or(first_allowed(mask, logits.len()), |b| b.0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax_with_lowest_index_on_ties() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn argmax_matches_a_plain_scan_and_skips_nan() {
        use rand::Rng;
        let mut rng = StdRng::seed_from_u64(5);
        for n in [1usize, 7, 8, 9, 31, 1000, 151_936] {
            let mut v: Vec<f32> = (0..n).map(|_| rng.random_range(-4.0f32..4.0)).collect();
            // Plant a tie at two positions and a NaN, which must never win.
            if n > 10 {
                let top = v.iter().cloned().fold(f32::MIN, f32::max) + 1.0;
                v[n / 2] = top;
                v[n - 1] = top;
                v[n / 3] = f32::NAN;
            }
            let want = (0..n).fold(0, |b, i| if v[i] > v[b] || v[b].is_nan() && !v[i].is_nan() { i } else { b });
            assert_eq!(argmax(&v) as usize, want, "n = {n}");
        }
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY, -1.0]), 1);
    }

    #[test]
    fn same_seed_same_draws_and_top_k_restricts() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let params = SamplingParams { temperature: 1.0, top_k: 5, top_p: 1.0, seed: 42 };
        let a: Vec<u32> = {
            let mut s = Sampler::new(params);
            (0..100).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(params);
            (0..100).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
        // The 5 largest logits are the five ids with i % 7 == 6 (ties by lowest id): 6, 13, 20, 27, 34.
        for t in &a {
            assert!([6, 13, 20, 27, 34].contains(t), "token {t} outside top-k");
        }
        assert!(a.iter().collect::<std::collections::HashSet<_>>().len() > 1, "sampling never varied");
    }

    #[test]
    fn top_p_keeps_only_the_dominant_token() {
        let mut logits = vec![0.0f32; 10];
        logits[3] = 20.0;
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 0, top_p: 0.9, seed: 1 });
        for _ in 0..50 {
            assert_eq!(s.sample(&logits), 3);
        }
    }

    /// Packed mask bits allowing exactly `ids`, over `n` tokens.
    fn mask_of(n: usize, ids: &[usize]) -> Vec<u32> {
        let mut m = vec![0u32; n.div_ceil(32)];
        for &i in ids {
            m[i / 32] |= 1 << (i % 32);
        }
        m
    }

    #[test]
    fn masked_greedy_is_the_argmax_of_the_allowed_tokens() {
        use rand::Rng;
        let mut rng = StdRng::seed_from_u64(9);
        for n in [5usize, 32, 33, 1000, 49_152] {
            let mut v: Vec<f32> = (0..n).map(|_| rng.random_range(-4.0f32..4.0)).collect();
            // Token 0 is allowed but NaN (never chosen); the last token is always allowed.
            let mut ids = vec![0];
            ids.extend((1..n - 1).filter(|_| rng.random_range(0..10) == 0));
            ids.push(n - 1);
            v[0] = f32::NAN;
            let mut want = None::<usize>;
            for &i in &ids {
                if !v[i].is_nan() && want.is_none_or(|w| v[i] > v[w]) {
                    want = Some(i);
                }
            }
            let m = mask_of(n, &ids);
            assert_eq!(masked_argmax(&v, &m) as usize, want.unwrap(), "n = {n}");
            let mut s = Sampler::new(SamplingParams::greedy());
            assert_eq!(s.sample_masked(&v, Some(&m)) as usize, want.unwrap());
        }
        // The global maximum is masked out; ties go to the lowest allowed id.
        let v = [9.0, 1.0, 1.0, 0.5];
        assert_eq!(masked_argmax(&v, &mask_of(4, &[1, 2, 3])), 1);
        // Nothing allowed has a usable logit: the lowest allowed id.
        assert_eq!(masked_argmax(&[1.0, f32::NAN, f32::NAN], &mask_of(3, &[1, 2])), 1);
        // Allowed ids past the logits (a mask over a larger vocabulary) are never chosen, not
        // even as the fallback.
        assert_eq!(masked_argmax(&[0.0, 2.0], &mask_of(40, &[0, 35])), 0);
        assert_eq!(masked_argmax(&[0.0, 2.0], &mask_of(40, &[35])), 0);
        assert_eq!(masked_argmax(&[f32::NAN, f32::NAN, 1.0], &mask_of(40, &[1, 35])), 1);
    }

    #[test]
    fn masked_sampling_draws_only_allowed_tokens_and_stays_seeded() {
        let logits: Vec<f32> = (0..64).map(|i| (i % 5) as f32).collect();
        let allowed = [3usize, 10, 17, 40, 63];
        let m = mask_of(64, &allowed);
        let params = SamplingParams { temperature: 1.5, top_k: 0, top_p: 1.0, seed: 3 };
        let draw = || {
            let mut s = Sampler::new(params);
            (0..200).map(|_| s.sample_masked(&logits, Some(&m))).collect::<Vec<u32>>()
        };
        let a = draw();
        assert_eq!(a, draw());
        assert!(a.iter().all(|&t| allowed.contains(&(t as usize))), "{a:?}");
        assert!(a.iter().collect::<std::collections::HashSet<_>>().len() >= 3, "sampling never varied: {a:?}");
    }

    /// The sampler before the lazy order: every candidate sorted, then the same walk (also
    /// the baseline of `bench_sampling_a_row`).
    pub(crate) fn sample_by_full_sort(
        p: &SamplingParams,
        rng: &mut StdRng,
        logits: &[f32],
        mask: Option<&[u32]>,
    ) -> u32 {
        let allowed = |i: usize| mask.is_none_or(|m| is_allowed(m, i));
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|&(i, l)| l.is_finite() && allowed(i))
            .map(|(i, &l)| (i as u32, l))
            .collect();
        let k = if p.top_k == 0 { cand.len() } else { p.top_k.min(cand.len()) };
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        cand.truncate(k);
        let max = cand[0].1;
        let mut probs: Vec<f64> = cand.iter().map(|&(_, l)| (((l - max) / p.temperature) as f64).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= total);
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = probs.iter().position(|q| {
                acc += q;
                acc >= p.top_p as f64
            });
            if let Some(i) = keep {
                probs.truncate(i + 1);
            }
        }
        let total: f64 = probs.iter().sum();
        let mut r = rng.random::<f64>() * total;
        for (i, q) in probs.iter().enumerate() {
            r -= q;
            if r <= 0.0 {
                return cand[i].0;
            }
        }
        cand[probs.len() - 1].0
    }

    #[test]
    fn lazy_order_draws_what_a_full_sort_draws() {
        let mut rng = StdRng::seed_from_u64(21);
        let mut draws = 0;
        let mut distinct = std::collections::HashSet::new();
        for case in 0..60 {
            let n = [50usize, 1_000, 49_152][case % 3];
            // Peaked (a few large logits over a flat floor) or flat, with ties and a NaN.
            let peak = case % 2 == 0;
            let mut logits: Vec<f32> = (0..n)
                .map(|_| if peak { rng.random_range(-8.0f32..0.0) } else { rng.random_range(0..16) as f32 * 0.5 })
                .collect();
            if peak {
                for _ in 0..5 {
                    let i = rng.random_range(0..n);
                    logits[i] = rng.random_range(4.0f32..9.0);
                }
            }
            logits[n / 2] = f32::NAN;
            let ids: Vec<usize> = (0..n).filter(|i| i % 3 != 1).collect();
            let mask = mask_of(n, &ids);
            let params = SamplingParams {
                temperature: [0.3, 0.7, 1.0, 2.0][case % 4],
                top_k: [0, 0, 5, 40, 100_000][case % 5],
                top_p: [1.0, 0.9, 0.5, 0.99][(case / 2) % 4],
                seed: case as u64,
            };
            let m = (case % 3 == 1).then_some(mask.as_slice());
            let mut s = Sampler::new(params);
            let mut reference = StdRng::seed_from_u64(params.seed);
            for _ in 0..40 {
                let want = sample_by_full_sort(&params, &mut reference, &logits, m);
                let got = s.sample_masked(&logits, m);
                assert_eq!(got, want, "case {case}: {params:?}");
                distinct.insert(got);
                draws += 1;
            }
        }
        assert_eq!(draws, 2_400);
        assert!(distinct.len() > 100, "the draws barely varied: {} tokens", distinct.len());
    }

    #[test]
    fn derived_seeds_differ_per_record_and_are_stable() {
        assert_eq!(derive_seed(7, "a"), derive_seed(7, "a"));
        assert_ne!(derive_seed(7, "a"), derive_seed(7, "b"));
        assert_ne!(derive_seed(7, "a"), derive_seed(8, "a"));
    }
}
