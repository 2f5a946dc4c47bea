//! `dustoff synth` writes a GGUF the loader runs: the file of a real shape (SmolLM2-135M, whose
//! 576-wide rows make q4_k_m fall back to Q5_0 as llama.cpp does) loads with that shape's
//! config and generates, and the same seed writes the same bytes.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use dustoff::model::gguf::GgufFile;
use dustoff::model::quant::GgmlType;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_dustoff"))
}

/// The reference Qwen3-MoE model's tokenizer (byte-level BPE, 2,048 tokens, ChatML).
fn tokenizer_dir() -> PathBuf {
    let d = common::shared_testdata().join("arch/qwen3_moe/hf");
    assert!(d.join("tokenizer.json").is_file(), "missing {}", d.display());
    d
}

fn synth(out: &Path, seed: &str) -> std::process::Output {
    let tok = tokenizer_dir();
    Command::new(bin())
        .args(["synth", "--shape", "smollm2-135m", "--type", "q4_k_m", "--quiet", "--force", "--seed", seed])
        .arg("--tokenizer")
        .arg(&tok)
        .arg("--output")
        .arg(out)
        .output()
        .unwrap()
}

/// `dustoff generate` on the CPU from `model`, `tokens` tokens; its stderr (it must succeed).
fn generate(model: &Path, tokens: &str) -> String {
    let run = Command::new(bin())
        .args(["generate", "--device", "cpu", "--prompt", "Hello", "--max-tokens", tokens, "--model"])
        .arg(model)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(run.status.success(), "{err}");
    err
}

#[test]
fn a_synthetic_file_loads_with_its_shape_and_generates() {
    let dir = std::env::temp_dir().join(format!("dustoff-synth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (dir.join("a.gguf"), dir.join("b.gguf"));
    let o = synth(&a, "3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("smollm2-135m q4_k_m"));

    let g = GgufFile::open(&a).unwrap();
    assert_eq!(g.get_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(g.get_i64_array("tokenizer.ggml.token_type").unwrap().map(|t| t.len()), Some(49_152));
    let t = |n: &str| g.tensor_info(n).unwrap().dtype;
    assert_eq!(t("blk.0.attn_q.weight"), GgmlType::Q5_0);
    assert_eq!(t("blk.0.attn_norm.weight"), GgmlType::F32);
    assert!(g.tensor_info("output.weight").is_none(), "SmolLM2 ties its head");

    let err = generate(&a, "4");
    assert!(err.contains("30 layers, width 576, 9 heads / 3 KV heads, vocab 49152"), "{err}");
    assert!(err.contains("generated 4 tokens"), "{err}");

    assert!(synth(&b, "3").status.success());
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), "same seed, same file");
    assert!(synth(&b, "4").status.success());
    assert_ne!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), "another seed, other weights");

    let bad = Command::new(bin())
        .args(["synth", "--shape", "qwen9-9b", "--tokenizer"])
        .arg(tokenizer_dir())
        .arg("--output")
        .arg(dir.join("c.gguf"))
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown shape 'qwen9-9b'"));
    std::fs::remove_dir_all(&dir).ok();
}

/// `--layers N` keeps the shape's first N layers at its widths: the file loads as an N-layer
/// model and generates; 0 or more layers than the shape has is a usage error naming the count.
#[test]
fn layers_keeps_the_first_layers_at_full_width() {
    let dir = std::env::temp_dir().join(format!("dustoff-synth-layers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("two.gguf");
    let synth_layers = |n: &str, out: &Path| {
        Command::new(bin())
            .args(["synth", "--shape", "smollm2-135m", "--type", "q8_0", "--quiet", "--force", "--layers", n])
            .arg("--tokenizer")
            .arg(tokenizer_dir())
            .arg("--output")
            .arg(out)
            .output()
            .unwrap()
    };
    let o = synth_layers("2", &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let g = GgufFile::open(&out).unwrap();
    assert_eq!(g.get("llama.block_count").and_then(|v| v.as_u64()), Some(2));
    assert!(g.tensor_info("blk.1.ffn_down.weight").is_some());
    assert!(g.tensor_info("blk.2.ffn_down.weight").is_none(), "only the first two layers");
    assert_eq!(g.tensor_info("blk.0.ffn_down.weight").unwrap().dims, vec![1536, 576], "the shape's widths");
    let name = g.get_str("general.name").unwrap().unwrap_or_default().to_string();
    assert!(name.contains("first 2 of 30 layers"), "{name}");
    let err = generate(&out, "2");
    assert!(err.contains("2 layers, width 576"), "{err}");
    for bad in ["0", "31"] {
        let o = synth_layers(bad, &dir.join("bad.gguf"));
        assert_eq!(o.status.code(), Some(2), "--layers {bad}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(&format!("--layers {bad}: the shape smollm2-135m has 30 layers")), "{err}");
        assert!(!dir.join("bad.gguf").exists());
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A hybrid cut to its first layers keeps its pattern: Qwen3.6-35B-A3B's first four are three
/// linear-attention layers and one full-attention layer, each with its experts. No file is written.
#[test]
fn a_cut_hybrid_keeps_its_layer_pattern() {
    use dustoff::model::shapes::shape;
    use dustoff::model::synth_gguf::{synthetic_kv, synthetic_tensors};
    use dustoff::quantize::mix::QuantType;
    let mut c = shape("qwen3.6-35b-a3b").unwrap();
    c.keep_first_layers(4);
    let names: Vec<String> = synthetic_tensors(&c, QuantType::F16).into_iter().map(|t| t.name).collect();
    let has = |n: &str| names.iter().any(|x| x == n);
    for l in 0..3 {
        assert!(has(&format!("blk.{l}.ssm_out.weight")), "layer {l} is linear attention");
        assert!(!has(&format!("blk.{l}.attn_q.weight")), "layer {l}");
    }
    assert!(has("blk.3.attn_q.weight") && !has("blk.3.ssm_out.weight"), "layer 3 is full attention");
    assert!((0..4).all(|l| has(&format!("blk.{l}.ffn_gate_exps.weight"))));
    assert!(!names.iter().any(|n| n.starts_with("blk.4.")));
    let kv = synthetic_kv(&c, QuantType::F16, "x");
    let get = |k: &str| kv.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(get("qwen35moe.block_count").and_then(|v| v.as_u64()), Some(4));
    assert_eq!(get("qwen35moe.full_attention_interval").and_then(|v| v.as_u64()), Some(4));
}

/// A synthetic hybrid file has llama.cpp's layout: for the shapes of the tiny reference models
/// (their HF configs), the F16 tensor list and the architecture keys are those of llama.cpp's
/// converter output of the same model (`<arch>-f16.gguf`). No file is written.
#[test]
fn hybrid_shapes_have_llama_cpp_tensors_and_keys() {
    use dustoff::model::synth_gguf::{synthetic_kv, synthetic_tensors};
    use dustoff::quantize::mix::QuantType;
    for (dir, file) in [
        ("qwen3_5", "qwen3_5-f16.gguf"),
        ("qwen3_5_moe", "qwen3_5_moe-f16.gguf"),
        ("qwen3_next", "qwen3_next-f16.gguf"),
    ] {
        let d = common::arch_dir(dir);
        let (cfg, _) = dustoff::model::hf::read_config(&d.join("hf")).unwrap();
        let reference = GgufFile::open(d.join(file)).unwrap();
        let mut ours: Vec<(String, Vec<u64>, GgmlType)> = synthetic_tensors(&cfg, QuantType::F16)
            .into_iter()
            .map(|t| (t.name, t.shape.iter().rev().map(|&x| x as u64).collect(), t.dtype))
            .collect();
        let mut want: Vec<(String, Vec<u64>, GgmlType)> =
            reference.tensors.iter().map(|t| (t.name.clone(), t.dims.clone(), t.dtype)).collect();
        ours.sort_by(|a, b| a.0.cmp(&b.0));
        want.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(ours, want, "{dir}");
        let kv = synthetic_kv(&cfg, QuantType::F16, "x");
        let arch = reference.get_str("general.architecture").unwrap().unwrap().to_string();
        for k in reference.metadata_order.iter().filter(|k| k.starts_with(&format!("{arch}."))) {
            let mine = kv.iter().find(|(n, _)| n == k).map(|(_, v)| v);
            assert_eq!(mine, reference.get(k), "{dir}: {k}");
        }
    }
}

/// The real hybrid shapes in the q4_k_m mix: every layer's tensors are there with the
/// checkpoint's widths, the converter's F32 tensors stay F32, the experts are stacked.
#[test]
fn real_hybrid_shapes_list_their_tensors() {
    use dustoff::model::shapes::shape;
    use dustoff::model::synth_gguf::synthetic_tensors;
    use dustoff::quantize::mix::QuantType;
    let find = |t: &[dustoff::model::gguf_writer::TensorOut], n: &str| {
        t.iter().find(|x| x.name == n).unwrap_or_else(|| panic!("no {n}")).clone()
    };
    // Qwen3.6-35B-A3B: 30 DeltaNet layers (2 norms, 9 DeltaNet and 8 MoE tensors), 10
    // attention layers (2 norms, 6 attention and 8 MoE tensors); embedding, head, output norm.
    let c = shape("qwen3.6-35b-a3b").unwrap();
    let t = synthetic_tensors(&c, QuantType::Q4KM);
    assert_eq!(t.len(), 30 * 19 + 10 * 16 + 3);
    let e = find(&t, "blk.0.ffn_gate_exps.weight");
    assert_eq!((e.shape.clone(), e.dtype), (vec![256, 512, 2048], GgmlType::Q4K));
    assert_eq!(find(&t, "blk.0.ffn_gate_inp.weight").dtype, GgmlType::F32);
    assert_eq!(find(&t, "blk.0.ssm_conv1d.weight").shape, vec![8192, 4]);
    assert_eq!(find(&t, "blk.0.ssm_conv1d.weight").dtype, GgmlType::F32);
    assert_eq!(find(&t, "blk.0.attn_qkv.weight").shape, vec![8192, 2048]);
    assert_eq!(find(&t, "blk.3.attn_q.weight").shape, vec![8192, 2048]);
    assert_eq!(find(&t, "blk.0.ffn_gate_inp_shexp.weight").shape, vec![1, 2048]);
    assert_eq!(find(&t, "output.weight").dtype, GgmlType::Q6K);
    // Qwen3.5-27B: 48 value heads of 128, dense FFN of 17,408.
    let t = synthetic_tensors(&shape("qwen3.5-27b").unwrap(), QuantType::Q4KM);
    assert_eq!(find(&t, "blk.0.attn_gate.weight").shape, vec![6144, 5120]);
    assert_eq!(find(&t, "blk.0.ssm_out.weight").shape, vec![5120, 6144]);
    assert_eq!(find(&t, "blk.0.ffn_down.weight").shape, vec![5120, 17408]);
    assert_eq!(find(&t, "blk.63.attn_k.weight").shape, vec![1024, 5120]);
    let t = synthetic_tensors(&shape("qwen3.5-9b").unwrap(), QuantType::Q4KM);
    assert_eq!(t.iter().filter(|x| x.name.ends_with("ssm_a")).count(), 24);
}

/// SIGINT while the tensors are written: synth stops before the next tensor, removes its
/// `.partial` file and exits 4 (the same path quantize and convert write through).
#[test]
fn an_interrupt_removes_the_partial_file_and_exits_4() {
    let dir = std::env::temp_dir().join(format!("dustoff-synth-int-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("big.gguf");
    let partial = dir.join("big.gguf.partial");
    // 8.7 GB of random Q8_0 tensors: the signal comes long before the last one.
    let mut child = Command::new(bin())
        .args(["synth", "--shape", "qwen3-8b", "--type", "q8_0", "--quiet", "--tokenizer"])
        .arg(tokenizer_dir())
        .arg("--output")
        .arg(&out)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::fs::metadata(&partial).map_or(0, |m| m.len()) < 64 << 20 {
        assert!(child.try_wait().unwrap().is_none(), "synth ended before it was interrupted");
        assert!(std::time::Instant::now() < deadline, "no partial file within 2 minutes");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let k = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(k.success());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(4), "{err}");
    assert!(err.contains("interrupted by SIGINT/SIGTERM before") && err.contains("nothing was written"), "{err}");
    assert!(!partial.exists() && !out.exists(), "the partial file is removed and no output appears");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A synthetic MoE file routes as a trained model does: in each layer a chunk of prose reaches
/// nearly every expert and no expert takes most of it (`DUSTOFF_ROUTE_STATS=1` on the CPU). Files
/// written before the embedding and attention-output scales of `synth_scale::Scale` sent 405-510
/// of a 512-token chunk to one expert from the first layers on (34-107 of 128 experts used), so
/// their MoE timings were not a real model's.
#[test]
fn a_synthetic_moe_file_spreads_a_chunk_over_the_experts() {
    let dir = common::tmpdir("synth-routing");
    let out = dir.join("q30-3l.gguf");
    let o = Command::new(bin())
        .args(["synth", "--shape", "qwen3-30b-a3b", "--layers", "3", "--quiet", "--force", "--tokenizer"])
        .arg(tokenizer_dir())
        .arg("--output")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Prose: the sample job's records, one after another (~900 tokens of this tokenizer).
    let news = std::fs::read_to_string(common::repo().join("samples/news.jsonl")).unwrap();
    let text: Vec<String> = news
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["text"].as_str().map(str::to_owned))
        .collect();
    let run = Command::new(bin())
        .env("DUSTOFF_ROUTE_STATS", "1")
        .args(["generate", "--device", "cpu", "--max-tokens", "1", "--model"])
        .arg(&out)
        .arg("--prompt")
        .arg(text.join(" "))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert_spread(&err, 3);
    std::fs::remove_dir_all(&dir).ok();
}

/// The in-memory random model of `bench --synthetic` routes as the files do (the same scales,
/// `model::synth_scale`): with the matrices' scale everywhere one expert took 254 of a 512-token
/// chunk in the second layer and 496 in the third (measured before the change).
#[test]
fn the_in_memory_synthetic_moe_model_spreads_a_chunk_over_the_experts() {
    let run = Command::new(bin())
        .env("DUSTOFF_ROUTE_STATS", "1")
        .args(["bench", "--synthetic", "qwen3-30b-a3b", "--layers", "3", "--dtype", "q8_0", "--device", "cpu"])
        .args(["--prompt-tokens", "512", "--gen-tokens", "1", "--runs", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert!(String::from_utf8_lossy(&run.stdout).contains("synthetic qwen3-30b-a3b (first 3 layers) q8_0"));
    assert_spread(&err, 3);
}

/// Every chunk of 256+ tokens in `DUSTOFF_ROUTE_STATS` lines ("route: N tokens over E of 128
/// experts, at most M to one; ...") reached at least 100 experts with at most a third of its
/// tokens on one, and at least `layers` such chunks were seen.
fn assert_spread(err: &str, layers: usize) {
    let chunks: Vec<(usize, usize, usize)> = err
        .lines()
        .filter_map(|l| l.strip_prefix("route: "))
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some((w.first()?.parse().ok()?, w.get(3)?.parse().ok()?, w.get(9)?.parse().ok()?))
        })
        .filter(|&(n, _, _)| n >= 256)
        .collect();
    assert!(chunks.len() >= layers, "a chunk of 256+ tokens through each of the {layers} layers:\n{err}");
    for (n, used, most) in chunks {
        assert!(used >= 100, "{n} tokens reached only {used} of 128 experts:\n{err}");
        assert!(most * 3 <= n, "one expert took {most} of {n} tokens:\n{err}");
    }
}
