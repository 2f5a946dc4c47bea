//! The activation tap of the CUDA forward pass (calibration for `dustoff quantize --device
//! cuda`): with a tap set, the input of every matrix of a step (`[n_tok, cols]` f32, as the
//! matmul reads it before any F16 cast) is downloaded and handed to the same
//! [`ActivationTap`] the CPU backend feeds, under the names the CPU reports (the matrices that
//! share one input in one call: Q/K/V; DeltaNet's q|k|v, z, b, a; gate/up; the shared expert's
//! gate row and gate/up). Routed experts: per expert that has tokens, its gate/up
//! input (the rows of the tokens routed to it) and its down input (their `silu(gate) * up`
//! rows), gathered on the host from the grouped walk's buffers. The output head's input is
//! reported for every token of the step (final RMSNorm applied), as on the CPU.
//!
//! A head-only tap ([`CudaTap::head_only`], `dustoff eval --device cuda`) reports the head's
//! input alone: no layer's input is downloaded.
//!
//! A step with a tap runs without graph replay (each download waits for the stream) and takes
//! the plainest launches (norms apart, the grouped expert walk, the shared expert and the
//! DeltaNet norm apart); without a tap the forward pass does nothing extra.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DeviceRepr, ValidAsZeroBits};

use super::ops::launch::Dev;
use super::CudaError;
use crate::backend::cpu::tap::ActivationTap;
use crate::model::layer::{Ffn, Mixer};
use crate::model::weights::{ModelWeights, Tensor};

/// The matrix inputs of one layer, in forward order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TapPoint {
    /// The attention-normed hidden state, read by the mixer's input projections (Q, K, V; or
    /// a DeltaNet layer's q|k|v, z, b, a).
    MixerIn,
    /// The input of the mixer's output projection (attention output after the gate; DeltaNet's
    /// normed core output).
    MixerOut,
    /// The FFN-normed hidden state, read by gate and up.
    GateUp,
    /// The FFN-normed hidden state of a sparse layer, read by its router.
    Router,
    /// The same rows, read by the shared expert's gate row and gate/up.
    SharedIn,
    /// `silu(gate) * up`, read by down.
    Down,
    /// The shared expert's `silu(gate) * up`, read by its down.
    SharedDown,
}

/// Names of one routed expert's matrices (`blk.N.ffn_gate_exps.weight[e]`, ...).
struct ExpertNames {
    gate_up: [String; 2],
    down: String,
}

/// Matrix names of one layer (the GGUF names the host weights carry).
struct LayerNames {
    mixer_in: Vec<String>,
    mixer_out: String,
    gate_up: Vec<String>,
    down: String,
    /// Sparse layers: the router; the shared expert's gate row and gate/up, and its down.
    router: Vec<String>,
    experts: Vec<ExpertNames>,
    shared_in: Vec<String>,
    shared_down: Option<String>,
}

fn names(ts: &[&Tensor]) -> Vec<String> {
    ts.iter().map(|t| t.name.clone()).collect()
}

impl LayerNames {
    fn of(l: &crate::model::weights::LayerWeights) -> Self {
        let t = l.typed();
        let (mixer_in, mixer_out) = match t.mixer {
            Mixer::Attention(a) | Mixer::GatedAttention(a) => (names(&[a.wq, a.wk, a.wv]), a.wo.name.clone()),
            Mixer::DeltaNet(d) => (names(&[&d.w_qkv, &d.w_z, &d.w_b, &d.w_a]), d.w_out.name.clone()),
        };
        let mut n = LayerNames {
            mixer_in,
            mixer_out,
            gate_up: Vec::new(),
            down: String::new(),
            router: Vec::new(),
            experts: Vec::new(),
            shared_in: Vec::new(),
            shared_down: None,
        };
        match t.ffn {
            Ffn::Dense(d) => {
                n.gate_up = names(&[d.gate, d.up]);
                n.down = d.down.name.clone();
            }
            Ffn::Moe(m) => {
                n.router = vec![m.router.name.clone()];
                n.experts = m
                    .experts
                    .iter()
                    .map(|e| ExpertNames {
                        gate_up: [e.gate.name.clone(), e.up.name.clone()],
                        down: e.down.name.clone(),
                    })
                    .collect();
                if let Some(sh) = &m.shared {
                    n.shared_in = names(&[&sh.gate, &sh.expert.gate, &sh.expert.up]);
                    n.shared_down = Some(sh.expert.down.name.clone());
                }
            }
        }
        n
    }
}

/// Where a sparse layer's grouped walk left what its experts read (`moe::moe_ffn_grouped`).
pub(super) struct ExpertRows {
    /// `[n_tok, dim]`: the routed input.
    pub h: Dev<f32>,
    /// `[n_experts + 1]`: grouped positions per expert.
    pub offsets: Dev<i32>,
    /// `[n_tok k]`: the pair (`token k + rank`) at each grouped position.
    pub entries: Dev<i32>,
    /// `[n_tok k, ffn]`: `silu(gate) * up` at each grouped position.
    pub act: Dev<f32>,
    pub n_tok: usize,
    pub k: usize,
    pub dim: usize,
    pub ffn: usize,
}

/// A host tap plus the matrix names it reports under.
pub struct CudaTap {
    tap: Box<dyn ActivationTap>,
    layers: Vec<LayerNames>,
    head: String,
    /// Only the head's input is reported (the layers' inputs are not downloaded).
    head_only: bool,
}

/// The first `len` values of `d`, downloaded (the stream is synchronized).
fn download<T: DeviceRepr + ValidAsZeroBits + Default + Clone>(
    s: &CudaStream,
    d: Dev<T>,
    len: usize,
) -> Result<Vec<T>, CudaError> {
    if d.len < len {
        return Err(CudaError::Shape { kernel: "tap", reason: format!("buffer of {} < {len} values", d.len) });
    }
    let mut host = vec![T::default(); len];
    if len == 0 {
        return Ok(host);
    }
    let failed = |what: &'static str| move |e| CudaError::Driver { what: what.into(), source: e };
    // SAFETY: `d` holds at least `len` values of `T` on this stream's device (checked above);
    // `host` has `len` elements and is read only after the stream is synchronized.
    unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut host[..], d.ptr, s.cu_stream()) }
        .map_err(failed("downloading a tapped input"))?;
    s.synchronize().map_err(failed("waiting for a tapped input"))?;
    Ok(host)
}

impl CudaTap {
    /// `w`: the weights the backend was made from (only their names are read).
    pub fn new(tap: Box<dyn ActivationTap>, w: &ModelWeights) -> Self {
        let layers = w.layers.iter().map(LayerNames::of).collect();
        CudaTap { tap, layers, head: w.output.name.clone(), head_only: false }
    }

    /// A tap that sees only the output head's input (`[n_tok, dim]`, every token of a step,
    /// final RMSNorm applied), reported under `head` (the head tensor's name): what `dustoff
    /// eval` reads. The layers' inputs stay on the device.
    pub fn head_only(tap: Box<dyn ActivationTap>, head: &str) -> Self {
        CudaTap { tap, layers: Vec::new(), head: head.to_string(), head_only: true }
    }

    /// The host tap, to take its results out.
    pub fn into_inner(self) -> Box<dyn ActivationTap> {
        self.tap
    }

    fn layer(&self, layer: usize) -> Result<&LayerNames, CudaError> {
        self.layers.get(layer).ok_or_else(|| CudaError::Shape { kernel: "tap", reason: format!("no layer {layer}") })
    }

    fn report(
        &mut self,
        s: &Arc<CudaStream>,
        buf: Dev<f32>,
        n: usize,
        cols: usize,
        names: &[String],
    ) -> Result<(), CudaError> {
        if names.is_empty() {
            return Ok(());
        }
        let host = download(s, buf, n * cols)?;
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        self.tap.matmul_input(&refs, &host, n);
        Ok(())
    }

    /// `buf` (`[n, cols]`) is the input of `point` in `layer`.
    pub(super) fn layer_input(
        &mut self,
        s: &Arc<CudaStream>,
        layer: usize,
        point: TapPoint,
        buf: Dev<f32>,
        n: usize,
        cols: usize,
    ) -> Result<(), CudaError> {
        if self.head_only {
            return Ok(());
        }
        let l = self.layer(layer)?;
        let names: Vec<String> = match point {
            TapPoint::MixerIn => l.mixer_in.clone(),
            TapPoint::MixerOut => vec![l.mixer_out.clone()],
            TapPoint::GateUp => l.gate_up.clone(),
            TapPoint::Down => vec![l.down.clone()],
            TapPoint::Router => l.router.clone(),
            TapPoint::SharedIn => l.shared_in.clone(),
            TapPoint::SharedDown => l.shared_down.iter().cloned().collect(),
        };
        self.report(s, buf, n, cols, &names)
    }

    /// The routed experts of `layer`: per expert with tokens (ascending index, as the CPU), the
    /// rows of its tokens (gate/up's input) and their activations (down's input).
    pub(super) fn experts(&mut self, s: &Arc<CudaStream>, layer: usize, r: &ExpertRows) -> Result<(), CudaError> {
        if self.head_only {
            return Ok(());
        }
        let n_experts = self.layer(layer)?.experts.len();
        let pairs = r.n_tok * r.k;
        let h = download(s, r.h, r.n_tok * r.dim)?;
        let offsets = download(s, r.offsets, n_experts + 1)?;
        let entries = download(s, r.entries, pairs)?;
        let act = download(s, r.act, pairs * r.ffn)?;
        let bad = |reason: String| CudaError::Shape { kernel: "tap", reason };
        let mut rows = Vec::new();
        for e in 0..n_experts {
            let (p0, p1) = (offsets[e].max(0) as usize, offsets[e + 1].max(0) as usize);
            if p1 <= p0 {
                continue;
            }
            if p1 > pairs {
                return Err(bad(format!("layer {layer} expert {e}: grouped positions {p0}..{p1} of {pairs}")));
            }
            rows.clear();
            for &pair in &entries[p0..p1] {
                let t = pair.max(0) as usize / r.k.max(1);
                let row = h.get(t * r.dim..(t + 1) * r.dim).ok_or_else(|| bad(format!("pair {pair} of {pairs}")))?;
                rows.extend_from_slice(row);
            }
            let ex = &self.layers[layer].experts[e];
            let gate_up: Vec<&str> = ex.gate_up.iter().map(String::as_str).collect();
            self.tap.matmul_input(&gate_up, &rows, p1 - p0);
            let down = ex.down.clone();
            self.tap.matmul_input(&[&down], &act[p0 * r.ffn..p1 * r.ffn], p1 - p0);
        }
        Ok(())
    }

    /// `buf` (`[n, dim]`) is the final-normed hidden state of every token (the head's input).
    pub(super) fn head_input(
        &mut self,
        s: &Arc<CudaStream>,
        buf: Dev<f32>,
        n: usize,
        dim: usize,
    ) -> Result<(), CudaError> {
        let head = [self.head.clone()];
        self.report(s, buf, n, dim, &head)
    }
}
