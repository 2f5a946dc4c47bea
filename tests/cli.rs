//! The CLI's machine-readable modes on the real sample model and real files.

mod common;

use std::process::Command;

use common::*;

fn write_lines(path: &std::path::Path, lines: &[serde_json::Value]) {
    let s: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(path, s).unwrap();
}

fn read_lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn tokenize_command_reproduces_every_reference_case() {
    let d = tmpdir("tokenize");
    let cases = read_cases("tokenizer_cases.jsonl");
    let input: Vec<_> = cases
        .iter()
        .map(|c| serde_json::json!({"id": c["id"], "text": c["text"], "add_bos": c["add_bos"], "parse_special": c["parse_special"]}))
        .collect();
    write_lines(&d.join("in.jsonl"), &input);
    let st = in_out_cmd(&["tokenize"], &d).status().unwrap();
    assert!(st.success());
    let out = read_lines(&d.join("out.jsonl"));
    assert_eq!(out.len(), cases.len());
    for (o, c) in out.iter().zip(&cases) {
        assert_eq!(o["id"], c["id"]);
        assert_eq!(o["ids"], c["ids"], "case {}", c["id"]);
    }
}

#[test]
fn generate_command_matches_f64_greedy_and_reports_bad_lines() {
    let d = tmpdir("generate");
    let cases = read_cases("greedy_cases.jsonl");
    let mut input: Vec<_> =
        cases.iter().map(|c| serde_json::json!({"id": c["id"], "prompt_ids": c["prompt_ids"]})).collect();
    input.push(serde_json::json!({"id": "no-prompt"}));
    input.push(serde_json::json!({"id": "bad-ids", "prompt_ids": [1, -3]}));
    let mut text: String = input.iter().map(|l| format!("{l}\n")).collect();
    text.push_str("{not json\n");
    std::fs::write(d.join("in.jsonl"), text).unwrap();
    let out =
        in_out_cmd(&["generate", "--device", "cpu", "--max-tokens", "16", "--temperature", "0"], &d).output().unwrap();
    // Exit code 3: some records became error rows, the rest finished.
    assert_eq!(out.status.code(), Some(3), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let rows = read_lines(&d.join("out.jsonl"));
    assert_eq!(rows.len(), cases.len() + 3, "one row per input line");
    for (r, c) in rows.iter().zip(&cases) {
        assert_eq!(r["id"], c["id"]);
        let want = ids(c, "f64_free_greedy_ids");
        let margins = floats(c, "f64_free_margins");
        let got: Vec<u32> = r["token_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let n = margins.iter().position(|&m| m < 0.02).unwrap_or(16).min(16).min(got.len());
        assert_eq!(got[..n], want[..n], "case {}", c["id"]);
        assert_eq!(r["prompt_tokens"].as_u64().unwrap() as usize, c["prompt_ids"].as_array().unwrap().len());
        assert!(r["text"].is_string());
        assert!(matches!(r["finish_reason"].as_str(), Some("stop" | "length")));
    }
    let tail = &rows[cases.len()..];
    assert_eq!(tail[0]["id"], "no-prompt");
    assert!(tail[0]["error"].as_str().unwrap().contains("prompt"));
    assert_eq!(tail[1]["id"], "bad-ids");
    assert!(tail[1]["error"].as_str().unwrap().contains("token id"));
    assert_eq!(tail[2]["id"], serde_json::Value::Null);
    assert_eq!(tail[2]["line"], cases.len() + 3);
    assert!(tail[2]["error"].as_str().unwrap().contains("malformed JSON"));
    // The job loop of `run` wrote its report beside the output: every line counted once.
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("out.jsonl.report.json")).unwrap()).unwrap();
    let counts = &report["counts"];
    assert_eq!((counts["ok"].as_u64(), counts["error"].as_u64()), (Some(cases.len() as u64), Some(3)), "{report}");
    // As with `run`: the same command again finds its finished output (exit as when it
    // finished, nothing recomputed); other options are another job, refused unless --restart.
    let before = std::fs::read(d.join("out.jsonl")).unwrap();
    let again =
        in_out_cmd(&["generate", "--device", "cpu", "--max-tokens", "16", "--temperature", "0"], &d).output().unwrap();
    let err = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(3), "{err}");
    assert!(err.contains("nothing to do"), "{err}");
    let other =
        in_out_cmd(&["generate", "--device", "cpu", "--max-tokens", "12", "--temperature", "0"], &d).output().unwrap();
    let err = String::from_utf8_lossy(&other.stderr);
    assert_eq!(other.status.code(), Some(2), "{err}");
    assert!(err.contains("different job"), "{err}");
    assert_eq!(std::fs::read(d.join("out.jsonl")).unwrap(), before);
}

#[test]
fn broken_model_files_give_clear_errors() {
    let d = tmpdir("badmodel");
    let model = std::fs::read(repo().join(dustoff::model::loader::SAMPLE_MODEL)).unwrap();
    let cases: [(&str, Vec<u8>, &str); 3] = [
        ("truncated.gguf", model[..model.len() / 2].to_vec(), "outside the file"),
        ("header.gguf", model[..100].to_vec(), "cannot fit"),
        ("text.gguf", b"hello, I am not a model".to_vec(), "not a GGUF file"),
    ];
    for (name, bytes, want) in cases {
        let p = d.join(name);
        std::fs::write(&p, bytes).unwrap();
        let out = Command::new(bin())
            .args(["generate", "--device", "cpu", "--prompt", "hi", "--model"])
            .arg(&p)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want) && err.contains(name), "{name}: {err}");
    }
    let out =
        Command::new(bin()).args(["generate", "--prompt", "hi", "--model", "/nonexistent/m.gguf"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
}

/// `bench --synthetic`'s help names every shape the code knows (it missed two).
#[test]
fn bench_help_lists_every_synthetic_shape() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_dustoff")).args(["bench", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&o.stdout);
    let missing: Vec<&str> = dustoff::model::shapes::SHAPES
        .iter()
        .copied()
        .filter(|s| !help.contains(&format!("{s} ")) && !help.contains(&format!("{s},")))
        .collect();
    assert!(missing.is_empty(), "bench --help lacks {missing:?}");
}
