//! Counters of constrained decoding for the job report: masks, forced tokens, time.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Sub-buckets per power of two: quantiles are exact to 1/16 (~6%) of the value.
const SUB: u64 = 16;
/// Enough buckets for any `u64` nanosecond count.
const BUCKETS: usize = (64 - 4 + 1) * SUB as usize;

/// Mask times, in a log-linear histogram: fixed memory however many tokens a job decodes.
#[derive(Clone, Debug)]
pub struct MaskTimes {
    counts: Vec<u64>, // [BUCKETS]
    n: u64,
    total_ns: u128,
}

impl Default for MaskTimes {
    fn default() -> Self {
        MaskTimes { counts: vec![0; BUCKETS], n: 0, total_ns: 0 }
    }
}

/// Log-linear buckets (16 per power of two, exact below 16 ns): median and p99 stay within ~6%
/// in a fixed-size table, however many masks a job computes.
fn bucket(ns: u64) -> usize {
    if ns < SUB {
        return ns as usize;
    }
    let e = 63 - u64::from(ns.leading_zeros()); // >= 4
    let sub = (ns >> (e - 4)) & (SUB - 1);
    ((e - 3) * SUB + sub) as usize
}

/// The smallest value of bucket `b` (the inverse of `bucket` on bucket starts).
fn bucket_floor(b: usize) -> u64 {
    let b = b as u64;
    if b < SUB {
        return b;
    }
    let e = b / SUB + 3;
    let sub = b % SUB;
    (SUB + sub) << (e - 4)
}

impl MaskTimes {
    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.counts[bucket(ns)] += 1;
        self.n += 1;
        self.total_ns += u128::from(ns);
    }

    pub fn count(&self) -> u64 {
        self.n
    }

    pub fn total(&self) -> Duration {
        Duration::from_nanos(u64::try_from(self.total_ns).unwrap_or(u64::MAX))
    }

    /// The `q` quantile (0..=1), as the lower edge of its bucket; zero when nothing was recorded.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.n == 0 {
            return Duration::ZERO;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Duration::from_nanos(bucket_floor(b));
            }
        }
        Duration::from_nanos(bucket_floor(BUCKETS - 1))
    }
}

/// The report's view of constrained decoding (engine metrics `constraint`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ConstraintMetrics {
    /// Requests decoded under a grammar.
    pub constrained_requests: u64,
    /// Token masks computed (one per sampled token of a constrained request).
    pub masks: u64,
    /// Tokens appended because the grammar allowed only them (no sampling, and no model step
    /// of their own: they run as one chunk with the next step).
    pub forced_tokens: u64,
    /// CPU time of all masks (computed on worker threads while the model step runs).
    pub mask_seconds: f64,
    pub mask_us_median: f64,
    pub mask_us_p99: f64,
    /// Time steps waited for masks after the model step had finished (what the overlap did not hide).
    pub mask_wait_seconds: f64,
    /// Time spent advancing the grammars over sampled tokens and finding forced tokens
    /// (between steps, in parallel over the sequences).
    pub commit_seconds: f64,
    /// Sequences whose grammar failed (a parser error): ended early, their rows fail validation.
    pub grammar_errors: u64,
}

impl ConstraintMetrics {
    pub fn set_mask_times(&mut self, t: &MaskTimes) {
        self.masks = t.count();
        self.mask_seconds = t.total().as_secs_f64();
        self.mask_us_median = t.quantile(0.5).as_secs_f64() * 1e6;
        self.mask_us_p99 = t.quantile(0.99).as_secs_f64() * 1e6;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_trip_and_quantiles_are_within_a_sixteenth() {
        for ns in [0u64, 1, 15, 16, 17, 31, 32, 1000, 12_345, 1 << 40, u64::MAX] {
            let b = bucket(ns);
            assert!(b < BUCKETS, "{ns}");
            let lo = bucket_floor(b);
            assert!(lo <= ns && bucket(lo) == b, "{ns}: floor {lo}");
            assert!(ns - lo <= ns / 16, "{ns}: floor {lo}");
        }
        let mut t = MaskTimes::default();
        // 1..=1000 microseconds: median 500 us, p99 990 us.
        for us in 1..=1000u64 {
            t.record(Duration::from_micros(us));
        }
        let near = |got: Duration, want_us: f64| {
            let g = got.as_secs_f64() * 1e6;
            assert!(g <= want_us && g >= want_us * (1.0 - 1.0 / 16.0), "got {g} us, want ~{want_us}");
        };
        near(t.quantile(0.5), 500.0);
        near(t.quantile(0.99), 990.0);
        assert_eq!(t.count(), 1000);
        assert_eq!(t.total(), Duration::from_micros(500_500));
        assert_eq!(MaskTimes::default().quantile(0.5), Duration::ZERO);
    }
}
