//! Qwen2-MoE on the CPU backend against Hugging Face transformers (float32) references: the tiny
//! random model of `tests/data/arch/qwen2_moe/` (made by `scripts/arch-ref/qwen2moe.py`, whose
//! docs say what it exercises: Q/K/V biases, a dense layer among sparse ones, top-2 of 4
//! experts not renormalised, a gated shared expert wider than the routed ones) in both forms:
//! the HF directory (BF16 safetensors, one tensor per expert) and the GGUF `dustoff convert`
//! writes from it in llama.cpp's `qwen2moe` layout. The assertions and tolerances are those of
//! tests/arch_qwen3_moe.rs (../shared/testdata/arch/README.md explains them):
//! - teacher-forced argmax equal wherever the reference margin is >= 0.02;
//! - free-running greedy equal for all 32 tokens (the generator kept prompt variants whose
//!   greedy margins are >= 0.05 and whose router gaps are >= 3e-4);
//! - logits (`top5`, `prompt_last_logits`, `last_logits`) within 2e-3 absolute;
//! - the two forms agree with each other to 1e-4;
//! - `dustoff generate` gives transformers' greedy tokens from either form.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use dustoff::backend::cpu::CpuBackend;
use dustoff::engine::sampler::argmax;
use dustoff::engine::single::SingleSeq;
use dustoff::model::config::Arch;
use dustoff::model::gguf::GgufFile;
use dustoff::model::loader::{load_model, LoadedModel};
use dustoff::model::quant::GgmlType;
use serde_json::Value as Json;

use common::max_abs_diff;

/// Margin below which two logits count as a near-tie for f32 arithmetic.
const TAU: f64 = 0.02;
/// Absolute logit tolerance against transformers.
const LOGIT_TOL: f64 = 2e-3;
/// HF (BF16 read in f32) vs GGUF (F16 read in f32) of the same weights.
const FORMS_TOL: f64 = 1e-4;

fn data_dir() -> PathBuf {
    common::repo().join("tests/data/arch/qwen2_moe")
}

fn refs() -> Vec<Json> {
    common::read_jsonl(&data_dir().join("refs.jsonl"))
}

fn hf_model() -> LoadedModel {
    load_model(&data_dir().join("hf")).expect("load the HF directory")
}

/// The HF directory converted to GGUF by `dustoff convert` into `dir`.
fn convert_to_gguf(dir: &Path) -> PathBuf {
    use dustoff::commands::convert::{run, ConvertArgs};
    let out = dir.join("qwen2_moe-f16.gguf");
    run(ConvertArgs { model: data_dir().join("hf"), output: out.clone(), ..ConvertArgs::default() }).unwrap();
    out
}

fn gguf_model(name: &str) -> (LoadedModel, PathBuf) {
    let d = common::tmpdir(name);
    let m = load_model(&convert_to_gguf(&d)).expect("load the converted GGUF");
    (m, d)
}

fn backend(m: &LoadedModel) -> CpuBackend {
    CpuBackend::new(m.config.clone(), m.weights.clone(), 16, 16)
}

fn check_against_refs(m: &LoadedModel, form: &str) {
    let mut b = backend(m);
    let (mut worst, mut tf_checked) = (0f64, 0);
    for r in refs() {
        let name = format!("{form} {}", r["name"].as_str().unwrap());
        let prompt = common::ids(&r, "prompt_ids");
        let forced = common::ids(&r, "teacher_forced_ids");
        let enc = m.tokenizer.encode(r["source_text"].as_str().unwrap(), false, true).unwrap();
        assert!(enc.starts_with(&prompt), "{name}: tokenizer output does not start with prompt_ids");

        // Prefill, then the cached greedy continuation: all 32 tokens (margins >= 0.05).
        let mut seq = SingleSeq::new(&b, 0, forced.len()).unwrap();
        let mut logits = seq.feed(&mut b, &prompt).unwrap();
        let d = max_abs_diff(&logits, &common::floats(&r, "prompt_last_logits"));
        assert!(d <= LOGIT_TOL, "{name}: prefill logits differ by {d}");
        worst = worst.max(d);
        let want = common::ids(&r, "greedy_ids");
        assert!(common::floats(&r, "greedy_margins").iter().all(|&g| g >= TAU), "{name}: a greedy near-tie");
        let mut got = Vec::new();
        for i in 0..want.len() {
            got.push(argmax(&logits));
            if i + 1 < want.len() {
                logits = seq.feed(&mut b, &[got[i]]).unwrap();
            }
        }
        assert_eq!(got, want, "{name}: free-running greedy differs");

        // The whole teacher-forced sequence as one prefill: its last logits.
        let mut seq = SingleSeq::new(&b, 0, forced.len()).unwrap();
        let logits = seq.feed(&mut b, &forced).unwrap();
        let d = max_abs_diff(&logits, &common::floats(&r, "last_logits"));
        assert!(d <= LOGIT_TOL, "{name}: last logits of a {}-token prefill differ by {d}", forced.len());
        worst = worst.max(d);

        // Teacher forcing one token at a time: the argmax at every clear position, top-5 logits.
        let argmax_ids = common::ids(&r, "argmax_ids");
        let tf_margins = common::floats(&r, "margins");
        let top5 = r["top5"].as_array().unwrap();
        let mut seq = SingleSeq::new(&b, 0, forced.len()).unwrap();
        for (t, &tok) in forced.iter().enumerate() {
            let logits = seq.feed(&mut b, &[tok]).unwrap();
            if tf_margins[t] >= TAU {
                assert_eq!(argmax(&logits), argmax_ids[t], "{name}: teacher-forced argmax at position {t}");
                tf_checked += 1;
            }
            if let Some(e) = top5.iter().find(|e| e["pos"].as_u64() == Some(t as u64)) {
                let want = common::floats(e, "logits");
                let got: Vec<f32> = common::ids(e, "ids").iter().map(|&i| logits[i as usize]).collect();
                let d = max_abs_diff(&got, &want);
                assert!(d <= LOGIT_TOL, "{name}: top-5 logits at position {t} differ by {d}");
                worst = worst.max(d);
            }
        }
    }
    // 6 prompts, 40 to 232 positions each (766 in all), a few near-ties skipped.
    assert!(tf_checked > 700, "{form}: only {tf_checked} teacher-forced positions were checked");
    eprintln!("{form}: largest logit difference to transformers {worst:.2e}, {tf_checked} argmax positions");
}

#[test]
fn both_forms_load_as_qwen2_moe_with_the_reference_config() {
    let (gg, d) = gguf_model("qwen2moe-config");
    for m in [hf_model(), gg] {
        let c = &m.config;
        assert_eq!(
            (c.arch, c.n_layers, c.dim, c.ffn_dim, c.n_heads, c.n_kv_heads, c.head_dim),
            (Arch::Qwen2Moe, 3, 64, 96, 2, 1, 64)
        );
        assert_eq!((c.vocab_size, c.tied_embeddings, c.rope_theta), (2048, false, 1e6));
        let moe = c.moe.as_ref().expect("an MoE config");
        assert_eq!((moe.n_experts, moe.n_used, moe.expert_ffn_dim, moe.norm_topk_prob), (4, 2, 32, false));
        assert_eq!((moe.shared_ffn_dim, &moe.sparse_layers), (Some(48), &vec![true, false, true]));
        let kinds = c.layer_kinds();
        assert!(kinds[0].has_shared_expert() && !kinds[1].is_sparse() && kinds[2].has_shared_expert());
        for (i, l) in m.weights.layers.iter().enumerate() {
            assert!(l.bq.is_some() && l.bk.is_some() && l.bv.is_some() && l.q_norm.is_none(), "layer {i}");
            match &l.moe {
                None => assert_eq!((i, l.w_gate.rows, l.w_down.cols), (1, 96, 96), "the dense layer"),
                Some(w) => {
                    assert_eq!((w.router.rows, w.experts.len(), w.experts[3].down.cols), (4, 4, 32));
                    let s = w.shared.as_ref().expect("a shared expert in every sparse layer");
                    assert_eq!((s.expert.gate.rows, s.expert.down.cols, s.gate.rows, s.gate.cols), (48, 48, 1, 64));
                    assert_eq!(l.w_gate.rows, 0, "a sparse layer has no dense FFN");
                }
            }
        }
    }
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn hf_directory_matches_transformers() {
    check_against_refs(&hf_model(), "hf");
}

#[test]
fn converted_gguf_matches_transformers_and_the_hf_directory() {
    let (gg, d) = gguf_model("qwen2moe-gguf");
    check_against_refs(&gg, "gguf");
    let hf = hf_model();
    // Same weights: the shared expert and router of the last layer. BF16 -> F16 is exact but
    // for magnitudes below 2^-14, F16 subnormals with an error below 3e-8 (convert counts them);
    // the router and the gate row are F32 in the GGUF (exact).
    let (a, b) = (hf.weights.layers[2].moe.as_ref().unwrap(), gg.weights.layers[2].moe.as_ref().unwrap());
    let (sa, sb) = (a.shared.as_ref().unwrap(), b.shared.as_ref().unwrap());
    let wide = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<_>>();
    let w = max_abs_diff(&sa.expert.down.to_f32_vec(), &wide(sb.expert.down.to_f32_vec()));
    assert!(w < 3e-8, "shared expert down_proj of layer 2 differs by {w}");
    assert!(sa.gate.to_f32_vec() == sb.gate.to_f32_vec(), "shared expert gate of layer 2 differs");
    assert!(a.router.to_f32_vec() == b.router.to_f32_vec(), "router of layer 2 differs");
    let (mut bh, mut bg) = (backend(&hf), backend(&gg));
    for r in refs() {
        let prompt = common::ids(&r, "teacher_forced_ids");
        let lh = SingleSeq::new(&bh, 0, prompt.len()).unwrap().feed(&mut bh, &prompt).unwrap();
        let lg = SingleSeq::new(&bg, 0, prompt.len()).unwrap().feed(&mut bg, &prompt).unwrap();
        let d = max_abs_diff(&lh, &lg.iter().map(|&v| v as f64).collect::<Vec<_>>());
        assert!(d <= FORMS_TOL, "{}: HF and GGUF logits differ by {d}", r["name"]);
    }
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn convert_writes_llama_cpps_qwen2moe_names_and_keys() {
    let d = common::tmpdir("qwen2moe-keys");
    let g = GgufFile::open(convert_to_gguf(&d)).unwrap();
    assert_eq!(g.get_str("general.architecture").unwrap(), Some("qwen2moe"));
    for (k, v) in [
        ("expert_count", 4),
        ("expert_used_count", 2),
        ("expert_feed_forward_length", 32),
        ("expert_shared_feed_forward_length", 48),
        ("feed_forward_length", 96),
    ] {
        assert_eq!(g.get_u64(&format!("qwen2moe.{k}")).unwrap(), Some(v), "{k}");
    }
    assert_eq!(g.get_bool("qwen2moe.expert_weights_norm").unwrap(), Some(false));
    // llama.cpp's loader (src/models/qwen2moe.cpp): per sparse layer the router, the stacked
    // experts and the four shared-expert tensors, GGUF dims innermost first.
    let dims = |n: &str| g.tensor_info(n).unwrap_or_else(|| panic!("{n} missing")).dims.clone();
    for l in [0, 2] {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        assert_eq!(dims(&n("ffn_gate_inp")), [64, 4]);
        assert_eq!(dims(&n("ffn_gate_exps")), [64, 32, 4]);
        assert_eq!(dims(&n("ffn_down_exps")), [32, 64, 4]);
        assert_eq!(dims(&n("ffn_gate_shexp")), [64, 48]);
        assert_eq!(dims(&n("ffn_up_shexp")), [64, 48]);
        assert_eq!(dims(&n("ffn_down_shexp")), [48, 64]);
        assert_eq!(dims(&n("ffn_gate_inp_shexp")), [64, 1]);
        for t in ["ffn_gate_inp", "ffn_gate_inp_shexp"] {
            assert_eq!(g.tensor_info(&n(t)).unwrap().dtype, GgmlType::F32, "{t}");
        }
    }
    assert!(g.tensor_info("blk.1.ffn_gate_inp.weight").is_none() && g.tensor_info("blk.1.ffn_up.weight").is_some());
    assert_eq!(dims("blk.0.attn_q.bias"), [128]);
    std::fs::remove_dir_all(&d).ok();
}

/// `dustoff generate` (CPU, greedy) on `model`: the token ids of every reference prompt.
fn generate_cli(model: &Path, d: &Path) -> Vec<Vec<u32>> {
    let input: String = refs()
        .iter()
        .map(|r| format!("{}\n", serde_json::json!({"id": r["name"], "prompt_ids": r["prompt_ids"]})))
        .collect();
    let (inp, outp) = (d.join("in.jsonl"), d.join("gen.jsonl"));
    std::fs::write(&inp, input).unwrap();
    std::fs::remove_file(&outp).ok();
    let out = Command::new(common::bin())
        .args(["generate", "--device", "cpu", "--max-tokens", "32", "--temperature", "0", "--restart", "--model"])
        .arg(model)
        .arg("--input")
        .arg(&inp)
        .arg("--output")
        .arg(&outp)
        .output()
        .unwrap();
    assert!(out.status.success(), "generate: {}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Json> = common::read_jsonl(&outp);
    rows.iter().map(|row| common::ids(row, "token_ids")).collect()
}

#[test]
fn generate_command_gives_transformers_greedy_tokens_from_both_forms() {
    let d = common::tmpdir("qwen2moe-cli");
    let gguf = convert_to_gguf(&d);
    let r = refs();
    for model in [data_dir().join("hf"), gguf] {
        let got = generate_cli(&model, &d);
        assert_eq!(got.len(), r.len());
        for (g, ref_) in got.iter().zip(&r) {
            // All 32 tokens, or up to an end-of-sequence token the reference also chose.
            let want = common::ids(ref_, "greedy_ids");
            assert_eq!(g[..], want[..g.len()], "{}: {}", model.display(), ref_["name"]);
            assert!(g.len() == 32 || [2045, 2047].contains(&want[g.len()]), "{}", ref_["name"]);
        }
    }
    std::fs::remove_dir_all(&d).ok();
}

/// `dustoff synth` writes the converter's layout: for the reference's config the F16 tensor
/// list and the `qwen2moe.*` keys equal those of the converted file; the real Qwen2-57B-A14B
/// shape (`--shape qwen2-57b-a14b`) lists every layer's shared expert at its own width.
#[test]
fn synth_writes_the_converted_layout_and_the_real_shape() {
    use dustoff::model::shapes::shape;
    use dustoff::model::synth_gguf::{synthetic_kv, synthetic_tensors};
    use dustoff::quantize::mix::QuantType;
    let d = common::tmpdir("qwen2moe-synth");
    let g = GgufFile::open(convert_to_gguf(&d)).unwrap();
    let (cfg, _) = dustoff::model::hf::read_config(&data_dir().join("hf")).unwrap();
    let mut ours: Vec<(String, Vec<u64>, GgmlType)> = synthetic_tensors(&cfg, QuantType::F16)
        .into_iter()
        .map(|t| (t.name, t.shape.iter().rev().map(|&x| x as u64).collect(), t.dtype))
        .collect();
    let mut want: Vec<(String, Vec<u64>, GgmlType)> =
        g.tensors.iter().map(|t| (t.name.clone(), t.dims.clone(), t.dtype)).collect();
    ours.sort_by(|a, b| a.0.cmp(&b.0));
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(ours, want);
    let kv = synthetic_kv(&cfg, QuantType::F16, "x");
    for k in g.metadata_order.iter().filter(|k| k.starts_with("qwen2moe.")) {
        assert_eq!(kv.iter().find(|(n, _)| n == k).map(|(_, v)| v), g.get(k), "{k}");
    }
    std::fs::remove_dir_all(&d).ok();

    let c = shape("qwen2-57b-a14b").unwrap();
    let t = synthetic_tensors(&c, QuantType::Q4KM);
    // Per layer 2 norms, q/k/v/o, 3 biases, the router, 3 stacked experts, 4 shared-expert
    // tensors; embedding, head, output norm.
    assert_eq!(t.len(), 28 * 17 + 3);
    let find = |n: &str| t.iter().find(|x| x.name == n).unwrap_or_else(|| panic!("no {n}")).clone();
    assert_eq!(find("blk.27.ffn_gate_exps.weight").shape, vec![64, 2560, 3584]);
    assert_eq!(find("blk.27.ffn_down_shexp.weight").shape, vec![3584, 20480]);
    assert_eq!(find("blk.0.ffn_up_shexp.weight").shape, vec![20480, 3584]);
    let gate_row = find("blk.0.ffn_gate_inp_shexp.weight");
    assert_eq!((gate_row.shape, gate_row.dtype), (vec![1, 3584], GgmlType::F32), "the converter's F32 gate row");
    assert_eq!(
        (find("blk.0.ffn_gate_inp.weight").dtype, find("blk.0.attn_k.bias").dtype),
        (GgmlType::F32, GgmlType::F32)
    );
    let kv = synthetic_kv(&c, QuantType::Q4KM, "x");
    let get = |k: &str| kv.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(get("qwen2moe.expert_shared_feed_forward_length").and_then(|v| v.as_u64()), Some(20480));
}

/// `dustoff quantize` takes the HF directory (converted to F16 first, as `convert` does) and
/// writes a Q8_0 file that loads as the same model: the shared experts quantized (their
/// 48-wide down rows, not whole blocks of 32, fall back to F16; the gate row gets the base
/// type, as `quantize::mix` says), the router F32.
#[test]
fn quantize_takes_the_hf_directory() {
    let d = common::tmpdir("qwen2moe-quantize");
    let out = d.join("q8.gguf");
    let o = Command::new(common::bin())
        .args(["quantize", "--type", "q8_0", "--model"])
        .arg(data_dir().join("hf"))
        .arg("--output")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "quantize: {}", String::from_utf8_lossy(&o.stderr));
    let m = load_model(&out).unwrap();
    assert_eq!((m.config.arch, &m.config.moe), (Arch::Qwen2Moe, &hf_model().config.moe));
    for l in [0, 2] {
        let w = m.weights.layers[l].moe.as_ref().unwrap();
        let s = w.shared.as_ref().expect("the shared expert");
        assert_eq!(
            (s.expert.gate.dtype, s.expert.down.dtype, s.gate.dtype),
            (GgmlType::Q8_0, GgmlType::F16, GgmlType::Q8_0)
        );
        assert_eq!(w.router.dtype, GgmlType::F32);
    }
    std::fs::remove_dir_all(&d).ok();
}
