//! Shared helpers of the integration tests: the sample model and the reference data.
#![allow(dead_code)]

pub mod naive;
pub mod planted;

use std::path::{Path, PathBuf};
use std::process::Command;

use dustoff::model::loader::{load_model, LoadedModel, SAMPLE_MODEL};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The project's shared test data: `../shared/testdata` beside this checkout (how CI lays it
/// out), else beside the local repository this one was cloned from (a clone in a temporary
/// folder: `git clone . $(mktemp -d)`). Tests that use it fail on a missing file, naming it.
pub fn shared_testdata() -> PathBuf {
    let beside = repo().join("../shared/testdata");
    if beside.exists() {
        return beside;
    }
    let origin = Command::new("git").arg("-C").arg(repo()).args(["remote", "get-url", "origin"]).output();
    match origin {
        Ok(o) if o.status.success() => {
            let url = String::from_utf8_lossy(&o.stdout).trim().to_string();
            let from_origin = Path::new(&url).join("../shared/testdata");
            if from_origin.exists() {
                from_origin
            } else {
                beside
            }
        }
        _ => beside,
    }
}

/// The sample model; fails with the fetch command when it is missing.
pub fn sample_model() -> LoadedModel {
    let p = repo().join(SAMPLE_MODEL);
    assert!(p.exists(), "sample model missing: run samples/fetch-model.sh");
    load_model(&p).expect("load sample model")
}

pub fn read_cases(name: &str) -> Vec<serde_json::Value> {
    read_jsonl(&repo().join("tests/data/smollm2").join(name))
}

/// The JSON values of a JSONL file's lines (blank lines skipped); fails naming the file.
pub fn read_jsonl(p: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: a line is not JSON: {e}", p.display())))
        .collect()
}

/// `../shared/testdata/arch/<arch>/`: a tiny random model of an architecture and the
/// transformers outputs for it (`refs.jsonl`).
pub fn arch_dir(arch: &str) -> PathBuf {
    shared_testdata().join("arch").join(arch)
}

/// The largest `|a - b|` of two equally long logit rows (dustoff's f32 against a reference's f64).
pub fn max_abs_diff(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(&x, &y)| (x as f64 - y).abs()).fold(0.0, f64::max)
}

pub fn ids(v: &serde_json::Value, key: &str) -> Vec<u32> {
    v[key].as_array().unwrap_or_else(|| panic!("{key} missing")).iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

pub fn floats(v: &serde_json::Value, key: &str) -> Vec<f64> {
    v[key].as_array().unwrap_or_else(|| panic!("{key} missing")).iter().map(|x| x.as_f64().unwrap()).collect()
}

/// The dustoff binary built for this test run.
pub fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_dustoff"))
}

/// `dustoff <args> --input <dir>/in.jsonl --output <dir>/out.jsonl` in the repo root: a
/// command whose rows a test writes and reads back in `dir`.
pub fn in_out_cmd(args: &[&str], dir: &Path) -> Command {
    let mut c = Command::new(bin());
    c.current_dir(repo())
        .args(args)
        .arg("--input")
        .arg(dir.join("in.jsonl"))
        .arg("--output")
        .arg(dir.join("out.jsonl"));
    c
}

/// A test path as `&str` (for command arguments; test paths are UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `p` with `suffix` appended to its last component (`out.jsonl` -> `out.jsonl.dustoff`: the
/// checkpoint folder beside an output).
pub fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut o = p.as_os_str().to_owned();
    o.push(suffix);
    PathBuf::from(o)
}

pub fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dustoff-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The shipped summarize pipeline with `max_tokens = 8` (fast; the rows are still real output).
pub fn short_pipeline(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("pipelines/summarize.toml")).unwrap();
    assert!(text.contains("max_tokens = 64"), "pipelines/summarize.toml changed: update this test");
    let p = dir.join("summarize8.toml");
    std::fs::write(&p, text.replace("max_tokens = 64", "max_tokens = 8")).unwrap();
    p
}

/// A `dustoff` command in the repo root (for `pipelines/` and the sample model), with every
/// variable removed that would change a job's behaviour from the environment the tests run in
/// (sharding, commit batching, fault injection); `env` sets the ones a test wants.
pub fn dustoff_cmd(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(bin());
    c.current_dir(repo()).args(args);
    for k in [
        "SLURM_ARRAY_TASK_ID",
        "SLURM_ARRAY_TASK_MIN",
        "SLURM_ARRAY_TASK_COUNT",
        "JOB_COMPLETION_INDEX",
        "DUSTOFF_SHARD_COUNT",
        "DUSTOFF_COMMIT_ROWS",
        "DUSTOFF_INJECT_OOM",
        "DUSTOFF_INJECT_WRITE_ERROR",
        "DUSTOFF_INJECT_KILL",
    ] {
        c.env_remove(k);
    }
    c.envs(env.iter().copied());
    c
}

/// Free-running greedy decoding of sequence `seq` (room for `max_len` positions): the prompt
/// in one chunk, then `n` tokens, each the `argmax` of the logits before it (and fed back).
pub fn free_greedy<B: dustoff::backend::Backend>(
    b: &mut B,
    seq: dustoff::engine::plan::SeqId,
    prompt: &[u32],
    max_len: usize,
    n: usize,
) -> Vec<u32> {
    use dustoff::engine::sampler::argmax;
    let mut s = dustoff::engine::single::SingleSeq::new(b, seq, max_len).unwrap();
    let mut logits = s.feed(b, prompt).unwrap();
    let mut got = Vec::with_capacity(n);
    for _ in 0..n {
        let t = argmax(&logits);
        got.push(t);
        logits = s.feed(b, &[t]).unwrap();
    }
    got
}
