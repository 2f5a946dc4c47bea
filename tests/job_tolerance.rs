//! Error rows a scheduler can live with (issue 31): the real binary, the sample model, the CPU
//! backend, summarize with 8 generated tokens.
//! - `--allow-errors N` / `--max-error-rate R`: within them a completed job exits 0, over them 3;
//! - `<output>.errors.jsonl` lists the error rows after every run, also after a --max-errors abort;
//! - the Slurm sample passes a shard whose bad record is within its tolerance;
//! - `merge` names the shards that are missing (exit 2).

mod common;

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use common::*;

fn run(pipeline: &Path, input: &Path, output: &Path, extra: &[&str]) -> Output {
    let mut a = vec!["run", s(pipeline), "--input", s(input), "--output", s(output), "--device", "cpu", "--quiet"];
    a.extend(extra);
    dustoff_cmd(&a, &[]).output().expect("start dustoff")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn expect_code(o: &Output, want: i32, what: &str) {
    assert_eq!(o.status.code(), Some(want), "{what}: stderr:\n{}", stderr(o));
}

/// Three good news records and one without its text (one error row of four).
fn input_with_one_bad(dir: &Path) -> std::path::PathBuf {
    let news = std::fs::read_to_string(repo().join("samples/news.jsonl")).unwrap();
    let mut text: String = news.lines().take(3).map(|l| format!("{l}\n")).collect();
    text.push_str("{\"id\": \"no-text\", \"source\": \"wire\"}\n");
    let p = dir.join("in.jsonl");
    std::fs::write(&p, text).unwrap();
    p
}

fn errors_file(output: &Path) -> Vec<Value> {
    read_jsonl(&with_suffix(output, ".errors.jsonl"))
}

#[test]
fn error_tolerance_decides_the_exit_code_and_the_errors_file_lists_the_rows() {
    let d = tmpdir("tolerance");
    let p = short_pipeline(&d);
    let input = input_with_one_bad(&d);

    let strict = d.join("strict.jsonl");
    expect_code(&run(&p, &input, &strict, &[]), 3, "an error row without tolerance");
    let errs = errors_file(&strict);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0]["id"], "no-text");
    assert_eq!(errs[0]["kind"], "missing_field");
    assert!(errs[0]["message"].as_str().unwrap().contains("text"), "{errs:?}");
    // The finished job rerun with a tolerance that covers it: nothing to do, exit 0.
    expect_code(&run(&p, &input, &strict, &["--allow-errors", "1"]), 0, "rerun within --allow-errors");

    let rate = d.join("rate.jsonl");
    let o = run(&p, &input, &rate, &["--max-error-rate", "0.25"]);
    expect_code(&o, 0, "1 of 4 rows within --max-error-rate 0.25");
    let e = stderr(&o);
    assert!(e.contains("1 of 4 rows (25.0%), within the tolerance (--max-error-rate 0.25)"), "{e}");
    assert!(e.contains("rate.jsonl.errors.jsonl"), "the summary names the errors file: {e}");
    let rep: Value = serde_json::from_slice(&std::fs::read(with_suffix(&rate, ".report.json")).unwrap()).unwrap();
    assert_eq!(rep["error_rows"], 1, "the report still counts the error row");
    assert_eq!(rep["counts"]["errors_by_kind"]["missing_field"], 1);
    assert_eq!(errors_file(&rate).len(), 1);

    let over = d.join("over.jsonl");
    let o = run(&p, &input, &over, &["--max-error-rate", "0.2", "--allow-errors", "0"]);
    expect_code(&o, 3, "1 of 4 rows over both limits");
    assert!(stderr(&o).contains("over the tolerance"), "{}", stderr(&o));

    let good = d.join("good.jsonl");
    expect_code(&run(&p, &input, &good, &["--max-error-rate", "1.5"]), 2, "a rate that is not a share");
}

#[test]
fn the_errors_file_is_readable_after_a_max_errors_abort() {
    let d = tmpdir("abort-errors");
    let p = short_pipeline(&d);
    let out = d.join("out.jsonl");
    let o = run(&p, &repo().join("samples/bad.jsonl"), &out, &["--max-errors", "1"]);
    expect_code(&o, 3, "past --max-errors");
    assert!(!out.exists(), "no output after an abort");
    let errs = errors_file(&out);
    assert!(errs.len() >= 2, "the committed error rows, past the limit of 1: {errs:?}");
    for e in &errs {
        assert!(e["kind"].is_string() && e["message"].is_string(), "{e}");
    }
    // The second line of bad.jsonl is cut off: no id, so its line number is given.
    assert_eq!(errs[0]["id"], Value::Null);
    assert_eq!(errs[0]["line"], 2);
    assert_eq!(errs[0]["kind"], "malformed_json");
}

#[test]
fn the_slurm_sample_passes_a_shard_with_a_tolerated_bad_record() {
    let d = tmpdir("slurm-sample");
    let p = short_pipeline(&d);
    let input = input_with_one_bad(&d);
    let out = d.join("out");
    let script = repo().join("samples/cluster/slurm-array.sh");
    let text = std::fs::read_to_string(&script).unwrap();
    assert!(text.contains("--max-error-rate"), "the sample sets a tolerance");
    let run_script = |rate: &str| {
        std::process::Command::new("bash")
            .arg(&script)
            .current_dir(repo())
            .env("SRUN", "")
            .env("DUSTOFF", bin())
            .env("SLURM_ARRAY_TASK_ID", "0")
            .env("SHARDS", "1")
            .env("PIPELINE", &p)
            .env("INPUT", &input)
            .env("OUT", &out)
            .env("DEVICE", "cpu")
            .env("MAX_ERROR_RATE", rate)
            .env_remove("SLURM_ARRAY_TASK_COUNT")
            .output()
            .unwrap()
    };
    // Over its tolerance, the shard fails (exit 3) and says where the error rows are.
    let o = run_script("0.01");
    expect_code(&o, 3, "1 bad record of 4 over 1%");
    assert!(String::from_utf8_lossy(&o.stdout).contains("errors.jsonl"), "{}", String::from_utf8_lossy(&o.stdout));
    // Within it, the same shard passes (a rerun of the finished job: nothing to do, exit 0).
    let o = run_script("0.5");
    expect_code(&o, 0, "1 bad record of 4 within 50%");
    assert!(String::from_utf8_lossy(&o.stdout).contains("shard 0/1 done"), "{}", String::from_utf8_lossy(&o.stdout));
    assert_eq!(read_jsonl(&out.join("shard-0.jsonl")).len(), 4);
}

#[test]
fn merge_names_the_missing_shards_and_exits_2() {
    let d = tmpdir("merge-missing");
    let p = short_pipeline(&d);
    let input = input_with_one_bad(&d);
    let a = d.join("shard-0.jsonl");
    let o = run(&p, &input, &a, &["--shard", "0/3", "--allow-errors", "1"]);
    expect_code(&o, 0, "shard 0/3");
    let o = dustoff_cmd(&["merge", "--output", s(&d.join("all.jsonl")), s(&a), s(&d.join("shard-2.jsonl"))], &[])
        .output()
        .unwrap();
    expect_code(&o, 2, "merge with missing shards");
    let e = stderr(&o);
    assert!(e.contains("missing shards 1/3, 2/3") && e.contains("not found: ") && e.contains("shard-2.jsonl"), "{e}");
}
