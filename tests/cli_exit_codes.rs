//! One exit-code table for every command (issue 31): each subcommand's error paths, walked with
//! the real binary, end in the code `dustoff --help` lists for them (2: the command has to
//! change; 1: an error a rerun may not repeat; 5: another run holds the job's lock), with a
//! message naming the thing. `kernels --arch compute_99` needs NVRTC (scripts/test.sh finds it).

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
    let (kdir, under_file, s_out) = (d.join("ptx"), exists.join("ptx"), d.join("s.gguf"));
    // A tokenizer directory for synth (its errors above come before the file is read).
    let tok = d.join("tok");
    std::fs::create_dir_all(&tok).unwrap();
    std::fs::write(tok.join("tokenizer.json"), "{}").unwrap();
    let no_tok = d.join("no-tokenizer");
    // A file where the output's checkpoint folder would be.
    let ck_out = d.join("ck.jsonl");
    std::fs::write(d.join("ck.jsonl.dustoff"), b"x").unwrap();
    // An output a failed tokenize must leave as it was.
    let keep = d.join("keep.jsonl");
    std::fs::write(&keep, "{\"id\":1}\n").unwrap();
    let (typo, tok_json, hf_tok) = (d.join("typo.jsonl"), tok.join("tokenizer.json"), hf.join("tokenizer.json"));
    // The sample model with its architecture renamed (general.architecture's value only).
    let mut gguf = std::fs::read(repo().join(dustoff::model::loader::SAMPLE_MODEL)).unwrap();
    let key = gguf.windows(20).position(|w| w == b"general.architecture").unwrap();
    let at = key + gguf[key..].windows(5).position(|w| w == b"llama").unwrap();
    gguf[at..at + 5].copy_from_slice(b"mamba");
    let other_arch = d.join("other-arch.gguf");
    std::fs::write(&other_arch, gguf).unwrap();
    // Pipelines a run must refuse: one that reads no input field, one that is not text.
    let summarize = std::fs::read_to_string(repo().join("pipelines/summarize.toml")).unwrap();
    let tmpl_line = summarize.lines().find(|l| l.trim_start().starts_with("template")).unwrap();
    let constant = d.join("constant.toml");
    std::fs::write(&constant, summarize.replace(tmpl_line, "template = \"Say hello.\"")).unwrap();
    let binary = d.join("binary.toml");
    std::fs::write(&binary, b"\xff\xfe garbage").unwrap();
    let (p_out, slash_out) = (d.join("p.jsonl"), format!("{}/", d.join("folder-out").display()));
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            vec!["run", s(&constant), "--input", "samples/news.jsonl", "--output", s(&p_out)],
            2,
            "reads none of input.fields",
        ),
        (vec!["run", s(&binary), "--input", "samples/news.jsonl", "--output", s(&p_out)], 2, "not UTF-8 text"),
        (
            vec!["run", "summarize", "--pipelines", s(&no_tok), "--input", "samples/news.jsonl", "--output", s(&p_out)],
            2,
            "is not a folder",
        ),
        (
            vec!["run", "--input", "samples/openai-batch.jsonl", "--output", s(&p_out), "--default-max-tokens", "0"],
            2,
            "--default-max-tokens 0",
        ),
        (vec!["run", "summarize", "--input", "samples/news.jsonl", "--output", &slash_out], 2, "names a folder"),
        (vec!["run", "summarize", "--input", "/dev/null", "--output", s(&p_out)], 2, "is not a regular file"),
        (
            vec!["run", "summarize", "--input", "samples/news.jsonl", "--output", s(&p_out), "--max-batch-tokens", "0"],
            2,
            "--max-batch-tokens",
        ),
        (
            vec!["quantize", "--model", s(&other_arch), "--output", s(&q_out), "--type", "q8_0"],
            2,
            "architecture 'mamba'",
        ),
        (vec!["tokenize", "--input", s(&typo), "--output", s(&keep)], 2, "does not exist"),
        (
            vec!["tokenize", "--input", "samples/news.jsonl", "--output", s(&hf_tok), "--model", s(&hf)],
            2,
            "inside the input directory",
        ),
        (
            vec![
                "quantize",
                "--model",
                s(&exists),
                "--output",
                s(&q_out),
                "--calibration",
                "samples/news.jsonl",
                "--imatrix-out",
                s(&exists),
            ],
            2,
            "would overwrite the input",
        ),
        (
            vec!["quantize", "--model", s(&exists), "--output", s(&q_out), "--imatrix-out", s(&m_out)],
            2,
            "--imatrix-out writes",
        ),
        (vec!["quantize", "--model", s(&exists), "--output", s(&q_out), "--imatrix", s(&typo)], 2, "--imatrix"),
        (vec!["generate", "--prompt", "hi", "--temperature", "NaN"], 2, "--temperature"),
        (vec!["generate", "--prompt", "hi", "--top-p", "2"], 2, "--top-p"),
        (
            vec!["generate", "--prompt", "hi", "--ctx", "100000000", "--max-tokens", "9000", "--device", "cpu"],
            2,
            "--ctx is 8192",
        ),
        (vec!["generate", "--prompt", "hi", "--max-tokens", "5000", "--device", "cpu"], 2, "--ctx is 4096"),
        (vec!["generate", "--input", s(&typo), "--output", s(&out)], 2, "does not exist"),
        (vec!["bench", "--device", "cpu", "--runs", "0"], 2, "--runs must be at least 1"),
        (vec!["bench", "--device", "cpu", "--batch", "4,0"], 2, "each --batch size"),
        (
            vec!["synth", "--tokenizer", s(&tok), "--output", s(&tok_json), "--shape", "smollm2-135m", "--force"],
            2,
            "inside the input directory",
        ),
        (
            vec!["convert", "--model", s(&hf), "--output", s(&c_out), "--max-lossy-fraction", "NaN"],
            2,
            "--max-lossy-fraction",
        ),
        (vec!["run", "summarize", "--input", "samples/news.jsonl", "--output", s(&out), "--slots", "0"], 2, "slots"),
        (vec!["run", "no-such-pipeline", "--input", "samples/news.jsonl", "--output", s(&out)], 2, "no-such-pipeline"),
        (vec!["run", "summarize", "--input", "samples/none-*.jsonl", "--output", s(&out)], 2, "matches no file"),
        (vec!["run", "summarize", "--input", "samples", "--output", s(&out)], 2, "'samples' is a folder"),
        (
            vec!["run", "summarize", "--input", "samples/news.jsonl", "--output", s(&ck_out)],
            2,
            "not a checkpoint folder",
        ),
        (
            vec!["run", "summarize", "--input", "samples/news.jsonl", "--output", s(&out), "--default-max-tokens", "9"],
            2,
            "a pipeline sets generation.max_tokens",
        ),
        (
            vec!["run", "summarize", "--input", "samples/news.jsonl", "--output", s(&out), "--shard-count", "2"],
            2,
            "no shard index",
        ),
        (vec!["generate", "--chat", "--input", "samples/news.jsonl", "--output", s(&out)], 2, "--chat wraps --prompt"),
        (vec!["generate", "--input", "samples/news.parquet", "--output", s(&out)], 2, "is a Parquet file"),
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
        (vec!["eval", "--model", s(&no_model), "--batch-windows", "0"], 2, "--batch-windows must be 1..=256"),
        (vec!["eval", "--model", s(&no_model), "--device", "tpu"], 2, "unknown device 'tpu'"),
        (vec!["bench", "--synthetic", "no-such-shape", "--device", "cpu"], 2, "unknown shape 'no-such-shape'"),
        (vec!["kernels", "--arch", "sm_70", "--out", s(&kdir)], 2, "expected compute_XY"),
        (vec!["kernels", "--arch", "compute_99", "--out", s(&kdir)], 2, "compute_99"),
        (vec!["kernels", "--arch", "compute_70", "--out", s(&under_file)], 1, "creating"),
        (vec!["synth", "--tokenizer", s(&tok), "--output", s(&s_out), "--shape", "no-such-shape"], 2, "unknown shape"),
        (
            vec!["synth", "--tokenizer", s(&tok), "--output", s(&s_out), "--shape", "smollm2-135m", "--type", "q9"],
            2,
            "unknown --type 'q9'",
        ),
        (
            vec!["synth", "--tokenizer", s(&no_tok), "--output", s(&s_out), "--shape", "smollm2-135m"],
            2,
            "no tokenizer.json",
        ),
        (vec!["synth", "--tokenizer", s(&tok), "--output", s(&exists), "--shape", "smollm2-135m"], 2, "exists"),
        (
            vec!["run", "summarize", "--input", "samples/news.jsonl", "--output", s(&out), "--max-error-rate", "7"],
            2,
            "--max-error-rate",
        ),
        // The CPU's KV cache is planned against the host memory (100,000 x 4,096 positions of
        // 46 KB: 19 TB) before anything is allocated; it aborted on the allocation.
        (
            vec![
                "generate",
                "--device",
                "cpu",
                "--input",
                "samples/news.jsonl",
                "--output",
                s(&out),
                "--slots",
                "100000",
            ],
            2,
            "the CPU backend's memory does not fit this machine",
        ),
        (vec!["doctor", "--model", s(&no_model), "--ctx", "0"], 2, "--ctx 0"),
        // The flags of a Hugging Face conversion were ignored for a GGUF --model.
        (
            vec![
                "convert",
                "--model",
                dustoff::model::loader::SAMPLE_MODEL,
                "--output",
                s(&c_out),
                "--dtype",
                "q8_0",
                "--allow-lossy",
            ],
            2,
            "--allow-lossy applies to a Hugging Face directory",
        ),
        (vec!["doctor", "--slots", "18446744073709551615"], 2, "the memory plan takes at most"),
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
    assert_eq!(std::fs::read_to_string(&keep).unwrap(), "{\"id\":1}\n", "a failed tokenize left its output as it was");
    assert_eq!(std::fs::read_to_string(&tok_json).unwrap(), "{}", "synth left the tokenizer as it was");
    assert!(!q_out.exists() && !with_suffix(&q_out, ".partial").exists(), "nothing written for another architecture");
}

#[test]
fn a_job_held_by_another_run_exits_busy() {
    let d = tmpdir("exit-busy");
    let out = d.join("out.jsonl");
    let lock = std::fs::File::create(with_suffix(&out, ".dustoff.lock")).unwrap();
    lock.try_lock().unwrap();
    for args in [
        vec!["run", "summarize", "--input", "samples/news.jsonl", "--output", s(&out), "--device", "cpu"],
        vec!["generate", "--input", "samples/news.jsonl", "--output", s(&out), "--device", "cpu"],
    ] {
        let o = dustoff_cmd(&args, &[]).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(5), "{args:?}: {err}");
        assert!(err.contains("holds the lock"), "{err}");
    }
    drop(lock);
    let help = dustoff_cmd(&["--help"], &[]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("  5  busy: another run of this job holds its lock"), "--help documents code 5: {help}");
}
