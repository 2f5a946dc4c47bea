//! One exit-code table for every command (issue 31): each subcommand's error paths, walked with
//! the real binary, end in the code `dustoff --help` lists for them (2: the command has to
//! change; 1: an error a rerun may not repeat), with a message naming the thing.

mod common;

use common::*;

#[test]
fn every_subcommand_maps_its_errors_to_the_one_table() {
    let d = tmpdir("exit-codes");
    let exists = d.join("exists.gguf");
    std::fs::write(&exists, b"x").unwrap();
    let hf = d.join("hf");
    std::fs::create_dir_all(&hf).unwrap();
    std::fs::write(hf.join("config.json"), r#"{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}"#).unwrap();
    let out = d.join("out.jsonl");
    let no_model = d.join("no-model.gguf");
    let (c_out, q_out, m_out, shard) = (d.join("c.gguf"), d.join("q.gguf"), d.join("m.jsonl"), d.join("shard-0.jsonl"));
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["run", "summarize", "--input", "samples/news.jsonl", "--output", s(&out), "--slots", "0"], 2, "slots"),
        (vec!["run", "no-such-pipeline", "--input", "samples/news.jsonl", "--output", s(&out)], 2, "no-such-pipeline"),
        (vec!["run", "summarize", "--input", "samples/none-*.jsonl", "--output", s(&out)], 2, "matches no file"),
        (
            vec!["run", "summarize", "--input", "samples/news.jsonl", "--output", s(&out), "--model", s(&no_model)],
            2,
            "no-model.gguf",
        ),
        (vec!["generate", "--prompt", "hi", "--model", s(&no_model)], 2, "does not exist"),
        (vec!["generate"], 2, "give either --prompt"),
        (
            vec!["tokenize", "--input", "samples/news.jsonl", "--output", s(&out), "--model", s(&no_model)],
            2,
            "does not exist",
        ),
        (vec!["convert", "--model", s(&hf), "--output", s(&exists)], 2, "exists"),
        (vec!["convert", "--model", s(&hf), "--output", s(&c_out)], 2, "not supported"),
        (vec!["quantize", "--model", s(&hf), "--output", s(&q_out)], 2, "not supported"),
        (vec!["merge", "--output", s(&m_out), s(&shard)], 2, "shard-0.jsonl"),
        (vec!["eval", "--model", s(&no_model)], 2, "does not exist"),
        // Not yet: `bench --synthetic no-such-shape` exits 1 (its unknown-shape error is not a usage error).
        (
            vec!["run", "summarize", "--input", "samples/news.jsonl", "--output", s(&out), "--max-error-rate", "7"],
            2,
            "--max-error-rate",
        ),
    ];
    let mut wrong = Vec::new();
    for (args, want, says) in &cases {
        let o = dustoff_cmd(args, &[]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        if o.status.code() != Some(*want) || !err.contains(says) {
            wrong.push(format!("{args:?}: exit {:?} (want {want}), stderr: {err}", o.status.code()));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
