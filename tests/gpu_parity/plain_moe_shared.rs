//! A plain-attention mixture-of-experts model with a shared expert (the Qwen2-MoE layout: full
//! attention, routed experts plus a gated always-on expert) on the CUDA backend against the
//! CPU backend, same prompt, greedy decode. The CPU walker runs the shared expert for every
//! sparse layer; the CUDA walker must too (before the layer walker the GPU ran it only in
//! hybrid layers, so such a model silently differed). The shared expert of the experts' width
//! and format takes the one-stream launches with the routed experts in decode steps
//! (`moe/shexp.rs`); one of another width runs apart (`shared_expert.rs`); the 100-token
//! prefill runs it apart in both.
//!
//! The model is the small Qwen3-MoE test shape (layer 1 dense) whose sparse layers get a
//! random shared expert; every token uses all 8 experts (see moe.rs
//! `moe_model_logits_match_cpu_backend`: a near-tied choice can flip under the GPU's F16
//! rounding, which no tolerance on the logits absorbs).

use dustoff::backend::cuda::CudaBackend;
use dustoff::model::config::ModelConfig;
use dustoff::model::moe::{Expert, MoeConfig, SharedExpert};
use dustoff::model::quant::{quantize_row, GgmlType};
use dustoff::model::weights::{ModelWeights, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{compare, gpu, opts, run_greedy};

fn small_moe(n_layers: usize) -> ModelConfig {
    let mut c = dustoff::model::shapes::shape("qwen3-30b-a3b").unwrap();
    c.n_layers = n_layers;
    c.dim = 512;
    c.n_heads = 8;
    c.n_kv_heads = 2;
    c.head_dim = 64;
    c.vocab_size = 4096;
    c.ffn_dim = 1024;
    c.moe = Some(MoeConfig {
        n_experts: 8,
        n_used: 8,
        expert_ffn_dim: 256,
        norm_topk_prob: true,
        shared_ffn_dim: None,
        sparse_layers: (0..n_layers).map(|i| i != 1).collect(),
    });
    c
}

fn matrix(name: String, rows: usize, cols: usize, dtype: GgmlType, rng: &mut StdRng) -> Tensor {
    let a = (3.0 / cols as f32).sqrt();
    let mut bytes = Vec::new();
    for _ in 0..rows {
        let row: Vec<f32> = (0..cols).map(|_| rng.random_range(-a..a)).collect();
        bytes.extend(quantize_row(dtype, &row));
    }
    Tensor::from_bytes(name, dtype, rows, cols, bytes)
}

/// Gives every sparse layer of `w` a random shared expert of width `f` in `dtype` (its gate
/// row f32), named as GGUF files name them.
fn add_shared_experts(w: &mut ModelWeights, dim: usize, f: usize, dtype: GgmlType, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    for (i, lw) in w.layers.iter_mut().enumerate() {
        let Some(m) = lw.moe.as_mut() else { continue };
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        let expert = Expert {
            gate: matrix(n("ffn_gate_shexp"), f, dim, dtype, &mut rng),
            up: matrix(n("ffn_up_shexp"), f, dim, dtype, &mut rng),
            down: matrix(n("ffn_down_shexp"), dim, f, dtype, &mut rng),
        };
        let gate = matrix(n("ffn_gate_inp_shexp"), 1, dim, GgmlType::F32, &mut rng);
        m.shared = Some(SharedExpert::new(expert, gate, dim).expect("shared expert shapes"));
    }
}

/// CUDA and CPU logits of prefill (100 tokens) and 12 greedy decode steps, with a shared
/// expert of width `f`.
fn check(f: usize) {
    let Some(g) = gpu("plain-attention MoE with a shared expert, cuda vs cpu") else { return };
    drop(g);
    let cfg = small_moe(4);
    let mut w = dustoff::model::synth::random_weights(&cfg, GgmlType::Q4K, 11);
    add_shared_experts(&mut w, cfg.dim, f, GgmlType::Q4K, 12);
    assert!(w.layers.iter().any(|l| l.moe.as_ref().is_some_and(|m| m.shared.is_some())));
    assert!(cfg.layer_kinds().iter().all(|k| k.mixer == dustoff::model::layer::MixerKind::Attention));
    let mut gb = CudaBackend::new(cfg.clone(), &w, &opts(8)).expect("CUDA backend");
    let vocab = cfg.vocab_size as u32;
    let mut cb = dustoff::backend::cpu::CpuBackend::new(cfg, w, 8, 16);
    let prompt: Vec<u32> = (0..100).map(|i| (500 + i * 97) % vocab).collect();
    let got = run_greedy(&mut gb, &prompt, 12);
    let want = run_greedy(&mut cb, &prompt, 12);
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        compare("cuda_vs_cpu_moe_logits", i as u64, a, b);
    }
}

/// The shared expert of the routed experts' width and format (the one-stream launches).
#[test]
fn plain_moe_shared_expert_of_expert_width_matches_cpu() {
    check(256);
}

/// A shared expert of its own width (run apart after the routed experts).
#[test]
fn plain_moe_shared_expert_of_other_width_matches_cpu() {
    check(512);
}
