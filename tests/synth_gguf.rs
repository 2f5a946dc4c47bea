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

    let run = Command::new(bin())
        .args(["generate", "--device", "cpu", "--prompt", "Hello", "--max-tokens", "4", "--model"])
        .arg(&a)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert!(err.contains("30 layers, width 576, 9 heads / 3 KV heads, vocab 49152"), "{err}");
    assert!(err.contains("generated 4 tokens"), "{err}");

    assert!(synth(&b, "3").status.success());
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), "same seed, same file");
    assert!(synth(&b, "4").status.success());
    assert_ne!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), "another seed, other weights");

    let bad = Command::new(bin())
        .args(["synth", "--shape", "qwen3.5-9b", "--tokenizer", "x", "--output"])
        .arg(dir.join("c.gguf"))
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("hybrid"));
    std::fs::remove_dir_all(&dir).ok();
}
