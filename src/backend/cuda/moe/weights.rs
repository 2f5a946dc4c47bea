//! The experts of a sparse layer on the device (three slabs in their file format, the router in
//! f32) and the buffers of a step's MoE kernels.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::backend::cuda::compile::kernels::Kernels;
use crate::backend::cuda::device::{up, zeros};
use crate::backend::cuda::dmat::DevMat;
use crate::backend::cuda::ops::launch::{allocated, Dev};
use crate::backend::cuda::ops::moe_slab::slab_bytes;
use crate::backend::cuda::CudaError;
use crate::model::config::ModelConfig;
use crate::model::moe::{MoeConfig, MoeWeights};
use crate::model::quant::GgmlType;
use crate::model::synth_scale::Scale;
use crate::model::weights::Tensor;

/// The experts of one sparse layer on the device.
pub struct MoeLayerW {
    pub router: CudaSlice<f32>, // [n_experts, dim] f32
    pub gate: DevMat,           // [n_experts * ffn, dim]: expert e's rows e * ffn ..
    pub up: DevMat,             // [n_experts * ffn, dim]
    pub down: DevMat,           // [n_experts * dim, ffn]
    pub n_experts: usize,
    pub n_used: usize,
    /// Width of one expert (`expert_ffn_dim`).
    pub ffn: usize,
    pub dim: usize,
    pub norm_topk_prob: bool,
    /// Qwen3.5-MoE / Qwen3-Next: the gated shared expert (`shared_expert.rs`), run after the
    /// routed experts by the caller of `moe_ffn`.
    pub shared: Option<crate::backend::cuda::ops::shared_expert::SharedExpertW>,
}

/// Checks that `w`'s experts can be put on the GPU (shapes, formats, the kernels' row rules)
/// before anything is allocated; the error names the tensor.
pub fn check_layer(w: &MoeWeights) -> Result<(), CudaError> {
    let first = w.experts.first().ok_or_else(|| CudaError::Weights(format!("{}: no experts", w.router.name)))?;
    if w.n_used == 0 || w.n_used > 32 || w.n_used > w.experts.len() {
        return Err(CudaError::Weights(format!(
            "{}: {} experts used of {} (the GPU router takes 1..=32)",
            w.router.name,
            w.n_used,
            w.experts.len()
        )));
    }
    if w.experts.len() > 1024 || !w.router.cols.is_multiple_of(4) {
        return Err(CudaError::Weights(format!(
            "{}: {} experts of width {} (the GPU router takes up to 1024 experts, a width divisible by 4)",
            w.router.name,
            w.experts.len(),
            w.router.cols
        )));
    }
    if let Some(sh) = &w.shared {
        crate::backend::cuda::ops::shared_expert::SharedExpertW::check(sh)?;
    }
    for e in &w.experts {
        for (t, like) in [(&e.gate, &first.gate), (&e.up, &first.gate), (&e.down, &first.down)] {
            crate::backend::cuda::qformat::check_tensor(t)?;
            if (t.rows, t.cols, t.dtype) != (like.rows, like.cols, like.dtype) {
                return Err(CudaError::Weights(format!(
                    "expert tensor {} [{}, {}] {} differs from {} [{}, {}] {}: one slab needs one shape and format",
                    t.name, t.rows, t.cols, t.dtype, like.name, like.rows, like.cols, like.dtype
                )));
            }
        }
    }
    Ok(())
}

/// Device bytes of one sparse layer's router (f32), three slabs and shared expert.
pub fn layer_bytes(w: &MoeWeights, to_f16: bool) -> u64 {
    let n = w.experts.len();
    let shared = w.shared.as_ref().map_or(0, |sh| crate::backend::cuda::ops::shared_expert::shared_bytes(sh, to_f16));
    let router = (w.router.rows * w.router.cols * 4) as u64 + shared;
    let Some(e) = w.experts.first() else { return router };
    router
        + slab_bytes(e.gate.dtype, n * e.gate.rows, e.gate.cols, to_f16)
        + slab_bytes(e.up.dtype, n * e.up.rows, e.up.cols, to_f16)
        + slab_bytes(e.down.dtype, n * e.down.rows, e.down.cols, to_f16)
}

/// Step buffers of the MoE kernels for `cap_tok` tokens (bytes), for the memory plan.
pub fn workspace_bytes(cap_tok: usize, dim: usize, m: &MoeConfig) -> u64 {
    let pairs = cap_tok * m.n_used;
    // f32 activations and outputs, ids / weights / entries / positions, then the grouped
    // GEMM's F16 gathered inputs and activations (moe_gemm.rs).
    let f32_rows = pairs * (m.expert_ffn_dim + dim + 4) * 4;
    let f16_rows = pairs * (m.expert_ffn_dim + dim) * 2;
    (f32_rows + f16_rows + (cap_tok + 1) * (m.n_experts + 1) * 4) as u64
}

fn stack<'a>(w: &'a MoeWeights, f: impl Fn(&'a crate::model::moe::Expert) -> &'a Tensor) -> Vec<&'a Tensor> {
    w.experts.iter().map(f).collect()
}

impl MoeLayerW {
    /// Uploads a checked (`check_layer`) sparse layer: each slab packed as in the file (or F16
    /// with `to_f16`). Returns the layer and the count of values clamped to the F16 range.
    pub fn upload(s: &Arc<CudaStream>, w: &MoeWeights, to_f16: bool, what: &str) -> Result<(Self, u64), CudaError> {
        let router = up(s, &w.router.to_f32_vec(), &format!("{what} router"))?;
        let (gate, c1) = DevMat::upload(s, &stack(w, |e| &e.gate), to_f16, &format!("{what} expert gate slab"))?;
        let (upm, c2) = DevMat::upload(s, &stack(w, |e| &e.up), to_f16, &format!("{what} expert up slab"))?;
        let (down, c3) = DevMat::upload(s, &stack(w, |e| &e.down), to_f16, &format!("{what} expert down slab"))?;
        let ffn = w.experts[0].gate.rows;
        let (shared, c4) = match &w.shared {
            Some(sh) => {
                let (x, c) = crate::backend::cuda::ops::shared_expert::SharedExpertW::upload(
                    s,
                    sh,
                    to_f16,
                    &format!("{what} shared expert"),
                )?;
                (Some(x), c)
            }
            None => (None, 0),
        };
        let l = MoeLayerW {
            router,
            gate,
            up: upm,
            down,
            n_experts: w.experts.len(),
            n_used: w.n_used,
            ffn,
            dim: w.router.cols,
            norm_topk_prob: w.norm_topk_prob,
            shared,
        };
        Ok((l, c1 + c2 + c3 + c4))
    }

    /// A sparse layer of random weights made on the GPU (`DevMat::synthetic` slabs: gate and up
    /// in `gate_up`, down in `down`) and a random f32 router uniform in +-sqrt(3 / dim), so that
    /// the router logits of normed inputs spread over the experts as in real use.
    #[allow(clippy::too_many_arguments)]
    pub fn synthetic(
        s: &Arc<CudaStream>,
        k: &mut Kernels,
        c: &ModelConfig,
        m: &MoeConfig,
        gate_up: GgmlType,
        down: GgmlType,
        seed: u64,
        what: &str,
    ) -> Result<Self, CudaError> {
        let (e, f, d) = (m.n_experts, m.expert_ffn_dim, c.dim);
        let mut rng = StdRng::seed_from_u64(seed);
        let a = (3.0 / d as f32).sqrt();
        let r: Vec<f32> = (0..e * d).map(|_| rng.random_range(-a..a)).collect();
        let router = up(s, &r, &format!("{what} router"))?;
        let gate =
            DevMat::synthetic(s, k, gate_up, e * f, d, (Scale::Matrix, seed ^ 1), &format!("{what} expert gate slab"))?;
        let upm =
            DevMat::synthetic(s, k, gate_up, e * f, d, (Scale::Matrix, seed ^ 2), &format!("{what} expert up slab"))?;
        let down =
            DevMat::synthetic(s, k, down, e * d, f, (Scale::Matrix, seed ^ 3), &format!("{what} expert down slab"))?;
        Ok(MoeLayerW {
            router,
            gate,
            up: upm,
            down,
            n_experts: e,
            n_used: m.n_used,
            ffn: f,
            dim: d,
            norm_topk_prob: m.norm_topk_prob,
            shared: None,
        })
    }

    /// Device bytes of the layer (router and every expert).
    pub fn bytes(&self) -> u64 {
        (self.router.len() * 4) as u64 + self.gate.bytes() + self.up.bytes() + self.down.bytes() + self.shared_bytes()
    }

    /// Device bytes of the shared expert (0 without one), all read by every token.
    fn shared_bytes(&self) -> u64 {
        self.shared.as_ref().map_or(0, |s| s.bytes())
    }

    /// Bytes one token reads: the router and its `n_used` experts.
    pub fn active_bytes(&self) -> u64 {
        let experts = self.gate.bytes() + self.up.bytes() + self.down.bytes();
        (self.router.len() * 4) as u64
            + experts * self.n_used as u64 / self.n_experts.max(1) as u64
            + self.shared_bytes()
    }

    /// Bytes a step whose tokens chose `experts` distinct experts reads: the router, those
    /// experts and the shared expert.
    pub fn touched_bytes(&self, experts: usize) -> u64 {
        let all = self.gate.bytes() + self.up.bytes() + self.down.bytes();
        (self.router.len() * 4) as u64
            + all * experts.min(self.n_experts) as u64 / self.n_experts.max(1) as u64
            + self.shared_bytes()
    }

    /// The three slabs (for the format census).
    pub fn slabs(&self) -> [&DevMat; 3] {
        [&self.gate, &self.up, &self.down]
    }
}

/// Buffers of the MoE kernels, sized for `cap_pairs` (token, rank) pairs.
#[derive(Default)]
pub struct MoeWork {
    pub cap_pairs: usize,
    pub logits: Option<CudaSlice<f32>>,      // [tokens, n_experts] router logits
    pub ids: Option<CudaSlice<i32>>,         // [pairs] chosen experts
    pub wts: Option<CudaSlice<f32>>,         // [pairs] their weights
    pub offsets: Option<CudaSlice<i32>>,     // [n_experts + 1]
    pub entries: Option<CudaSlice<i32>>,     // [pairs] pair at each grouped position
    pub position: Option<CudaSlice<i32>>,    // [pairs] grouped position of each pair
    pub act: Option<CudaSlice<f32>>,         // [pairs, expert ffn] SwiGLU activations
    pub y: Option<CudaSlice<f32>>,           // [pairs, dim] expert outputs
    pub x16: Option<CudaSlice<u16>>,         // [pairs, dim] F16 inputs by grouped position (GEMM)
    pub act16: Option<CudaSlice<u16>>,       // [pairs, expert ffn] F16 SwiGLU activations (GEMM)
    pub route_count: Option<CudaSlice<u32>>, // [tokens] blocks done (fused router; 0 between launches)
}

impl MoeWork {
    /// Grows the buffers to `cap_tok` tokens of the sparse layer `m` (every sparse layer of a
    /// model has its shape); returns whether any was reallocated.
    pub fn grow(&mut self, s: &Arc<CudaStream>, cap_tok: usize, m: &MoeLayerW) -> Result<bool, CudaError> {
        let (pairs, dim) = (cap_tok * m.n_used, m.dim);
        if pairs <= self.cap_pairs {
            return Ok(false);
        }
        *self = MoeWork::default(); // free first
        self.logits = Some(zeros(s, cap_tok * m.n_experts, "MoE router logits")?);
        self.ids = Some(zeros(s, pairs, "MoE expert ids")?);
        self.wts = Some(zeros(s, pairs, "MoE expert weights")?);
        self.offsets = Some(zeros(s, m.n_experts + 1, "MoE group offsets")?);
        self.entries = Some(zeros(s, pairs, "MoE group entries")?);
        self.position = Some(zeros(s, pairs, "MoE group positions")?);
        self.act = Some(zeros(s, pairs * m.ffn, "MoE activations")?);
        self.y = Some(zeros(s, pairs * dim, "MoE expert outputs")?);
        self.x16 = Some(zeros(s, pairs * dim, "MoE gathered F16 inputs")?);
        self.act16 = Some(zeros(s, pairs * m.ffn, "MoE F16 activations")?);
        self.route_count = Some(zeros(s, cap_tok, "MoE router counts")?);
        self.cap_pairs = pairs;
        Ok(true)
    }
}

pub(super) fn dev<T>(b: &Option<CudaSlice<T>>, s: &CudaStream) -> Result<Dev<T>, CudaError> {
    allocated(b, s, "moe", "MoE work buffers")
}
