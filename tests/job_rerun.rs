//! Nightly reruns of a finished job (issue 31): the real binary, the sample model, the CPU
//! backend, summarize with 8 generated tokens over a few news records.
//! - the same job again: nothing is computed or written, exit 0;
//! - a changed pipeline or input: refused (exit 2) naming what changed, until --restart;
//! - --incremental over a grown and edited input: only the new and changed records are
//!   computed, the other rows are the old ones byte for byte, and the output equals a full run.

mod common;

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use common::*;

fn dustoff(args: &[&str]) -> Output {
    dustoff_cmd(args, &[]).output().expect("start dustoff")
}

fn run(pipeline: &Path, input: &Path, output: &Path, extra: &[&str]) -> Output {
    let mut a = vec!["run", s(pipeline), "--input", s(input), "--output", s(output), "--device", "cpu", "--quiet"];
    a.extend(extra);
    dustoff(&a)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn expect_code(o: &Output, want: i32, what: &str) {
    assert_eq!(o.status.code(), Some(want), "{what}: stderr:\n{}", stderr(o));
}

fn report(output: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(with_suffix(output, ".report.json")).unwrap()).unwrap()
}

/// The first `n` lines of the sample news, with `edit` applied to each line.
fn news(n: usize, edit: impl Fn(usize, &str) -> String) -> String {
    let text = std::fs::read_to_string(repo().join("samples/news.jsonl")).unwrap();
    text.lines().take(n).enumerate().map(|(i, l)| edit(i, l) + "\n").collect()
}

#[test]
fn a_finished_job_reruns_as_nothing_to_do_and_a_changed_one_is_refused_until_restart() {
    let d = tmpdir("rerun");
    let p = short_pipeline(&d);
    let input = d.join("in.jsonl");
    let out = d.join("out.jsonl");
    std::fs::write(&input, news(3, |_, l| l.to_string())).unwrap();
    expect_code(&run(&p, &input, &out, &[]), 0, "first run");
    let first = std::fs::read(&out).unwrap();
    let rep = report(&out);
    let f = &rep["finished"];
    assert_eq!(f["rows"], 3, "{rep}");
    assert_eq!(f["job"]["inputs"][0]["name"], "in.jsonl", "{rep}");
    assert!(f["job"]["model"]["sample"].is_string() && f["job"]["pipeline"].is_string(), "{rep}");
    assert!(with_suffix(&out, ".digests.tsv").is_file());

    // The same command: nothing to do, said at once, before the model loads.
    let o = run(&p, &input, &out, &[]);
    expect_code(&o, 0, "rerun of a finished job");
    let e = stderr(&o);
    assert!(e.contains("nothing to do") && e.contains("3 rows"), "{e}");
    assert!(!e.contains("backend:"), "no model was loaded: {e}");
    assert_eq!(std::fs::read(&out).unwrap(), first);
    assert_eq!(report(&out), rep, "the report is left as it was");

    // A changed pipeline: refused, naming it; the output stays.
    let p9 = d.join("summarize9.toml");
    std::fs::write(&p9, std::fs::read_to_string(&p).unwrap().replace("max_tokens = 8", "max_tokens = 9")).unwrap();
    let o = run(&p9, &input, &out, &[]);
    expect_code(&o, 2, "a changed pipeline");
    let e = stderr(&o);
    assert!(e.contains("the pipeline file") && e.contains("--restart"), "{e}");
    assert!(!e.contains("--incremental"), "not offered when more than the input changed: {e}");
    assert_eq!(std::fs::read(&out).unwrap(), first);

    // The 8-bit KV cache by name changes the rows (quantized values): another job, refused.
    let o = run(&p, &input, &out, &["--kv-cache", "q8"]);
    expect_code(&o, 2, "--kv-cache q8 over an F16 job");
    assert!(stderr(&o).contains("--restart"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&out).unwrap(), first);
    // Slots and the default cache choice do not: the same job, nothing to do.
    let o = run(&p, &input, &out, &["--kv-cache", "auto", "--slots", "3"]);
    expect_code(&o, 0, "auto cache, other slots");
    assert!(stderr(&o).contains("nothing to do"), "{}", stderr(&o));

    // A grown input: refused, naming the file and offering --incremental.
    std::fs::write(&input, news(4, |_, l| l.to_string())).unwrap();
    let o = run(&p, &input, &out, &[]);
    expect_code(&o, 2, "a grown input");
    let e = stderr(&o);
    assert!(e.contains("in.jsonl") && e.contains("--incremental") && e.contains("--restart"), "{e}");

    // --restart computes everything again.
    let o = run(&p, &input, &out, &["--restart"]);
    expect_code(&o, 0, "--restart");
    assert_eq!(report(&out)["counts"]["ok"], 4);
    assert!(std::fs::read(&out).unwrap().starts_with(&first), "greedy rows are the same");
}

#[test]
fn incremental_computes_only_new_and_changed_records_and_keeps_the_other_rows() {
    let d = tmpdir("incremental");
    let p = short_pipeline(&d);
    let input = d.join("in.jsonl");
    let out = d.join("out.jsonl");
    // Without a finished output, --incremental computes everything.
    std::fs::write(&input, news(4, |_, l| l.to_string())).unwrap();
    let o = run(&p, &input, &out, &["--incremental"]);
    expect_code(&o, 0, "first incremental run");
    assert!(stderr(&o).contains("every record is computed"), "{}", stderr(&o));
    let old = std::fs::read_to_string(&out).unwrap();
    let old_rows: Vec<&str> = old.lines().collect();

    // The archive grows by 2 records and record 1 (news-002) is edited.
    let edited =
        |i: usize, l: &str| if i == 1 { l.replace("Shares of Northwind", "Shares of Contoso") } else { l.to_string() };
    std::fs::write(&input, news(6, edited)).unwrap();
    let o = run(&p, &input, &out, &["--incremental"]);
    expect_code(&o, 0, "incremental run over the grown input");
    let rep = report(&out);
    let inc = &rep["incremental"];
    assert_eq!((inc["reused"].as_u64(), inc["new"].as_u64(), inc["changed"].as_u64()), (Some(3), Some(2), Some(1)));
    assert_eq!(rep["counts"]["ok"], 3, "only the new and changed records were computed: {rep}");
    assert_eq!(rep["counts"]["reused"], 3);
    assert_eq!(rep["tokens"]["generated"], 3 * 8);
    let e = stderr(&o);
    assert!(e.contains("2 new, 1 changed (computed), 3 reused"), "{e}");
    let new = std::fs::read_to_string(&out).unwrap();
    let new_rows: Vec<&str> = new.lines().collect();
    assert_eq!(new_rows.len(), 6);
    for k in [0, 2, 3] {
        assert_eq!(new_rows[k], old_rows[k], "an unchanged record's row is the old one, byte for byte");
    }
    assert_ne!(new_rows[1], old_rows[1], "the edited record was computed again");

    // The same rows as a full run over the new input.
    let full = d.join("full.jsonl");
    expect_code(&run(&p, &input, &full, &[]), 0, "full run");
    assert_eq!(std::fs::read_to_string(&full).unwrap(), new);

    // Nothing new: nothing to do.
    let o = run(&p, &input, &out, &["--incremental"]);
    expect_code(&o, 0, "incremental rerun");
    assert!(stderr(&o).contains("nothing to do"), "{}", stderr(&o));

    // A record removed from the input: its row goes, the rest is reused.
    std::fs::write(&input, news(6, edited).lines().skip(1).map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let o = run(&p, &input, &out, &["--incremental"]);
    expect_code(&o, 0, "incremental run over a shrunk input");
    let inc = report(&out)["incremental"].clone();
    assert_eq!((inc["reused"].as_u64(), inc["removed"].as_u64(), inc["new"].as_u64()), (Some(5), Some(1), Some(0)));
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        new.lines().skip(1).map(|l| format!("{l}\n")).collect::<String>()
    );

    // An edited output is not trusted: its rows are not reused.
    std::fs::write(&out, "{}\n").unwrap();
    std::fs::write(&input, news(2, |_, l| l.to_string())).unwrap();
    let o = run(&p, &input, &out, &["--incremental"]);
    expect_code(&o, 0, "incremental run over an edited output");
    assert!(stderr(&o).contains("changed since its report was written"), "{}", stderr(&o));
    assert_eq!(report(&out)["counts"]["ok"], 2);
}

/// `--output` through a symbolic link writes the file the link names (a link to a file not made
/// yet too): the link stays a link, the report and checkpoint sit beside the file, and a rerun
/// through the file's own name is the same job (nothing to do).
#[cfg(unix)]
#[test]
fn an_output_through_a_symbolic_link_writes_the_file_it_names() {
    let d = tmpdir("outlink");
    let p = short_pipeline(&d);
    let input = d.join("in.jsonl");
    std::fs::write(&input, news(2, |_, l| l.to_string())).unwrap();
    let (real, link) = (d.join("real.jsonl"), d.join("link.jsonl"));
    std::os::unix::fs::symlink("real.jsonl", &link).unwrap();
    let o = run(&p, &input, &link, &[]);
    expect_code(&o, 0, "run through the link");
    assert!(stderr(&o).contains("is a symbolic link"), "{}", stderr(&o));
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link was replaced");
    assert_eq!(std::fs::read_to_string(&real).unwrap().lines().count(), 2);
    assert_eq!(report(&real)["finished"]["rows"], 2);
    assert!(!with_suffix(&link, ".report.json").exists() && !with_suffix(&link, ".dustoff").exists());
    let again = run(&p, &input, &real, &[]);
    expect_code(&again, 0, "rerun through the file");
    assert!(stderr(&again).contains("nothing to do"), "{}", stderr(&again));
}
