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
