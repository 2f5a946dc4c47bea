//! CUDA graphs of decode steps: steps of up to 64 tokens are captured once per shape
//! (`GraphKey`) and replayed, since launch gaps, not bytes, limit a memory-bound step. A shape
//! whose capture fails (a library call that cannot be captured) is noted and runs without a
//! graph from then on. The backend captures (it owns the kernels a step launches); this module
//! owns the graphs and the capture bookkeeping.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};

use crate::backend::cuda::device;
use crate::backend::cuda::tuning;
use crate::backend::cuda::CudaError;

/// The shape a captured graph serves: (tokens, logit rows, attention splits, split-kernel
/// tokens, prefill tiles, positions per split, prefill splits). Graph-sized steps have no
/// shared-prefix pass.
pub(in crate::backend::cuda) type GraphKey = (usize, usize, usize, usize, usize, usize, usize);

/// Captured steps by shape, and the shapes whose capture failed.
pub(in crate::backend::cuda) struct StepGraphs {
    /// Replay on (`DUSTOFF_CUDA_GRAPHS`, `CudaBackend::set_graphs`).
    pub on: bool,
    captured: HashMap<GraphKey, CudaGraph>,
    uncapturable: HashSet<GraphKey>,
}

/// Whether the driver can instantiate captured graphs (CUDA 11.4+, [`crate::backend::cuda::device::GRAPH_ENTRY`]):
/// on an older driver steps run without graphs (cudarc would panic calling the missing symbol).
pub(in crate::backend::cuda) fn graphs_supported() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| device::driver_has(device::GRAPH_ENTRY))
}

impl StepGraphs {
    /// Replay `on` where the driver supports it ([`graphs_supported`]).
    pub fn new(on: bool) -> Self {
        StepGraphs { on: on && graphs_supported(), captured: HashMap::new(), uncapturable: HashSet::new() }
    }

    /// Drops the captured graphs (they hold buffer addresses and kernel choices that changed).
    pub fn clear(&mut self) {
        self.captured.clear();
    }

    /// Whether a step of this shape should run from a graph: replay on and the shape not known
    /// to fail capture.
    pub fn wanted(&self, key: &GraphKey) -> bool {
        self.on && !self.uncapturable.contains(key)
    }

    pub fn contains(&self, key: &GraphKey) -> bool {
        self.captured.contains_key(key)
    }

    /// Starts capturing the stream's work (module loads are not stream work: do them before).
    pub fn begin_capture(s: &Arc<CudaStream>) -> Result<(), CudaError> {
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(CudaError::driver("beginning graph capture"))
    }

    /// Ends the capture begun by [`StepGraphs::begin_capture`]; `ran` is what launching the
    /// step into it returned. `true`: the graph is stored under `key`; `false`: the step could
    /// not be captured (nothing ran; this shape is not tried again).
    pub fn end_capture(
        &mut self,
        s: &Arc<CudaStream>,
        key: GraphKey,
        n_tok: usize,
        ran: Result<(), CudaError>,
    ) -> Result<bool, CudaError> {
        let g = s.end_capture(CUgraphInstantiate_flags(0)).map_err(CudaError::driver("ending graph capture"));
        // A library call that cannot be captured (cuBLAS setting up a workspace, say)
        // invalidates the capture: run such shapes without a graph from then on.
        let g = match (ran, g) {
            (Ok(()), Ok(Some(g))) => g,
            (ran, g) => {
                let why = ran.err().map(|e| e.to_string()).or(g.err().map(|e| e.to_string()));
                if self.uncapturable.is_empty() {
                    eprintln!(
                        "note: a {n_tok}-token step could not be captured as a CUDA graph ({}); such steps run without one",
                        why.unwrap_or_else(|| "empty capture".into())
                    );
                }
                self.uncapturable.insert(key);
                return Ok(false);
            }
        };
        if tuning::tuning().graph_nodes {
            let mut nodes = 0usize;
            // SAFETY: the graph handle is live (owned by `g`); a null node array asks only
            // for the count.
            let r = unsafe { cudarc::driver::sys::cuGraphGetNodes(g.cu_graph(), std::ptr::null_mut(), &mut nodes) };
            eprintln!("graph: {n_tok}-token step, {nodes} nodes ({r:?})");
        }
        self.captured.insert(key, g);
        Ok(true)
    }

    /// Replays the graph of `key` (captured before: [`StepGraphs::contains`]).
    pub fn launch(&self, key: &GraphKey) -> Result<(), CudaError> {
        self.captured[key].launch().map_err(CudaError::driver("launching the decode graph"))
    }
}
