//! A dry run that gates (issue 31): it exits as the run would (3 when records would fail beyond
//! the tolerance), makes the run's checks (lock, finished output, checkpoint), prints a summary
//! (JSON with --json); and no command panics on a closed pipe.

mod common;

use std::path::Path;
use std::process::{Output, Stdio};

use serde_json::Value;

use common::*;

fn run(pipeline: &Path, input: &Path, output: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut a = vec!["run", s(pipeline), "--input", s(input), "--output", s(output), "--device", "cpu", "--quiet"];
    a.extend(extra);
    dustoff_cmd(&a, env).output().expect("start dustoff")
}

fn out(o: &Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn expect_code(o: &Output, want: i32, what: &str) {
    assert_eq!(o.status.code(), Some(want), "{what}: {}", out(o));
}

fn input_with_one_bad(dir: &Path) -> std::path::PathBuf {
    let news = std::fs::read_to_string(repo().join("samples/news.jsonl")).unwrap();
    let mut text: String = news.lines().take(3).map(|l| format!("{l}\n")).collect();
    text.push_str("{\"id\": \"no-text\", \"source\": \"wire\"}\n");
    let p = dir.join("in.jsonl");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_dry_run_exits_as_the_run_would_and_prints_a_summary_or_json() {
    let d = tmpdir("dry-gate");
    let p = short_pipeline(&d);
    let input = input_with_one_bad(&d);
    let o = d.join("out.jsonl");
    let r = run(&p, &input, &o, &["--dry-run"], &[]);
    expect_code(&r, 3, "a record would fail");
    let text = String::from_utf8_lossy(&r.stdout);
    assert!(text.contains("dry run: 4 records, 3 would run, 1 would fail"), "{}", out(&r));
    assert!(text.contains("missing_field 1") && text.contains("line 4:"), "{}", out(&r));
    assert!(text.contains("the run would exit 3"), "{}", out(&r));
    assert!(!o.exists() && !with_suffix(&o, ".dustoff.lock").exists(), "a dry run leaves nothing");

    let r = run(&p, &input, &o, &["--dry-run", "--json", "--allow-errors", "1"], &[]);
    expect_code(&r, 0, "within --allow-errors");
    let v: Value = serde_json::from_slice(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", out(&r)));
    assert_eq!((v["records"].as_u64(), v["errors"].as_u64(), v["exit_code"].as_u64()), (Some(4), Some(1), Some(0)));

    // Good records only: exit 0.
    let good = d.join("good.jsonl");
    std::fs::write(&good, std::fs::read_to_string(repo().join("samples/news.jsonl")).unwrap()).unwrap();
    expect_code(&run(&p, &good, &d.join("g.jsonl"), &["--dry-run"], &[]), 0, "nothing would fail");
}

#[test]
fn a_dry_run_makes_the_lock_checkpoint_and_finished_output_checks_of_the_run() {
    let d = tmpdir("dry-checks");
    let p = short_pipeline(&d);
    let input = d.join("in.jsonl");
    let news = std::fs::read_to_string(repo().join("samples/news.jsonl")).unwrap();
    std::fs::write(&input, news.lines().take(3).map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let o = d.join("out.jsonl");

    // A checkpoint left by a failed final write: the dry run says the run resumes.
    let r = run(&p, &input, &o, &[], &[("DUSTOFF_INJECT_WRITE_ERROR", "output")]);
    expect_code(&r, 1, "injected full disk at the output");
    let r = run(&p, &input, &o, &["--dry-run"], &[]);
    expect_code(&r, 0, "dry run over a resumable checkpoint");
    assert!(String::from_utf8_lossy(&r.stdout).contains("3 rows already committed"), "{}", out(&r));
    // Another job's checkpoint (a changed pipeline) is refused, as by the run.
    let p9 = d.join("summarize9.toml");
    std::fs::write(&p9, std::fs::read_to_string(&p).unwrap().replace("max_tokens = 8", "max_tokens = 9")).unwrap();
    let r = run(&p9, &input, &o, &["--dry-run"], &[]);
    expect_code(&r, 2, "dry run against another job's checkpoint");
    assert!(out(&r).contains("belongs to a different job"), "{}", out(&r));

    // The lock held by a running job.
    {
        let lock = std::fs::File::create(with_suffix(&o, ".dustoff.lock")).unwrap();
        lock.try_lock().unwrap();
        let r = run(&p, &input, &o, &["--dry-run"], &[]);
        expect_code(&r, 5, "dry run while the job runs");
        assert!(out(&r).contains("holds the lock"), "{}", out(&r));
    }

    // The finished output of the same job: nothing to do; of another: refused.
    expect_code(&run(&p, &input, &o, &[], &[]), 0, "the run completes");
    let r = run(&p, &input, &o, &["--dry-run"], &[]);
    expect_code(&r, 0, "dry run of a finished job");
    assert!(out(&r).contains("nothing to do"), "{}", out(&r));
    expect_code(&run(&p9, &input, &o, &["--dry-run"], &[]), 2, "dry run of a changed job over a finished output");
}

/// The read end closed before the command writes: the process may end by SIGPIPE (or finish),
/// never panic (exit 101).
#[test]
fn a_closed_pipe_never_panics() {
    use std::os::unix::process::ExitStatusExt;
    let d = tmpdir("sigpipe");
    let p = short_pipeline(&d);
    let input = repo().join("samples/news.jsonl");
    let o = d.join("out.jsonl");
    let cases: Vec<Vec<&str>> = vec![
        vec!["run", s(&p), "--input", s(&input), "--output", s(&o), "--dry-run"],
        vec!["run", s(&p), "--input", s(&input), "--output", s(&o), "--dry-run", "--json"],
        vec!["--help"],
        vec!["run", "--help"],
        vec!["generate", "--device", "cpu", "--prompt", "Hello", "--max-tokens", "4"],
    ];
    for args in cases {
        let mut c = dustoff_cmd(&args, &[]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(c.stdout.take());
        let r = c.wait_with_output().unwrap();
        let st = r.status;
        let ok = st.signal() == Some(13) || st.code() == Some(0);
        assert!(ok, "{args:?}: {st:?}, stderr:\n{}", String::from_utf8_lossy(&r.stderr));
    }
}
