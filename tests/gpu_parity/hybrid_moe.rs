//! Qwen3.5-MoE (`qwen35moe`: L F L F) and Qwen3-Next (`qwen3next`: L L L F), hybrid layers
//! with a mixture of experts and a gated shared expert, through the CUDA backend: the
//! reference assertions of tests/arch_qwen35_moe.rs and tests/arch_qwen3_next.rs (all 32
//! greedy tokens, teacher-forced argmax, top-5 logits, with the GPU tolerances of qwen35.rs)
//! for the HF directory and the GGUF; both forms agree on the GPU; the engine gives the CPU's
//! outputs with the prefix cache (device state snapshots) on and off.
//!
//! MoE routing on the GPU sees the F16 rounding of the GPU path (K/V, a chunk's matmul
//! inputs); every expert choice of these prompts has a router gap >= 3e-4 (README), and the
//! whole-model logits are checked, so a flipped choice would fail the logit bounds.

use std::path::PathBuf;

use dustoff::backend::cuda::CudaBackend;
use dustoff::model::loader::{load_model, LoadedModel};

use super::gpu;
use super::qwen35::{arch_dir, check_against_refs_in, cuda, engine_on_cuda_equals_cpu, prefill_then_decode, refs_in};

/// The HF and GGUF forms hold the same values (BF16 -> F16 is exact), so on the GPU, where
/// both round the same activations to F16, their logits differ only by f32 sums in another
/// order (value heads tiled in the qwen35moe GGUF, interleaved in the HF file).
const FORMS_TOL: f64 = 5e-3;

fn model(arch: &str, file: &str) -> LoadedModel {
    let p: PathBuf = arch_dir(arch).join(file);
    load_model(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn forms_agree_on_cuda(arch: &str, gguf: &str) {
    let refs = refs_in(&arch_dir(arch));
    let (hf, gg) = (model(arch, "hf"), model(arch, gguf));
    let (mut a, mut b): (CudaBackend, CudaBackend) = (cuda(&hf, 16), cuda(&gg, 16));
    let mut worst = 0f64;
    for r in refs.iter().take(3) {
        let (la, lb) = (prefill_then_decode(&mut a, r), prefill_then_decode(&mut b, r));
        for (i, (x, y)) in la.iter().zip(&lb).enumerate() {
            let d = x.iter().zip(y).map(|(&p, &q)| (p as f64 - q as f64).abs()).fold(0.0, f64::max);
            assert!(d < FORMS_TOL, "{arch} {}: step {i}: HF and GGUF logits differ by {d} on the GPU", r["name"]);
            worst = worst.max(d);
        }
    }
    eprintln!("{arch}: HF vs GGUF on the GPU: largest |logit difference| {worst:.2e}");
}

#[test]
fn qwen35moe_gguf_on_cuda_matches_transformers() {
    let Some(_g) = gpu("qwen35moe gguf") else { return };
    check_against_refs_in(&refs_in(&arch_dir("qwen3_5_moe")), &model("qwen3_5_moe", "qwen3_5_moe-f16.gguf"), "gguf");
}

#[test]
fn qwen35moe_hf_directory_on_cuda_matches_transformers() {
    let Some(_g) = gpu("qwen35moe hf") else { return };
    check_against_refs_in(&refs_in(&arch_dir("qwen3_5_moe")), &model("qwen3_5_moe", "hf"), "hf");
}

#[test]
fn qwen35moe_hf_and_gguf_agree_on_cuda() {
    let Some(_g) = gpu("qwen35moe forms") else { return };
    forms_agree_on_cuda("qwen3_5_moe", "qwen3_5_moe-f16.gguf");
}

#[test]
fn qwen35moe_engine_on_cuda_same_output_with_prefix_cache_on_and_off() {
    let Some(_g) = gpu("qwen35moe engine") else { return };
    let m = model("qwen3_5_moe", "qwen3_5_moe-f16.gguf");
    engine_on_cuda_equals_cpu(&refs_in(&arch_dir("qwen3_5_moe")), &m);
}

#[test]
fn qwen3next_gguf_on_cuda_matches_transformers() {
    let Some(_g) = gpu("qwen3next gguf") else { return };
    check_against_refs_in(&refs_in(&arch_dir("qwen3_next")), &model("qwen3_next", "qwen3_next-f16.gguf"), "gguf");
}

#[test]
fn qwen3next_hf_directory_on_cuda_matches_transformers() {
    let Some(_g) = gpu("qwen3next hf") else { return };
    check_against_refs_in(&refs_in(&arch_dir("qwen3_next")), &model("qwen3_next", "hf"), "hf");
}

#[test]
fn qwen3next_hf_and_gguf_agree_on_cuda() {
    let Some(_g) = gpu("qwen3next forms") else { return };
    forms_agree_on_cuda("qwen3_next", "qwen3_next-f16.gguf");
}

#[test]
fn qwen3next_engine_on_cuda_same_output_with_prefix_cache_on_and_off() {
    let Some(_g) = gpu("qwen3next engine") else { return };
    let m = model("qwen3_next", "hf");
    engine_on_cuda_equals_cpu(&refs_in(&arch_dir("qwen3_next")), &m);
}
