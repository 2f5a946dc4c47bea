//! `DUSTOFF_PROFILE=1`: GPU time per kernel class of the forward pass, for finding where a
//! step's time goes. Events are recorded between the classes of each step (graphs are off while
//! profiling: every step launches its kernels one by one), summed per class and per step kind
//! (tokens per step in buckets), and printed to stderr when the backend is dropped.

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use super::CudaError;

pub const PROFILE_ENV: &str = "DUSTOFF_PROFILE";

pub fn profiling_requested() -> bool {
    crate::sys::env::get(PROFILE_ENV).is_some_and(|v| v == "1")
}

/// The step-size bucket a step of `n_tok` tokens is counted under.
fn bucket(n_tok: usize) -> &'static str {
    match n_tok {
        0..=1 => "1 token",
        2..=64 => "2-64 tokens",
        65..=256 => "65-256 tokens",
        _ => ">256 tokens",
    }
}

pub struct Profiler {
    ctx: Arc<CudaContext>,
    /// Events of the current step: (class that ends at this event, event).
    marks: Vec<(&'static str, CudaEvent)>,
    start: Option<CudaEvent>,
    step_bucket: &'static str,
    /// (bucket, class) -> (ms, count).
    totals: BTreeMap<(&'static str, &'static str), (f64, usize)>,
    steps: BTreeMap<&'static str, (usize, usize)>,
}

impl Profiler {
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        Profiler {
            ctx,
            marks: Vec::new(),
            start: None,
            step_bucket: "",
            totals: BTreeMap::new(),
            steps: BTreeMap::new(),
        }
    }

    fn event(&self) -> Result<CudaEvent, CudaError> {
        self.ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(CudaError::driver("creating a profiling event"))
    }

    pub fn begin(&mut self, s: &CudaStream, n_tok: usize) -> Result<(), CudaError> {
        let e = self.event()?;
        e.record(s).map_err(CudaError::driver("recording a profiling event"))?;
        self.start = Some(e);
        self.marks.clear();
        self.step_bucket = bucket(n_tok);
        let st = self.steps.entry(self.step_bucket).or_default();
        st.0 += 1;
        st.1 += n_tok;
        Ok(())
    }

    /// The work launched since the previous mark belongs to `class`.
    pub fn mark(&mut self, s: &CudaStream, class: &'static str) -> Result<(), CudaError> {
        if self.start.is_none() {
            return Ok(());
        }
        let e = self.event()?;
        e.record(s).map_err(CudaError::driver("recording a profiling event"))?;
        self.marks.push((class, e));
        Ok(())
    }

    /// Waits for the step and adds its times.
    pub fn end(&mut self) -> Result<(), CudaError> {
        let Some(start) = self.start.take() else { return Ok(()) };
        let mut prev = &start;
        for (class, e) in &self.marks {
            e.synchronize().map_err(CudaError::driver("waiting for a profiling event"))?;
            let ms = prev.elapsed_ms(e).map_err(CudaError::driver("reading a profiling event"))? as f64;
            let t = self.totals.entry((self.step_bucket, class)).or_default();
            t.0 += ms;
            t.1 += 1;
            prev = e;
        }
        Ok(())
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        for (b, (n_steps, n_tok)) in &self.steps {
            let total: f64 = self.totals.iter().filter(|((bb, _), _)| bb == b).map(|(_, v)| v.0).sum();
            eprintln!("profile: {b}: {n_steps} steps, {n_tok} tokens, {total:.1} ms GPU");
            let mut rows: Vec<_> = self.totals.iter().filter(|((bb, _), _)| bb == b).collect();
            rows.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
            for ((_, class), (ms, _)) in rows {
                eprintln!("profile:   {class:18} {ms:10.1} ms  {:5.1}%", 100.0 * ms / total.max(1e-9));
            }
        }
    }
}

pub const STEP_TIMES_ENV: &str = "DUSTOFF_STEP_TIMES";

pub fn step_times_requested() -> bool {
    crate::sys::env::get(STEP_TIMES_ENV).is_some_and(|v| v == "1")
}

/// `DUSTOFF_STEP_TIMES=1`: per step size (tokens, up to 64; larger steps in one row), the GPU
/// time of the step's own work (events around the graph replay or the direct launches, graphs
/// on) against the period from one step's start to the next (host work, uploads, logits and
/// the GPU's idle time included). Where the two differ, the fixed cost of a step is on the
/// host; where they agree, on the GPU. Printed to stderr when the backend is dropped.
pub struct StepTimes {
    ctx: Arc<CudaContext>,
    /// The step in flight: tokens, start time, its start and end events.
    pending: Option<(usize, std::time::Instant, CudaEvent, Option<CudaEvent>)>,
    /// tokens (65: more) -> (GPU ms, period ms) of every step.
    rows: BTreeMap<usize, Vec<(f64, f64)>>,
}

impl StepTimes {
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        StepTimes { ctx, pending: None, rows: BTreeMap::new() }
    }

    fn record(&self, s: &CudaStream) -> Result<CudaEvent, CudaError> {
        let e = self
            .ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(CudaError::driver("creating a step-time event"))?;
        e.record(s).map_err(CudaError::driver("recording a step-time event"))?;
        Ok(e)
    }

    /// A step of `n_tok` tokens starts (the previous one is counted now).
    pub fn begin(&mut self, s: &CudaStream, n_tok: usize) -> Result<(), CudaError> {
        self.settle()?;
        let e = self.record(s)?;
        self.pending = Some((n_tok, std::time::Instant::now(), e, None));
        Ok(())
    }

    /// The step's GPU work has all been launched.
    pub fn end(&mut self, s: &CudaStream) -> Result<(), CudaError> {
        let e = self.record(s)?;
        if let Some(p) = self.pending.as_mut() {
            p.3 = Some(e);
        }
        Ok(())
    }

    fn settle(&mut self) -> Result<(), CudaError> {
        let Some((n, t0, e0, Some(e1))) = self.pending.take() else { return Ok(()) };
        e1.synchronize().map_err(CudaError::driver("waiting for a step-time event"))?;
        let gpu = e0.elapsed_ms(&e1).map_err(CudaError::driver("reading a step-time event"))? as f64;
        self.rows.entry(n.min(65)).or_default().push((gpu, t0.elapsed().as_secs_f64() * 1e3));
        Ok(())
    }
}

impl Drop for StepTimes {
    fn drop(&mut self) {
        // The last step has no successor: its period is unknown, so it is left out. Medians:
        // the steps that capture a graph take far longer than the replays.
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        for (n, v) in &self.rows {
            let n = if *n == 65 { ">64".to_string() } else { n.to_string() };
            let (gpu, period) = (median(v.iter().map(|r| r.0).collect()), median(v.iter().map(|r| r.1).collect()));
            eprintln!(
                "step times: {n}-token steps: {}, median GPU {gpu:.3} ms (upload + layers), median period {period:.3} ms (GPU busy {:.1}%)",
                v.len(),
                100.0 * gpu / period.max(1e-9)
            );
        }
    }
}
