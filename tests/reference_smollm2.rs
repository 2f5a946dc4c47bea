//! The CPU backend against the exact float64 reference of the sample model
//! (tests/data/smollm2/README.md explains the data and these assertions).

mod common;

use common::*;
use dustoff::backend::cpu::CpuBackend;
use dustoff::engine::sampler::argmax;
use dustoff::engine::single::SingleSeq;

/// Margin below which two logits count as a near-tie for f32 CPU arithmetic.
const TAU: f64 = 0.02;

fn backend(m: &dustoff::model::loader::LoadedModel) -> CpuBackend {
    CpuBackend::new(m.config.clone(), m.weights.clone(), 64, 16)
}

#[test]
fn free_running_greedy_matches_f64_up_to_first_near_tie() {
    let m = sample_model();
    let mut b = backend(&m);
    for case in read_cases("greedy_cases.jsonl") {
        let id = case["id"].as_str().unwrap();
        let prompt = ids(&case, "prompt_ids");
        let want = ids(&case, "f64_free_greedy_ids");
        let margins = floats(&case, "f64_free_margins");
        let check_len = margins.iter().position(|&m| m < TAU).unwrap_or(want.len());
        let got = free_greedy(&mut b, 0, &prompt, prompt.len() + want.len(), check_len);
        assert_eq!(got, want[..check_len], "case {id}: free-running greedy differs (checked {check_len} tokens)");
    }
}

#[test]
fn teacher_forced_argmax_and_top5_logits_match_f64() {
    let m = sample_model();
    let mut b = backend(&m);
    let mut checked = 0;
    for case in read_cases("greedy_cases.jsonl") {
        let id = case["id"].as_str().unwrap();
        let prompt = ids(&case, "prompt_ids");
        let forced = ids(&case, "llamacpp_greedy_ids");
        let want = ids(&case, "f64_argmax_ids");
        let margins = floats(&case, "f64_tf_margins");
        let top5 = case["f64_top5_first8"].as_array().unwrap();
        let mut seq = SingleSeq::new(&b, 0, prompt.len() + forced.len()).unwrap();
        let mut logits = seq.feed(&mut b, &prompt).unwrap();
        for j in 0..forced.len() {
            if margins[j] >= TAU {
                assert_eq!(argmax(&logits), want[j], "case {id}: teacher-forced argmax at position {j}");
                checked += 1;
            }
            if j < 8 {
                for pair in top5[j].as_array().unwrap() {
                    let tok = pair[0].as_u64().unwrap() as usize;
                    let l = pair[1].as_f64().unwrap();
                    let d = (logits[tok] as f64 - l).abs();
                    assert!(
                        d <= 0.01,
                        "case {id}: position {j} token {tok}: logit {} vs f64 {l} (|d| = {d})",
                        logits[tok]
                    );
                }
            }
            if j + 1 < forced.len() {
                logits = seq.feed(&mut b, &[forced[j]]).unwrap();
            }
        }
    }
    assert!(checked > 500, "only {checked} positions were checked");
}
