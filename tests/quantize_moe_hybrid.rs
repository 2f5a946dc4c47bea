//! Calibrated quantization of the tiny MoE + hybrid reference models
//! (`../shared/testdata/arch/{qwen3_5_moe,qwen3_next}`): every matrix gets importance from the
//! tokens that reach it (each expert from the tokens routed to it, the shared expert, the
//! attention and Gated DeltaNet projections) except the documented cases (the untied embedding;
//! experts no token was routed to, counted with their fallback), the type mix follows
//! llama.cpp's rules for these families, and the quantized file runs (generate on the CPU, KL
//! divergence against the F16 source reported).

mod common;

use std::path::Path;
use std::process::Command;

use common::{arch_dir, bin, repo, tmpdir};
use dustoff::model::gguf::GgufFile;
use dustoff::model::quant::GgmlType;
use dustoff::quantize::imatrix::Imatrix;

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

/// `dustoff quantize` (q4_k_m, CPU calibration on samples/news.jsonl) with extra arguments;
/// returns its console output (stdout then stderr).
fn quantize(model: &Path, out: &Path, imatrix: &Path, extra: &[&str]) -> String {
    let o = Command::new(bin())
        .args(["quantize", "--device", "cpu", "--calibration"])
        .arg(repo().join("samples/news.jsonl"))
        .arg("--model")
        .arg(model)
        .arg("--output")
        .arg(out)
        .arg("--imatrix-out")
        .arg(imatrix)
        .args(extra)
        .output()
        .unwrap();
    let err = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "quantize {}: {err}", model.display());
    err
}

/// The checks shared by both models. `projections`: matrices of layer 0 (a DeltaNet layer)
/// and of the first attention layer that must be calibrated from their own inputs.
/// `short_leaves_unrouted`: 8 calibration tokens leave some expert of the model unrouted (so
/// the fallback is exercised; with the other model they happen to reach all 96).
fn calibrated_everywhere(name: &str, model: &Path, n_layers: usize, projections: &[&str], short_leaves_unrouted: bool) {
    let d = tmpdir(&format!("quantize-moe-hybrid-{name}"));
    let (out, im) = (d.join("q.gguf"), d.join("imatrix.gguf"));
    let err = quantize(model, &out, &im, &["--verify"]);
    let report = json(&d.join("q.gguf.report.json"));

    // Only the embedding (looked up, never multiplied) is left without importance.
    assert_eq!(report["missing_importance"], serde_json::json!(["token_embd.weight"]), "{name}: {report}");
    assert!(err.contains("without importance: token_embd.weight (an embedding lookup"), "{name}: {err}");
    // Every expert matrix of every layer is accounted for: 8 experts x 3 projections.
    let routed = report["routed_expert_matrices"].as_u64().unwrap() as usize;
    let unrouted = report["unrouted_experts"].as_array().unwrap().len();
    assert_eq!(routed + unrouted, n_layers * 3 * 8, "{name}");
    assert!(routed > n_layers * 3 * 6, "{name}: 859 tokens reach most experts ({routed} routed)");
    assert!(
        err.contains(&format!("{routed} expert matrices from their routed tokens, {unrouted} never routed")),
        "{err}"
    );

    // The importance matrix holds each expert's own sums (its routed tokens) and every
    // projection's, named as the GGUF names the tensors.
    let m = Imatrix::load(&im).unwrap();
    let e = |n: &str| m.entries.get(n).unwrap_or_else(|| panic!("{name}: no importance for {n}"));
    let router = e("blk.0.ffn_gate_inp.weight").count;
    let expert_rows: u64 =
        (0..8).filter_map(|x| m.entries.get(&format!("blk.0.ffn_up_exps.weight[{x}]"))).map(|x| x.count).sum();
    assert_eq!(expert_rows, 2 * router, "{name}: top-2 routing, every token reaches two experts");
    for p in projections {
        assert!(e(p).count > 0, "{name}: {p}");
    }
    for p in ["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp", "ffn_gate_inp_shexp"] {
        assert_eq!(e(&format!("blk.0.{p}.weight")).count, router, "{name}: the shared expert sees every token");
    }

    // llama.cpp's mix for an 8-expert model: attn_v-like (attn_v, attn_qkv) and attn_k Q8_0,
    // attn_output Q5_K (rows of 256 fit); conv taps F32.
    let g = GgufFile::open(&out).unwrap();
    let ty = |n: &str| g.tensor_info(n).unwrap_or_else(|| panic!("{name}: no {n}")).dtype;
    assert_eq!(ty("blk.0.attn_qkv.weight"), GgmlType::Q8_0, "{name}");
    assert_eq!(ty("blk.0.ssm_conv1d.weight"), GgmlType::F32, "{name}");
    assert_eq!(ty("blk.0.ffn_gate_inp.weight"), GgmlType::F32, "{name}");
    assert_eq!(ty(&format!("blk.{}.attn_k.weight", n_layers - 1)), GgmlType::Q8_0, "{name}");
    assert_eq!(ty(&format!("blk.{}.attn_output.weight", n_layers - 1)), GgmlType::Q5K, "{name}");

    // The file runs, and its KL divergence against the source is reported (these random tiny
    // models amplify rounding: llama.cpp's own F16 file is off by up to 5 in log-probs, README).
    let kl = report["verify"]["eval"]["models"][0]["kl_divergence"]["mean"].as_f64().unwrap();
    assert!(kl.is_finite() && kl > 0.0, "{name}: KL {kl}");
    let run = Command::new(bin())
        .args(["generate", "--device", "cpu", "--prompt", "The city council", "--max-tokens", "8", "--model"])
        .arg(&out)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success() && log.contains("generated 8 tokens"), "{name}: {log}");

    // A calibration too short to reach every expert: the unrouted ones are listed with their
    // fallback, exactly those the importance matrix has no tokens for.
    let (out2, im2) = (d.join("short.gguf"), d.join("short-imatrix.gguf"));
    quantize(model, &out2, &im2, &["--calibration-tokens", "8", "--calibration-ctx", "8"]);
    let r2 = json(&d.join("short.gguf.report.json"));
    let m2 = Imatrix::load(&im2).unwrap();
    let listed: Vec<String> =
        r2["unrouted_experts"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    assert_eq!(!listed.is_empty(), short_leaves_unrouted, "{name}: {listed:?}");
    for l in 0..n_layers {
        for p in ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] {
            for x in 0..8 {
                let n = format!("blk.{l}.{p}.weight[{x}]");
                let fallback = if p == "ffn_down_exps" { "uniform" } else { "router input" };
                let is_listed = listed.contains(&format!("{n}: {fallback}"));
                assert_eq!(is_listed, !m2.entries.contains_key(&n), "{name}: {n}");
            }
        }
    }
    std::fs::remove_dir_all(&d).ok();
}

/// Qwen3.5-MoE from its HF directory (converted to F16 first): DeltaNet layers with separate
/// `ssm_beta` / `ssm_alpha`.
#[test]
fn qwen35_moe_from_hf_is_calibrated_in_every_matrix() {
    let projections = [
        "blk.0.attn_qkv.weight",
        "blk.0.attn_gate.weight",
        "blk.0.ssm_beta.weight",
        "blk.0.ssm_alpha.weight",
        "blk.0.ssm_out.weight",
        "blk.1.attn_q.weight",
        "blk.1.attn_k.weight",
        "blk.1.attn_v.weight",
        "blk.1.attn_output.weight",
        "output.weight",
    ];
    calibrated_everywhere("qwen35moe", &arch_dir("qwen3_5_moe").join("hf"), 4, &projections, true);
}

/// Qwen3-Next from llama.cpp's GGUF: its fused `ssm_ba` is one matrix of the file.
#[test]
fn qwen3_next_from_gguf_is_calibrated_in_every_matrix() {
    let projections = [
        "blk.0.attn_qkv.weight",
        "blk.0.attn_gate.weight",
        "blk.0.ssm_ba.weight",
        "blk.0.ssm_out.weight",
        "blk.3.attn_q.weight",
        "blk.3.attn_output.weight",
        "output.weight",
    ];
    calibrated_everywhere("qwen3next", &arch_dir("qwen3_next").join("qwen3_next-f16.gguf"), 4, &projections, false);
}
