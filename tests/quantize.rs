//! `dustoff quantize` and `dustoff eval` on a tiny random Llama-style HF directory (hf_synth,
//! the sample model's vocabulary, width 64, FFN 256 so `ffn_down` rows fit a K super-block):
//! every type loads back and computes logits close to the F16 model's, the file's blocks are the
//! quantizer's own, calibration round-trips through its file, and bad inputs fail clearly.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use dustoff::backend::cpu::CpuBackend;
use dustoff::commands::convert::{self, ConvertArgs};
use dustoff::commands::eval::{self, EvalArgs};
use dustoff::commands::quantize::{run, QuantizeArgs};
use dustoff::engine::single::SingleSeq;
use dustoff::job::adapters::TokenizerCodec;
use dustoff::job::pipeline::Pipeline;
use dustoff::model::config::Arch;
use dustoff::model::gguf::GgufFile;
use dustoff::model::hf_synth::{write_hf_dir, SynthSpec};
use dustoff::model::loader::{load_model, SAMPLE_MODEL};
use dustoff::model::quant::{dequantize_row, GgmlType};
use dustoff::quantize::blocks::quantize_row_weighted;
use dustoff::quantize::prompts::pipeline_windows;
use dustoff::quantize::row_weights;

const TOKENS: [u32; 6] = [1, 504, 3458, 314, 9156, 28];

fn synth(d: &Path) -> PathBuf {
    let dir = d.join("hf");
    let spec = SynthSpec { ffn_dim: 256, ..SynthSpec::tiny(Arch::Llama, 7) };
    write_hf_dir(&dir, &spec, &repo().join(SAMPLE_MODEL), &mut |_, _| {}).unwrap();
    dir
}

fn f16_reference(d: &Path, hf: &Path) -> PathBuf {
    let out = d.join("ref-f16.gguf");
    convert::run(ConvertArgs { model: hf.to_path_buf(), output: out.clone(), ..Default::default() }).unwrap();
    out
}

fn quantize(hf: &Path, out: &Path, ty: &str) -> dustoff::commands::quantize::QuantizeSummary {
    let a = QuantizeArgs { model: hf.to_path_buf(), output: out.to_path_buf(), qtype: ty.into(), ..Default::default() };
    run(&a).unwrap_or_else(|e| panic!("quantize {ty}: {e:#}"))
}

fn logits_of(path: &Path) -> Vec<f32> {
    let m = load_model(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut b = CpuBackend::new(m.config, m.weights, 2, 16);
    let mut s = SingleSeq::new(&b, 0, TOKENS.len()).unwrap();
    TOKENS.iter().flat_map(|&t| s.feed(&mut b, &[t]).unwrap()).collect()
}

/// `|a - b| / |b|` (L2).
fn rel_diff(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let n: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (d / n).sqrt()
}

fn tensor_type(g: &GgufFile, name: &str) -> GgmlType {
    g.tensor_info(name).unwrap_or_else(|| panic!("{name} missing")).dtype
}

#[test]
fn every_type_loads_back_close_to_the_f16_model_with_the_mix_rules() {
    let d = tmpdir("quantize-types");
    let hf = synth(&d);
    let reference = f16_reference(&d, &hf);
    let want = logits_of(&reference);
    let g_ref = GgufFile::open(&reference).unwrap();
    // (type, bound on the relative L2 difference of the logits from F16's (about 1.5x what was
    // measured on 2026-12-01: 0.010, 0.013, 0.052, 0.064, 0.064, 0.151; a wrong block layout
    // gives ~1), ffn_down of layers 0 and 1, file_type).
    let cases = [
        ("q8_0", 0.02, [GgmlType::Q8_0, GgmlType::Q8_0], 7),
        ("q6_k", 0.025, [GgmlType::Q6K, GgmlType::Q6K], 18),
        ("q5_k_m", 0.08, [GgmlType::Q5K, GgmlType::Q6K], 17),
        ("q4_k_m", 0.12, [GgmlType::Q4K, GgmlType::Q6K], 15),
        ("q4_k_s", 0.12, [GgmlType::Q4K, GgmlType::Q4K], 14),
        ("q4_0", 0.25, [GgmlType::Q4_0, GgmlType::Q4_0], 2),
    ];
    let mut diffs = Vec::new();
    for (ty, bound, downs, ftype) in cases {
        let out = d.join(format!("{ty}.gguf"));
        let s = quantize(&hf, &out, ty);
        let g = GgufFile::open(&out).unwrap();
        assert_eq!(g.get_u64("general.file_type").unwrap(), Some(ftype), "{ty}");
        assert_eq!(g.get_u64("general.quantization_version").unwrap(), Some(2));
        assert_eq!([tensor_type(&g, "blk.0.ffn_down.weight"), tensor_type(&g, "blk.1.ffn_down.weight")], downs, "{ty}");
        assert_eq!(tensor_type(&g, "blk.0.attn_norm.weight"), GgmlType::F32);
        // Width 64 fits no K super-block: those matrices fall back, and the report says so.
        if ty.contains("_k") {
            let want = match ty {
                "q6_k" => GgmlType::Q8_0,
                "q5_k_m" => GgmlType::Q5_1,
                _ => GgmlType::Q5_0,
            };
            assert_eq!(tensor_type(&g, "blk.0.attn_q.weight"), want, "{ty}");
            assert!(
                s.report.fallbacks.iter().any(|f| f.starts_with("blk.0.attn_q.weight: ")),
                "{ty}: {:?}",
                s.report.fallbacks
            );
        }
        // The tied embedding is the output head: Q6_K wanted, Q8_0 for rows of 64.
        assert_eq!(tensor_type(&g, "token_embd.weight"), GgmlType::Q8_0, "{ty}");
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join(format!("{ty}.gguf.report.json"))).unwrap()).unwrap();
        assert_eq!(report["tensors"].as_array().unwrap().len(), g.tensors.len());
        assert!(report["bytes_out"].as_u64().unwrap() < report["bytes_in"].as_u64().unwrap());

        // The blocks in the file are the quantizer's, and decode to its reconstruction.
        let info = g.tensor_info("blk.0.ffn_down.weight").unwrap();
        let src = g_ref.tensor_info("blk.0.ffn_down.weight").unwrap();
        let (rows, cols) = (info.n_rows(), info.row_len());
        let (mut x, mut y, mut dq, mut rw) = (vec![0f32; cols], vec![0f32; cols], vec![0f32; cols], vec![0f32; cols]);
        let rb = info.dtype.row_bytes(cols).unwrap();
        for r in 0..rows {
            dequantize_row(GgmlType::F16, &g_ref.tensor_data(src)[r * cols * 2..(r + 1) * cols * 2], &mut x);
            let mut bytes = Vec::new();
            row_weights(info.dtype, &vec![1.0; cols], &x, &mut rw);
            assert!(quantize_row_weighted(info.dtype, &x, &rw, &mut bytes, &mut y));
            let file_row = &g.tensor_data(info)[r * rb..(r + 1) * rb];
            assert_eq!(bytes, file_row, "{ty}: row {r}");
            dequantize_row(info.dtype, file_row, &mut dq);
            assert!(dq.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty}: row {r}");
        }

        diffs.push((ty, rel_diff(&logits_of(&out), &want), bound));
        std::fs::remove_file(&out).unwrap();
    }
    assert!(diffs.iter().all(|&(_, d, b)| d < b), "relative logit differences from F16 (type, diff, bound): {diffs:?}");
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn calibration_round_trips_through_its_file_and_eval_reports_the_loss() {
    let d = tmpdir("quantize-calibration");
    let hf = synth(&d);
    let reference = f16_reference(&d, &hf);
    let (a_out, b_out, im) = (d.join("cal.gguf"), d.join("reuse.gguf"), d.join("imatrix.gguf"));
    let a = QuantizeArgs {
        model: hf.clone(),
        output: a_out.clone(),
        calibration: Some(repo().join("README.md")),
        calibration_tokens: 96,
        calibration_ctx: 32,
        imatrix_out: Some(im.clone()),
        ..Default::default()
    };
    let s = run(&a).unwrap();
    assert_eq!(s.calibration_tokens, Some(96));
    let q = s.report.tensors.iter().find(|t| t.name == "blk.1.ffn_down.weight").unwrap();
    assert!(q.weighted_relative_error.is_some_and(|e| e > 0.0), "{q:?}");
    assert!(s.report.missing_importance.is_empty(), "{:?}", s.report.missing_importance);
    // The saved matrix reproduces the calibrated file exactly.
    let b =
        QuantizeArgs { calibration: None, imatrix: Some(im.clone()), output: b_out.clone(), imatrix_out: None, ..a };
    run(&b).unwrap();
    assert_eq!(std::fs::read(&a_out).unwrap(), std::fs::read(&b_out).unwrap());
    let g = GgufFile::open(&a_out).unwrap();
    assert_eq!(g.get_str("quantize.imatrix.file").unwrap(), Some(im.to_str().unwrap()));

    let e = eval::run(&EvalArgs {
        models: vec![a_out.clone(), reference.clone()],
        reference: Some(reference.clone()),
        text: Some(repo().join("README.md")),
        ctx: 32,
        max_tokens: 160,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(e.windows, 5);
    assert_eq!(e.scored_positions, 5 * 15);
    let (q, same) = (&e.models[0], &e.models[1]);
    let r = e.reference.as_ref().unwrap();
    // The reference against itself: zero divergence, full agreement, the same perplexity.
    assert_eq!(same.kl_divergence.as_ref().unwrap().max, 0.0);
    assert_eq!(same.top1_agreement, Some(1.0));
    assert_eq!(same.perplexity, r.perplexity);
    let kl = q.kl_divergence.as_ref().unwrap();
    assert!(kl.mean > 0.0 && kl.mean.is_finite() && kl.p99 >= kl.median, "{kl:?}");
    assert!(q.top1_agreement.is_some_and(|t| t > 0.3), "{:?}", q.top1_agreement);
    assert!(r.perplexity > 1.0 && q.perplexity.is_finite());
    std::fs::remove_dir_all(&d).ok();
}

fn cli(args: &[&str]) -> (i32, String) {
    let o = Command::new(bin()).args(args).current_dir(repo()).output().unwrap();
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn bad_inputs_fail_clearly() {
    let d = tmpdir("quantize-errors");
    let out = d.join("o.gguf");
    let o = out.to_str().unwrap();
    let (code, err) = cli(&["quantize", "--model", SAMPLE_MODEL, "--output", o, "--type", "q3_k"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unknown --type \"q3_k\""), "{err}");
    let (code, err) = cli(&["quantize", "--model", SAMPLE_MODEL, "--output", o, "--pipeline", "summarize"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--pipeline needs --calibration"), "{err}");
    // The sample model is Q4_1 already.
    let (code, err) = cli(&["quantize", "--model", SAMPLE_MODEL, "--output", o]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is already quantized (") && err.contains("--allow-requantize"), "{err}");
    assert!(!out.exists());

    // A quantized file cut short: the tensor that no longer fits is named.
    let hf = synth(&d);
    let q = d.join("q.gguf");
    quantize(&hf, &q, "q8_0");
    let bytes = std::fs::read(&q).unwrap();
    let cut = d.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() - 1000]).unwrap();
    let (code, err) = cli(&["quantize", "--model", cut.to_str().unwrap(), "--output", o, "--allow-requantize"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("lies outside the file"), "{err}");

    // An unsupported source type (id 10, Q2_K) in an otherwise valid file.
    let f16 = f16_reference(&d, &hf);
    let mut b = std::fs::read(&f16).unwrap();
    let name = b"blk.0.attn_q.weight";
    let at = b.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    let ty = at + 4 + 2 * 8; // n_dims (u32), two dims (u64), then the type id
    b[ty..ty + 4].copy_from_slice(&10u32.to_le_bytes());
    let bad = d.join("bad-type.gguf");
    std::fs::write(&bad, &b).unwrap();
    let (code, err) = cli(&["quantize", "--model", bad.to_str().unwrap(), "--output", o]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("'blk.0.attn_q.weight' has type id 10"), "{err}");
    assert!(!out.exists());
    std::fs::remove_dir_all(&d).ok();
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

#[test]
fn verify_is_recorded_and_a_kl_bound_fails_the_command() {
    let d = tmpdir("quantize-verify");
    let hf = synth(&d);
    let (q, back) = (d.join("q4_0.gguf"), d.join("back-f16.gguf"));
    let (hs, qs) = (hf.to_str().unwrap(), q.to_str().unwrap());
    // A bound no real quantization meets: exit 1; the file and its report stay, and say why.
    let (code, err) = cli(&["quantize", "--model", hs, "--output", qs, "--type", "q4_0", "--verify-max-kl", "0"]);
    assert_eq!(code, 1, "{err}");
    assert!(q.exists());
    let v = json(&d.join("q4_0.gguf.report.json"))["verify"].clone();
    assert_eq!((v["passed"].as_bool(), v["max_kl"].as_f64()), (Some(false), Some(0.0)), "{v}");
    assert_eq!(v["reference"].as_str(), Some(hs));
    let kl = v["eval"]["models"][0]["kl_divergence"]["mean"].as_f64().unwrap();
    assert!(kl > 0.0 && kl < 1.0, "{v}");
    assert!(v["eval"]["scored_positions"].as_u64().unwrap() > 100, "{v}");

    // GGUF -> GGUF convert --verify: an F16 copy of the Q4_0 file is scored against that file.
    let (code, err) = cli(&["convert", "--model", qs, "--output", back.to_str().unwrap(), "--verify-max-kl", "1e-3"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&d.join("back-f16.gguf.report.json"))["verify"].clone();
    assert_eq!(v["passed"].as_bool(), Some(true), "{v}");
    assert_eq!(v["reference"].as_str(), Some(qs));
    assert!(v["eval"]["models"][0]["kl_divergence"]["mean"].as_f64().unwrap() < 1e-3, "{v}");

    // HF -> GGUF convert --verify: the eval joins the tensor check, in the summary and the report.
    let c = d.join("conv.gguf");
    let s = convert::run(ConvertArgs {
        model: hf.clone(),
        output: c.clone(),
        verify: true,
        verify_tokens: 4,
        verify_max_kl: Some(1e-3),
        ..Default::default()
    })
    .unwrap();
    assert!(s.passed());
    let e = s.verify.unwrap().eval.unwrap();
    let k = e.eval.models[0].kl_divergence.as_ref().unwrap();
    assert!(k.mean < 1e-3 && k.max.is_finite(), "{k:?}");
    let r = json(&s.report);
    assert_eq!(r["verify"]["eval"]["models"][0]["kl_divergence"]["mean"].as_f64(), Some(k.mean));
    assert!(r["tensors"].as_array().is_some_and(|t| !t.is_empty()), "the tensor report is kept");
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn pipeline_calibration_feeds_the_prompts_a_job_feeds() {
    let d = tmpdir("quantize-pipeline");
    let hf = synth(&d);
    let m = load_model(&hf).unwrap();
    let p = Pipeline::resolve("summarize", &repo().join("pipelines")).unwrap();
    let news = repo().join("samples/news.jsonl");
    let records: Vec<serde_json::Value> = std::fs::read_to_string(&news)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let w = pipeline_windows(&m.tokenizer, &p, &news, usize::MAX).unwrap();
    assert_eq!((w.records, w.skipped, w.windows.len()), (records.len(), 0, records.len()));
    // Every window is the job's prompt for its record, token for token.
    let codec = TokenizerCodec(&m.tokenizer);
    for (r, win) in records.iter().zip(&w.windows) {
        let mut fields = serde_json::Map::new();
        fields.insert("text".into(), r["text"].clone());
        let want = p.prompt_ids(&codec, r["id"].as_str().unwrap(), &fields).unwrap();
        assert_eq!(win, &want.ids, "{}", r["id"]);
    }
    // That is the system prompt, the instruction and the document in the chat markup.
    let first = m.tokenizer.decode(&w.windows[0]).unwrap();
    for part in
        [p.spec.prompt.system.as_str(), p.spec.prompt.instruction.as_str(), records[0]["text"].as_str().unwrap()]
    {
        assert!(first.contains(part), "{part:?} not in {first:?}");
    }
    assert!(first.len() > records[0]["text"].as_str().unwrap().len() + 100);
    // The token budget cuts the last prompt taken.
    let budget = w.windows[0].len() + 5;
    let cut = pipeline_windows(&m.tokenizer, &p, &news, budget).unwrap();
    assert_eq!(cut.windows.iter().map(Vec::len).collect::<Vec<_>>(), vec![w.windows[0].len(), 5]);
    assert_eq!(cut.windows[1], w.windows[1][..5]);

    // quantize --pipeline calibrates on exactly those windows, and the report says so.
    let out = d.join("cal.gguf");
    let s = run(&QuantizeArgs {
        model: hf.clone(),
        output: out.clone(),
        calibration: Some(news.clone()),
        pipeline: Some("summarize".into()),
        device: "cpu".into(),
        ..Default::default()
    })
    .unwrap();
    let c = s.calibration.as_ref().unwrap();
    assert_eq!(c.device, "cpu");
    assert_eq!(c.windows, records.len());
    assert_eq!(c.tokens, w.windows.iter().map(|w| w.len() as u64).sum::<u64>());
    assert_eq!(c.prompts.as_ref().map(|p| p.records), Some(records.len()));
    let r = json(&d.join("cal.gguf.report.json"));
    assert_eq!(r["calibration"]["prompts"]["records"].as_u64(), Some(records.len() as u64));
    assert!(r["calibration"]["pipeline"].as_str().is_some_and(|p| p.ends_with("summarize.toml")), "{r}");
    std::fs::remove_dir_all(&d).ok();
}

/// llama.cpp's Python reader (gguf-py) parses dustoff's files and its decoders agree with
/// dustoff's report (scripts/check-gguf.py). Runs where `python3 -c "import gguf"` works (not a
/// CI dependency); elsewhere it says so and passes.
#[test]
fn gguf_py_reads_the_files_and_decodes_them_as_dustoff_does() {
    let has_gguf = Command::new("python3").args(["-c", "import gguf"]).output().is_ok_and(|o| o.status.success());
    if !has_gguf {
        eprintln!("SKIPPED: python3 with the gguf package (gguf-py) is not installed");
        return;
    }
    let d = tmpdir("quantize-gguf-py");
    let hf = synth(&d);
    let reference = f16_reference(&d, &hf);
    for ty in ["q4_k_m", "q4_0"] {
        let out = d.join(format!("{ty}.gguf"));
        quantize(&reference, &out, ty);
        let o = Command::new("python3")
            .arg(repo().join("scripts/check-gguf.py"))
            .args([out.as_os_str(), "--reference".as_ref(), reference.as_os_str()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{ty}: {text}");
        let want_ftype = if ty == "q4_0" { 2 } else { 15 };
        assert!(text.contains(&format!("general.file_type {want_ftype},")), "{ty}: {text}");
        assert!(text.contains("decoded ") && !text.contains("decoded 0 "), "{ty}: {text}");
    }
    std::fs::remove_dir_all(&d).ok();
}
