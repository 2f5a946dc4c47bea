//! Jobs that survive operator mistakes (issue 16): the real binary, the sample model, the CPU
//! backend, summarize with 8 generated tokens over the 12 news records.
//! - two runs of one job at once: the second is refused at once (exit 5, the pid and the lock);
//! - an output that is an input: refused before anything is written (run, generate, tokenize);
//! - exit codes: usage errors exit 2 everywhere;
//! - a rerun after fixing the input: replaced when nothing successful was committed, else a
//!   message that says what changed and what --restart discards;
//! - out of memory inside a step (injected): the job continues and its output is unchanged;
//! - disk full (injected) in a commit and in the final output: a clear error, and the same
//!   command resumes to the unbroken output;
//! - Ctrl-C during `generate --input`: exit 4, and the same command resumes;
//! - a kill (injected) at each instant of a job's last step: the same command completes it
//!   without computing a row again.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use common::*;

const NEWS: &str = "samples/news.jsonl";

fn dustoff(args: &[&str], env: &[(&str, &str)]) -> Output {
    dustoff_cmd(args, env).output().expect("start dustoff")
}

fn spawn(args: &[&str], env: &[(&str, &str)], log: &Path) -> Child {
    let f = std::fs::File::create(log).unwrap();
    dustoff_cmd(args, env).stdout(Stdio::null()).stderr(f).spawn().expect("start dustoff")
}

fn run_args<'a>(pipeline: &'a str, input: &'a str, output: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a =
        vec!["run", pipeline, "--input", input, "--output", output, "--device", "cpu", "--slots", "4", "--quiet"];
    a.extend(extra);
    a
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn expect_code(o: &Output, want: i32, what: &str) {
    assert_eq!(o.status.code(), Some(want), "{what}: stderr:\n{}", stderr(o));
}

fn bytes(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn report(output: &Path) -> Value {
    serde_json::from_slice(&bytes(&with_suffix(output, ".report.json"))).unwrap()
}

fn journal_lines(output: &Path) -> usize {
    std::fs::read_to_string(with_suffix(output, ".dustoff/journal.jsonl")).map(|t| t.lines().count()).unwrap_or(0)
}

/// Waits until `ready` holds, with the child still running.
fn wait_until(child: &mut Child, what: &str, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !ready() {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("the job ended ({st}) before {what}");
        }
        assert!(Instant::now() < deadline, "no {what} within 90 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The unbroken summarize-8 run over the news (4 slots): the output the tests compare with.
struct Baseline {
    dir: PathBuf,
    pipeline: PathBuf,
    output: PathBuf,
}

fn baseline() -> &'static Baseline {
    static B: OnceLock<Baseline> = OnceLock::new();
    B.get_or_init(|| {
        let dir = tmpdir("safety-baseline");
        let pipeline = short_pipeline(&dir);
        let output = dir.join("unbroken.jsonl");
        let o = dustoff(&run_args(s(&pipeline), NEWS, s(&output), &[]), &[]);
        expect_code(&o, 0, "baseline run");
        Baseline { dir, pipeline, output }
    })
}

#[test]
fn a_second_run_of_the_same_job_is_refused_at_once_naming_the_pid_and_the_lock() {
    let b = baseline();
    let d = tmpdir("lock");
    let out = d.join("out.jsonl");
    let args = run_args(s(&b.pipeline), NEWS, s(&out), &[]);
    let env = [("DUSTOFF_COMMIT_ROWS", "1")];
    let mut first = spawn(&args, &env, &d.join("first.log"));
    wait_until(&mut first, "the first commit", || journal_lines(&out) > 0);
    let t = Instant::now();
    let o = dustoff(&args, &env);
    expect_code(&o, 5, "second run while the first runs");
    let e = stderr(&o);
    assert!(e.contains(&format!("pid {}", first.id())), "names the pid: {e}");
    assert!(e.contains("out.jsonl.dustoff.lock"), "names the lock: {e}");
    assert!(!e.contains("model:"), "refused before loading the model: {e}");
    assert!(t.elapsed() < Duration::from_secs(10), "refused at once");
    // The first run is not disturbed: stop it (exit 4) and resume it to the unbroken output.
    let k = Command::new("kill").args(["-TERM", &first.id().to_string()]).status().unwrap();
    assert!(k.success());
    assert_eq!(first.wait().unwrap().code(), Some(4));
    // kill -9 leaves the lock file but no lock: the next run takes it over.
    let n = journal_lines(&out);
    let mut killed = spawn(&args, &env, &d.join("killed.log"));
    let deadline = Instant::now() + Duration::from_secs(90);
    while journal_lines(&out) <= n && killed.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = killed.kill();
    killed.wait().unwrap();
    let o = dustoff(&args, &[]);
    expect_code(&o, 0, "resume after kill -9");
    assert_eq!(bytes(&out), bytes(&b.output), "no row lost or duplicated");
    assert!(!with_suffix(&out, ".dustoff.lock").exists(), "the lock file goes with the run");
}

#[test]
fn an_output_that_is_an_input_is_refused_before_anything_is_written() {
    let b = baseline();
    let d = tmpdir("overwrite");
    let input = d.join("news.jsonl");
    std::fs::copy(repo().join(NEWS), &input).unwrap();
    let before = bytes(&input);
    let same = d.join("./sub/../news.jsonl");
    std::fs::create_dir_all(d.join("sub")).unwrap();
    let bare = d.join("news");
    let cases: [Vec<&str>; 4] = [
        run_args(s(&b.pipeline), s(&input), s(&same), &[]),
        // The checkpoint directory of the output would hold the input.
        run_args(s(&b.pipeline), s(&input), s(&bare), &[]),
        vec!["generate", "--device", "cpu", "--input", s(&input), "--output", s(&same)],
        vec!["tokenize", "--input", s(&input), "--output", s(&same)],
    ];
    // `news` as output: its files are news.dustoff/, news.report.json...; put the input in there.
    let inside = d.join("news.dustoff");
    std::fs::create_dir_all(&inside).unwrap();
    std::fs::copy(&input, inside.join("in.jsonl")).unwrap();
    for (k, args) in cases.iter().enumerate() {
        let mut args = args.clone();
        let nested = inside.join("in.jsonl");
        if k == 1 {
            args[3] = s(&nested);
        }
        let o = dustoff(&args, &[]);
        expect_code(&o, 2, &format!("{args:?}"));
        assert!(stderr(&o).contains("would overwrite the input"), "{}", stderr(&o));
        assert!(!stderr(&o).contains("model:"), "refused before loading the model: {}", stderr(&o));
    }
    assert_eq!(bytes(&input), before, "the input is untouched");
    assert!(!with_suffix(&input, ".dustoff").exists() && !with_suffix(&input, ".report.json").exists());
}

#[test]
fn usage_errors_exit_2_everywhere() {
    let b = baseline();
    let out = b.dir.join("never.jsonl");
    let run = |extra: &[&str]| {
        let mut a = vec!["run", s(&b.pipeline), "--input", NEWS, "--output", s(&out), "--quiet"];
        a.extend(extra);
        a.iter().map(|x| x.to_string()).collect::<Vec<_>>()
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (run(&["--slots", "0"]), "--slots 0"),
        (run(&["--device", "gpu"]), "unknown device 'gpu'"),
        (vec!["generate".into()], "give either --prompt"),
        (vec!["generate".into(), "--prompt".into(), "hi".into(), "--max-tokens".into(), "0".into()], "--max-tokens 0"),
        (
            ["generate", "--device", "cpu", "--input", NEWS, "--output", "x.parquet"].map(String::from).to_vec(),
            "generate writes JSONL",
        ),
    ];
    for (args, want) in cases {
        let o = dustoff_cmd(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]).output().unwrap();
        expect_code(&o, 2, &format!("{args:?}"));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
    // An output directory that cannot be made fails before the model loads (exit 1), naming it.
    let under_file = repo().join(NEWS).join("x.jsonl");
    let o = dustoff(&["tokenize", "--input", NEWS, "--output", s(&under_file)], &[]);
    expect_code(&o, 1, "output under a file");
    assert!(stderr(&o).contains("cannot create") && !stderr(&o).contains("model:"), "{}", stderr(&o));
    assert!(!out.exists() && !with_suffix(&out, ".dustoff").exists());
}

#[test]
fn a_rerun_after_fixing_the_input_resumes_or_says_what_restart_discards() {
    let b = baseline();
    let d = tmpdir("fixed");
    let news = std::fs::read_to_string(repo().join(NEWS)).unwrap();
    let input = d.join("in.jsonl");
    let out = d.join("out.jsonl");
    let args = run_args(s(&b.pipeline), s(&input), s(&out), &["--max-errors", "0"]);

    // 1. The first record is broken: the abort commits one error row and nothing else. Fixed,
    //    the same command replaces that checkpoint and runs the job (no --restart needed).
    std::fs::write(&input, format!("{{\"id\": \"x\", \"text\": 5}}\n{news}")).unwrap();
    let o = dustoff(&args, &[]);
    expect_code(&o, 3, "aborted at the first record");
    assert!(stderr(&o).contains("--max-errors"), "{}", stderr(&o));
    std::fs::write(&input, &news).unwrap();
    let o = dustoff(&args, &[]);
    expect_code(&o, 0, "fixed input, same command");
    assert!(stderr(&o).contains("held no successful row"), "says what it replaced: {}", stderr(&o));
    assert_eq!(bytes(&out), bytes(&b.output));

    // 2. A start that failed on an unreadable input leaves an empty checkpoint: no --restart.
    let pq = d.join("in.parquet");
    std::fs::write(&pq, b"PAR1 this is not parquet PAR1").unwrap();
    let pq_out = d.join("pq.jsonl");
    let pq_args = run_args(s(&b.pipeline), s(&pq), s(&pq_out), &[]);
    let o = dustoff(&pq_args, &[]);
    expect_code(&o, 1, "unreadable parquet");
    assert!(stderr(&o).contains("in.parquet"), "names the input: {}", stderr(&o));
    std::fs::copy(repo().join("samples/news.parquet"), &pq).unwrap();
    let o = dustoff(&pq_args, &[]);
    expect_code(&o, 0, "fixed parquet, same command");
    assert_eq!(bytes(&pq_out), bytes(&b.output));

    // 3. Successful rows committed, then the input changes: refused, saying which file changed
    //    and how many rows --restart discards.
    let out3 = d.join("out3.jsonl");
    let broken: String =
        news.lines().enumerate().map(|(i, l)| if i == 1 { "{oops\n".into() } else { format!("{l}\n") }).collect();
    std::fs::write(&input, &broken).unwrap();
    let args3 = run_args(s(&b.pipeline), s(&input), s(&out3), &["--max-errors", "0"]);
    let o = dustoff(&args3, &[]);
    expect_code(&o, 3, "aborted at the second record");
    std::fs::write(&input, &news).unwrap();
    let o = dustoff(&args3, &[]);
    expect_code(&o, 2, "changed input with successful rows");
    let e = stderr(&o);
    let rows = report(&out3)["counts"]["ok"].as_u64().unwrap() + 1;
    for part in
        ["in.jsonl (", "bytes, content differs", &format!("holds {rows} committed rows"), "--restart", "discards"]
    {
        assert!(e.contains(part), "{part:?} missing: {e}");
    }
    assert!(!e.contains("model:"), "refused before the model loads: {e}");
    let o = dustoff(&run_args(s(&b.pipeline), s(&input), s(&out3), &["--restart"]), &[]);
    expect_code(&o, 0, "--restart");
    assert_eq!(bytes(&out3), bytes(&b.output));
}

#[test]
fn out_of_memory_inside_a_step_shrinks_the_batch_and_loses_nothing() {
    let b = baseline();
    let out = b.dir.join("oom.jsonl");
    // The first step with 4 sequences, and every later one as large, run out of memory.
    let o = dustoff(&run_args(s(&b.pipeline), NEWS, s(&out), &[]), &[("DUSTOFF_INJECT_OOM", "1,4")]);
    expect_code(&o, 0, "job with injected OOM");
    let e = stderr(&o);
    assert!(e.contains("out of device memory") && e.contains("retrying with at most 2 sequences"), "{e}");
    assert_eq!(bytes(&out), bytes(&b.output), "the same rows as the unbroken run");
    let r = report(&out);
    assert!(r["engine"]["oom_recoveries"].as_u64().unwrap() >= 1, "{}", r["engine"]);
    assert!(r["engine"]["preemptions"].as_u64().unwrap() >= 2, "the newest sequences were preempted: {}", r["engine"]);
}

#[test]
fn disk_full_gives_a_clear_error_and_the_same_command_resumes() {
    let b = baseline();
    let d = tmpdir("diskfull");
    let out = d.join("out.jsonl");
    let args = run_args(s(&b.pipeline), NEWS, s(&out), &[]);
    // The second commit fails half way through its part file.
    let o = dustoff(&args, &[("DUSTOFF_COMMIT_ROWS", "4"), ("DUSTOFF_INJECT_WRITE_ERROR", "commit:2")]);
    expect_code(&o, 1, "disk full in a commit");
    let e = stderr(&o);
    assert_eq!(e.matches("No space left on device").count(), 1, "the cause once: {e}");
    assert!(e.contains(&format!("checkpoint of {}", out.display())), "names the user's output: {e}");
    assert!(e.contains("run the same command"), "{e}");
    let ck = with_suffix(&out, ".dustoff");
    assert_eq!(journal_lines(&out), 1, "the first commit stays");
    let first: Value = serde_json::from_str(std::fs::read_to_string(ck.join("journal.jsonl")).unwrap().trim()).unwrap();
    assert!(!ck.join("part-000002.tsv").exists(), "the half part is gone");
    let o = dustoff(&args, &[]);
    expect_code(&o, 0, "resume after space is freed");
    assert_eq!(bytes(&out), bytes(&b.output));
    assert_eq!(report(&out)["counts"]["skipped_done"], first["rows"], "the committed rows were kept");

    // The final output fails: no half output, the checkpoint stays whole, the rerun writes it.
    let out2 = d.join("out2.jsonl");
    let args2 = run_args(s(&b.pipeline), NEWS, s(&out2), &[]);
    let o = dustoff(&args2, &[("DUSTOFF_INJECT_WRITE_ERROR", "output")]);
    expect_code(&o, 1, "disk full in the output");
    assert!(stderr(&o).contains(&format!("writing the output {}", out2.display())), "{}", stderr(&o));
    assert!(!out2.exists());
    let o = dustoff(&args2, &[]);
    expect_code(&o, 0, "rerun writes the output");
    assert_eq!(bytes(&out2), bytes(&b.output));
    assert_eq!(report(&out2)["counts"]["skipped_done"], 12, "nothing recomputed");
}

/// A kill at each instant of the job's last step (`DUSTOFF_INJECT_KILL`, the windows random
/// kills hit only by chance): after the output is in place (the checkpoint whole: the rerun
/// finishes from it), after the checkpoint is renamed to `.dustoff.old` to be deleted, and while
/// it is deleted (the report is written before the checkpoint goes: the rerun finds the job
/// finished and removes the leftover). Either way the same command ends with the unbroken
/// output, every row once, no checkpoint left behind, and no row computed again.
#[test]
fn a_kill_in_the_last_step_of_a_job_loses_and_recomputes_nothing() {
    use std::os::unix::process::ExitStatusExt;
    let b = baseline();
    let d = tmpdir("finish-kill");
    let want_ids: Vec<Value> = read_jsonl(&b.output).iter().map(|v| v["id"].clone()).collect();
    assert_eq!(want_ids.len(), 12);
    for (point, checkpoint_left, old_left) in [
        ("finish-after-output", true, false),
        ("finish-after-discard-rename", false, true),
        ("finish-during-removal", false, true),
    ] {
        let out = d.join(format!("{point}.jsonl"));
        let (ck, old) = (with_suffix(&out, ".dustoff"), with_suffix(&out, ".dustoff.old"));
        let args = run_args(s(&b.pipeline), NEWS, s(&out), &[]);
        let o = dustoff(&args, &[("DUSTOFF_INJECT_KILL", point)]);
        assert_eq!(o.status.signal(), Some(9), "{point}: killed there; stderr:\n{}", stderr(&o));
        assert_eq!(bytes(&out), bytes(&b.output), "{point}: the output was in place");
        assert_eq!((ck.exists(), old.exists()), (checkpoint_left, old_left), "{point}: what the kill left");

        let o = dustoff(&args, &[]);
        expect_code(&o, 0, &format!("{point}: rerun"));
        assert_eq!(bytes(&out), bytes(&b.output), "{point}: the unbroken run's output");
        let ids: Vec<Value> = read_jsonl(&out).iter().map(|v| v["id"].clone()).collect();
        assert_eq!(ids, want_ids, "{point}: every row once, in input order");
        assert!(!ck.exists() && !old.exists(), "{point}: a checkpoint is left behind");
        let counts = &report(&out)["counts"];
        if checkpoint_left {
            assert_eq!(
                (&counts["skipped_done"], &counts["ok"]),
                (&Value::from(12), &Value::from(0)),
                "{point}: {counts}"
            );
            assert!(stderr(&o).contains("12 already done"), "{point}: {}", stderr(&o));
        } else {
            // The killed run's own report: every row computed once, by it.
            assert_eq!(
                (&counts["skipped_done"], &counts["ok"]),
                (&Value::from(0), &Value::from(12)),
                "{point}: {counts}"
            );
            assert!(stderr(&o).contains("nothing to do"), "{point}: {}", stderr(&o));
        }
    }
}

/// A failure writing the report (a full disk; here a directory where the report goes) comes
/// before the checkpoint is removed: the same command then finishes the job from it. It used
/// to leave the output with neither checkpoint nor report, refused as someone else's file.
#[test]
fn a_failed_report_write_keeps_the_checkpoint_and_the_same_command_finishes() {
    let b = baseline();
    let d = tmpdir("report-fail");
    let out = d.join("out.jsonl");
    let report_path = with_suffix(&out, ".report.json");
    std::fs::create_dir_all(&report_path).unwrap();
    let args = run_args(s(&b.pipeline), NEWS, s(&out), &[]);
    let o = dustoff(&args, &[]);
    expect_code(&o, 1, "report path is a directory");
    assert!(stderr(&o).contains("writing the report beside"), "{}", stderr(&o));
    assert!(with_suffix(&out, ".dustoff").join("job.json").is_file(), "the checkpoint stays");
    std::fs::remove_dir(&report_path).unwrap();
    let o = dustoff(&args, &[]);
    expect_code(&o, 0, "the same command after the failure");
    assert_eq!(bytes(&out), bytes(&b.output));
    assert!(stderr(&o).contains("12 already done"), "{}", stderr(&o));
    assert!(!with_suffix(&out, ".dustoff").exists() && !with_suffix(&out, ".dustoff.old").exists());
}

#[test]
fn ctrl_c_during_generate_input_keeps_the_finished_rows_and_the_same_command_resumes() {
    let d = tmpdir("gen-int");
    let news = std::fs::read_to_string(repo().join(NEWS)).unwrap();
    let prompts: String = news
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let text: String = v["text"].as_str().unwrap().chars().take(200).collect();
            format!("{}\n", serde_json::json!({"id": v["id"], "prompt": text}))
        })
        .collect();
    let input = d.join("prompts.jsonl");
    std::fs::write(&input, prompts).unwrap();
    let gen = |out: &Path| {
        [
            "generate",
            "--device",
            "cpu",
            "--slots",
            "2",
            "--max-tokens",
            "8",
            "--ctx",
            "256",
            "--input",
            s(&input),
            "--output",
            s(out),
        ]
        .map(String::from)
        .to_vec()
    };
    let unbroken = d.join("unbroken.jsonl");
    let a = gen(&unbroken);
    let o = dustoff(&a.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    expect_code(&o, 0, "unbroken generate");
    assert_eq!(std::fs::read_to_string(&unbroken).unwrap().lines().count(), 12);

    let out = d.join("out.jsonl");
    let a = gen(&out);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let env = [("DUSTOFF_COMMIT_ROWS", "2")];
    let log = d.join("int.log");
    let mut child = spawn(&a, &env, &log);
    wait_until(&mut child, "a commit", || journal_lines(&out) > 0);
    let k = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(k.success());
    let st = child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(st.code(), Some(4), "SIGINT: {text}");
    assert!(text.contains("resume"), "{text}");
    assert!(!out.exists(), "the output is written when every line has its row");
    let kept = journal_lines(&out);
    assert!(kept >= 1);
    let o = dustoff(&a, &[]);
    expect_code(&o, 0, "resumed generate");
    assert!(stderr(&o).contains("from an earlier run"), "{}", stderr(&o));
    assert_eq!(bytes(&out), bytes(&unbroken), "resumed output equals the unbroken run's");
}

/// A checkpoint whose journal lists a part file that is gone (or whose journal is gone) is
/// damaged: exit 2 naming the file, as for a changed part (it was exit 1, "I/O", which promises
/// that the same command resumes).
#[test]
fn a_checkpoint_missing_a_file_is_damaged_exit_2() {
    let b = baseline();
    let d = tmpdir("ck-missing");
    for file in ["part-000001.tsv", "journal.jsonl"] {
        let out = d.join(format!("{file}.jsonl"));
        let args = run_args(s(&b.pipeline), NEWS, s(&out), &[]);
        let o = dustoff(&args, &[("DUSTOFF_INJECT_KILL", "finish-after-output")]);
        assert!(o.status.code().is_none(), "killed at the injected point: {}", stderr(&o));
        std::fs::remove_file(with_suffix(&out, ".dustoff").join(file)).unwrap();
        let o = dustoff(&args, &[]);
        expect_code(&o, 2, file);
        assert!(stderr(&o).contains(file) && stderr(&o).contains("damaged"), "{}", stderr(&o));
    }
}

/// The same for an `--incremental` run, whose checkpoint names the output it builds on (a
/// failure after its output replaced that one): the same command finishes it from its
/// checkpoint (the rerun could not compute that base again: it was refused as another job).
#[test]
fn a_failed_report_write_of_an_incremental_run_is_finished_by_the_same_command() {
    let b = baseline();
    let d = tmpdir("report-fail-inc");
    let (input, out) = (d.join("in.jsonl"), d.join("out.jsonl"));
    let news = std::fs::read_to_string(repo().join(NEWS)).unwrap();
    std::fs::write(&input, news.lines().take(3).map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let args = run_args(s(&b.pipeline), s(&input), s(&out), &["--incremental"]);
    expect_code(&dustoff(&args, &[]), 0, "the first 3 records");
    std::fs::write(&input, &news).unwrap();
    // The report is written under <report>.tmp, then renamed: a directory there fails it.
    let tmp = with_suffix(&out, ".report.json.tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let o = dustoff(&args, &[]);
    expect_code(&o, 1, "incremental run whose report cannot be written");
    std::fs::remove_dir(&tmp).unwrap();
    let o = dustoff(&args, &[]);
    expect_code(&o, 0, "the same command after the failure");
    assert!(stderr(&o).contains("finishing the job from its checkpoint"), "{}", stderr(&o));
    assert_eq!(bytes(&out), bytes(&b.output), "the 12 rows of an unbroken run");
    assert!(!with_suffix(&out, ".dustoff").exists());
    let o = dustoff(&args, &[]);
    expect_code(&o, 0, "and then nothing to do");
    assert!(stderr(&o).contains("nothing to do"), "{}", stderr(&o));
}
