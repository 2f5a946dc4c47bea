//! The one-launch sparse layer (kernels/moe.cu `moe_one_<fmt>_<fmt>`, cuda/moe_one.rs) against
//! the three fused launches it replaces (bit for bit: the same device functions in the same
//! order) and against the CPU reference `moe_ffn`, for every format pair it is built for, k = 8
//! and 3, 1..8 tokens; each launch twice, so that the tile counters it leaves are zero again.
//! Then the Qwen3-30B-A3B shape (128 experts, width 2048, 8 used; grids of 640 to 4,224 tiles,
//! many waves of blocks waiting on earlier tiles) against the three launches.

use dustoff::backend::cpu::moe::{moe_ffn as cpu_moe_ffn, MoeScratch};
use dustoff::backend::cuda::moe::{pair_ffn, MoeLayerW, MoeWork, PairPath};
use dustoff::backend::cuda::moe_one::ONE_ENTRIES;
use dustoff::model::moe::MoeConfig;
use dustoff::model::quant::GgmlType;

use super::moe::layer;
use super::{compare, gpu, Gpu};

/// `QFormat::index` order, F16 last (moe_one.rs ONE_ENTRIES).
const BY_INDEX: [GgmlType; 9] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::F16,
];

/// Runs `pair_ffn` by `path` on a copy of `x` (with `rms`: a norm weight, `h = rmsnorm(x)`
/// first); returns the residual after, the ids and `h` after (and checks that the one-launch
/// counters are zero again).
#[allow(clippy::too_many_arguments)]
fn run(
    g: &mut Gpu,
    lw: &MoeLayerW,
    work: &MoeWork,
    h: &[f32],
    x: &[f32],
    n: usize,
    path: PairPath,
    rms: Option<&[f32]>,
) -> (Vec<f32>, Vec<i32>, Vec<f32>) {
    let s = g.dev.stream.clone();
    let (hd, xd) = (g.up(h), g.up(x));
    let nd = rms.map(|w| g.up(w));
    let rms = nd.as_ref().map(|b| (g.d(b), 1e-6f32));
    let (hv, xv) = (g.d(&hd), g.d(&xd));
    pair_ffn(&mut g.k, &s, lw, work, hv, xv, n, path, rms).unwrap();
    let ids = g.down(work.ids.as_ref().unwrap())[..n * lw.n_used].to_vec();
    let sync = g.down(work.one_sync.as_ref().unwrap());
    assert!(sync.iter().all(|&c| c == 0), "{path:?}, {n} tokens: tile counters left at zero");
    (g.down(&xd), ids, g.down(&hd))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|a| a.to_bits()).collect()
}

#[test]
fn one_launch_equals_three_launches_and_the_cpu_every_format_pair() {
    let Some(mut g) = gpu("moe one launch") else { return };
    let s = g.dev.stream.clone();
    let (e, dim, f) = (16, 512, 256);
    for &(gi, di, entry) in ONE_ENTRIES.iter() {
        let (gu, dn) = (BY_INDEX[gi], BY_INDEX[di]);
        for k in [8usize, 3] {
            let w = layer(&mut g, e, dim, f, k, gu, dn);
            let (lw, _) = MoeLayerW::upload(&s, &w, false, "test layer").unwrap();
            let m =
                MoeConfig { n_experts: e, n_used: k, expert_ffn_dim: f, norm_topk_prob: true, sparse_layers: vec![] };
            let mut work = MoeWork::default();
            work.grow(&s, 8, dim, &m).unwrap();
            for n in [1usize, 2, 5, 8] {
                let h = g.randn(n * dim, 1.0);
                let x = g.randn(n * dim, 5.0);
                let (three, ids3, _) = run(&mut g, &lw, &work, &h, &x, n, PairPath::Three, None);
                let (one, ids1, _) = run(&mut g, &lw, &work, &h, &x, n, PairPath::One, None);
                let (again, _, _) = run(&mut g, &lw, &work, &h, &x, n, PairPath::One, None);
                assert_eq!(ids1, ids3, "{entry}, k {k}, {n} tokens: routing");
                assert_eq!(bits(&one), bits(&three), "{entry}, k {k}, {n} tokens: one launch = three launches");
                assert_eq!(bits(&again), bits(&one), "{entry}, k {k}, {n} tokens: the second launch");
                // The RMSNorm inside the launch = rmsnorm_f32 then the three launches.
                let nw: Vec<f32> = g.randn(dim, 0.3).iter().map(|v| 1.0 + v).collect();
                let (three_n, ids3n, h3) = run(&mut g, &lw, &work, &h, &x, n, PairPath::Three, Some(&nw));
                let (one_n, ids1n, h1) = run(&mut g, &lw, &work, &h, &x, n, PairPath::One, Some(&nw));
                assert_eq!(ids1n, ids3n, "{entry}, k {k}, {n} tokens, norm inside: routing");
                assert_eq!(bits(&h1), bits(&h3), "{entry}, k {k}, {n} tokens: the normed input");
                assert_eq!(bits(&one_n), bits(&three_n), "{entry}, k {k}, {n} tokens, norm inside: the output");
                let mut out = vec![0f32; n * dim];
                let mut sc = MoeScratch::default();
                cpu_moe_ffn(&w, &h, n, &mut out, &mut sc);
                let want: Vec<f32> = x.iter().zip(&out).map(|(a, b)| a + b).collect();
                let name = if gu == GgmlType::F16 { "moe_layer_f16" } else { "moe_layer_quant" };
                compare(name, g.seed + n as u64, &one, &want);
                let ids_u: Vec<u32> = ids1.iter().map(|&i| i as u32).collect();
                assert_eq!(ids_u, sc.routing.experts, "{entry}, k {k}, {n} tokens: the CPU's routing");
            }
        }
    }
}

#[test]
fn one_launch_equals_three_launches_at_the_qwen3_30b_a3b_shape() {
    let Some(mut g) = gpu("moe one launch, 30B-A3B shape") else { return };
    let s = g.dev.stream.clone();
    let c = dustoff::model::shapes::shape("qwen3-30b-a3b").unwrap();
    let m = c.moe.clone().unwrap();
    let lw = MoeLayerW::synthetic(&s, &mut g.k, &c, &m, GgmlType::Q4K, GgmlType::Q6K, 5, "test").unwrap();
    let mut work = MoeWork::default();
    work.grow(&s, 8, c.dim, &m).unwrap();
    for n in [1usize, 3, 8] {
        let h = g.randn(n * c.dim, 1.0);
        let x = g.randn(n * c.dim, 1.0);
        let nw: Vec<f32> = g.randn(c.dim, 0.3).iter().map(|v| 1.0 + v).collect();
        for rms in [None, Some(&nw[..])] {
            let (three, ids3, _) = run(&mut g, &lw, &work, &h, &x, n, PairPath::Three, rms);
            for rep in 0..3 {
                let (one, ids1, _) = run(&mut g, &lw, &work, &h, &x, n, PairPath::One, rms);
                assert_eq!(ids1, ids3, "{n} tokens, norm {}, launch {rep}: routing", rms.is_some());
                let same = bits(&one) == bits(&three);
                assert!(
                    same,
                    "{n} tokens, norm {}, launch {rep}: one launch = three launches bit for bit",
                    rms.is_some()
                );
            }
        }
    }
}
