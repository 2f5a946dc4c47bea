//! Progress: an indicatif bar on a terminal, plain periodic log lines (stderr) otherwise, so
//! batch logs under Slurm or Kubernetes stay readable.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A snapshot of the counters shown.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProgressStats {
    /// Records with a row: computed this run, committed by an earlier run, or reused.
    pub done: u64,
    /// Of `done`, those this run did not compute (resumed or reused): not part of the rate.
    pub carried: u64,
    pub errors: u64,
    pub prompt_tokens: u64,
    pub prompt_computed: u64,
    pub generated_tokens: u64,
}

pub struct Progress {
    bar: Option<ProgressBar>,
    total: Option<u64>,
    start: Instant,
    last_log: Instant,
    interval: Duration,
    quiet: bool,
}

impl Progress {
    /// `total`: records expected (if known). A bar when stderr is a terminal, log lines every
    /// `interval` otherwise; `quiet` shows nothing.
    pub fn new(total: Option<u64>, interval: Duration, quiet: bool) -> Self {
        let bar = if !quiet && std::io::stderr().is_terminal() {
            let b = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr_with_hz(4));
            let tmpl = if total.is_some() {
                "{elapsed_precise} [{bar:30}] {pos}/{len} ETA {eta} {msg}"
            } else {
                "{elapsed_precise} {pos} records {msg}"
            };
            b.set_style(
                ProgressStyle::with_template(tmpl)
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            Some(b)
        } else {
            None
        };
        let now = Instant::now();
        Progress { bar, total, start: now, last_log: now, interval, quiet }
    }

    fn line(&self, s: &ProgressStats) -> String {
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        let reuse =
            if s.prompt_tokens > 0 { 100.0 * (1.0 - s.prompt_computed as f64 / s.prompt_tokens as f64) } else { 0.0 };
        format!(
            "{:.1} rec/s, {:.0} tok/s, prefix reuse {:.0}%, {} errors",
            s.done as f64 / secs,
            s.generated_tokens as f64 / secs,
            reuse,
            s.errors
        )
    }

    /// Shows the counters (cheap: rate-limited by indicatif or by `interval`).
    pub fn update(&mut self, s: &ProgressStats) {
        if self.quiet {
            return;
        }
        if let Some(b) = &self.bar {
            b.set_position(s.done);
            b.set_message(self.line(s));
        } else if self.last_log.elapsed() >= self.interval {
            self.last_log = Instant::now();
            eprintln!("[dustoff] {}, {}", plain_head(self.start.elapsed(), s, self.total), self.line(s));
        }
    }

    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

/// The start of the non-terminal progress line: elapsed time, records done, and with a known
/// total the percentage and an ETA from this run's own rate (resumed and reused records come
/// for free, so they are not part of it). `ETA ?` until a record has been computed.
pub fn plain_head(elapsed: Duration, s: &ProgressStats, total: Option<u64>) -> String {
    let secs = elapsed.as_secs_f64();
    let Some(t) = total.filter(|&t| t > 0) else {
        return format!("{secs:.0}s {} records", s.done);
    };
    let pct = 100.0 * s.done.min(t) as f64 / t as f64;
    let computed = s.done.saturating_sub(s.carried);
    let eta = if computed > 0 && secs > 0.0 {
        let left = t.saturating_sub(s.done) as f64 * secs / computed as f64;
        format_duration(left)
    } else {
        "?".to_string()
    };
    format!("{secs:.0}s {}/{t} records ({pct:.1}%), ETA {eta}", s.done)
}

/// `1h02m`, `3m40s`, `12s`.
fn format_duration(secs: f64) -> String {
    let s = secs.round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_line_has_percent_and_an_eta_from_this_runs_rate() {
        let s = ProgressStats { done: 300, carried: 100, ..Default::default() };
        // 200 records computed in 100 s: the 700 left take 350 s.
        let h = plain_head(Duration::from_secs(100), &s, Some(1000));
        assert_eq!(h, "100s 300/1000 records (30.0%), ETA 5m50s");
        let fresh = ProgressStats { done: 100, carried: 100, ..Default::default() };
        assert_eq!(plain_head(Duration::from_secs(3), &fresh, Some(1000)), "3s 100/1000 records (10.0%), ETA ?");
        assert_eq!(plain_head(Duration::from_secs(3), &s, None), "3s 300 records");
        assert_eq!(format_duration(3725.0), "1h02m");
        assert_eq!(format_duration(12.4), "12s");
    }
}
