//! The activation tap of the CUDA forward pass (calibration for `dustoff quantize --device
//! cuda`): with a tap set, the input of every matrix of a step (`[n_tok, cols]` f32, as the
//! matmul reads it before any F16 cast) is downloaded and handed to the same
//! [`ActivationTap`] the CPU backend feeds, under the names of the matrices that read it (Q/K/V
//! share one input, gate/up share one). The output head's input is reported for every token of
//! the step (final RMSNorm applied), as on the CPU.
//!
//! A step with a tap runs without graph replay (each download waits for the stream); without a
//! tap the forward pass does nothing extra. Hybrid layers report only their sparse FFN's input
//! (under the router's name, as the CPU does): enough to compare routing choices.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::CudaError;
use crate::backend::cpu::tap::ActivationTap;
use crate::model::weights::ModelWeights;

/// The matrix inputs of one layer, in forward order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TapPoint {
    /// The attention-normed hidden state, read by Q, K and V.
    Qkv,
    /// The attention output, read by O.
    O,
    /// The FFN-normed hidden state, read by gate and up.
    GateUp,
    /// The FFN-normed hidden state of a sparse layer, read by its router (and experts).
    Router,
    /// `silu(gate) * up`, read by down.
    Down,
}

/// Matrix names of one layer (the GGUF names the host weights carry).
struct LayerNames {
    qkv: [String; 3],
    o: String,
    gate_up: [String; 2],
    down: String,
    /// The router of a sparse layer (its input: the FFN-normed hidden state).
    router: Option<String>,
}

/// A host tap plus the matrix names it reports under.
pub struct CudaTap {
    tap: Box<dyn ActivationTap>,
    layers: Vec<LayerNames>,
    head: String,
    /// Host staging of one download (`[n_tok, cols]`).
    host: Vec<f32>,
}

impl CudaTap {
    /// `w`: the weights the backend was made from (only their names are read).
    pub fn new(tap: Box<dyn ActivationTap>, w: &ModelWeights) -> Self {
        let layers = w
            .layers
            .iter()
            .map(|l| LayerNames {
                qkv: [l.wq.name.clone(), l.wk.name.clone(), l.wv.name.clone()],
                o: l.wo.name.clone(),
                gate_up: [l.w_gate.name.clone(), l.w_up.name.clone()],
                down: l.w_down.name.clone(),
                router: l.moe.as_ref().map(|m| m.router.name.clone()),
            })
            .collect();
        CudaTap { tap, layers, head: w.output.name.clone(), host: Vec::new() }
    }

    /// The host tap, to take its results out.
    pub fn into_inner(self) -> Box<dyn ActivationTap> {
        self.tap
    }

    fn report(
        &mut self,
        s: &Arc<CudaStream>,
        buf: &Option<CudaSlice<f32>>,
        n: usize,
        cols: usize,
        names: &[&str],
    ) -> Result<(), CudaError> {
        let b = buf.as_ref().ok_or_else(|| CudaError::Shape { kernel: "tap", reason: "work buffer missing".into() })?;
        if b.len() < n * cols {
            return Err(CudaError::Shape { kernel: "tap", reason: format!("buffer of {} < {n} x {cols}", b.len()) });
        }
        self.host.resize(n * cols, 0.0);
        s.memcpy_dtoh(&b.slice(0..n * cols), &mut self.host[..])
            .map_err(CudaError::driver("downloading a tapped input"))?;
        s.synchronize().map_err(CudaError::driver("waiting for a tapped input"))?;
        self.tap.matmul_input(names, &self.host, n);
        Ok(())
    }

    /// `buf` (`[n, cols]`) is the input of `point` in `layer`.
    pub(super) fn layer_input(
        &mut self,
        s: &Arc<CudaStream>,
        layer: usize,
        point: TapPoint,
        buf: &Option<CudaSlice<f32>>,
        n: usize,
        cols: usize,
    ) -> Result<(), CudaError> {
        let l = self
            .layers
            .get(layer)
            .ok_or_else(|| CudaError::Shape { kernel: "tap", reason: format!("no layer {layer}") })?;
        let names: Vec<String> = match point {
            TapPoint::Qkv => l.qkv.to_vec(),
            TapPoint::O => vec![l.o.clone()],
            TapPoint::GateUp => l.gate_up.to_vec(),
            TapPoint::Down => vec![l.down.clone()],
            TapPoint::Router => l.router.iter().cloned().collect(),
        };
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        self.report(s, buf, n, cols, &refs)
    }

    /// `buf` (`[n, dim]`) is the final-normed hidden state of every token (the head's input).
    pub(super) fn head_input(
        &mut self,
        s: &Arc<CudaStream>,
        buf: &Option<CudaSlice<f32>>,
        n: usize,
        dim: usize,
    ) -> Result<(), CudaError> {
        let head = self.head.clone();
        self.report(s, buf, n, dim, &[&head])
    }
}
