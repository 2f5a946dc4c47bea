//! Logs of unattended runs (issue 31, item 8): the real binary, the sample model, the CPU
//! backend, summarize with 8 tokens over the 12 news records. Test processes read dustoff's
//! stderr through a pipe, so it is "not a terminal" here, as under cron or systemd:
//! - every stderr line starts with a UTC timestamp;
//! - `--log-file` appends the same lines, stamped, including the final error line of a run
//!   that fails;
//! - the plain progress line says the percentage done and an ETA.

mod common;

use std::path::Path;
use std::process::Output;

use common::*;

fn run(pipeline: &str, output: &Path, log: &Path) -> Output {
    let a = ["run", pipeline, "--input", "samples/news.jsonl", "--output", s(output), "--device", "cpu"];
    let mut a = a.to_vec();
    a.extend(["--slots", "2", "--log-file", s(log)]);
    dustoff_cmd(&a, &[("DUSTOFF_PROGRESS_SECONDS", "0")]).output().expect("start dustoff")
}

/// `2026-12-03T15:20:07Z ` at the start of `line`.
fn stamped(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 21
        && b[..20].iter().enumerate().all(|(i, &c)| match i {
            4 | 7 => c == b'-',
            10 => c == b'T',
            13 | 16 => c == b':',
            19 => c == b'Z',
            _ => c.is_ascii_digit(),
        })
        && b[20] == b' '
}

#[test]
fn stderr_lines_are_stamped_and_the_log_file_gets_the_same_lines_appended() {
    let d = tmpdir("logs");
    let p = short_pipeline(&d);
    let (out, log) = (d.join("out.jsonl"), d.join("logs/run.log"));

    // A log file whose folder does not exist: refused before anything runs.
    let o = run(s(&p), &out, &log);
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("run.log"), "names the file");
    assert!(!out.exists());

    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    let o = run(s(&p), &out, &log);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(0), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert!(lines.iter().all(|l| stamped(l)), "every stderr line is stamped:\n{err}");
    assert!(lines.iter().any(|l| l.contains("done: 12 records")), "{err}");
    let progress: Vec<&&str> = lines.iter().filter(|l| l.contains("[dustoff] ")).collect();
    assert!(!progress.is_empty(), "progress lines after engine steps:\n{err}");
    assert!(
        progress.iter().all(|l| l.contains("/12 records (") && l.contains("%), ETA ")),
        "percent and ETA in the plain progress line:\n{err}"
    );
    assert!(progress.iter().any(|l| !l.contains("ETA ?")), "an ETA once records are done:\n{err}");
    let first = std::fs::read_to_string(&log).unwrap();
    assert_eq!(first, err, "the log file holds stderr's lines, stamped alike");

    // A second run (a pipeline that does not exist) appends, its error line included.
    let o = run("no-such-pipeline", &d.join("other.jsonl"), &log);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{err}");
    let all = std::fs::read_to_string(&log).unwrap();
    assert!(all.starts_with(&first), "appended, not replaced");
    let added = &all[first.len()..];
    assert_eq!(added, err);
    assert!(added.lines().any(|l| stamped(l) && l.contains("error: pipeline 'no-such-pipeline' not found")), "{added}");
}

#[test]
fn generate_input_lines_are_stamped_too() {
    let d = tmpdir("logs-generate");
    let input = d.join("prompts.jsonl");
    std::fs::write(
        &input,
        "{\"id\":\"a\",\"prompt\":\"The capital of France is\"}\n{\"id\":\"b\",\"prompt\":\"One, two,\"}\n",
    )
    .unwrap();
    let out = d.join("out.jsonl");
    let a = ["generate", "--input", s(&input), "--output", s(&out), "--device", "cpu", "--max-tokens", "2"];
    let o = dustoff_cmd(&a, &[]).output().expect("start dustoff");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("2 rows committed"), "{err}");
    assert!(err.lines().all(stamped), "every stderr line is stamped:\n{err}");
    assert_eq!(read_jsonl(&out).len(), 2);
}
