//! The engine's tally of its steps against their bound (`engine::step_cost`, the share a GPU job
//! reports): on the CPU backend with the sample model and made-up rates, one request's prefill
//! chunk and decode steps are each counted with the KV they read, the tokens they ran and the
//! positions they attended, and the bound's seconds are the sum of the per-step maxima (at the
//! tally's rates and at a V100's).

mod common;

use common::*;
use dustoff::backend::cpu::CpuBackend;
use dustoff::backend::Backend;
use dustoff::engine::batch::{Engine, EngineConfig, Request};
use dustoff::engine::sampler::SamplingParams;
use dustoff::engine::step_cost::{params_per_token, BoundRates};

#[test]
fn a_request_s_steps_are_tallied_with_what_each_read_and_computed() {
    let m = sample_model();
    let b = CpuBackend::new(m.config.clone(), m.weights.clone(), 64, 16);
    let (weights, kv_pos) = (b.decode_weight_bytes(), b.kv_bytes_per_position());
    let c = m.config.clone();
    // Slow made-up rates, so that the prefill step is bound by arithmetic and decode by bytes.
    let rates = BoundRates { bandwidth: 1e11, flops: Some(1e12) };
    let cfg = EngineConfig { slots: 2, max_batch_tokens: 256, prefix_cache: false, model_fingerprint: m.fingerprint };
    let mut e = Engine::new(b, cfg).unwrap().with_step_bound(rates);
    let prompt: Vec<u32> = (0..40).map(|i| 100 + 7 * i).collect();
    let (p, g) = (prompt.len(), 6usize);
    e.add_request(Request { id: 1, prompt, max_tokens: g, sampling: SamplingParams::greedy(), stop_ids: vec![] })
        .unwrap();
    let done = e.run_to_completion().unwrap();
    assert_eq!(done[0].token_ids.len(), g);
    let mt = e.metrics();
    let t = mt.step_bound.expect("tallied");
    // One prefill step (positions 0..p), then g - 1 decode steps at positions p..p+g-2.
    assert_eq!((t.steps, mt.steps), (g as u64, g as u64));
    let attn_flops = |attended: f64| 4.0 * (c.n_heads * c.head_dim * c.n_kv_layers()) as f64 * attended;
    let per_tok = 2.0 * params_per_token(&c) as f64;
    let mut steps = vec![(p as u64, per_tok * p as f64 + attn_flops((p * (p + 1) / 2) as f64))];
    for k in 1..g {
        steps.push(((p + k) as u64, per_tok + attn_flops((p + k) as f64)));
    }
    let bytes = |read: u64| (weights + read * kv_pos) as f64;
    let bound: f64 = steps.iter().map(|&(r, f)| (bytes(r) / 1e11).max(f / 1e12)).sum();
    assert!((t.bound_seconds - bound).abs() < 1e-9 * bound.max(1.0), "{} vs {bound}", t.bound_seconds);
    let kv_mean = steps.iter().map(|&(r, _)| (r * kv_pos) as f64).sum::<f64>() / g as f64 / 1e9;
    assert!((t.kv_gb_per_step - kv_mean).abs() < 1e-12, "{} vs {kv_mean}", t.kv_gb_per_step);
    assert_eq!(t.flop_bound_steps, steps.iter().filter(|&&(r, f)| f / 1e12 > bytes(r) / 1e11).count() as u64);
    assert!(t.flop_bound_steps >= 1 && t.flop_bound_steps < g as u64, "{t:?}");
    assert!(t.measured_seconds > 0.0 && (t.share - t.bound_seconds / t.measured_seconds).abs() < 1e-12);
    // The same steps at a V100's peak rates, whatever rates the tally was taken at.
    let v100: f64 = steps.iter().map(|&(r, f)| (bytes(r) / 900e9).max(f / 125e12)).sum();
    assert!((t.v100_bound_seconds - v100).abs() < 1e-9 * v100.max(1.0), "{} vs {v100}", t.v100_bound_seconds);
    // The CPU backend reports no device memory.
    assert_eq!(mt.peak_device_bytes, None);
}
