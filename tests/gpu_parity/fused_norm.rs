//! RMSNorm fused into the products that read it (kernels/fused_norm.cu): each kernel against
//! the launches it replaces (bit for bit where it promises so) and against its CPU twin, and
//! whole models with the fusion on and off.

use cudarc::driver::CudaSlice;
use dustoff::backend::cuda::ops::fused_norm::{gemv_norm_twin, rmsnorm_q8_twin, GemvNorm, RmsNormF16, RmsNormQ8};
use dustoff::backend::cuda::ops::q8x::{dequantized, Q8X_LO};
use dustoff::backend::cuda::ops::qlaunch::{q8x_bytes, QuantizeX};
use dustoff::backend::cuda::{CudaBackend, WeightMix};

use super::{compare, f16_bits, f16_vals, gpu, l, opts, Gpu};

/// A residual-stream-like input: rows of different scales (one large), and a norm weight
/// around 1.
fn inputs(g: &mut Gpu, n: usize, dim: usize) -> (Vec<f32>, Vec<f32>) {
    let mut x = Vec::with_capacity(n * dim);
    for t in 0..n {
        let scale = [1.0f32, 30.0, 0.02][t % 3];
        x.extend(g.randn(dim, scale));
    }
    let w: Vec<f32> = g.randn(dim, 0.5).iter().map(|v| 1.0 + v).collect();
    (x, w)
}

/// The unfused norm the fused kernels replace: `rmsnorm_f32` of `n` rows of `dim` into `out`.
fn plain_rmsnorm(
    g: &mut Gpu,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    out: &CudaSlice<f32>,
    n: usize,
    dim: usize,
    eps: f32,
) {
    let s = g.dev.stream.clone();
    l::RmsNorm::plain(g.d(x), g.d(w), g.d(out), n, dim, eps).launch(&mut g.k, &s).unwrap();
}

/// The GPU's two int8 planes read back as the values the int8 GEMV sees (`d q + dl l`).
fn planes_as_values(xq: &[u8], n: usize, dim: usize) -> Vec<f32> {
    let (ql_off, xs_off, _) = q8x_bytes(n, dim);
    (0..n * dim)
        .map(|i| {
            let (t, j) = (i / dim, i % dim);
            let at = xs_off + 8 * (t * (dim / 16) + j / 16);
            let d = f32::from_le_bytes(xq[at..at + 4].try_into().unwrap());
            let (q, lo) = (xq[i] as i8 as f32, xq[ql_off + i] as i8 as f32);
            (d * Q8X_LO).mul_add(lo, d * q)
        })
        .collect()
}

#[test]
fn rmsnorm_q8_equals_rmsnorm_then_quantize_and_its_twin() {
    let Some(mut g) = gpu("rmsnorm_q8") else { return };
    let s = g.dev.stream.clone();
    for (n, dim) in [(1, 4096), (2, 576), (5, 1024), (8, 2048), (37, 4096)] {
        let (xv, wv) = inputs(&mut g, n, dim);
        let (xd, wd) = (g.up(&xv), g.up(&wv));
        let total = q8x_bytes(n, dim).2;
        let (h, xq) = (g.poisoned(n * dim), g.zeros::<u8>(total));
        let (h2, xq2) = (g.poisoned(n * dim), g.zeros::<u8>(total));
        let eps = 1e-6;
        RmsNormQ8 { x: g.d(&xd), w: g.d(&wd), h: g.d(&h), xq: g.d(&xq), n_tok: n, dim, eps }
            .launch(&mut g.k, &s)
            .unwrap();
        plain_rmsnorm(&mut g, &xd, &wd, &h2, n, dim, eps);
        QuantizeX { x: g.d(&h2), xq: g.d(&xq2), n_tok: n, cols: dim, x_stride: dim }.launch(&mut g.k, &s).unwrap();
        let (hf, hu) = (g.down(&h), g.down(&h2));
        assert!(hf.iter().zip(&hu).all(|(a, b)| a.to_bits() == b.to_bits()), "{n}x{dim}: h differs from rmsnorm_f32");
        let (qf, qu) = (g.down(&xq), g.down(&xq2));
        assert!(qf == qu, "{n}x{dim}: int8 planes differ from quantize_x_q8");
        // Against the CPU twin: the normed rows, and the values the planes stand for.
        let (hc, planes) = rmsnorm_q8_twin(&xv, &wv, eps);
        assert_eq!(planes.len(), n);
        compare("rmsnorm_f32", g.seed, &hf, &hc);
        compare("rmsnorm_q8_f32", g.seed, &planes_as_values(&qf, n, dim), &dequantized(&hc, dim));
    }
}

#[test]
fn rmsnorm_f16_equals_rmsnorm_then_cast_and_its_twin() {
    let Some(mut g) = gpu("rmsnorm_f16") else { return };
    let s = g.dev.stream.clone();
    for (n, dim) in [(1, 4096), (3, 576), (16, 1024), (100, 2048)] {
        let (xv, wv) = inputs(&mut g, n, dim);
        let (xd, wd) = (g.up(&xv), g.up(&wv));
        let (h, x16, h2, x16b) =
            (g.poisoned(n * dim), g.zeros::<u16>(n * dim), g.poisoned(n * dim), g.zeros::<u16>(n * dim));
        let eps = 1e-5;
        RmsNormF16 { x: g.d(&xd), w: g.d(&wd), h: g.d(&h), x16: g.d(&x16), n_tok: n, dim, eps }
            .launch(&mut g.k, &s)
            .unwrap();
        plain_rmsnorm(&mut g, &xd, &wd, &h2, n, dim, eps);
        l::CastF16 { x: g.d(&h2), out: g.d(&x16b), n: n * dim }.launch(&mut g.k, &s).unwrap();
        let (hf, hu) = (g.down(&h), g.down(&h2));
        assert!(hf.iter().zip(&hu).all(|(a, b)| a.to_bits() == b.to_bits()), "{n}x{dim}: h differs from rmsnorm_f32");
        let (cf, cu) = (g.down(&x16), g.down(&x16b));
        assert!(cf == cu, "{n}x{dim}: f16 cast differs from cast_f32_f16");
        let mut hc = vec![0f32; n * dim];
        dustoff::backend::cpu::ops::rmsnorm(&xv, &wv, eps, &mut hc);
        compare("rmsnorm_f32", g.seed, &hf, &hc);
        compare("rmsnorm_f16_f32", g.seed, &f16_vals(&cf), &f16_vals(&f16_bits(&hc)));
    }
}

#[test]
fn gemv_norm_every_token_count_with_bias_accumulation_and_swiglu() {
    let Some(mut g) = gpu("gemv_norm") else { return };
    let s = g.dev.stream.clone();
    for (rows, cols) in [(999, 576), (256, 4096)] {
        let w16 = f16_bits(&g.randn(2 * rows * cols, 0.05));
        let wf = f16_vals(&w16);
        let wd = g.up(&w16);
        let bias = g.randn(rows, 1.0);
        let bd = g.up(&bias);
        for n in 1..=l::GEMV_MAX_TOKENS {
            let (xv, gv) = inputs(&mut g, n, cols);
            let (xd, gd) = (g.up(&xv), g.up(&gv));
            let eps = 1e-6;
            // Plain, with bias, accumulating onto a random output.
            let start = g.randn(n * rows, 2.0);
            let out = g.up(&start);
            let plain = GemvNorm {
                w: g.d(&wd),
                x: g.d(&xd),
                g: g.d(&gd),
                out: g.d(&out),
                bias: Some(g.d(&bd)),
                rows,
                cols,
                n_tok: n,
                out_stride: rows,
                accumulate: true,
                swiglu: false,
                eps,
            };
            plain.launch(&mut g.k, &s).unwrap();
            let mut want = start.clone();
            gemv_norm_twin(&wf[..rows * cols], &xv, &gv, Some(&bias), rows, false, eps, &mut want, true);
            compare("gemv_norm_f16", g.seed, &g.down(&out), &want);
            // SwiGLU on the stacked [2 rows, cols] weights.
            let act = g.poisoned(n * rows);
            GemvNorm { out: g.d(&act), bias: None, accumulate: false, swiglu: true, ..plain }
                .launch(&mut g.k, &s)
                .unwrap();
            let mut want = vec![0f32; n * rows];
            gemv_norm_twin(&wf, &xv, &gv, None, rows, true, eps, &mut want, false);
            compare("gemv_norm_swiglu_f16", g.seed, &g.down(&act), &want);
        }
    }
}

/// Prompt then fixed tokens (teacher-forced, so both runs see the same inputs): every step's
/// logits.
fn forced_logits(b: &mut CudaBackend, prompt: &[u32], forced: &[u32]) -> Vec<Vec<f32>> {
    super::run_steps(b, prompt, forced.len(), |i, _| forced[i])
}

/// Whole models, fusion on against off, through decode graphs: a Q4_K_M-mix model (mixed QKV
/// parts, int8 planes written by the fused norm; prefill through its F16 cast) gives the same
/// logits bit for bit; an F16 model (the norm inside the one-token GEMV) within f32 rounding.
#[test]
fn models_with_fused_norms_match_unfused() {
    let Some(g) = gpu("fused norms in the model") else { return };
    drop(g);
    let cfg = dustoff::model::shapes::shape("qwen3-0.6b").unwrap();
    let prompt: Vec<u32> = (0..45).map(|i| 300 + i * 53).collect();
    let forced: Vec<u32> = (0..20).map(|i| 700 + i * 101).collect();
    for (mix, op) in
        [(WeightMix::Q4KM, "fused_norm_q8_model"), (WeightMix::parse("f16").unwrap(), "fused_norm_f16_model")]
    {
        let mut b = CudaBackend::synthetic_mix(cfg.clone(), mix, 11, &opts(16)).expect("synthetic backend");
        b.set_fuse_norm(false);
        let want = forced_logits(&mut b, &prompt, &forced);
        b.set_fuse_norm(true);
        let got = forced_logits(&mut b, &prompt, &forced);
        for (i, (a, w)) in got.iter().zip(&want).enumerate() {
            compare(op, i as u64, a, w);
        }
    }
}
