//! Commands that run no model read only the tokenizer: a vocab-only GGUF (llama.cpp's
//! `ggml-vocab-qwen35.gguf`, no tensors) works for `tokenize` and `run --dry-run`.

mod common;

use std::process::Command;

use common::*;

fn vocab_gguf() -> std::path::PathBuf {
    common::shared_testdata().join("qwen35-vocab/ggml-vocab-qwen35.gguf")
}

#[test]
fn tokenize_reads_a_vocab_only_gguf() {
    let d = tmpdir("vocab-tokenize");
    // "résumé" with decomposed accents: the qwen35 rule keeps each mark with its letter.
    std::fs::write(d.join("in.jsonl"), "{\"id\":\"a\",\"text\":\"re\u{301}sume\u{301}\"}\n").unwrap();
    let out = in_out_cmd(&["tokenize", "--model", vocab_gguf().to_str().unwrap()], &d).output().unwrap();
    assert!(out.status.success(), "tokenize failed: {}", String::from_utf8_lossy(&out.stderr));
    let row: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(d.join("out.jsonl")).unwrap().trim()).unwrap();
    // llama.cpp's ids for this text (ggml-vocab-qwen35.gguf.out, the "résumé" case).
    let inp =
        std::fs::read_to_string(common::shared_testdata().join("qwen35-vocab/ggml-vocab-qwen35.gguf.inp")).unwrap();
    let outp =
        std::fs::read_to_string(common::shared_testdata().join("qwen35-vocab/ggml-vocab-qwen35.gguf.out")).unwrap();
    let idx = inp.split("\n__ggml_vocab_test__\n").position(|t| t == "re\u{301}sume\u{301}").expect("case in the .inp");
    let want: Vec<u64> = outp.split('\n').nth(idx).unwrap().split_whitespace().map(|t| t.parse().unwrap()).collect();
    let got: Vec<u64> = row["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(got, want);
}

#[test]
fn dry_run_reads_a_vocab_only_gguf() {
    let out = Command::new(bin())
        .args(["run", "summarize", "--dry-run", "--json", "--device", "cpu", "--input", "samples/news.jsonl"])
        .arg("--output")
        .arg(tmpdir("vocab-dry").join("out.jsonl"))
        .arg("--model")
        .arg(vocab_gguf())
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "dry run failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["records"].as_u64(), Some(12), "{report}");
    assert_eq!(report["ok"].as_u64(), Some(12), "{report}");
}
