//! One forward step of `CudaBackend`: the plan flattened into one per-step input buffer
//! (uploaded in one copy), the kernels of every layer, and the logits copied back.
//!
//! Steps of up to 64 tokens (decode of up to 64 sequences) run as a replayed CUDA graph, captured
//! once per shape (`GraphKey`): every pointer a kernel reads is fixed (work buffers, the
//! step-input buffer with a fixed block-table stride), and the attention split count is rounded
//! up to a power of two (extra splits exit at once), so one graph serves a growing sequence. A
//! shape whose capture fails (a cuBLAS call that cannot be captured) runs without a graph.
//!
//! Matrix products: 1 token (below `tc_min_tokens`): f32 GEMV; 2..=16 tokens
//! (`tc_max_tokens`): the tensor-core GEMM (input cast to F16, each weight read once for all
//! tokens); more: cuBLAS (faster there on the H200).
//!
//! Attention: one-token chunks (decode) take the split kernel, longer chunks (prefill) the
//! tensor-core prefill kernel in 16-token tiles (`prefill`, split along the context when the
//! tiles alone do not fill the GPU), where the head shape allows it. In steps above the graph
//! size, decode tokens whose block tables share leading blocks read them once per group
//! (`cascade`).
//!
//! The layers themselves: the walker in `layers/` (norm, mixer, residual, norm, FFN, residual
//! for every layer kind; the norms folded into the launches after them where no tap reads
//! them).

use cudarc::driver::CudaStream;
use rayon::prelude::*;

use super::flat::Flat;
use super::graph::StepGraphs;
use super::inputs::graph_key;
use super::workspace::{ptr, Work};
use crate::backend::cuda::model::CudaBackend;
use crate::backend::cuda::ops as l;
use crate::backend::cuda::ops::gemm_tc::TC_MAX_TOKENS;
use crate::backend::cuda::ops::launch::Dev;
use crate::backend::cuda::CudaError;

impl CudaBackend {
    /// Uploads the step inputs and runs (or replays) the layers; the logits stay on the device.
    pub(in crate::backend::cuda) fn run_step(&mut self, w: &mut Work, f: &Flat) -> Result<(), CudaError> {
        let meta = w.meta.as_mut().expect("step inputs allocated by ensure_work");
        let mut view = meta.slice_mut(0..self.host_meta.len());
        if let Some(t) = self.step_times.as_mut() {
            t.begin(&self.dev.stream, f.n_tok)?;
        }
        self.dev.stream.memcpy_htod(&self.host_meta, &mut view).map_err(CudaError::driver("uploading step inputs"))?;
        self.launch_step(w, f)?;
        if let Some(t) = self.step_times.as_mut() {
            t.end(&self.dev.stream)?;
        }
        Ok(())
    }

    /// The step's kernels: profiled, replayed from a graph, or launched one by one.
    fn launch_step(&mut self, w: &mut Work, f: &Flat) -> Result<(), CudaError> {
        if self.prof.is_some() {
            let mut prof = self.prof.take();
            let r = self.run_layers(w, f, &mut prof);
            self.prof = prof;
            r?;
            self.prof.as_mut().map_or(Ok(()), |p| p.end())?;
        } else if self.tap.is_none()
            && self.tp.is_none()
            && f.n_tok <= TC_MAX_TOKENS
            && self.graphs.wanted(&graph_key(f))
        {
            if !self.replay(w, f)? {
                self.run_layers(w, f, &mut None)?;
            }
        } else {
            self.run_layers(w, f, &mut None)?;
        }
        Ok(())
    }

    /// Runs the step and returns the logits of the chunks that want them.
    pub(in crate::backend::cuda) fn forward(&mut self, f: &Flat) -> Result<Vec<Vec<f32>>, CudaError> {
        let mut w = std::mem::take(&mut self.work);
        let r = (|| {
            self.run_step(&mut w, f)?;
            if f.m == 0 {
                return Ok(Vec::new());
            }
            let v = self.cfg.vocab_size;
            let all = w.logits.as_ref().expect("logits allocated by ensure_work").slice(0..f.m * v);
            let pinned = w.host_logits.as_mut().expect("pinned logits allocated by ensure_work");
            let host = pinned.as_mut_slice().map_err(CudaError::driver("mapping the pinned logits"))?;
            let host = &mut host[..f.m * v];
            // A plain host slice: the copy is asynchronous, so wait for the stream before reading.
            self.dev.stream.memcpy_dtoh(&all, host).map_err(CudaError::driver("downloading logits"))?;
            self.dev.stream.synchronize().map_err(CudaError::driver("waiting for the logits"))?;
            // One vector per sequence, split across threads (64 x 600 KB a step at 64 slots).
            Ok(host.par_chunks(v).map(|r| r.to_vec()).collect())
        })();
        self.work = w;
        r
    }

    /// Runs the step and returns the arg-max id of each logits row, chosen on the device.
    pub(in crate::backend::cuda) fn forward_greedy(&mut self, f: &Flat) -> Result<Vec<u32>, CudaError> {
        let mut w = std::mem::take(&mut self.work);
        let r = (|| {
            self.run_step(&mut w, f)?;
            if f.m == 0 {
                return Ok(Vec::new());
            }
            let s: &CudaStream = &self.dev.stream;
            let ids = w.argmax.as_ref().expect("arg-max buffer allocated by ensure_work");
            l::ArgmaxRows { x: ptr(&w.logits, s), out: Dev::of(ids, s), rows: f.m, n: self.cfg.vocab_size }
                .launch(&mut self.kernels, s)?;
            let got =
                self.dev.stream.clone_dtoh(&ids.slice(0..f.m)).map_err(CudaError::driver("downloading arg-max ids"))?;
            // The copy is asynchronous by API (pageable memory makes it synchronous in practice):
            // wait before reading.
            self.dev.stream.synchronize().map_err(CudaError::driver("waiting for the arg-max ids"))?;
            Ok(got.into_iter().map(|i| i as u32).collect())
        })();
        self.work = w;
        r
    }

    /// Launches the captured graph of this step shape, capturing it first if needed. `false`:
    /// the step could not be captured (nothing ran; the caller launches it directly, and this
    /// shape is not tried again).
    fn replay(&mut self, w: &Work, f: &Flat) -> Result<bool, CudaError> {
        let key = graph_key(f);
        if !self.graphs.contains(&key) {
            // Module loads are not stream work; do them all before capturing.
            self.kernels.load_all()?;
            let s = self.dev.stream.clone();
            StepGraphs::begin_capture(&s)?;
            let ran = self.run_layers(w, f, &mut None);
            if !self.graphs.end_capture(&s, key, f.n_tok, ran)? {
                return Ok(false);
            }
            self.note_memory();
        }
        self.graphs.launch(&key)?;
        Ok(true)
    }
}
