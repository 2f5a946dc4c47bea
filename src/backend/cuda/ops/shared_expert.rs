//! The shared expert of Qwen3.5-MoE / Qwen3-Next sparse layers on the GPU: a dense SwiGLU FFN
//! of its own width `f` that every token runs beside its routed experts, scaled per token by
//! `sigmoid(gate . h)` (CPU reference: `shared_expert` in src/backend/cpu/moe.rs).
//!
//! Per step of `n` tokens, after `moe::moe_ffn` has added the routed experts into `x`:
//! 1. gate/up + SwiGLU through the step's dispatcher (`step::swiglu`: the fused GEMV for few
//!    tokens, else the product into `gu` and `silu_mul`) -> `act` `[n, f]`;
//! 2. down through the dispatcher -> `y` `[n, dim]`;
//! 3. `shexp_gate_add_f32` (kernels/shared_expert.cu): `x[t] += sigmoid(gate . h[t]) y[t]`.
//!
//! Where the down GEMV reads int8 activations (decode steps of packed weights), 2 and 3 are
//! `shexp_gate_q8_f32` (the gated row `sigmoid(gate . h[t]) act[t]` quantized) and the down
//! GEMV accumulating into `x`.
//!
//! The routed sum enters `x` first and the shared expert second, the order of transformers'
//! `Qwen3NextSparseMoeBlock`; the CPU adds both into a zeroed row before the residual, so the
//! two round differently by one addition (f32).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::super::compile::kernels::Kernels;
use super::super::device::{up, zeros};
use super::super::dmat::{DevMat, Linear};
use super::super::matmul::{input_form, packed_gemv, Mm, Product, XForm};
use super::super::qformat::check_tensor;
use super::super::CudaError;
use super::launch::{allocated, blocks_for, check, i32_of, launch, need, Dev};
use super::qlaunch::q8x_planes;
use crate::model::moe::SharedExpert;
use crate::model::quant::GgmlType;
use crate::model::synth_scale::Scale;

/// One layer's shared expert on the device.
pub struct SharedExpertW {
    /// `[2 f, dim]`: gate rows then up rows (one read of the input).
    pub gu: Linear,
    /// `[dim, f]`.
    pub down: Linear,
    /// `[dim]` f32: the gate row (GGUF `ffn_gate_inp_shexp`, HF `shared_expert_gate`).
    pub gate: CudaSlice<f32>,
    /// Width `f` (`shared_expert_intermediate_size`).
    pub ffn: usize,
}

impl SharedExpertW {
    /// Checks the three matrices against the kernels' row rules before anything is allocated.
    pub fn check(sh: &SharedExpert) -> Result<(), CudaError> {
        for t in [&sh.expert.gate, &sh.expert.up, &sh.expert.down] {
            check_tensor(t)?;
        }
        Ok(())
    }

    /// Uploads a checked shared expert (block formats packed, or F16 with `to_f16`); returns
    /// it and the count of values clamped to the F16 range.
    pub fn upload(s: &Arc<CudaStream>, sh: &SharedExpert, to_f16: bool, what: &str) -> Result<(Self, u64), CudaError> {
        let e = &sh.expert;
        let (gu, c1) = Linear::upload(s, &[&e.gate, &e.up], to_f16, &format!("{what} gate/up"))?;
        let (down, c2) = Linear::upload(s, &[&e.down], to_f16, &format!("{what} down"))?;
        let gate = up(s, &sh.gate.to_f32_vec(), &format!("{what} gate"))?;
        Ok((SharedExpertW { gu, down, gate, ffn: e.gate.rows }, c1 + c2))
    }

    /// Random weights made on the GPU (`DevMat::synthetic`: gate/up in `gate_up`, down in
    /// `down`) and a gate row uniform in +-sqrt(3 / dim), so the gate logits of normed inputs
    /// spread around 0 as a trained model's do.
    #[allow(clippy::too_many_arguments)]
    pub fn synthetic(
        s: &Arc<CudaStream>,
        k: &mut Kernels,
        dim: usize,
        ffn: usize,
        gate_up: GgmlType,
        down: GgmlType,
        seed: u64,
        what: &str,
    ) -> Result<Self, CudaError> {
        let gu = DevMat::synthetic(s, k, gate_up, 2 * ffn, dim, (Scale::Matrix, seed ^ 5), &format!("{what} gate/up"))?;
        let dn = DevMat::synthetic(s, k, down, dim, ffn, (Scale::Matrix, seed ^ 6), &format!("{what} down"))?;
        let mut rng = StdRng::seed_from_u64(seed ^ 7);
        let a = (3.0 / dim as f32).sqrt();
        let g: Vec<f32> = (0..dim).map(|_| rng.random_range(-a..a)).collect();
        let gate = up(s, &g, &format!("{what} gate"))?;
        Ok(SharedExpertW { gu: Linear { parts: vec![gu] }, down: Linear { parts: vec![dn] }, gate, ffn })
    }

    /// Device bytes (all of which every token reads).
    pub fn bytes(&self) -> u64 {
        self.gu.bytes() + self.down.bytes() + (self.gate.len() * 4) as u64
    }

    /// The matrices (for the format census).
    pub fn mats(&self) -> impl Iterator<Item = &DevMat> {
        self.gu.parts.iter().chain(&self.down.parts)
    }
}

/// Device bytes of a shared expert as `SharedExpertW::upload` puts it (for the memory plan).
pub fn shared_bytes(sh: &SharedExpert, to_f16: bool) -> u64 {
    let e = &sh.expert;
    let m = |t: &crate::model::weights::Tensor| super::moe_slab::slab_bytes(t.dtype, t.rows, t.cols, to_f16);
    m(&e.gate) + m(&e.up) + m(&e.down) + (sh.gate.cols * 4) as u64
}

/// Step buffers of the shared experts, grown on demand (never shrunk).
#[derive(Default)]
pub struct SharedWork {
    pub cap_tok: usize,
    pub gu: Option<CudaSlice<f32>>,  // [cap, 2 f]
    pub act: Option<CudaSlice<f32>>, // [cap, f]
    pub y: Option<CudaSlice<f32>>,   // [cap, dim]
}

impl SharedWork {
    /// Buffers for `cap` tokens of width `ffn`; true when any was reallocated (graphs hold the
    /// old addresses).
    pub fn grow(&mut self, s: &Arc<CudaStream>, cap: usize, dim: usize, ffn: usize) -> Result<bool, CudaError> {
        if cap <= self.cap_tok {
            return Ok(false);
        }
        *self = SharedWork::default(); // free first
        self.gu = Some(zeros(s, cap * 2 * ffn, "shared expert gate/up")?);
        self.act = Some(zeros(s, cap * ffn, "shared expert activations")?);
        self.y = Some(zeros(s, cap * dim, "shared expert output")?);
        self.cap_tok = cap;
        Ok(true)
    }

    /// Bytes of the buffers for `cap` tokens (the memory plan).
    pub fn bytes_for(cap: usize, dim: usize, ffn: usize) -> u64 {
        (cap * (3 * ffn + dim) * 4) as u64
    }
}

fn dev(b: &Option<CudaSlice<f32>>, s: &CudaStream) -> Result<Dev<f32>, CudaError> {
    allocated(b, s, "shared expert", "work buffers")
}

/// Whether the gate is folded into the down product's int8 input where the down GEMV reads
/// one (`DUSTOFF_SHEXP_FUSED=0`: the product into `y`, then `shexp_gate_add_f32`).
pub(in crate::backend::cuda) fn gate_folded() -> bool {
    super::super::tuning::tuning().shexp_fused
}

/// `x[t] += sigmoid(gate . h[t]) * shared(h[t])` for `n` tokens (`h`, `x` `[n, dim]`).
pub fn shared_expert_ffn(
    k: &mut Kernels,
    mm: &mut Mm,
    w: &SharedExpertW,
    work: &SharedWork,
    h: Dev<f32>,
    x: Dev<f32>,
    n: usize,
) -> Result<(), CudaError> {
    shared_expert_ffn_with(k, mm, w, work, h, x, n, XForm::None, gate_folded())
}

/// [`shared_expert_ffn`] where `mm.x16` already holds `h` in the form `have` (the FFN norm
/// before the routed experts wrote it: they read `h` in f32 and leave `x16` alone); `fold`:
/// the gate folded into the down product's int8 input where it reads one.
///
/// One token (the packed int8 GEMVs): the fused SwiGLU GEMV, `shexp_gate_q8_f32` (gate, scale,
/// quantize) and the down GEMV adding into `x`: three launches, or two with `have`.
#[allow(clippy::too_many_arguments)]
pub fn shared_expert_ffn_with(
    k: &mut Kernels,
    mm: &mut Mm,
    w: &SharedExpertW,
    work: &SharedWork,
    h: Dev<f32>,
    x: Dev<f32>,
    n: usize,
    have: XForm,
    fold: bool,
) -> Result<(), CudaError> {
    let s = mm.s;
    super::launch::check("shared expert", n <= work.cap_tok, || format!("{n} tokens, buffers for {}", work.cap_tok))?;
    let (gu, act, y) = (dev(&work.gu, s)?, dev(&work.act, s)?, dev(&work.y, s)?);
    let gate = Dev::of(&w.gate, s);
    match &w.gu.parts[..] {
        [m] if m.quant(s).is_some() && packed_gemv(m, n) => {
            let wq = m.quant(s).expect("checked above");
            mm.swiglu_q_with(k, wq, h, n, act, w.ffn, have)?;
        }
        _ => super::super::matmul::swiglu(k, mm, &w.gu, h, n, gu, act, w.ffn)?,
    }
    if let ([m], true) = (&w.down.parts[..], fold) {
        if input_form(m, n) == XForm::Q8 && w.ffn.is_multiple_of(32) {
            ShexpGateQ8 { h, gate, act, xq: mm.x16.bytes(), n_tok: n, dim: w.gu.cols(), ffn: w.ffn }.launch(k, s)?;
            let p = Product { lin: &w.down, bias: None, x: act, n, out: x, accumulate: true };
            return mm.run_with(k, p, XForm::Q8);
        }
    }
    mm.run(k, Product { lin: &w.down, bias: None, x: act, n, out: y, accumulate: false })?;
    ShexpGateAdd { h, gate, y, x, n_tok: n, dim: w.gu.cols() }.launch(k, s)
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct GateQ8Params {
    h: u64,
    gate: u64,
    act: u64,
    qx: u64,
    ql: u64,
    xs: u64,
    n_tok: i32,
    dim: i32,
    f: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct (trailing padding included).
unsafe impl DeviceRepr for GateQ8Params {}

/// `sigmoid(gate . h[t]) * act[t]` quantized into `xq` (layout: `qlaunch::q8x_bytes(n_tok,
/// ffn)`) as the down GEMV's int8 input (`h` `[n_tok, dim]`, `act` `[n_tok, ffn]`, `gate`
/// `[dim]`). CPU twin: the logit and scale of cpu/moe.rs `shared_expert`, then `q8x::quantize`.
pub struct ShexpGateQ8 {
    pub h: Dev<f32>,
    pub gate: Dev<f32>,
    pub act: Dev<f32>,
    pub xq: Dev<u8>,
    pub n_tok: usize,
    pub dim: usize,
    pub ffn: usize,
}

impl ShexpGateQ8 {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "shexp_gate_q8_f32";
        check(K, self.act.ptr.is_multiple_of(16), || "the activations must be 16-byte aligned".into())?;
        need(K, "input", self.h, self.n_tok * self.dim)?;
        need(K, "gate", self.gate, self.dim)?;
        need(K, "activations", self.act, self.n_tok * self.ffn)?;
        let (qx, ql, xs) = q8x_planes(K, "int8 input", self.xq, self.n_tok, self.ffn)?;
        if self.n_tok == 0 {
            return Ok(());
        }
        let p = GateQ8Params {
            h: self.h.ptr,
            gate: self.gate.ptr,
            act: self.act.ptr,
            qx,
            ql,
            xs,
            n_tok: i32_of(K, self.n_tok)?,
            dim: i32_of(K, self.dim)?,
            f: i32_of(K, self.ffn)?,
        };
        launch(k, s, K, (blocks_for(K, self.n_tok, 1)?, 1, 1), 256, 0, &p)
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct GateParams {
    h: u64,
    gate: u64,
    y: u64,
    x: u64,
    n_tok: i32,
    dim: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for GateParams {}

/// `x[t] += sigmoid(gate . h[t]) * y[t]` (`h`, `y`, `x` `[n_tok, dim]`, `gate` `[dim]`).
pub struct ShexpGateAdd {
    pub h: Dev<f32>,
    pub gate: Dev<f32>,
    pub y: Dev<f32>,
    pub x: Dev<f32>,
    pub n_tok: usize,
    pub dim: usize,
}

impl ShexpGateAdd {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "shexp_gate_add_f32";
        let n = self.n_tok * self.dim;
        need(K, "input", self.h, n)?;
        need(K, "gate", self.gate, self.dim)?;
        need(K, "shared expert output", self.y, n)?;
        need(K, "residual", self.x, n)?;
        if n == 0 {
            return Ok(());
        }
        let p = GateParams {
            h: self.h.ptr,
            gate: self.gate.ptr,
            y: self.y.ptr,
            x: self.x.ptr,
            n_tok: i32_of(K, self.n_tok)?,
            dim: i32_of(K, self.dim)?,
        };
        launch(k, s, K, (blocks_for(K, self.n_tok, 1)?, 1, 1), 256, 0, &p)
    }
}
