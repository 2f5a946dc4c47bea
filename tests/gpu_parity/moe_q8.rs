//! The one-stream MoE kernels on int8 activations (kernels/moe_q8.cu) against their CPU twin:
//! per pair the expert's product on the input as the int8 kernels see it
//! (`q8x::matmul_q8x`: the block's own quantization is `quantize_x_q8`'s, bit for bit), for
//! every packed format, k = 8 and 3, per pair (1 / 2 / 8 tokens) and grouped by expert (9 / 40
//! tokens), widths that are not whole chunks of 128 values and row counts that are not whole
//! blocks; an expert that every token chooses and one that none chooses.

use dustoff::backend::cpu::moe::{group, Groups, Routing};
use dustoff::backend::cpu::ops;
use dustoff::backend::cuda::moe::{MoeLayerW, Walk};
use dustoff::backend::cuda::moe_q8::{MoeDownQ8, MoeDownSumQ8, MoeGateUpQ8};
use dustoff::backend::cuda::q8x::matmul_q8x;
use dustoff::model::quant::GgmlType;

use super::moe::layer;
use super::{compare, gpu, Gpu};

const PACKED: &[GgmlType] = &[
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

fn op(kind: &str, t: GgmlType) -> String {
    format!("{kind}_{}", t.name().to_ascii_lowercase())
}

/// `n` tokens' ids: k distinct experts each, random; with `skew`, expert 1 in every token's
/// first slot and expert 0 in none (experts 2.. fill the rest).
fn ids_for(g: &mut Gpu, n: usize, e: usize, k: usize, skew: bool) -> Vec<i32> {
    use rand::Rng;
    let mut ids = Vec::with_capacity(n * k);
    for _ in 0..n {
        let mut chosen: Vec<i32> = if skew { vec![1] } else { Vec::new() };
        while chosen.len() < k {
            let c = g.rng.random_range(if skew { 2 } else { 0 }..e as i32);
            if !chosen.contains(&c) {
                chosen.push(c);
            }
        }
        ids.extend(chosen);
    }
    ids
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
                let walk = Walk::Pairs { ids: iv };
                MoeGateUpQ8 { gate: &lw.gate, up: &lw.up, n_experts: e, h: hv, walk, act: av, n_pairs: pairs, k }
                    .launch(&mut g.k, &s)
                    .unwrap();
                compare(&op("moe_gate_up_q8", dtype), g.seed, &g.down(&ad), &act);
                // Down + weighted sum on the twin's activations (each kernel checked on its own).
                let wts = g.randn(pairs, 1.0);
                let x = g.randn(n * dim, 5.0);
                let mut want = x.clone();
                for t in 0..n {
                    let mut o = vec![0f32; dim];
                    for j in 0..k {
                        let p = t * k + j;
                        let mut y = vec![0f32; dim];
                        matmul_q8x(&w.experts[ids[p] as usize].down, &act[p * f..(p + 1) * f], 1, &mut y);
                        o.iter_mut().zip(&y).for_each(|(a, &v)| *a += wts[p] * v);
                    }
                    want[t * dim..(t + 1) * dim].iter_mut().zip(&o).for_each(|(a, b)| *a += b);
                }
                let (ad2, wd, xd) = (g.up(&act), g.up(&wts), g.up(&x));
                let (av2, wv, xv) = (g.d(&ad2), g.d(&wd), g.d(&xd));
                MoeDownSumQ8 { down: &lw.down, n_experts: e, act: av2, ids: iv, wts: wv, x: xv, n_tok: n, k }
                    .launch(&mut g.k, &s)
                    .unwrap();
                compare(&op("moe_down_sum_q8", dtype), g.seed, &g.down(&xd), &want);
            }
        }
    }
}

/// The grouped int8 kernels (batches: gate/up and down over each expert's grouped positions,
/// MAT_NT = 4 items a pass) against the same twin, rows in grouped order: 9 and 40 tokens of
/// k = 8 and 3 over 12 experts, and 40 tokens that all choose expert 1 (40 items: ten passes)
/// and never expert 0 (an empty expert).
#[test]
fn q8_grouped_products_equal_the_int8_twin_every_format() {
    let Some(mut g) = gpu("moe q8 grouped products") else { return };
    let s = g.dev.stream.clone();
    let e = 12;
    for &dtype in PACKED {
        let (dim, f) = if dtype.block_size() == 32 { (352, 160) } else { (512, 256) };
        for k in [8usize, 3] {
            let w = layer(&mut g, e, dim, f, k, dtype, dtype);
            let (lw, _) = MoeLayerW::upload(&s, &w, false, "test layer").unwrap();
            for (n, skew) in [(9usize, false), (40, false), (40, true)] {
                let pairs = n * k;
                let h = g.randn(n * dim, 1.0);
                let ids = ids_for(&mut g, n, e, k, skew);
                let mut groups = Groups::default();
                let experts: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
                group(&Routing { k, experts, weights: vec![0.0; pairs] }, e, &mut groups);
                if skew {
                    assert_eq!(groups.offsets[2] - groups.offsets[1], n, "every token on expert 1");
                    assert_eq!(groups.offsets[1], 0, "no token on expert 0");
                }
                // Twin in grouped order: position q holds pair entries[q].
                let order: Vec<usize> = groups.entries.iter().map(|&p| p as usize).collect();
                let (mut act, mut y) = (vec![0f32; pairs * f], vec![0f32; pairs * dim]);
                for (q, &p) in order.iter().enumerate() {
                    let (t, ex) = (p / k, &w.experts[ids[p] as usize]);
                    let (mut gt, mut ut) = (vec![0f32; f], vec![0f32; f]);
                    matmul_q8x(&ex.gate, &h[t * dim..(t + 1) * dim], 1, &mut gt);
                    matmul_q8x(&ex.up, &h[t * dim..(t + 1) * dim], 1, &mut ut);
                    ops::silu_mul_inplace(&mut gt, &ut);
                    matmul_q8x(&ex.down, &gt, 1, &mut y[q * dim..(q + 1) * dim]);
                    act[q * f..(q + 1) * f].copy_from_slice(&gt);
                }
                let i32s = |v: &[u32]| v.iter().map(|&i| i as i32).collect::<Vec<_>>();
                let (hd, ad) = (g.up(&h), g.poisoned(pairs * f));
                let offsets: Vec<i32> = groups.offsets.iter().map(|&o| o as i32).collect();
                let (off, ent) = (g.up(&offsets), g.up(&i32s(&groups.entries)));
                let (hv, av, offv, entv) = (g.d(&hd), g.d(&ad), g.d(&off), g.d(&ent));
                let walk = Walk::Grouped { offsets: offv, entries: entv, n_experts: e };
                MoeGateUpQ8 { gate: &lw.gate, up: &lw.up, n_experts: e, h: hv, walk, act: av, n_pairs: pairs, k }
                    .launch(&mut g.k, &s)
                    .unwrap();
                compare(&op("moe_gate_up_q8_g", dtype), g.seed, &g.down(&ad), &act);
                // Down on the twin's activations.
                let (ad2, yd) = (g.up(&act), g.poisoned(pairs * dim));
                let (av2, yv) = (g.d(&ad2), g.d(&yd));
                MoeDownQ8 { down: &lw.down, n_experts: e, act: av2, offsets: offv, y: yv, n_pairs: pairs }
                    .launch(&mut g.k, &s)
                    .unwrap();
                compare(&op("moe_down_q8_g", dtype), g.seed, &g.down(&yd), &y);
            }
        }
    }
}
