//! The shared expert of Qwen3.5-MoE / Qwen3-Next sparse layers (src/backend/cuda/ops/
//! shared_expert.rs, kernels/shared_expert.cu) against the CPU: the gate kernel alone
//! (`x += sigmoid(gate . h) y`, its twin the end of cpu/moe.rs `shared_expert`), and a whole
//! sparse layer with a shared expert (routed experts, then the gated shared one) against the
//! CPU reference `moe_ffn`, F16 and the Q4_K_M mix, at 1 to 33 tokens and 100.

use dustoff::backend::cpu::matmul::matmul;
use dustoff::backend::cpu::moe::{moe_ffn as cpu_moe_ffn, MoeScratch};
use dustoff::backend::cuda::matmul::Mm;
use dustoff::backend::cuda::moe::{moe_ffn, MoeLayerW, MoeWork};
use dustoff::backend::cuda::ops::gemm_tc::tc64_part_len;
use dustoff::backend::cuda::ops::q8x;
use dustoff::backend::cuda::ops::qlaunch::q8x_bytes;
use dustoff::backend::cuda::ops::shared_expert::{shared_expert_ffn, SharedWork, ShexpGateAdd, ShexpGateQ8};
use dustoff::model::moe::{Expert, MoeWeights, SharedExpert};
use dustoff::model::quant::{quantize_row, GgmlType};
use dustoff::model::weights::Tensor;

use super::{compare, gpu, Gpu};

const TOKEN_COUNTS: &[usize] = &[1, 2, 5, 8, 9, 33, 100];

fn tensor(g: &mut Gpu, dtype: GgmlType, name: &str, rows: usize, cols: usize) -> Tensor {
    let a = (3.0 / cols as f32).sqrt();
    let mut bytes = Vec::new();
    for _ in 0..rows {
        let v = g.randn(cols, a);
        match dtype {
            GgmlType::F16 => bytes.extend(v.iter().flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes())),
            _ => bytes.extend(quantize_row(dtype, &v)),
        }
    }
    Tensor::from_bytes(name, dtype, rows, cols, bytes)
}

#[test]
fn shared_expert_gate_adds_the_sigmoid_scaled_output() {
    let Some(mut g) = gpu("shared expert gate") else { return };
    let s = g.dev.stream.clone();
    let dim = 384;
    let gate_row = g.randn(dim, (3.0 / dim as f32).sqrt());
    let gate = Tensor::from_f32("gate", 1, dim, &gate_row);
    for n in [1, 3, 64] {
        let (h, y, x) = (g.randn(n * dim, 1.5), g.randn(n * dim, 2.0), g.randn(n * dim, 4.0));
        // The CPU twin: the gate logit as a product, then `o += sigmoid(logit) * y`.
        let mut logit = vec![0f32; n];
        matmul(&gate, &h, n, &mut logit);
        let mut want = x.clone();
        for t in 0..n {
            let scale = 1.0 / (1.0 + (-logit[t]).exp());
            let o = &mut want[t * dim..(t + 1) * dim];
            o.iter_mut().zip(&y[t * dim..(t + 1) * dim]).for_each(|(a, &v)| *a += scale * v);
        }
        let (hd, gd, yd, xd) = (g.up(&h), g.up(&gate_row), g.up(&y), g.up(&x));
        let op = ShexpGateAdd { h: g.d(&hd), gate: g.d(&gd), y: g.d(&yd), x: g.d(&xd), n_tok: n, dim };
        op.launch(&mut g.k, &s).unwrap();
        compare("shexp_gate_add_f32", g.seed + n as u64, &g.down(&xd), &want);
    }
}

/// The gate folded into the down GEMV's int8 input: `sigmoid(gate . h) act` quantized on the
/// GPU against the CPU's scaled row through `q8x::quantize`, compared as the values the GEMV
/// sees (`d q + dl l`) and the per-run sums it adds (`xs.y`).
#[test]
fn shared_expert_gate_folded_into_the_int8_down_input() {
    let Some(mut g) = gpu("shared expert gate q8") else { return };
    let s = g.dev.stream.clone();
    let (dim, f) = (384, 512);
    let gate_row = g.randn(dim, (3.0 / dim as f32).sqrt());
    let gate = Tensor::from_f32("gate", 1, dim, &gate_row);
    for n in [1, 3, 8] {
        let (h, act) = (g.randn(n * dim, 1.5), g.randn(n * f, 2.0));
        let mut logit = vec![0f32; n];
        matmul(&gate, &h, n, &mut logit);
        let scaled: Vec<f32> = (0..n * f).map(|i| act[i] / (1.0 + (-logit[i / f]).exp())).collect();
        let want = q8x::dequantized(&scaled, f);
        let mut want_sums = Vec::new();
        for row in scaled.chunks(f) {
            let (q, l, ds) = q8x::quantize(row);
            for r in 0..f / 16 {
                let d = ds[r / 2];
                let (sq, sl) = (16 * r..16 * r + 16).fold((0i32, 0i32), |a, j| (a.0 + q[j] as i32, a.1 + l[j] as i32));
                want_sums.push((d * q8x::Q8X_LO).mul_add(sl as f32, d * sq as f32));
            }
        }
        let (ql_off, xs_off, total) = q8x_bytes(n, f);
        let (hd, gd, ad, xq) = (g.up(&h), g.up(&gate_row), g.up(&act), g.zeros::<u8>(total));
        let op = ShexpGateQ8 { h: g.d(&hd), gate: g.d(&gd), act: g.d(&ad), xq: g.d(&xq), n_tok: n, dim, ffn: f };
        op.launch(&mut g.k, &s).unwrap();
        let b = g.down(&xq);
        let xs = |i: usize| f32::from_le_bytes(b[xs_off + 4 * i..xs_off + 4 * i + 4].try_into().unwrap());
        let got: Vec<f32> = (0..n * f)
            .map(|i| {
                let (t, j) = (i / f, i % f);
                let d = xs(2 * (t * (f / 16) + j / 16));
                let (q, l) = (b[i] as i8 as f32, b[ql_off + i] as i8 as f32);
                (d * q8x::Q8X_LO).mul_add(l, d * q)
            })
            .collect();
        let got_sums: Vec<f32> = (0..n * f / 16).map(|r| xs(2 * r + 1)).collect();
        compare("shexp_gate_q8_f32", g.seed + n as u64, &got, &want);
        compare("shexp_gate_q8_f32", g.seed + n as u64, &got_sums, &want_sums);
    }
}

#[test]
fn sparse_layer_with_a_shared_expert_matches_the_cpu_reference() {
    // A shared expert of 512, wider than the routed ones (as the shape check allows).
    sparse_layer_vs_cpu("shared expert layer", 512, TOKEN_COUNTS, false);
}

/// One-stream steps (1 to 8 tokens) with the shared expert as one more pair of the routed
/// experts' three launches (src/backend/cuda/moe/shexp.rs: the gate block in the router, the
/// gate/up block rows, the down warp), which needs the routed experts' width.
#[test]
fn shared_expert_inside_the_routed_launches_matches_the_cpu_reference() {
    sparse_layer_vs_cpu("shared expert in the routed launches", 256, &[1, 2, 5, 8], true);
}

/// 8 experts of 256, 2 used, a shared expert of `sf`, width 256 (Q6_K rows are whole blocks of
/// 256), F16 and Q4_K/Q6_K, at each of `counts` tokens against the CPU's `moe_ffn`; `in_pairs`:
/// through `moe::shexp::moe_ffn_shared` (which must take every count), else `moe_ffn` and then
/// `shared_expert_ffn`.
fn sparse_layer_vs_cpu(test: &str, sf: usize, counts: &[usize], in_pairs: bool) {
    use dustoff::backend::cuda::moe::shexp::{moe_ffn_shared, shared_pairs};
    let Some(mut g) = gpu(test) else { return };
    let s = g.dev.stream.clone();
    let blas = cudarc::cublas::CudaBlas::new(s.clone()).unwrap();
    let (e, dim, f, k) = (8, 256, 256, 2);
    for (gu, dn) in [(GgmlType::F16, GgmlType::F16), (GgmlType::Q4K, GgmlType::Q6K)] {
        let r = g.randn(e * dim, (3.0 / dim as f32).sqrt());
        let experts = (0..e)
            .map(|i| Expert {
                gate: tensor(&mut g, gu, &format!("gate[{i}]"), f, dim),
                up: tensor(&mut g, gu, &format!("up[{i}]"), f, dim),
                down: tensor(&mut g, dn, &format!("down[{i}]"), dim, f),
            })
            .collect();
        let shexp = Expert {
            gate: tensor(&mut g, gu, "shexp gate", sf, dim),
            up: tensor(&mut g, gu, "shexp up", sf, dim),
            down: tensor(&mut g, dn, "shexp down", dim, sf),
        };
        let gate_row = g.randn(dim, (3.0 / dim as f32).sqrt());
        let shared = SharedExpert::new(shexp, Tensor::from_f32("shexp gate_inp", 1, dim, &gate_row), dim).unwrap();
        let w = MoeWeights {
            router: Tensor::from_f32("router", e, dim, &r),
            experts,
            n_used: k,
            norm_topk_prob: true,
            shared: Some(shared),
        };
        let (lw, _) = MoeLayerW::upload(&s, &w, false, "test layer").unwrap();
        let nmax = *counts.iter().max().unwrap();
        let mut work = MoeWork::default();
        work.grow(&s, 2 * nmax, &lw).unwrap(); // room for the shared expert's pairs
        let mut sw = SharedWork::default();
        sw.grow(&s, nmax, dim, sf).unwrap();
        let x16 = g.zeros::<u16>(nmax.max(16) * sf.max(dim));
        let part = g.zeros::<f32>(tc64_part_len(2 * sf, dim, 64).max(tc64_part_len(dim, sf, 64)).max(1));
        let wide = g.zeros::<u16>(2 * sf * dim);
        for &n in counts {
            let (h, x) = (g.randn(n * dim, 1.0), g.randn(n * dim, 5.0));
            let mut out = vec![0f32; n * dim];
            cpu_moe_ffn(&w, &h, n, &mut out, &mut MoeScratch::default());
            let want: Vec<f32> = x.iter().zip(&out).map(|(a, b)| a + b).collect();
            let (hd, xd) = (g.up(&h), g.up(&x));
            let (hv, xv) = (g.d(&hd), g.d(&xd));
            if in_pairs {
                let sh = shared_pairs(&lw, &work, n, &s).expect("a one-stream step takes the shared expert along");
                moe_ffn_shared(&mut g.k, &s, &lw, &work, &sh, hv, xv, n).unwrap();
            } else {
                moe_ffn(&mut g.k, &s, &lw, &work, hv, xv, n).unwrap();
                let mut mm = Mm { s: &s, blas: Some(&blas), x16: g.d(&x16), part: g.d(&part), wide: Some(g.d(&wide)) };
                let sh = lw.shared.as_ref().expect("the shared expert is uploaded");
                shared_expert_ffn(&mut g.k, &mut mm, sh, &sw, hv, xv, n).unwrap();
            }
            let name = if gu == GgmlType::F16 { "shared_expert_layer_f16" } else { "shared_expert_layer_quant" };
            eprintln!("{gu}/{dn}, {n} tokens");
            compare(name, g.seed + n as u64, &g.down(&xd), &want);
        }
    }
}
