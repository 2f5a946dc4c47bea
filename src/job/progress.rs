//! Progress: an indicatif bar on a terminal, plain periodic log lines (stderr) otherwise, so
//! batch logs under Slurm or Kubernetes stay readable.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A snapshot of the counters shown.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProgressStats {
    pub done: u64,
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
            let of = self.total.map(|t| format!("/{t}")).unwrap_or_default();
            eprintln!(
                "[dustoff] {:.0}s {}{} records, {}",
                self.start.elapsed().as_secs_f64(),
                s.done,
                of,
                self.line(s)
            );
        }
    }

    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
