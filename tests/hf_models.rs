//! Hugging Face directories, `convert` (BF16 -> F16) and the Qwen2/Qwen3 paths, on tiny random
//! models written by `hf_synth` with the sample model's vocabulary (2 layers, width 64).

mod common;

use std::collections::HashMap;
use std::path::Path;

use dustoff::backend::cpu::CpuBackend;
use dustoff::commands::convert::{run, ConvertArgs};
use dustoff::engine::single::SingleSeq;
use dustoff::model::config::{Arch, ModelConfig, RopeStyle};
use dustoff::model::gguf::GgufFile;
use dustoff::model::hf_synth::{write_hf_dir, SynthSpec};
use dustoff::model::loader::{load_model, SAMPLE_MODEL};
use dustoff::model::quant::{bf16_to_f32, f32_to_bf16};
use dustoff::model::safetensors::{write_checkpoint, SafetensorsDir, StMeta, StWriteTensor};

const TOKENS: [u32; 5] = [1, 504, 3458, 314, 9156];

/// Writes a synthetic directory; returns its config and the BF16-rounded values of every
/// tensor (captured before they reach the file, so the reference below never reads it).
fn synth(dir: &Path, spec: &SynthSpec) -> (ModelConfig, HashMap<String, Vec<f64>>) {
    let mut vals = HashMap::new();
    let mut keep = |name: &str, v: &mut [f32]| {
        vals.insert(name.to_string(), v.iter().map(|&x| bf16_to_f32(f32_to_bf16(x)) as f64).collect());
    };
    let (cfg, _) = write_hf_dir(dir, spec, &common::repo().join(SAMPLE_MODEL), &mut keep).unwrap();
    (cfg, vals)
}

/// Logits after each of `tokens`, from the model at `path` (GGUF or HF directory) on the CPU.
fn logits_of(path: &Path, tokens: &[u32]) -> Vec<Vec<f32>> {
    let m = load_model(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut b = CpuBackend::new(m.config, m.weights, 4, 16);
    let mut s = SingleSeq::new(&b, 0, tokens.len()).unwrap();
    tokens.iter().map(|&t| s.feed(&mut b, &[t]).unwrap()).collect()
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

// ---- independent reference: plain loops in f64, HF semantics (rotate-half RoPE) ----

fn rms(x: &[f64], g: &[f64], eps: f64) -> Vec<f64> {
    let s = (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter().zip(g).map(|(v, w)| v / s * w).collect()
}

fn matvec(w: &[f64], x: &[f64]) -> Vec<f64> {
    w.chunks(x.len()).map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum()).collect()
}

fn rope_halves(x: &mut [f64], hd: usize, pos: usize, theta: f64) {
    let half = hd / 2;
    for head in x.chunks_mut(hd) {
        for i in 0..half {
            let a = pos as f64 * theta.powf(-(2.0 * i as f64) / hd as f64);
            let (x0, x1) = (head[i], head[i + half]);
            head[i] = x0 * a.cos() - x1 * a.sin();
            head[i + half] = x0 * a.sin() + x1 * a.cos();
        }
    }
}

fn reference_logits(c: &ModelConfig, w: &HashMap<String, Vec<f64>>, tokens: &[u32]) -> Vec<Vec<f64>> {
    let (d, hd, eps, theta) = (c.dim, c.head_dim, c.rms_eps as f64, c.rope_theta as f64);
    let g = |n: &str| w.get(n).unwrap_or_else(|| panic!("{n}")).as_slice();
    let emb = g("model.embed_tokens.weight");
    let mut xs: Vec<Vec<f64>> = tokens.iter().map(|&t| emb[t as usize * d..(t as usize + 1) * d].to_vec()).collect();
    for l in 0..c.n_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        let (mut ks, mut vs, mut outs) = (Vec::new(), Vec::new(), Vec::new());
        for (pos, x) in xs.iter().enumerate() {
            let h = rms(x, g(&p("input_layernorm.weight")), eps);
            let mut q = matvec(g(&p("self_attn.q_proj.weight")), &h);
            let mut k = matvec(g(&p("self_attn.k_proj.weight")), &h);
            let mut v = matvec(g(&p("self_attn.v_proj.weight")), &h);
            if c.arch == Arch::Qwen2 {
                for (buf, n) in [(&mut q, "q"), (&mut k, "k"), (&mut v, "v")] {
                    buf.iter_mut().zip(g(&p(&format!("self_attn.{n}_proj.bias")))).for_each(|(a, b)| *a += b);
                }
            }
            if c.arch == Arch::Qwen3 {
                q = q.chunks(hd).flat_map(|hq| rms(hq, g(&p("self_attn.q_norm.weight")), eps)).collect();
                k = k.chunks(hd).flat_map(|hk| rms(hk, g(&p("self_attn.k_norm.weight")), eps)).collect();
            }
            rope_halves(&mut q, hd, pos, theta);
            rope_halves(&mut k, hd, pos, theta);
            ks.push(k);
            vs.push(v);
            let group = c.n_heads / c.n_kv_heads;
            let mut att = vec![0f64; c.n_heads * hd];
            for h in 0..c.n_heads {
                let kv = h / group;
                let qh = &q[h * hd..(h + 1) * hd];
                let scores: Vec<f64> = (0..=pos)
                    .map(|j| {
                        qh.iter().zip(&ks[j][kv * hd..(kv + 1) * hd]).map(|(a, b)| a * b).sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (ej, vj) in e.iter().zip(&vs) {
                    for (a, vv) in att[h * hd..(h + 1) * hd].iter_mut().zip(&vj[kv * hd..(kv + 1) * hd]) {
                        *a += ej / z * vv;
                    }
                }
            }
            outs.push(matvec(g(&p("self_attn.o_proj.weight")), &att));
        }
        for (x, o) in xs.iter_mut().zip(outs) {
            x.iter_mut().zip(o).for_each(|(a, b)| *a += b);
            let h = rms(x, g(&p("post_attention_layernorm.weight")), eps);
            let gate = matvec(g(&p("mlp.gate_proj.weight")), &h);
            let up = matvec(g(&p("mlp.up_proj.weight")), &h);
            let act: Vec<f64> = gate.iter().zip(&up).map(|(a, b)| a / (1.0 + (-a).exp()) * b).collect();
            x.iter_mut().zip(matvec(g(&p("mlp.down_proj.weight")), &act)).for_each(|(a, b)| *a += b);
        }
    }
    let head = if c.tied_embeddings { emb } else { g("lm_head.weight") };
    xs.iter().map(|x| matvec(head, &rms(x, g("model.norm.weight"), eps))).collect()
}

#[test]
fn bf16_directories_match_an_f64_reference_for_every_arch() {
    for (i, arch) in [Arch::Qwen2, Arch::Qwen3, Arch::Llama].into_iter().enumerate() {
        let dir = common::tmpdir(&format!("ref-{}", arch.name()));
        let (cfg, vals) = synth(&dir, &SynthSpec::tiny(arch, 10 + i as u64));
        assert_eq!(cfg.rope_style, RopeStyle::Halves);
        let got = logits_of(&dir, &TOKENS);
        let want = reference_logits(&cfg, &vals, &TOKENS);
        let mut worst = 0f64;
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.len(), w.len());
            worst = g.iter().zip(w).map(|(a, b)| (*a as f64 - b).abs()).fold(worst, f64::max);
        }
        let scale = want.iter().flatten().map(|v| v.abs()).fold(0.0, f64::max);
        assert!(scale > 0.5, "{arch:?}: logits too small to test anything ({scale})");
        assert!(worst < 2e-4 * scale.max(1.0), "{arch:?}: max |dustoff - reference| = {worst} (scale {scale})");
        std::fs::remove_dir_all(&dir).ok();
    }
}

fn convert(
    model: &Path,
    output: &Path,
    verify: bool,
    allow_lossy: bool,
) -> anyhow::Result<dustoff::commands::convert::ConvertSummary> {
    run(ConvertArgs {
        model: model.to_path_buf(),
        output: output.to_path_buf(),
        verify,
        allow_lossy,
        verify_tokens: 8,
        ..ConvertArgs::default()
    })
}

#[test]
fn same_model_as_safetensors_and_as_gguf_gives_the_same_logits() {
    for (i, arch) in [Arch::Llama, Arch::Qwen2, Arch::Qwen3].into_iter().enumerate() {
        let root = common::tmpdir(&format!("gguf-{}", arch.name()));
        let src = root.join("src");
        let mut spec = SynthSpec::tiny(arch, 20 + i as u64);
        if arch == Arch::Llama {
            // Llama 3 RoPE scaling travels as rope_freqs.weight in GGUF.
            spec.rope_scaling = Some(serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}));
            spec.tied = false;
        }
        synth(&src, &spec);
        let gguf = root.join("model.gguf");
        let s = convert(&src, &gguf, true, false).unwrap();
        let v = s.verify.as_ref().unwrap();
        assert_eq!((v.values_mismatched, v.representable_mismatched), (0, 0), "{arch:?}");
        assert_eq!(v.top1_agreement, 1.0, "{arch:?}: {v:?}");
        assert!(root.join("model.gguf.report.json").is_file(), "the report follows the output's name");

        let hf = logits_of(&src, &TOKENS);
        let gg = logits_of(&gguf, &TOKENS);
        let d = max_diff(&hf, &gg);
        assert!(d < 2e-3, "{arch:?}: safetensors vs GGUF logits differ by {d}");

        // The GGUF is a llama.cpp-style file: metadata keys, tensor names, RoPE layout, tokenizer.
        let g = GgufFile::open(&gguf).unwrap();
        let a = arch.name();
        assert_eq!(g.get_str("general.architecture").unwrap(), Some(a));
        assert_eq!(g.get_u64(&format!("{a}.block_count")).unwrap(), Some(2));
        assert_eq!(g.get_u64(&format!("{a}.attention.head_count_kv")).unwrap(), Some(2));
        assert!(g.tensor_info("blk.1.ffn_down.weight").is_some());
        assert_eq!(g.tensor_info("output.weight").is_some(), !spec.tied);
        assert_eq!(g.tensor_info("blk.0.attn_q.bias").is_some(), arch == Arch::Qwen2);
        assert_eq!(g.tensor_info("blk.0.attn_k_norm.weight").is_some(), arch == Arch::Qwen3);
        assert_eq!(g.tensor_info("rope_freqs.weight").is_some(), arch == Arch::Llama);
        assert_eq!(
            g.get_str("tokenizer.ggml.pre").unwrap(),
            Some(if arch == Arch::Llama { "smollm" } else { "qwen2" })
        );
        let m = load_model(&gguf).unwrap();
        let want_style = if arch == Arch::Llama { RopeStyle::Adjacent } else { RopeStyle::Halves };
        assert_eq!(m.config.rope_style, want_style);
        let h = load_model(&src).unwrap();
        let text = "Hello world, 2024 <|im_end|> ünïcode\n\n";
        assert_eq!(m.tokenizer.encode(text, false, true).unwrap(), h.tokenizer.encode(text, false, true).unwrap());
        assert_eq!(m.tokenizer.chat_template(), h.tokenizer.chat_template());
        assert_eq!(m.tokenizer.eos_ids()[0], h.tokenizer.eos_ids()[0]);

        // And as an F16 safetensors directory.
        let out = root.join("f16");
        let s = convert(&src, &out, true, false).unwrap();
        assert_eq!(s.verify.as_ref().unwrap().values_mismatched, 0);
        let d = max_diff(&hf, &logits_of(&out, &TOKENS));
        assert!(d < 2e-3, "{arch:?}: BF16 vs F16 directory logits differ by {d}");
        std::fs::remove_dir_all(&root).ok();
    }
}

#[test]
fn sharded_checkpoint_gives_the_same_logits_as_one_file() {
    let root = common::tmpdir("sharded");
    let mut spec = SynthSpec::tiny(Arch::Qwen3, 7);
    synth(&root.join("one"), &spec);
    spec.shards = 3;
    synth(&root.join("three"), &spec);
    assert_eq!(SafetensorsDir::open(&root.join("three")).unwrap().files.len(), 3);
    assert!(root.join("three/model.safetensors.index.json").is_file());
    assert_eq!(logits_of(&root.join("one"), &TOKENS[..3]), logits_of(&root.join("three"), &TOKENS[..3]));
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn conversion_policy_on_planted_values() {
    let root = common::tmpdir("planted");
    let src = root.join("src");
    let planted = [65504.0f32, 65520.0, 1e6, -1e6, 1e-8, f32::NAN];
    let target = "model.layers.0.mlp.up_proj.weight";
    let mut plant = |name: &str, v: &mut [f32]| {
        if name == target {
            v[..planted.len()].copy_from_slice(&planted);
        }
    };
    write_hf_dir(&src, &SynthSpec::tiny(Arch::Llama, 3), &common::repo().join(SAMPLE_MODEL), &mut plant).unwrap();

    // Refused without --allow-lossy; the report names the tensor and counts every case.
    let gguf = root.join("m.gguf");
    let e = convert(&src, &gguf, false, false).unwrap_err().to_string();
    assert!(e.contains(target) && e.contains("--allow-lossy"), "{e}");
    assert!(!gguf.exists(), "a refused conversion leaves no output");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("m.gguf.report.json")).unwrap()).unwrap();
    let t = report["tensors"].as_array().unwrap().iter().find(|t| t["name"] == target).unwrap();
    // 65504 and 65520 are stored as BF16 65536: beyond F16's range like +-1e6.
    assert_eq!(
        (t["clamped"].as_u64(), t["underflowed"].as_u64(), t["non_finite"].as_u64()),
        (Some(4), Some(1), Some(1))
    );
    assert_eq!((t["from"].as_str(), t["to"].as_str(), t["lossy"].as_bool()), (Some("BF16"), Some("F16"), Some(true)));
    assert_eq!(t["shape"], serde_json::json!([128, 64]));
    assert_eq!(report["written"], false);

    // With --allow-lossy: clamped to +-65504, 1e-8 -> 0, NaN kept (never hidden).
    let s = convert(&src, &gguf, false, true).unwrap();
    assert_eq!(s.lossy_tensors, vec![target.to_string()]);
    let g = GgufFile::open(&gguf).unwrap();
    let row: Vec<f32> = g.tensor_data(g.tensor_info("blk.0.ffn_up.weight").unwrap())[..12]
        .chunks(2)
        .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect();
    assert_eq!(&row[..5], &[65504.0, 65504.0, 65504.0, -65504.0, 0.0]);
    assert!(row[5].is_nan());

    // Verify re-reads every tensor against the policy (exact where representable).
    let out = root.join("f16");
    let s = convert(&src, &out, true, true).unwrap();
    let v = s.verify.unwrap();
    assert_eq!((v.values_mismatched, v.representable_mismatched), (0, 0));
    assert!(v.values_checked > 3_000_000);
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn malformed_directories_give_errors_naming_the_file_and_tensor() {
    let root = common::tmpdir("malformed");
    let dir = root.join("m");
    synth(&dir, &SynthSpec::tiny(Arch::Qwen2, 5));
    let cfg_path = dir.join("config.json");
    let good_cfg = std::fs::read_to_string(&cfg_path).unwrap();
    let err = |p: &Path| load_model(p).err().map(|e| e.to_string()).unwrap_or_default();

    std::fs::write(&cfg_path, "{\"architectures\": [").unwrap();
    let e = err(&dir);
    assert!(e.contains("config.json") && e.contains("JSON"), "{e}");
    std::fs::write(&cfg_path, good_cfg.replace("\"hidden_size\"", "\"hidden_sizes\"")).unwrap();
    let e = err(&dir);
    assert!(e.contains("config.json") && e.contains("'hidden_size' is missing"), "{e}");

    // Shape mismatch: the config says 96 for the MLP, the tensors are 128 wide.
    std::fs::write(&cfg_path, good_cfg.replace("\"intermediate_size\": 128", "\"intermediate_size\": 96")).unwrap();
    let e = err(&dir);
    assert!(e.contains("model.safetensors") && e.contains("mlp.gate_proj.weight") && e.contains("[128, 64]"), "{e}");
    std::fs::write(&cfg_path, &good_cfg).unwrap();

    // Missing tensor: rewrite the checkpoint without one bias.
    let gone = "model.layers.1.self_attn.k_proj.bias";
    let st = SafetensorsDir::open(&dir).unwrap();
    let keep: Vec<StWriteTensor> = st
        .names()
        .into_iter()
        .filter(|&n| n != gone)
        .map(|n| {
            let (_, shape, bytes) = st.read(n).unwrap();
            StWriteTensor {
                meta: StMeta { name: n.into(), dtype: "BF16", shape: shape.to_vec() },
                data: bytes.to_vec().into(),
            }
        })
        .collect();
    let out = root.join("missing");
    std::fs::create_dir_all(&out).unwrap();
    write_checkpoint(&out, &keep, 1).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(dir.join(f), out.join(f)).unwrap();
    }
    let e = err(&out);
    assert!(e.contains(gone) && e.contains("missing"), "{e}");

    // A tokenizer with an id past the embedding table's rows: refused at load, not when a
    // prompt first holds that id.
    let tok_path = dir.join("tokenizer.json");
    let good_tok = std::fs::read_to_string(&tok_path).unwrap();
    let mut t: serde_json::Value = serde_json::from_str(&good_tok).unwrap();
    let rows = load_model(&dir).unwrap().config.vocab_size;
    t["added_tokens"].as_array_mut().unwrap().push(serde_json::json!({"id": rows, "content": "<|past|>",
        "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}));
    std::fs::write(&tok_path, t.to_string()).unwrap();
    let e = err(&dir);
    assert!(e.contains(&format!("token ids up to {rows}")) && e.contains(&format!("{rows} rows")), "{e}");
    std::fs::write(&tok_path, &good_tok).unwrap();

    // A directory without config.json, and convert's refusal of an existing output.
    let e = err(&root);
    assert!(e.contains("config.json"), "{e}");
    let e = convert(&dir, &out, false, false).unwrap_err().to_string();
    assert!(e.contains("exists"), "{e}");
    std::fs::remove_dir_all(&root).ok();
}

/// Writes a tiny model of each architecture (HF directory + converted GGUF) under
/// `$DUSTOFF_HF_SAMPLES_DIR`, for checks with other tools (gguf-py, llama.cpp):
/// `DUSTOFF_HF_SAMPLES_DIR=/tmp/hf cargo test --release --test hf_models -- --ignored`.
#[test]
#[ignore]
fn write_samples_for_external_tools() {
    let Ok(root) = std::env::var("DUSTOFF_HF_SAMPLES_DIR") else { return };
    let root = Path::new(&root);
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3] {
        let src = root.join(arch.name());
        let _ = std::fs::remove_dir_all(&src);
        let _ = std::fs::remove_file(root.join(format!("{}.gguf", arch.name())));
        synth(&src, &SynthSpec::tiny(arch, 1));
        let s = convert(&src, &root.join(format!("{}.gguf", arch.name())), true, false).unwrap();
        println!("{}", s.to_text());
    }
}

/// Regression: `run` on a Hugging Face directory failed ("Is a directory") because the job
/// fingerprint read the model path as one file. The directory now runs a pipeline job, and a
/// rerun of the same job resumes (same fingerprint) with nothing to do.
#[test]
fn run_job_on_a_hf_directory() {
    let dir = common::tmpdir("run-hf-dir");
    let model = dir.join("model");
    synth(&model, &SynthSpec::tiny(Arch::Qwen3, 77));
    let out = dir.join("out.jsonl");
    let run = || {
        std::process::Command::new(common::bin())
            .args(["run", "summarize", "--device", "cpu", "--input", "samples/news.jsonl", "--model"])
            .arg(&model)
            .arg("--output")
            .arg(&out)
            .current_dir(common::repo())
            .output()
            .unwrap()
    };
    let first = run();
    assert!(first.status.success(), "run on an HF directory: {}", String::from_utf8_lossy(&first.stderr));
    let rows = std::fs::read_to_string(&out).unwrap();
    assert_eq!(rows.lines().count(), 12, "one row per sample record");
    let second = run();
    assert!(second.status.success(), "rerun: {}", String::from_utf8_lossy(&second.stderr));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), rows, "the rerun leaves the output as it was");
    std::fs::remove_dir_all(&dir).ok();
}
