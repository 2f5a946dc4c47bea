//! The one-stream MoE kernels on int8 activations (kernels/moe_q8.cu) against their CPU twin:
//! per pair the expert's product on the input as the int8 kernels see it
//! (`q8x::matmul_q8x`: the block's own quantization is `quantize_x_q8`'s, bit for bit), for
//! every packed format, k = 8 and 3, 1 / 2 / 8 tokens, widths that are not whole chunks of 128
//! values and row counts that are not whole blocks; an expert that every token chooses and
//! experts that none chooses.

use dustoff::backend::cpu::ops;
use dustoff::backend::cuda::moe::{MoeDownSum, MoeLayerW};
use dustoff::backend::cuda::ops::moe_q8::MoeGateUpQ8;
use dustoff::backend::cuda::ops::q8x::matmul_q8x;
use dustoff::model::quant::GgmlType;

use super::moe::{distinct_ids, layer, PACKED};
use super::{compare, gpu, Gpu};

fn op(kind: &str, t: GgmlType) -> String {
    format!("{kind}_{}", t.name().to_ascii_lowercase())
}

/// `n` tokens' ids: k distinct experts each, random; with `skew`, expert 1 in every token's
/// first slot and expert 0 in none (experts 2.. fill the rest).
fn ids_for(g: &mut Gpu, n: usize, e: usize, k: usize, skew: bool) -> Vec<i32> {
    let draw = if skew { 2 } else { 0 }..e as u32;
    distinct_ids(g, n, k, skew.then_some(1), draw, None).into_iter().map(|i| i as i32).collect()
}

#[test]
fn q8_expert_products_equal_the_int8_twin_every_format() {
    let Some(mut g) = gpu("moe q8 expert products") else { return };
    let s = g.dev.stream.clone();
    let e = 12;
    for &dtype in PACKED {
        // 32-value formats: 11 blocks of 32 (not whole 128-value chunks) and 160 expert rows
        // (not whole gate/up blocks); the K formats need whole super-blocks of 256.
        let (dim, f) = if dtype.block_size() == 32 { (352, 160) } else { (512, 256) };
        for k in [8usize, 3] {
            let w = layer(&mut g, e, dim, f, k, dtype, dtype);
            let (lw, _) = MoeLayerW::upload(&s, &w, false, "test layer").unwrap();
            for (n, skew) in [(1usize, false), (2, false), (8, false), (8, true)] {
                let pairs = n * k;
                let h = g.randn(n * dim, 1.0);
                let ids = ids_for(&mut g, n, e, k, skew);
                // Twin: per pair silu(gate h) * up h on the int8 view of h.
                let mut act = vec![0f32; pairs * f];
                for p in 0..pairs {
                    let (t, ex) = (p / k, &w.experts[ids[p] as usize]);
                    let (mut gt, mut ut) = (vec![0f32; f], vec![0f32; f]);
                    matmul_q8x(&ex.gate, &h[t * dim..(t + 1) * dim], 1, &mut gt);
                    matmul_q8x(&ex.up, &h[t * dim..(t + 1) * dim], 1, &mut ut);
                    ops::silu_mul_inplace(&mut gt, &ut);
                    act[p * f..(p + 1) * f].copy_from_slice(&gt);
                }
                let (hd, idd, ad) = (g.up(&h), g.up(&ids), g.poisoned(pairs * f));
                let (hv, iv, av) = (g.d(&hd), g.d(&idd), g.d(&ad));
                MoeGateUpQ8 { gate: &lw.gate, up: &lw.up, n_experts: e, h: hv, ids: iv, act: av, n_pairs: pairs, k }
                    .launch(&mut g.k, &s)
                    .unwrap();
                compare(&op("moe_gate_up_q8", dtype), g.seed, &g.down(&ad), &act);
                // Down + weighted sum on the twin's activations (each kernel checked on its own).
                let wts = g.randn(pairs, 1.0);
                let x = g.randn(n * dim, 5.0);
                let want = super::moe::down_sum_twin(&x, &act, &wts, k, f, &mut |p, a, y| {
                    matmul_q8x(&w.experts[ids[p] as usize].down, a, 1, y)
                });
                let (ad2, wd, xd) = (g.up(&act), g.up(&wts), g.up(&x));
                let (av2, wv, xv) = (g.d(&ad2), g.d(&wd), g.d(&xd));
                MoeDownSum { down: &lw.down, n_experts: e, act: av2, ids: iv, wts: wv, x: xv, n_tok: n, k }
                    .launch_q8(&mut g.k, &s)
                    .unwrap();
                compare(&op("moe_down_sum_q8", dtype), g.seed, &g.down(&xd), &want);
            }
        }
    }
}
