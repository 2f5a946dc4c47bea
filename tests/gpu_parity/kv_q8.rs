//! The 8-bit KV cache (`--kv-cache q8`) on the GPU against its CPU twin
//! (`backend::kv_type::q8_round_trip`, `CpuBackend::with_kv_type`): the stores quantize exactly
//! as the twin does (the cache read back equals the twin's values bit for bit), and whole
//! backends with the 8-bit cache agree over prefill, prefill after a shared prefix (prefix
//! reuse: the tensor-core prefill kernel split along the context and merged), decode with the
//! shared-prefix (cascade) pass, and one-pass decode over a long context.

use cudarc::driver::CudaSlice;
use dustoff::backend::cuda::ops::launch::KvScales;
use dustoff::backend::kv_type::{q8_round_trip, KvType, Q8_GROUP};
use half::f16;

use super::{compare, gpu, Gpu};

/// The values an 8-bit cache holds in its rows `rows` (`[cache_rows, kv_dim]` int8 as half
/// pairs, scales `[cache_rows, kv_dim / 32]` f16), read back as the attention kernels read
/// them: `f16(q * d)`.
pub(crate) fn read_back(
    g: &Gpu,
    (data, scales): (&CudaSlice<u16>, &CudaSlice<u16>),
    kv_dim: usize,
    rows: &[i32],
) -> Vec<f32> {
    let (data, scales) = (g.down(data), g.down(scales));
    let bytes: Vec<i8> = data.iter().flat_map(|w| [(*w & 0xff) as u8 as i8, (*w >> 8) as u8 as i8]).collect();
    let mut out = Vec::with_capacity(rows.len() * kv_dim);
    for &r in rows {
        for i in 0..kv_dim {
            let e = r as usize * kv_dim + i;
            let d = f16::from_bits(scales[e / Q8_GROUP]).to_f32();
            out.push(f16::from_f32((bytes[e] as f32 * d).clamp(-65504.0, 65504.0)).to_f32());
        }
    }
    out
}

/// An empty 8-bit cache of `cache_rows` rows: (K codes, V codes, K scales, V scales), the codes
/// `[cache_rows, kv_dim]` int8 as half pairs, the scales `[cache_rows, kv_dim / 32]` f16.
type Q8Cache = (CudaSlice<u16>, CudaSlice<u16>, CudaSlice<u16>, CudaSlice<u16>);
fn new_cache(g: &Gpu, cache_rows: usize, kv_dim: usize) -> Q8Cache {
    let (k, v) = (g.zeros::<u16>(cache_rows * kv_dim / 2), g.zeros::<u16>(cache_rows * kv_dim / 2));
    let (ks, vs) = (g.zeros::<u16>(cache_rows * kv_dim / Q8_GROUP), g.zeros::<u16>(cache_rows * kv_dim / Q8_GROUP));
    (k, v, ks, vs)
}

/// `kv_store_f16` of `n_tok` rows of a fused QKV buffer `[n_tok, stride]` (Q `q_dim` wide,
/// then K and V `kv_dim` each) into a new 8-bit cache of `cache_rows` rows at `kv_rows`.
pub(crate) fn store_q8(
    g: &mut Gpu,
    qkv: &CudaSlice<f32>,
    kv_rows: &CudaSlice<i32>,
    cache_rows: usize,
    (n_tok, kv_dim, stride, q_dim): (usize, usize, usize, usize),
) -> Q8Cache {
    let (k, v, ks, vs) = new_cache(g, cache_rows, kv_dim);
    super::kv_store(g, qkv, (&k, &v), Some((&ks, &vs)), kv_rows, cache_rows, n_tok, kv_dim, stride, q_dim);
    (k, v, ks, vs)
}

/// `kv_store_f16` and the fused `qkv_post_f32` into an 8-bit cache: the cache read back equals
/// the twin's round trip of the rows they stored (the K rows as rotated in place by the fused
/// kernel), bit for bit; values of every magnitude, an all-zero head and one beyond the F16
/// range included.
#[test]
fn q8_kv_stores_equal_the_cpu_round_trip() {
    let Some(mut g) = gpu("8-bit KV cache stores") else { return };
    let s = g.dev.stream.clone();
    let (nh, nkv, hd, n, cache_rows) = (8usize, 2usize, 128usize, 7usize, 64usize);
    let (qd, kvd) = (nh * hd, nkv * hd);
    let stride = qd + 2 * kvd;
    let mut qkv = g.randn(n * stride, 3.0);
    // Token 1's first V head all zero, token 2's first K head far beyond F16.
    qkv[stride + qd + kvd..stride + qd + kvd + hd].fill(0.0);
    qkv[2 * stride + qd..2 * stride + qd + hd].iter_mut().for_each(|v| *v *= 1e6);
    let rows: Vec<i32> = (0..n as i32).map(|i| (i * 9 + 5) % cache_rows as i32).collect();
    let rowsd = g.up(&rows);
    let twin = |x: &[f32], off: usize| -> Vec<f32> {
        let mut want: Vec<f32> = (0..n).flat_map(|t| x[t * stride + off..t * stride + off + kvd].to_vec()).collect();
        want.chunks_exact_mut(Q8_GROUP).for_each(q8_round_trip);
        want
    };
    // The plain store.
    let qkvd = g.up(&qkv);
    let (k, v, ks, vs) = store_q8(&mut g, &qkvd, &rowsd, cache_rows, (n, kvd, stride, qd));
    compare("kv_store_q8", g.seed, &read_back(&g, (&k, &ks), kvd, &rows), &twin(&qkv, qd));
    compare("kv_store_q8", g.seed, &read_back(&g, (&v, &vs), kvd, &rows), &twin(&qkv, qd + kvd));
    // The fused QK-norm + RoPE + store: K as the kernel rotated it (written back into qkv).
    let max_pos = 4096;
    let inv: Vec<f32> = (0..hd / 2).map(|i| 1e6f32.powf(-(2.0 * i as f32) / hd as f32)).collect();
    let all: Vec<usize> = (0..max_pos).collect();
    let (cos, sin) = dustoff::backend::cpu::ops::rope_table(&all, &inv);
    let pos: Vec<i32> = (0..n as i32).map(|i| i * 311 % max_pos as i32).collect();
    let (cd, sd, posd) = (g.up(&cos), g.up(&sin), g.up(&pos));
    let (qn, kn) = (g.randn(hd, 1.0), g.randn(hd, 1.0));
    let (qnd, knd) = (g.up(&qn), g.up(&kn));
    let qkvd = g.up(&qkv);
    let (k, v, ks, vs) = new_cache(&g, cache_rows, kvd);
    let mut store =
        super::rope_store(&g, Some((&qnd, &knd)), &posd, (&cd, &sd, max_pos), (&k, &v), (&rowsd, cache_rows));
    store.kv_scales = Some(KvScales { k: g.d(&ks), v: g.d(&vs) });
    dustoff::backend::cuda::ops::kv_cache::QkvPost {
        qkv: g.d(&qkvd),
        store,
        n_tok: n,
        n_heads: nh,
        n_kv: nkv,
        head_dim: hd,
        stride,
        halves: true,
        eps: 1e-6,
    }
    .launch(&mut g.k, &s)
    .unwrap();
    let rotated = g.down(&qkvd);
    compare("kv_store_q8", g.seed, &read_back(&g, (&k, &ks), kvd, &rows), &twin(&rotated, qd));
    compare("kv_store_q8", g.seed, &read_back(&g, (&v, &vs), kvd, &rows), &twin(&rotated, qd + kvd));
}

/// As `attention::backend_steps_over_shared_blocks_match_cpu`, both backends with the 8-bit
/// cache: one 608-token prefix (38 shared blocks), 20 sequences prefilled with their own
/// 10..=29 tokens after it (prefill attention split along the context and merged, over the
/// reused prefix blocks), one decode step of all 20 (the shared-prefix pass, then each suffix),
/// then 40 more decode steps of 4 of them (contexts to ~680: the one-pass decode kernel). Logits
/// within the backend tolerance; the decode step repeated gives the same logits bit for bit.
#[test]
fn q8_kv_backend_steps_over_shared_blocks_match_cpu() {
    use dustoff::backend::Backend;
    use dustoff::engine::plan::{SeqChunk, StepPlan};
    use dustoff::model::quant::GgmlType;
    let Some(g) = gpu("8-bit KV cache through the backend") else { return };
    drop(g);
    for shape in ["smollm2-135m", "qwen3-0.6b"] {
        let cfg = dustoff::model::shapes::shape(shape).unwrap();
        let w = dustoff::model::synth::random_weights(&cfg, GgmlType::F16, 11);
        let n_blocks = 128;
        let opts = dustoff::backend::cuda::CudaOptions { kv_type: KvType::Q8, ..super::opts(n_blocks) };
        let mut gb = dustoff::backend::cuda::CudaBackend::new(cfg.clone(), &w, &opts).unwrap();
        assert!(gb.describe().contains("KV cache q8"), "{}", gb.describe());
        let mut cb = dustoff::backend::cpu::CpuBackend::new(cfg, w, n_blocks, 16).with_kv_type(KvType::Q8).unwrap();
        let shared: Vec<u32> = (0..38).collect();
        let prefix: Vec<u32> = (0..608).map(|i| 300 + (i * 53) % 20_000).collect();
        let tables: Vec<Vec<u32>> =
            (0..20u32).map(|i| shared.iter().copied().chain(38 + 3 * i..41 + 3 * i).collect()).collect();
        let own = |i: usize| 10 + i;
        let chunk = |seq: usize, tokens: Vec<u32>, start_pos: usize, table: &[u32]| SeqChunk {
            seq: seq as _,
            tokens,
            start_pos,
            block_table: table.to_vec(),
            want_logits: true,
        };
        let mut steps = vec![
            StepPlan::new(vec![chunk(100, prefix, 0, &shared)]),
            StepPlan::new(
                (0..20)
                    .map(|i| chunk(i, (0..own(i)).map(|j| (1000 + i * 97 + j * 13) as u32).collect(), 608, &tables[i]))
                    .collect(),
            ),
            StepPlan::new((0..20).map(|i| chunk(i, vec![(5000 + i * 7) as u32], 608 + own(i), &tables[i])).collect()),
        ];
        // Four sequences go on alone for 40 steps (contexts to ~660), their tables grown by two
        // blocks of their own.
        let long: Vec<Vec<u32>> = (0..4u32)
            .map(|i| {
                shared.iter().copied().chain([38 + 3 * i, 39 + 3 * i, 40 + 3 * i, 100 + 2 * i, 101 + 2 * i]).collect()
            })
            .collect();
        for k in 0..40 {
            steps.push(StepPlan::new(
                (0..4).map(|i| chunk(i, vec![(7000 + i * 11 + k) as u32], 608 + own(i) + 1 + k, &long[i])).collect(),
            ));
        }
        for (k, plan) in steps.iter().enumerate() {
            let got = gb.step(plan).unwrap();
            let want = cb.step(plan).unwrap();
            assert_eq!(got.len(), want.len());
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                compare("cuda_vs_cpu_logits_kv_q8", (k * 100 + i) as u64, a, b);
            }
            if k == 2 {
                let again = gb.step(plan).unwrap();
                assert!(
                    again == got,
                    "{shape}: the shared-prefix decode step with the 8-bit cache is not deterministic"
                );
            }
        }
    }
}
