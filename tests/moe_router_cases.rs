//! Qwen3-MoE router edge cases on tiny models the test writes itself (`hf_synth`, BF16 HF
//! directories with planted router weights), each checked against an independent naive
//! computation in this file: f64, every expert of a sparse layer run for every token and
//! weighted (zero for the unchosen), experts chosen by a stable sort (descending logit, then
//! ascending index, which is the documented tie rule: the lower expert index wins).
//!
//! Two levels:
//! - the MoE FFN of one layer (`backend::cpu::moe::moe_ffn`) on inputs the test chooses, so the
//!   routing of every token is known: ties, an expert no token chooses, all tokens choosing the
//!   same experts, few tokens (GEMV path) and many (tiled GEMM path);
//! - the whole model (`CpuBackend`: prefill and cached decode) against a naive f64 forward,
//!   for planted routers, a model with dense and sparse layers (`mlp_only_layers`,
//!   `decoder_sparse_step`), transformers' `norm_topk_prob` default, and a sharded checkpoint.

mod common;

use common::naive::{naive_logits, NaiveMoe};

use std::path::Path;

use dustoff::backend::cpu::moe::{moe_ffn, MoeScratch};
use dustoff::backend::cpu::CpuBackend;
use dustoff::engine::single::SingleSeq;
use dustoff::model::config::{Arch, ModelConfig};
use dustoff::model::hf_synth::{write_hf_dir, SynthMoe, SynthSpec};
use dustoff::model::loader::{load_model, LoadedModel, SAMPLE_MODEL};
use dustoff::model::moe::MoeWeights;
use dustoff::model::weights::ModelWeights;

/// f32 engine vs f64 reference on unit-scale values.
const TOL: f64 = 1e-4;

fn spec(seed: u64, moe: SynthMoe) -> SynthSpec {
    SynthSpec { moe: Some(moe), ..SynthSpec::tiny(Arch::Qwen3Moe, seed) }
}

fn moe4(norm: Option<bool>) -> SynthMoe {
    SynthMoe {
        n_experts: 4,
        n_used: 2,
        expert_ffn_dim: 32,
        norm_topk_prob: norm,
        mlp_only_layers: vec![],
        decoder_sparse_step: 1,
    }
}

/// Writes and loads a model; `router(layer, values)` may replace the router `[n_experts, dim]`.
fn model(dir: &Path, s: &SynthSpec, router: &dyn Fn(usize, &mut [f32])) -> LoadedModel {
    let mut edit = |name: &str, v: &mut [f32]| {
        if let Some(l) = name.strip_prefix("model.layers.").and_then(|r| r.strip_suffix(".mlp.gate.weight")) {
            router(l.parse().unwrap(), v);
        }
    };
    write_hf_dir(dir, s, &common::repo().join(SAMPLE_MODEL), &mut edit).unwrap();
    load_model(dir).unwrap()
}

// ---- the naive reference: tests/common/naive.rs ----

/// Prefill of `tokens`, and the same sequence decoded one token at a time after a prefill of
/// all but the last, both against the naive forward.
fn check_model_against_naive(m: &LoadedModel, tokens: &[u32], what: &str) {
    check_weights_against_naive(&m.config, &m.weights, tokens, what)
}

fn check_weights_against_naive(c: &ModelConfig, w: &ModelWeights, tokens: &[u32], what: &str) {
    let want = naive_logits(c, w, tokens);
    let mut b = CpuBackend::new(c.clone(), w.clone(), 8, 16);
    let prefill = SingleSeq::new(&b, 0, tokens.len()).unwrap().feed(&mut b, tokens).unwrap();
    let mut seq = SingleSeq::new(&b, 0, tokens.len()).unwrap();
    let n = tokens.len();
    seq.feed(&mut b, &tokens[..n - 4]).unwrap();
    let mut decoded = Vec::new();
    for &t in &tokens[n - 4..] {
        decoded = seq.feed(&mut b, &[t]).unwrap();
    }
    for (how, got) in [("prefill", &prefill), ("decode", &decoded)] {
        let d = got.iter().zip(&want).map(|(&g, &w)| (g as f64 - w).abs()).fold(0.0, f64::max);
        assert!(d < 1e-3, "{what}, {how}: logits differ from the naive forward by {d}");
    }
}

/// 20 tokens: a prefill puts more than 8 (the GEMV limit) through some experts.
const TOKENS: [u32; 20] =
    [504, 3575, 282, 4649, 314, 1010, 7, 88, 12000, 45, 3, 999, 2718, 31, 640, 17, 5000, 250, 61, 19];

// ---- the MoE FFN of one layer on chosen inputs ----

/// Deterministic inputs `[n, dim]` in [-1, 1] (or [0.1, 1] when `positive`).
fn inputs(n: usize, dim: usize, positive: bool) -> Vec<f32> {
    (0..n * dim)
        .map(|i| {
            let u = ((i as u64 * 2654435761 + 12345) % 1000) as f32 / 999.0;
            if positive {
                0.1 + 0.9 * u
            } else {
                2.0 * u - 1.0
            }
        })
        .collect()
}

/// Runs the layer on `x` and checks routing and output against the naive version; returns the
/// routing (`[n, k]` experts) and the per-expert token counts.
fn check_ffn(w: &MoeWeights, x: &[f32], what: &str) -> (Vec<u32>, Vec<usize>) {
    let dim = w.router.cols;
    let n = x.len() / dim;
    let mut out = vec![f32::NAN; n * dim];
    let mut s = MoeScratch::default();
    moe_ffn(w, x, n, &mut out, &mut s);
    let naive = NaiveMoe::of(w);
    for t in 0..n {
        let h: Vec<f64> = x[t * dim..(t + 1) * dim].iter().map(|&v| v as f64).collect();
        let (experts, y) = naive.forward(&h);
        let k = w.n_used;
        assert_eq!(&s.routing.experts[t * k..(t + 1) * k], experts.as_slice(), "{what}: token {t} routing");
        let d = out[t * dim..(t + 1) * dim].iter().zip(&y).map(|(&a, &b)| (a as f64 - b).abs()).fold(0.0, f64::max);
        assert!(d < TOL, "{what}: token {t} output differs by {d}");
    }
    let counts = s.groups.offsets.windows(2).map(|p| p[1] - p[0]).collect();
    (s.routing.experts.clone(), counts)
}

#[test]
fn ffn_ties_go_to_the_lower_index() {
    let root = common::tmpdir("moe-ties");
    // Layer 0: a zero router, a complete tie. Layer 1: rows 0..2 zero, row 3 random: a token with
    // a positive logit for expert 3 takes {3, 0}, a negative one {0, 1} (a three-way tie at the
    // second place, and expert 2 loses both).
    let zero = |l: usize, v: &mut [f32]| {
        let dim = v.len() / 4;
        v[..if l == 0 { 4 * dim } else { 3 * dim }].fill(0.0);
    };
    let m = model(&root.join("m"), &spec(11, moe4(Some(true))), &zero);
    let dim = m.config.dim;
    for n in [4, 12] {
        // Pairs (v, -v): opposite logits for expert 3, so both branches below occur.
        let half = inputs(n / 2, dim, false);
        let x: Vec<f32> =
            half.chunks(dim).flat_map(|r| r.iter().copied().chain(r.iter().map(|v| -v)).collect::<Vec<_>>()).collect();
        let (routing, counts) = check_ffn(m.weights.layers[0].moe.as_ref().unwrap(), &x, "zero router");
        assert_eq!(routing, [0, 1].repeat(n), "all tokens choose experts 0 and 1");
        assert_eq!(counts, vec![n, n, 0, 0]);

        let w = m.weights.layers[1].moe.as_ref().unwrap();
        let (routing, counts) = check_ffn(w, &x, "one live router row");
        let r3 = w.router.to_f32_vec()[3 * dim..].to_vec();
        for t in 0..n {
            let l3: f32 = r3.iter().zip(&x[t * dim..]).map(|(a, b)| a * b).sum();
            let want = if l3 > 0.0 { [3, 0] } else { [0, 1] };
            assert_eq!(routing[2 * t..2 * t + 2], want, "token {t}: logit {l3} for expert 3");
        }
        assert_eq!(counts[2], 0, "expert 2 is never chosen");
        assert_eq!((counts[1], counts[3]), (n / 2, n / 2), "each pair takes both branches");
    }
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn ffn_an_expert_no_token_chooses_and_one_every_token_chooses() {
    let root = common::tmpdir("moe-unused");
    // Positive inputs: a router row of -1 gives expert 1 a logit of -sum(x), far below the
    // random rows' (about +-1); a row of +1 gives expert 2 a logit far above them.
    let plant = |l: usize, v: &mut [f32]| {
        if l != 0 {
            return;
        }
        let dim = v.len() / 4;
        v[dim..2 * dim].fill(-1.0);
        v[2 * dim..3 * dim].fill(1.0);
    };
    for norm in [Some(true), Some(false)] {
        let m = model(&root.join(format!("m{norm:?}")), &spec(12, moe4(norm)), &plant);
        assert_eq!(m.config.moe.as_ref().unwrap().norm_topk_prob, norm == Some(true));
        for n in [1, 5, 12] {
            let x = inputs(n, m.config.dim, true);
            let (routing, counts) = check_ffn(m.weights.layers[0].moe.as_ref().unwrap(), &x, "planted rows");
            assert_eq!(counts[1], 0, "expert 1 is never chosen: {counts:?}");
            assert_eq!(counts[2], n, "every token chooses expert 2 first: {counts:?}");
            assert!(routing.chunks(2).all(|r| r[0] == 2));
        }
        // Random inputs route freely: every expert computed against the naive loop.
        let x = inputs(16, m.config.dim, false);
        check_ffn(m.weights.layers[1].moe.as_ref().unwrap(), &x, "random router");
    }
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn ffn_output_of_a_token_does_not_depend_on_the_batch() {
    // Decode (one token: fused gate/up), grouped GEMV (<= 8 tokens per expert) and the tiled
    // GEMM (more) must give every token bitwise the same output: the engine's 1-vs-N-slot
    // equality and the GPU parity suite build on it.
    let root = common::tmpdir("moe-batch");
    let m = model(&root.join("m"), &spec(13, moe4(Some(true))), &|_, _| {});
    let w = m.weights.layers[0].moe.as_ref().unwrap();
    let dim = m.config.dim;
    let x = inputs(40, dim, false);
    let run = |x: &[f32]| {
        let mut out = vec![0f32; x.len()];
        moe_ffn(w, x, x.len() / dim, &mut out, &mut MoeScratch::default());
        out
    };
    let all = run(&x);
    let (_, counts) = check_ffn(w, &x, "40 tokens");
    assert!(counts.iter().any(|&c| c > 8), "some expert takes the GEMM path: {counts:?}");
    let five = run(&x[..5 * dim]);
    for t in 0..40 {
        let alone = run(&x[t * dim..(t + 1) * dim]);
        assert!(alone == all[t * dim..(t + 1) * dim], "token {t}: alone vs in a batch of 40");
        if t < 5 {
            assert!(alone == five[t * dim..(t + 1) * dim], "token {t}: alone vs in a batch of 5");
        }
    }
    std::fs::remove_dir_all(&root).ok();
}

// ---- whole models ----

#[test]
fn models_with_planted_routers_match_the_naive_forward() {
    let root = common::tmpdir("moe-models");
    let zero = |l: usize, v: &mut [f32]| {
        if l == 1 {
            v.fill(0.0);
        }
    };
    let m = model(&root.join("zero"), &spec(21, moe4(Some(true))), &zero);
    check_model_against_naive(&m, &TOKENS, "layer 1 router all zero");
    let m = model(&root.join("random"), &spec(22, moe4(Some(true))), &|_, _| {});
    check_model_against_naive(&m, &TOKENS, "random routers");
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn dense_and_sparse_layers_hf_defaults_and_shards() {
    let root = common::tmpdir("moe-mixed");
    let mut s = spec(
        31,
        SynthMoe {
            n_experts: 6,
            n_used: 3,
            expert_ffn_dim: 16,
            // Left out: transformers' default, false, applies.
            norm_topk_prob: None,
            mlp_only_layers: vec![0],
            decoder_sparse_step: 2,
        },
    );
    s.n_layers = 4;
    s.shards = 3;
    let m = model(&root.join("m"), &s, &|_, _| {});
    let c: &ModelConfig = &m.config;
    let moe = c.moe.as_ref().unwrap();
    // Layer 0 listed dense; layers 1 and 3 pass (i + 1) % 2 == 0.
    assert_eq!(moe.sparse_layers, vec![false, true, false, true]);
    assert!(!moe.norm_topk_prob);
    for (i, l) in m.weights.layers.iter().enumerate() {
        assert_eq!(l.moe.is_some(), moe.sparse_layers[i], "layer {i}");
        assert_eq!(l.w_gate.rows, if moe.sparse_layers[i] { 0 } else { c.ffn_dim }, "layer {i}");
    }
    assert_eq!(dustoff::model::safetensors::SafetensorsDir::open(&root.join("m")).unwrap().files.len(), 3);
    check_model_against_naive(&m, &TOKENS, "dense + sparse layers, 3 shards");
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn convert_writes_a_moe_model_as_gguf_and_as_f16_safetensors() {
    use dustoff::commands::convert::{run, ConvertArgs};
    use dustoff::model::quant::GgmlType;
    let root = common::tmpdir("moe-convert");
    let src = root.join("src");
    let mut s = spec(41, moe4(Some(false)));
    s.n_layers = 3;
    s.moe.as_mut().unwrap().mlp_only_layers = vec![1];
    let m = model(&src, &s, &|_, _| {});
    let args = |output: &str| ConvertArgs {
        model: src.clone(),
        output: root.join(output),
        verify: true,
        verify_tokens: 4,
        ..ConvertArgs::default()
    };
    for out in ["m.gguf", "f16"] {
        // --verify re-reads every value (stacked experts included) against the policy.
        let summary = run(args(out)).unwrap_or_else(|e| panic!("{out}: {e:#}"));
        assert_eq!(summary.verify.unwrap().values_mismatched, 0, "{out}");
        let c = load_model(&root.join(out)).unwrap();
        assert_eq!(c.config.moe, m.config.moe, "{out}: the MoE config survives");
        assert!(c.weights.layers[1].moe.is_none(), "{out}: layer 1 stays dense");
        let (a, b) = (&m.weights.layers[2].moe.as_ref().unwrap(), &c.weights.layers[2].moe.as_ref().unwrap());
        for e in 0..4 {
            assert_eq!(b.experts[e].up.dtype, GgmlType::F16);
            assert_eq!(a.experts[e].down.to_f32_vec(), b.experts[e].down.to_f32_vec(), "{out}: expert {e} down");
        }
        assert_eq!(a.router.to_f32_vec(), b.router.to_f32_vec(), "{out}: router");
        if out.ends_with(".gguf") {
            check_model_against_naive(&c, &TOKENS, out);
        }
    }
    let g = dustoff::model::gguf::GgufFile::open(root.join("m.gguf")).unwrap();
    let t = g.tensor_info("blk.2.ffn_down_exps.weight").unwrap();
    assert_eq!((t.dims.clone(), t.dtype), (vec![32, 64, 4], GgmlType::F16));
    assert_eq!(g.tensor_info("blk.0.ffn_gate_inp.weight").unwrap().dtype, GgmlType::F32);
    assert!(g.tensor_info("blk.1.ffn_gate_inp.weight").is_none() && g.tensor_info("blk.1.ffn_up.weight").is_some());
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn quantized_experts_of_a_synthetic_shape_match_the_naive_forward() {
    use dustoff::model::moe::MoeConfig;
    use dustoff::model::quant::GgmlType;
    // The qwen3-30b-a3b shape shrunk (K-quant rows need 256 columns); layer 1 left dense.
    let full = dustoff::model::shapes::shape("qwen3-30b-a3b").unwrap();
    let c = ModelConfig {
        n_layers: 2,
        dim: 256,
        ffn_dim: 512,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 64,
        vocab_size: 512,
        moe: Some(MoeConfig {
            n_experts: 8,
            n_used: 3,
            expert_ffn_dim: 256,
            norm_topk_prob: true,
            shared_ffn_dim: None,
            sparse_layers: vec![true, false],
        }),
        ..full
    };
    let tokens: Vec<u32> = TOKENS.iter().map(|t| t % 512).collect();
    for dtype in [GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q6K] {
        let w = dustoff::model::synth::random_weights(&c, dtype, 5);
        let moe = w.layers[0].moe.as_ref().unwrap();
        assert_eq!((moe.experts.len(), moe.experts[0].gate.dtype, moe.router.dtype), (8, dtype, GgmlType::F32));
        assert!(w.layers[1].moe.is_none());
        check_weights_against_naive(&c, &w, &tokens, &format!("synthetic {dtype}"));
    }
}
