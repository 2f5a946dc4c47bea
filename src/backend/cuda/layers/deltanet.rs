//! The Gated DeltaNet mixer (`MixerKind::DeltaNet`, the linear-attention layers of Qwen3.5 and
//! Qwen3-Next) on the launchers of `cuda/ops/deltanet.rs`: the stacked q|k|v, z, b, a projection,
//! causal conv1d + SiLU, q/k L2 norms and gates, the delta rule per value head (the step form,
//! or the chunked form for prompt chunks), the gated RMSNorm, the output projection
//! (`io.x += out(core)`). Each sequence's conv window and delta-rule matrices live in the
//! recurrent-state pool (`RecurrentCuda`, `cuda/hybrid.rs`).

use super::super::hybrid::{LinearW, RecurrentCuda};
use super::super::matmul::{input_form, Product, XForm};
use super::super::ops::deltanet::{DnChunked, DnConv, DnConvPrep, DnGatedNorm, DnPrep, DnRecur, DnRecurNorm};
use super::super::step::norm::norm_product;
use super::super::tap::TapPoint;
use super::super::CudaError;
use super::{Cx, Hooks};
use crate::model::hybrid::HeadGrouping;

/// Layer `cx.li` with weights `d`, its state in `hy`'s pool.
pub(super) fn run(hy: &RecurrentCuda, d: &LinearW, cx: Cx, hooks: &mut Hooks) -> Result<(), CudaError> {
    let Cx { c, k, mm, io, li, pre, .. } = cx;
    let s = mm.s;
    let h = hy.config();
    let n = io.n_tok;
    let (ch, vd, nv, kk) = (h.conv_channels(), h.value_dim(), h.n_v_heads, h.conv_kernel);
    let width = d.proj.rows();
    let (proj, mixed, core) = (hy.proj_buf(s)?, hy.mixed_buf(s)?, hy.core_buf(s)?);
    hooks.input(li, TapPoint::MixerIn, io.h, n, c.dim)?;
    let p = Product { lin: &d.proj, bias: None, x: io.h, n, out: proj, accumulate: false };
    match pre {
        Some(a) => norm_product(k, mm, a, p)?,
        None => mm.run(k, p)?,
    }
    hooks.mark("dn in proj")?;
    // Graph-sized steps launch for every token as a possible chunk (the table says how
    // many there are), so a graph serves any split of its tokens into chunks.
    let max_chunks = if n <= super::super::ops::gemm_tc::TC_MAX_TOKENS { n } else { io.n_seqs };
    let pool = hy.state_pool(s, d, max_chunks)?;
    let conv =
        DnConv { x: proj, x_stride: width, out: mixed, w: d.conv_dev(s), pool, n_tok: n, channels: ch, kernel: kk };
    let (b_off, a_off) = (ch + vd, ch + vd + nv);
    let (neg_a, dt_bias, norm_w) = d.gates_dev(s);
    let prep = DnPrep {
        mixed,
        proj,
        neg_a,
        dt_bias,
        n_tok: n,
        n_k: h.n_k_heads,
        d_k: h.d_k,
        n_v: nv,
        channels: ch,
        proj_stride: width,
        b_off,
        a_off,
    };
    // Conv, L2 norms and gates in one launch; `DUSTOFF_DN_FUSED=0`: the two kernels.
    if super::super::hybrid::fused_conv_prep() {
        DnConvPrep { conv: &conv, prep: &prep }.launch(k, s)?;
    } else {
        conv.launch(k, s)?;
        prep.launch(k, s)?;
    }
    hooks.mark("dn conv+prep")?;
    let recur = DnRecur {
        mixed,
        proj,
        out: core,
        pool,
        conv_len: (kk - 1) * ch,
        n_tok: n,
        n_k: h.n_k_heads,
        n_v: nv,
        d_k: h.d_k,
        d_v: h.d_v,
        channels: ch,
        proj_stride: width,
        b_off,
        a_off,
        tiled: h.grouping == HeadGrouping::Tiled,
    };
    // Prompt chunks take the chunked form (more blocks, fewer serial steps); graph-sized
    // steps keep the step form, whose launch does not depend on the chunk lengths.
    let longest = hy.longest_chunk();
    let min = super::super::hybrid::chunked_min_tokens();
    let norm = DnGatedNorm {
        o: core,
        z: proj.offset(ch),
        z_stride: width,
        w: norm_w,
        n_tok: n,
        n_v: nv,
        d_v: h.d_v,
        eps: c.rms_eps,
    };
    if n > super::super::ops::gemm_tc::TC_MAX_TOKENS && min > 0 && longest >= min {
        DnChunked { recur: &recur, ab: hy.ab_buf(s)?, max_count: longest }.launch(k, s)?;
        hooks.mark("dn recurrence")?;
        norm.launch(k, s)?;
        hooks.mark("dn gated norm")?;
    } else if hy.recur_norm && !hooks.tapped() {
        // The out projection's int8 input written by the same launch where its GEMV reads one.
        let q8 = matches!(&d.out.parts[..], [m] if input_form(m, n) == XForm::Q8) && vd.is_multiple_of(32);
        let xq = q8.then(|| mm.x16.bytes());
        DnRecurNorm { recur: &recur, norm: &norm, xq }.launch(k, s)?;
        hooks.mark("dn recur+norm")?;
        let out = Product { lin: &d.out, bias: None, x: core, n, out: io.x, accumulate: hooks.adds_residual() };
        mm.run_with(k, out, if q8 { XForm::Q8 } else { XForm::None })?;
        return hooks.mark("dn out proj");
    } else {
        recur.launch(k, s)?;
        hooks.mark("dn recurrence")?;
        norm.launch(k, s)?;
        hooks.mark("dn gated norm")?;
    }
    // The tap reads the normed core output (the fused launch above may write only its int8 form).
    hooks.input(li, TapPoint::MixerOut, core, n, vd)?;
    let accumulate = hooks.adds_residual();
    mm.run(k, Product { lin: &d.out, bias: None, x: core, n, out: io.x, accumulate })?;
    hooks.mark("dn out proj")
}
