//! The grouped tensor-core GEMM of the MoE FFN (kernels/moe_gemm.cu) against its CPU twin: the
//! CPU decoder's weights (src/model/quant) and the inputs rounded to F16 as the kernel stages
//! them, sums in f64, SwiGLU in f32 and the activations rounded to F16 as the kernel stores
//! them. Every GEMM format, every tile, at 9, 33, 100 and 150 tokens, with an expert that no
//! token chooses and (at 100 and 150 tokens) one expert chosen by every token (at 150: three
//! tiles of 64, four of 48, two of 128 for gate/up, the second holding tokens of one column of
//! warps).

use dustoff::backend::cpu::moe::{group, Groups, Routing};
use dustoff::backend::cuda::moe::MoeLayerW;
use dustoff::backend::cuda::ops::moe_gemm::{gemm_fits, GemmOut, MoeGather, MoeGemm, Tile};
use dustoff::model::moe::MoeWeights;
use dustoff::model::quant::{staged_f16_row, GgmlType};
use dustoff::model::weights::Tensor;

use super::{compare, f16_vals, gpu, Gpu};

/// The formats with GEMM entries (moe_gemm.rs `GEMM_FORMATS`).
const GEMM_FORMATS: &[GgmlType] = &[GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K];

fn op(kind: &str, t: GgmlType) -> String {
    format!("{kind}_{}", t.name().to_ascii_lowercase())
}

fn round16(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// A tensor's rows as the kernel stages them (F16 values).
fn weights16(t: &Tensor) -> Vec<f32> {
    let mut w = vec![0f32; t.rows * t.cols];
    for (r, o) in w.chunks_exact_mut(t.cols).enumerate() {
        staged_f16_row(t.dtype, t.row(r), o);
    }
    w
}

fn dot(w: &[f32], x: &[f32]) -> f64 {
    w.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum()
}

/// `k` distinct experts for each of `n` tokens, never `unused`; with `all_first`, slot 0 of
/// every token is expert 0.
fn ids_for(g: &mut Gpu, n: usize, e: usize, k: usize, unused: u32, all_first: bool) -> Vec<u32> {
    super::moe::distinct_ids(g, n, k, all_first.then_some(0), 0..e as u32, Some(unused))
}

#[test]
fn grouped_gemm_equals_f16_rounded_twin() {
    let Some(mut g) = gpu("moe grouped gemm") else { return };
    let s = g.dev.stream.clone();
    let (e, dim, f, k, unused) = (8, 512, 256, 3, 5u32);
    for &dtype in GEMM_FORMATS {
        let w: MoeWeights = super::moe::layer(&mut g, e, dim, f, k, dtype, dtype);
        let (lw, _) = MoeLayerW::upload(&s, &w, false, "test layer").unwrap();
        assert!(gemm_fits(&lw.gate, &lw.up, &lw.down, lw.ffn, lw.dim), "{dtype}: the test layer takes the GEMM");
        let gate16: Vec<Vec<f32>> = w.experts.iter().map(|x| weights16(&x.gate)).collect();
        let up16: Vec<Vec<f32>> = w.experts.iter().map(|x| weights16(&x.up)).collect();
        let down16: Vec<Vec<f32>> = w.experts.iter().map(|x| weights16(&x.down)).collect();
        for (n, all_first) in [(9usize, false), (33, false), (100, true), (150, true)] {
            let pairs = n * k;
            let h = g.randn(n * dim, 1.0);
            let ids = ids_for(&mut g, n, e, k, unused, all_first);
            let mut groups = Groups::default();
            group(&Routing { k, experts: ids.clone(), weights: vec![0.0; pairs] }, e, &mut groups);
            assert_eq!(groups.offsets[unused as usize], groups.offsets[unused as usize + 1], "expert {unused} unused");
            let off = g.up(&groups.offsets.iter().map(|&o| o as i32).collect::<Vec<_>>());
            let ent = g.up(&groups.entries.iter().map(|&p| p as i32).collect::<Vec<_>>());
            let hd = g.up(&h);
            let x16 = g.up(&vec![0x7e00u16; pairs * dim]); // F16 NaN: unwritten rows show
            MoeGather { h: g.d(&hd), entries: g.d(&ent), x16: g.d(&x16), n_pairs: pairs, dim, k }
                .launch(&mut g.k, &s)
                .unwrap();
            let xg = f16_vals(&g.down(&x16));
            let want_x: Vec<f32> = groups
                .entries
                .iter()
                .flat_map(|&p| h[(p as usize / k) * dim..(p as usize / k + 1) * dim].iter().map(|&v| round16(v)))
                .collect();
            compare("moe_gather_f16", g.seed, &xg, &want_x);
            // Twin of gate/up + SwiGLU at each grouped position q (expert ex of its pair).
            let expert_of = |q: usize| ids[groups.entries[q] as usize] as usize;
            let mut want_act = vec![0f32; pairs * f];
            for q in 0..pairs {
                let (ex, xq) = (expert_of(q), &want_x[q * dim..(q + 1) * dim]);
                for r in 0..f {
                    let gt = dot(&gate16[ex][r * dim..(r + 1) * dim], xq) as f32;
                    let ut = dot(&up16[ex][r * dim..(r + 1) * dim], xq) as f32;
                    want_act[q * f + r] = round16(gt / (1.0 + (-gt).exp()) * ut);
                }
            }
            // Both forms of the kernel: every fragment of a tile multiplied, and the empty ones
            // skipped (DUSTOFF_MOE_GEMM_SKIP): the same values at every grouped position.
            for (tile, skip) in [Tile::T16, Tile::T64, Tile::W48, Tile::T8, Tile::R8, Tile::R16, Tile::T128]
                .into_iter()
                .flat_map(|t| [(t, false), (t, true)])
            {
                let act = g.up(&vec![0x7e00u16; pairs * f]);
                let y = g.poisoned(pairs * dim);
                let (xv, ov) = (g.d(&x16), g.d(&off));
                let gemm = |slab, x, out| MoeGemm { slab, n_experts: e, x, offsets: ov, out, n_pairs: pairs, tile };
                gemm(&lw.gate, xv, GemmOut::GateUp { up: &lw.up, act: g.d(&act) })
                    .launch_with(&mut g.k, &s, skip)
                    .unwrap();
                let got_act = f16_vals(&g.down(&act));
                compare(&op("moe_gemm_gate_up", dtype), g.seed, &got_act, &want_act);
                // down reads the kernel's own activations, so its product is checked alone
                // (the 128-token tile has no down product).
                if tile == Tile::T128 {
                    continue;
                }
                gemm(&lw.down, g.d(&act), GemmOut::Down { y: g.d(&y) }).launch_with(&mut g.k, &s, skip).unwrap();
                let mut want_y = vec![0f32; pairs * dim];
                for q in 0..pairs {
                    let (ex, aq) = (expert_of(q), &got_act[q * f..(q + 1) * f]);
                    for r in 0..dim {
                        want_y[q * dim + r] = dot(&down16[ex][r * f..(r + 1) * f], aq) as f32;
                    }
                }
                compare(&op("moe_gemm_down", dtype), g.seed, &g.down(&y), &want_y);
            }
        }
    }
}
