//! `dustoff eval --device cuda` (batched windows, the head-only tap) against `--device cpu` on
//! the tiny reference models of the four 2026 families (MoE, Gated DeltaNet hybrids, their
//! shared experts): a Q8_0 file made from each F16 source scored against that source, the
//! built-in text four times over in windows of 64 tokens (36 windows: batches of 8, and one
//! window at a time). Random weights give perplexities of 1e7-1e9 (CPU, measured) and Q8_0 a mean KL of 0.06-0.36 on these models (docs/BENCHMARKS.md), so the
//! device's F16 products (`cuda_vs_cpu_logits`: 2e-2 relative on the logits) move each number
//! less than the tolerances below (the hybrid models' GPU logits are within 5e-2 absolute of
//! the reference, qwen35.rs; a mean NLL of ~17-20 nats moves by about that at most), while a
//! window's rows taken from another position or sequence would move the mean NLL by nats, the
//! perplexity by orders of magnitude. The bounds are set before a first GPU run (none was at
//! hand when this test was written); the test prints every number it compares, so a run shows
//! how much room they leave.

use dustoff::commands::eval::{self, EvalArgs, EvalSummary, BUILTIN_TEXT};
use dustoff::commands::quantize::{run as quantize, QuantizeArgs};

use super::{common, gpu};

/// Relative tolerance of the perplexities (the reference's and the Q8_0 file's), GPU vs CPU.
const PPL_REL: f64 = 0.05;
/// Relative tolerance of the mean KL divergence, GPU vs CPU (a router choice that flips
/// between the devices, route_flips.rs, moves a few positions).
const KL_REL: f64 = 0.15;
/// Top-1 agreement, GPU vs CPU, in shares of the scored positions.
const TOP1_ABS: f64 = 0.04;
/// The GPU one window at a time against eight at a time (other step shapes, the same F16
/// rounding of every product's input).
const BATCH_PPL_REL: f64 = 0.01;

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(f64::MIN_POSITIVE)
}

fn check(arch: &str, what: &str, got: &EvalSummary, want: &EvalSummary, ppl_tol: f64) {
    assert_eq!((got.windows, got.scored_positions), (want.windows, want.scored_positions), "{arch} {what}");
    let (gr, wr) = (got.reference.as_ref().unwrap(), want.reference.as_ref().unwrap());
    let (gm, wm) = (&got.models[0], &want.models[0]);
    let (gk, wk) = (gm.kl_divergence.as_ref().unwrap(), wm.kl_divergence.as_ref().unwrap());
    eprintln!(
        "{arch} {what}: PPL ref {:.6e} / {:.6e}, PPL q8_0 {:.6e} / {:.6e}, KL mean {:.6} / {:.6}, top-1 {:.4} / {:.4}",
        gr.perplexity,
        wr.perplexity,
        gm.perplexity,
        wm.perplexity,
        gk.mean,
        wk.mean,
        gm.top1_agreement.unwrap(),
        wm.top1_agreement.unwrap()
    );
    assert!(rel(gr.perplexity, wr.perplexity) <= ppl_tol, "{arch} {what}: reference perplexity");
    assert!(rel(gm.perplexity, wm.perplexity) <= ppl_tol, "{arch} {what}: Q8_0 perplexity");
    assert!(wk.mean > 0.0 && rel(gk.mean, wk.mean) <= KL_REL, "{arch} {what}: mean KL");
    let top1 = (gm.top1_agreement.unwrap() - wm.top1_agreement.unwrap()).abs();
    assert!(top1 <= TOP1_ABS, "{arch} {what}: top-1 agreement");
}

#[test]
fn cuda_eval_of_batched_windows_matches_the_cpu_on_every_family() {
    let Some(g) = gpu("eval --device cuda") else { return };
    drop(g);
    let dir = std::env::temp_dir().join(format!("dustoff-gpu-eval-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("text.txt");
    std::fs::write(&text, [BUILTIN_TEXT; 4].join("\n\n")).unwrap();
    for arch in ["qwen3_moe", "qwen3_5", "qwen3_5_moe", "qwen3_next"] {
        let src = common::arch_dir(arch).join(format!("{arch}-f16.gguf"));
        let q8 = dir.join(format!("{arch}-q8_0.gguf"));
        let _ = std::fs::remove_file(&q8);
        let qa = QuantizeArgs {
            model: src.clone(),
            output: q8.clone(),
            qtype: "q8_0".into(),
            device: "cpu".into(),
            ..Default::default()
        };
        quantize(&qa).unwrap_or_else(|e| panic!("{arch}: quantize: {e:#}"));
        let args = |device: &str, batch_windows| EvalArgs {
            models: vec![q8.clone()],
            reference: Some(src.clone()),
            text: Some(text.clone()),
            ctx: 64,
            max_tokens: 100_000,
            device: device.into(),
            batch_windows,
            ..EvalArgs::default()
        };
        let cpu = eval::run(&args("cpu", 8)).unwrap_or_else(|e| panic!("{arch}: eval on the CPU: {e:#}"));
        let cuda = eval::run(&args("cuda", 8)).unwrap_or_else(|e| panic!("{arch}: eval on the GPU: {e:#}"));
        assert!(cpu.windows > 8, "{arch}: {} windows, more than one batch wanted", cpu.windows);
        assert_eq!(cuda.device, "cuda:0");
        check(arch, "cuda vs cpu", &cuda, &cpu, PPL_REL);
        let one = eval::run(&args("cuda", 1)).unwrap_or_else(|e| panic!("{arch}: eval on the GPU, 1 window: {e:#}"));
        check(arch, "cuda 1 vs 8 windows", &one, &cuda, BATCH_PPL_REL);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
