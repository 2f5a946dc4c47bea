//! Softmax attention over the paged KV cache (`MixerKind::Attention`, `GatedAttention`):
//! - [`full`]: the plain layers (llama, Qwen2/3, Qwen3-MoE): one fused Q|K|V product (+bias),
//!   `qkv_post` (q/k head norm, RoPE over the whole head, K/V store), attention, O product;
//! - [`hybrid`]: the attention layers of hybrid models (Qwen3.5, Qwen3-Next): the query
//!   projection holds per head `[query, gate]` where the model gates its output, RoPE over the
//!   first `rotary_dim` dims (the walker's table, built from `ModelConfig::rope_rotation`), and `out * sigmoid(gate)` before O.
//!
//! `io.x += o(attention(h))`; the norm before folds into the Q|K|V product where `cx.pre` says.

use cudarc::driver::{CudaSlice, CudaStream};

use super::super::hybrid::RecurrentCuda;
use super::super::layer::AttnW;
use super::super::matmul::Product;
use super::super::ops::hybrid_attn::{GateMul, HybQkvPost};
use super::super::ops::kv_cache::{QkvPost, RopeStore};
use super::super::ops::launch::{Dev, KvScales};
use super::super::ops::paged_attn::PagedAttn;
use super::super::step::norm::norm_product;
use super::super::tap::TapPoint;
use super::super::CudaError;
use super::{Cx, Hooks, StepIo};
use crate::model::config::{ModelConfig, RopeStyle};

/// The RoPE tables of the plain layers (`[max_pos, head_dim / 2]` each).
pub(super) struct Rope<'a> {
    pub cos: &'a CudaSlice<f32>,
    pub sin: &'a CudaSlice<f32>,
    pub max_pos: usize,
}

/// A plain attention layer.
pub(super) fn full(lw: &AttnW, rope: &Rope, cx: Cx, hooks: &mut Hooks) -> Result<(), CudaError> {
    let Cx { c, k, mm, io, li, pre, .. } = cx;
    let s = mm.s;
    let n = io.n_tok;
    let (qd, kvd, hd) = (c.q_dim(), c.kv_dim(), c.head_dim);
    let qkv_w = qd + 2 * kvd;
    let qkv = io.qkv;
    hooks.input(li, TapPoint::MixerIn, io.h, n, c.dim)?;
    let bias = lw.bqkv.as_ref().map(|b| Dev::of(b, s));
    let qkv_p = Product { lin: &lw.wqkv, bias, x: io.h, n, out: qkv, accumulate: false };
    match pre {
        Some(a) => {
            norm_product(k, mm, a, qkv_p)?;
            hooks.mark("norm+qkv matmul")?;
        }
        None => {
            mm.run(k, qkv_p)?;
            hooks.mark("qkv matmul")?;
        }
    }
    QkvPost {
        qkv,
        store: rope_store(lw, rope, io, s),
        n_tok: n,
        n_heads: c.n_heads,
        n_kv: c.n_kv_heads,
        head_dim: hd,
        stride: qkv_w,
        halves: c.rope_style == RopeStyle::Halves,
        eps: c.rms_eps,
    }
    .launch(k, s)?;
    hooks.mark("qkv_post")?;
    let paged = paged(c, io, qkv, qkv_w, lw.kv_dev(s));
    io.attn.launch(k, s, paged, &mut |class| hooks.mark(class))?;
    hooks.input(li, TapPoint::MixerOut, io.att, n, qd)?;
    let accumulate = hooks.adds_residual();
    mm.run(k, Product { lin: &lw.wo, bias: None, x: io.att, n, out: io.x, accumulate })?;
    hooks.mark("o matmul")
}

/// An attention layer of a hybrid model (`gated`: with the output gate).
pub(super) fn hybrid(
    hy: &RecurrentCuda,
    lw: &AttnW,
    gated: bool,
    rope: &Rope,
    cx: Cx,
    hooks: &mut Hooks,
) -> Result<(), CudaError> {
    let Cx { c, k, mm, io, li, pre, .. } = cx;
    let s = mm.s;
    let n = io.n_tok;
    let (qd, hd) = (c.q_dim(), c.head_dim);
    let width = lw.wqkv.rows();
    let (proj, q) = (hy.proj_buf(s)?, hy.core_buf(s)?);
    hooks.input(li, TapPoint::MixerIn, io.h, n, c.dim)?;
    let p = Product { lin: &lw.wqkv, bias: None, x: io.h, n, out: proj, accumulate: false };
    match pre {
        Some(a) => norm_product(k, mm, a, p)?,
        None => mm.run(k, p)?,
    }
    hooks.mark("attn qkv proj")?;
    HybQkvPost {
        proj,
        stride: width,
        q,
        store: rope_store(lw, rope, io, s),
        n_tok: n,
        n_heads: c.n_heads,
        n_kv: c.n_kv_heads,
        head_dim: hd,
        rot: hy.rotary_dim(),
        gated,
        eps: c.rms_eps,
    }
    .launch(k, s)?;
    hooks.mark("attn qkv_post")?;
    let paged = paged(c, io, q, qd, lw.kv_dev(s));
    io.attn.launch(k, s, paged, &mut |class| hooks.mark(class))?;
    if gated {
        GateMul { att: io.att, proj, stride: width, n_tok: n, n_heads: c.n_heads, head_dim: hd }.launch(k, s)?;
        hooks.mark("attn gate")?;
    }
    hooks.input(li, TapPoint::MixerOut, io.att, n, qd)?;
    let accumulate = hooks.adds_residual();
    mm.run(k, Product { lin: &lw.wo, bias: None, x: io.att, n, out: io.x, accumulate })?;
    hooks.mark("attn o proj")
}

/// The paged attention of a step's layer: queries `q` `[n_tok, q_stride]` (heads first) over the
/// layer's cache `kv` (K, V, the 8-bit cache's scales), output `io.att` `[n_tok, q_dim]`.
fn paged(
    c: &ModelConfig,
    io: &StepIo,
    q: Dev<f32>,
    q_stride: usize,
    kv: (Dev<u16>, Dev<u16>, Option<KvScales>),
) -> PagedAttn {
    let (k_cache, v_cache, kv_scales) = kv;
    PagedAttn {
        q,
        k_cache,
        v_cache,
        kv_scales,
        block_tables: io.block_tables,
        tok_seq: io.tok_seq,
        pos: io.pos,
        out: io.att,
        cache_rows: io.cache_rows,
        n_seqs: io.n_seqs,
        n_tok: io.n_tok,
        n_heads: c.n_heads,
        n_kv: c.n_kv_heads,
        head_dim: c.head_dim,
        block_size: io.block_size,
        bt_stride: io.bt_stride,
        q_stride,
        out_stride: c.q_dim(),
    }
}

/// Where the QKV post-processing of a step writes (`[n_tok]` positions, the layer's K/V cache
/// rows) and the norms and rotation it applies: shared by the plain and the hybrid attention.
fn rope_store(lw: &AttnW, rope: &Rope, io: &StepIo, s: &CudaStream) -> RopeStore {
    let (k_cache, v_cache, kv_scales) = lw.kv_dev(s);
    RopeStore {
        q_norm: lw.q_norm.as_ref().map(|v| Dev::of(v, s)),
        k_norm: lw.k_norm.as_ref().map(|v| Dev::of(v, s)),
        pos: io.pos,
        cos: Dev::of(rope.cos, s),
        sin: Dev::of(rope.sin, s),
        max_pos: rope.max_pos,
        k_cache,
        v_cache,
        kv_scales,
        kv_rows: io.kv_rows,
        cache_rows: io.cache_rows,
    }
}
