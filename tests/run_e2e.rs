//! `dustoff run` and `dustoff merge` end to end: the real binary, the real sample model, the CPU
//! backend. Inputs are the samples (12 news records, the malformed corpus, a Parquet copy, an
//! OpenAI batch file) with a copy of the summarize pipeline that generates 8 tokens, so the whole
//! file stays well under a minute on 2 cores. Rows are greedy, so every comparison is byte for byte.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use common::*;

const NEWS: &str = "samples/news.jsonl";
const ROW_KEYS: [&str; 7] =
    ["id", "output", "finish_reason", "prompt_tokens", "generated_tokens", "input_truncated", "empty_output"];

/// `dustoff run PIPELINE --input IN --output OUT --device cpu --slots 4 --quiet EXTRA...`.
fn run_args<'a>(pipeline: Option<&'a str>, input: &'a str, output: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["run"];
    a.extend(pipeline);
    a.extend(["--input", input, "--output", output, "--device", "cpu", "--slots", "4", "--quiet"]);
    a.extend(extra);
    a
}

fn dustoff(args: &[&str], env: &[(&str, &str)]) -> Output {
    dustoff_cmd(args, env).output().expect("start dustoff")
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn expect_code(o: &Output, want: i32, what: &str) {
    assert_eq!(code(o), want, "{what}: exit code {}; stderr:\n{}", code(o), stderr(o));
}

fn read_rows(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display()))).collect()
}

fn read_bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn report(output: &Path) -> Value {
    let mut p = output.as_os_str().to_owned();
    p.push(".report.json");
    serde_json::from_slice(&read_bytes(Path::new(&p))).unwrap()
}

fn checkpoint_dir(output: &Path) -> PathBuf {
    let mut p = output.as_os_str().to_owned();
    p.push(".dustoff");
    PathBuf::from(p)
}

fn input_ids(path: &Path) -> Vec<String> {
    read_rows(path).iter().map(|r| r["id"].as_str().unwrap().to_string()).collect()
}

/// The summarize-8 run over the 12 news records with 4 slots: the reference several tests
/// compare against (run once per test process).
struct Baseline {
    dir: PathBuf,
    pipeline: PathBuf,
    output: PathBuf,
    wall: Duration,
}

fn baseline() -> &'static Baseline {
    static B: OnceLock<Baseline> = OnceLock::new();
    B.get_or_init(|| {
        let dir = tmpdir("baseline");
        let pipeline = short_pipeline(&dir);
        let output = dir.join("summaries.jsonl");
        let t = Instant::now();
        let o = dustoff(&run_args(Some(s(&pipeline)), NEWS, s(&output), &[]), &[]);
        let wall = t.elapsed();
        expect_code(&o, 0, "baseline run");
        Baseline { dir, pipeline, output, wall }
    })
}

#[test]
fn jsonl_in_jsonl_out_one_row_per_record_in_order_with_report() {
    let b = baseline();
    eprintln!("baseline run (12 records, 8 tokens, 4 slots): {:.1} s", b.wall.as_secs_f64());
    let rows = read_rows(&b.output);
    assert_eq!(
        rows.iter().map(|r| r["id"].as_str().unwrap().to_string()).collect::<Vec<_>>(),
        input_ids(&repo().join(NEWS)),
        "one row per record, in input order"
    );
    let text = String::from_utf8(read_bytes(&b.output)).unwrap();
    for (line, r) in text.lines().zip(&rows) {
        // Key order is part of the format (rows compare byte for byte across tools).
        let keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        let mut want = ROW_KEYS.to_vec();
        let mut got = keys.clone();
        want.sort();
        got.sort();
        assert_eq!(got, want, "row keys: {line}");
        assert!(line.starts_with("{\"id\":"), "id comes first: {line}");
        assert!(!r["output"].as_str().unwrap().trim().is_empty(), "empty summary: {line}");
        assert_eq!(r["finish_reason"], "length", "8 tokens never finish a summary: {line}");
        assert_eq!(r["generated_tokens"], 8, "{line}");
        assert_eq!((&r["input_truncated"], &r["empty_output"]), (&Value::Bool(false), &Value::Bool(false)), "{line}");
        assert!(r["prompt_tokens"].as_u64().unwrap() > 40, "system + instruction + text: {line}");
        assert!(!line.contains("seconds"), "no wall-clock values in rows: {line}");
    }
    assert!(!checkpoint_dir(&b.output).exists(), "the checkpoint is removed after completion");

    let rep = report(&b.output);
    assert_eq!(rep["outcome"], "completed");
    let c = &rep["counts"];
    assert_eq!((c["records"].as_u64(), c["ok"].as_u64(), c["error"].as_u64()), (Some(12), Some(12), Some(0)));
    assert_eq!(c["skipped_done"], 0);
    let prompt: u64 = rows.iter().map(|r| r["prompt_tokens"].as_u64().unwrap()).sum();
    assert_eq!(rep["tokens"]["prompt_total"].as_u64(), Some(prompt));
    assert_eq!(rep["tokens"]["generated"].as_u64(), Some(12 * 8));
    let e = &rep["engine"];
    assert_eq!(e["prompt_tokens"].as_u64(), Some(prompt), "engine metrics: {e}");
    let computed = e["prompt_tokens_computed"].as_u64().unwrap();
    // The system prompt and instruction (a few full 16-token blocks) are computed once per job.
    assert!(computed + 11 * 16 <= prompt, "prefix reuse: computed {computed} of {prompt}");
    assert_eq!(rep["tokens"]["prompt_computed"].as_u64(), Some(computed));
    assert!(rep["wall_seconds"].as_f64().unwrap() > 0.0);
}

#[test]
fn bad_records_become_error_rows_and_max_errors_aborts_resumably() {
    let d = tmpdir("bad");
    let pipeline = short_pipeline(&d);
    let bad = "samples/bad.jsonl";
    let full = d.join("full.jsonl");
    let o = dustoff(&run_args(Some(s(&pipeline)), bad, s(&full), &[]), &[]);
    // A job that completed with error rows exits 3 (README: exit codes), and says how many.
    expect_code(&o, 3, "bad input run");
    assert!(stderr(&o).contains("error rows: 9"), "the summary counts the error rows: {}", stderr(&o));
    let rows = read_rows(&full);
    // (id, line of an id-less row, error kind or None for a result row), in input order;
    // the blank line 11 is not a record.
    let want: [(Option<&str>, Option<u64>, Option<&str>); 12] = [
        (Some("ok-1"), None, None),
        (None, Some(2), Some("malformed_json")),
        (None, Some(3), Some("malformed_json")),
        (None, Some(4), Some("missing_field")),
        (Some("no-text"), None, Some("missing_field")),
        (Some("wrong-type"), None, Some("wrong_type")),
        (Some("empty"), None, Some("empty_document")),
        (Some("ok-1"), None, Some("duplicate_id")),
        (Some("77"), None, None),
        (None, Some(10), Some("wrong_type")),
        (Some("ok-2"), None, None),
        (Some("bad-utf8"), None, Some("invalid_utf8")),
    ];
    assert_eq!(rows.len(), want.len(), "one row per record: {rows:#?}");
    for (r, (id, line, kind)) in rows.iter().zip(want) {
        assert_eq!(r["id"].as_str(), id, "{r}");
        match kind {
            None => {
                assert!(r["output"].as_str().is_some_and(|t| !t.is_empty()), "{r}");
                assert!(r.get("error").is_none(), "{r}");
            }
            Some(k) => {
                assert!(r["output"].is_null(), "{r}");
                assert_eq!(r["error"]["kind"], k, "{r}");
                assert!(!r["error"]["message"].as_str().unwrap().is_empty(), "{r}");
                if id.is_none() {
                    assert_eq!(r["line"].as_u64(), line, "an unparsable line is named by number: {r}");
                }
            }
        }
    }
    assert_eq!(report(&full)["error_rows"], 9);
    let c = &report(&full)["counts"];
    assert_eq!((c["ok"].as_u64(), c["error"].as_u64()), (Some(3), Some(9)), "{c}");
    assert_eq!(c["errors_by_kind"]["malformed_json"], 2, "{c}");

    // Past --max-errors: exit 3, no output, the checkpoint kept; a higher limit resumes.
    let capped = d.join("capped.jsonl");
    let o = dustoff(&run_args(Some(s(&pipeline)), bad, s(&capped), &["--max-errors", "2"]), &[]);
    expect_code(&o, 3, "--max-errors 2");
    assert!(stderr(&o).contains("--max-errors"), "the abort says why: {}", stderr(&o));
    assert!(!capped.exists(), "no output after an abort");
    assert!(checkpoint_dir(&capped).join("journal.jsonl").exists());
    assert_eq!(report(&capped)["outcome"], "aborted");
    // The same limit again stays aborted: the committed errors already pass it.
    let o = dustoff(&run_args(Some(s(&pipeline)), bad, s(&capped), &["--max-errors", "2"]), &[]);
    expect_code(&o, 3, "--max-errors 2 again");
    let o = dustoff(&run_args(Some(s(&pipeline)), bad, s(&capped), &["--max-errors", "20"]), &[]);
    expect_code(&o, 3, "resume with --max-errors 20 (completes, with error rows)");
    assert_eq!(report(&capped)["error_rows"], 9, "the error rows of both runs are counted");
    assert_eq!(read_bytes(&capped), read_bytes(&full), "a resumed job writes the unbroken job's output");
    let c = &report(&capped)["counts"];
    assert!(c["skipped_done"].as_u64().unwrap() >= 3, "committed rows are not recomputed: {c}");
    assert!(!checkpoint_dir(&capped).exists());
}

/// Waits until the journal of `output` has more than `after` lines (a commit happened), with the
/// child still running.
fn wait_for_commit(child: &mut Child, output: &Path, after: usize) {
    let journal = checkpoint_dir(output).join("journal.jsonl");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(t) = std::fs::read_to_string(&journal) {
            let n = t.lines().count();
            if n > after {
                return;
            }
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("the job ended ({st}) before a new checkpoint commit: the test needs more records");
        }
        assert!(Instant::now() < deadline, "no checkpoint commit within 60 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The journal entries of an output's checkpoint (one per committed part).
fn journal(output: &Path) -> Vec<Value> {
    read_rows(&checkpoint_dir(output).join("journal.jsonl"))
}

fn spawn(args: &[&str], env: &[(&str, &str)], log: &Path) -> Child {
    let f = std::fs::File::create(log).unwrap();
    dustoff_cmd(args, env).stdout(Stdio::null()).stderr(f).spawn().expect("start dustoff")
}

#[test]
fn kill_9_and_sigterm_then_resume_give_the_unbroken_output() {
    let d = tmpdir("kill");
    let pipeline = short_pipeline(&d);
    // 24 records: the news twice, the second copy with new ids (the prefix cache makes it cheap).
    let news = std::fs::read_to_string(repo().join(NEWS)).unwrap();
    let mut text = news.clone();
    for l in news.lines() {
        let mut v: Value = serde_json::from_str(l).unwrap();
        v["id"] = format!("{}-again", v["id"].as_str().unwrap()).into();
        text.push_str(&format!("{v}\n"));
    }
    let input = d.join("news24.jsonl");
    std::fs::write(&input, text).unwrap();

    let unbroken = d.join("unbroken.jsonl");
    let o = dustoff(&run_args(Some(s(&pipeline)), s(&input), s(&unbroken), &[]), &[]);
    expect_code(&o, 0, "unbroken run");
    assert_eq!(read_rows(&unbroken).len(), 24);

    // Commit every 4 rows so that several commits happen; interrupt the job three times at a
    // commit boundary plus whatever is in flight: kill -9, SIGTERM, kill -9.
    let out = d.join("resumed.jsonl");
    let args = run_args(Some(s(&pipeline)), s(&input), s(&out), &[]);
    let env = [("DUSTOFF_COMMIT_ROWS", "4")];
    let mut journal_lines = 0;
    for (round, signal) in ["KILL", "TERM", "KILL"].iter().enumerate() {
        let log = d.join(format!("round{round}.log"));
        let mut child = spawn(&args, &env, &log);
        wait_for_commit(&mut child, &out, journal_lines);
        let st = if *signal == "KILL" {
            child.kill().unwrap();
            child.wait().unwrap()
        } else {
            let k = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
            assert!(k.success());
            child.wait().unwrap()
        };
        let log_text = std::fs::read_to_string(&log).unwrap();
        if *signal == "TERM" {
            // SIGTERM: stop taking records, commit what finished, exit 4 with a resume hint.
            assert_eq!(st.code(), Some(4), "SIGTERM exit code; stderr:\n{log_text}");
            assert!(log_text.contains("resume"), "resume hint: {log_text}");
            assert_eq!(report(&out)["outcome"], "interrupted");
        } else {
            assert!(st.code().is_none(), "killed by the signal");
        }
        assert!(!out.exists(), "round {round}: no output before the job completes");
        // SIGTERM's own final commit adds a line: wait for a commit after it next round.
        journal_lines = journal(&out).len();
    }
    let committed: u64 = journal(&out).iter().map(|e| e["rows"].as_u64().unwrap()).sum();
    assert!((3..24).contains(&committed), "three interrupted runs committed part of the job: {committed}");
    let o = dustoff(&args, &env);
    expect_code(&o, 0, "final resume");
    assert_eq!(
        String::from_utf8(read_bytes(&out)).unwrap(),
        String::from_utf8(read_bytes(&unbroken)).unwrap(),
        "resumed output equals the unbroken run's"
    );
    let c = &report(&out)["counts"];
    assert_eq!(c["skipped_done"].as_u64(), Some(committed), "committed rows are not recomputed: {c}");
    assert_eq!(c["records"], 24, "{c}");
    assert!(!checkpoint_dir(&out).exists());
}

#[test]
fn a_different_job_on_the_same_output_is_refused_until_restart() {
    let d = tmpdir("mismatch");
    let pipeline = short_pipeline(&d);
    let bad = repo().join("samples/bad.jsonl");
    let out = d.join("out.jsonl");
    // Leave a checkpoint behind: abort at the first error.
    let o = dustoff(&run_args(Some(s(&pipeline)), s(&bad), s(&out), &["--max-errors", "0"]), &[]);
    expect_code(&o, 3, "--max-errors 0");
    let job_json = read_bytes(&checkpoint_dir(&out).join("job.json"));

    // A changed pipeline (one more generated token).
    let changed = d.join("summarize9.toml");
    let text = std::fs::read_to_string(&pipeline).unwrap().replace("max_tokens = 8", "max_tokens = 9");
    std::fs::write(&changed, text).unwrap();
    let o = dustoff(&run_args(Some(s(&changed)), s(&bad), s(&out), &["--max-errors", "0"]), &[]);
    expect_code(&o, 2, "changed pipeline");
    let e = stderr(&o);
    assert!(e.contains("different job") && e.contains("the pipeline file") && e.contains("--restart"), "{e}");

    // A changed input (same name, one more record).
    let input2 = d.join("bad.jsonl");
    let mut t = read_bytes(&bad);
    t.extend_from_slice(b"{\"id\": \"extra\", \"text\": \"One more record.\"}\n");
    std::fs::write(&input2, t).unwrap();
    let o = dustoff(&run_args(Some(s(&pipeline)), s(&input2), s(&out), &[]), &[]);
    expect_code(&o, 2, "changed input");
    assert!(stderr(&o).contains("the input files"), "{}", stderr(&o));
    assert_eq!(read_bytes(&checkpoint_dir(&out).join("job.json")), job_json, "a refused job changes nothing");
    assert!(!out.exists());

    // --restart discards the old checkpoint and runs the new job from the start.
    let o = dustoff(&run_args(Some(s(&changed)), s(&bad), s(&out), &["--restart"]), &[]);
    expect_code(&o, 3, "--restart (bad.jsonl completes with error rows)");
    let rows = read_rows(&out);
    assert_eq!(rows.len(), 12);
    assert_eq!(rows[0]["generated_tokens"], 9, "the new pipeline ran: {}", rows[0]);
    let c = &report(&out)["counts"];
    assert_eq!(c["skipped_done"], 0, "nothing was kept from the old job: {c}");
}

fn parquet_rows(path: &Path) -> Vec<Value> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{UInt32Type, UInt64Type};
    let f = std::fs::File::open(path).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f).unwrap().build().unwrap();
    let mut rows = Vec::new();
    for batch in reader {
        let b = batch.unwrap();
        let col = |n: &str| b.column_by_name(n).unwrap_or_else(|| panic!("no column {n}")).clone();
        let (id, line, output, fr) = (col("id"), col("line"), col("output"), col("finish_reason"));
        let (pt, gt) = (col("prompt_tokens"), col("generated_tokens"));
        let (tr, em) = (col("input_truncated"), col("empty_output"));
        assert!(b.column_by_name("error").is_some());
        let text =
            |a: &arrow::array::ArrayRef, i: usize| (!a.is_null(i)).then(|| a.as_string::<i32>().value(i).to_string());
        let num =
            |a: &arrow::array::ArrayRef, i: usize| (!a.is_null(i)).then(|| a.as_primitive::<UInt32Type>().value(i));
        let flag = |a: &arrow::array::ArrayRef, i: usize| (!a.is_null(i)).then(|| a.as_boolean().value(i));
        for i in 0..b.num_rows() {
            assert!(line.is_null(i) || line.as_primitive::<UInt64Type>().value(i) > 0);
            rows.push(serde_json::json!({
                "id": text(&id, i), "output": text(&output, i), "finish_reason": text(&fr, i),
                "prompt_tokens": num(&pt, i), "generated_tokens": num(&gt, i),
                "input_truncated": flag(&tr, i), "empty_output": flag(&em, i),
            }));
        }
    }
    rows
}

#[test]
fn parquet_in_parquet_out_and_openai_batch_in_and_out() {
    let b = baseline();
    let d = tmpdir("formats");
    // samples/news.parquet holds the same 12 records as samples/news.jsonl.
    let out = d.join("summaries.parquet");
    let o = dustoff(&run_args(Some(s(&b.pipeline)), "samples/news.parquet", s(&out), &[]), &[]);
    expect_code(&o, 0, "parquet run");
    assert_eq!(parquet_rows(&out), read_rows(&b.output), "Parquet rows equal the JSONL rows");
    assert_eq!(report(&out)["counts"]["ok"], 12);

    // OpenAI batch: no pipeline; OpenAI batch output lines in input order.
    let batch = repo().join("samples/openai-batch.jsonl");
    let out = d.join("batch-out.jsonl");
    let o = dustoff(&run_args(None, s(&batch), s(&out), &[]), &[]);
    expect_code(&o, 0, "openai batch run");
    let reqs = read_rows(&batch);
    let rows = read_rows(&out);
    assert_eq!(rows.len(), reqs.len());
    for (r, q) in rows.iter().zip(&reqs) {
        assert_eq!(r["custom_id"], q["custom_id"], "{r}");
        assert!(r["id"].as_str().unwrap().starts_with("batch_req_"), "{r}");
        assert!(r["error"].is_null(), "{r}");
        let resp = &r["response"];
        assert_eq!(resp["status_code"], 200, "{r}");
        let body = &resp["body"];
        let chat = q["url"] == "/v1/chat/completions";
        assert_eq!(body["object"], if chat { "chat.completion" } else { "text_completion" }, "{r}");
        let choice = &body["choices"][0];
        let text = if chat { &choice["message"]["content"] } else { &choice["text"] };
        assert!(!text.as_str().unwrap().trim().is_empty(), "{r}");
        let usage = &body["usage"];
        let n = usage["completion_tokens"].as_u64().unwrap();
        assert!(n >= 1 && n <= q["body"]["max_tokens"].as_u64().unwrap(), "the request's max_tokens: {r}");
        assert_eq!(usage["total_tokens"].as_u64(), Some(n + usage["prompt_tokens"].as_u64().unwrap()));
        assert!(choice["finish_reason"] == "stop" || choice["finish_reason"] == "length", "{r}");
    }
    // A completion request really ran through the model.
    let norway = rows[2]["response"]["body"]["choices"][0]["text"].as_str().unwrap();
    assert!(norway.contains("Oslo"), "'The capital of Norway is' -> {norway:?}");

    // OpenAI batch output is JSONL only: refused before any work.
    let o = dustoff(&run_args(None, s(&batch), s(&d.join("batch.parquet")), &[]), &[]);
    expect_code(&o, 1, "openai batch to parquet");
    assert!(stderr(&o).contains(".jsonl"), "{}", stderr(&o));
}

#[test]
fn shards_merge_into_the_unsharded_output_and_slurm_env_picks_the_shard() {
    let b = baseline();
    let d = tmpdir("shard");
    let (s0, s1) = (d.join("shard0.jsonl"), d.join("shard1.jsonl"));
    let o = dustoff(&run_args(Some(s(&b.pipeline)), NEWS, s(&s0), &["--shard", "0/2"]), &[]);
    expect_code(&o, 0, "--shard 0/2");
    // Shard 1 from the Slurm job-array variables instead of --shard.
    let slurm = [("SLURM_ARRAY_TASK_ID", "1"), ("SLURM_ARRAY_TASK_COUNT", "2")];
    let o = dustoff(&run_args(Some(s(&b.pipeline)), NEWS, s(&s1), &[]), &slurm);
    expect_code(&o, 0, "shard from SLURM_ARRAY_TASK_ID");
    assert_eq!(report(&s1)["shard"], "1/2");
    let order = std::fs::read_to_string(d.join("shard1.jsonl.order")).unwrap();
    let header: Value = serde_json::from_str(order.lines().next().unwrap()).unwrap();
    assert_eq!(header["shard"], serde_json::json!({"index": 1, "count": 2}));

    let (r0, r1) = (read_rows(&s0), read_rows(&s1));
    assert_eq!(r0.len() + r1.len(), 12);
    assert!(!r0.is_empty() && !r1.is_empty(), "both shards get records: {} and {}", r0.len(), r1.len());
    assert!(r0.iter().all(|a| r1.iter().all(|b| a["id"] != b["id"])), "disjoint shards");

    let merged = d.join("merged.jsonl");
    let o = dustoff(&["merge", "--output", s(&merged), s(&s1), s(&s0)], &[]);
    expect_code(&o, 0, "merge");
    assert_eq!(read_bytes(&merged), read_bytes(&b.output), "merged shards equal the unsharded run");
    // `shard*.jsonl` also matches each shard's error file: those are left out, not merged.
    let errors = |p: &std::path::Path| std::path::PathBuf::from(format!("{}.errors.jsonl", p.display()));
    assert!(errors(&s0).is_file(), "every run writes its error file");
    let again = d.join("again.jsonl");
    let o = dustoff(&["merge", "--output", s(&again), s(&errors(&s0)), s(&s0), s(&s1), s(&errors(&s1))], &[]);
    expect_code(&o, 0, "merge of a glob's matches");
    assert!(stderr(&o).contains("leaving out"), "{}", stderr(&o));
    assert_eq!(read_bytes(&again), read_bytes(&b.output));
    // Never over a shard being merged; a shard given twice fails the same way again (exit 2).
    let shard0 = read_bytes(&s0);
    let o = dustoff(&["merge", "--output", s(&s0), s(&s0), s(&s1)], &[]);
    expect_code(&o, 2, "merge into one of its shards");
    assert!(stderr(&o).contains("would overwrite the input"), "{}", stderr(&o));
    assert_eq!(read_bytes(&s0), shard0);
    let o = dustoff(&["merge", "--output", s(&again), s(&s0), s(&s0)], &[]);
    expect_code(&o, 2, "a shard given twice");
    // The output replaces only this job's earlier merge, unchanged: a shard's sidecar, another
    // file, an edited merge are refused and left as they were (merge wrote over any of them).
    let o = dustoff(&["merge", "--output", s(&merged), s(&s0), s(&s1)], &[]);
    expect_code(&o, 0, "the same merge again");
    assert_eq!(read_bytes(&merged), read_bytes(&b.output));
    let order0 = d.join("shard0.jsonl.order");
    let order_bytes = read_bytes(&order0);
    let o = dustoff(&["merge", "--output", s(&order0), s(&s0), s(&s1)], &[]);
    expect_code(&o, 2, "merge over a shard's .order file");
    assert_eq!(read_bytes(&order0), order_bytes);
    let precious = d.join("precious.jsonl");
    std::fs::write(&precious, "keep me\n").unwrap();
    let o = dustoff(&["merge", "--output", s(&precious), s(&s0), s(&s1)], &[]);
    expect_code(&o, 2, "merge over a file it did not write");
    assert!(stderr(&o).contains("is not an earlier merge"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me\n");
    // A shard changed since its run finished it (cut short here) is refused, not merged.
    let cut = d.join("cut.jsonl");
    std::fs::copy(&s0, &cut).unwrap();
    for ext in [".order", ".report.json", ".digests.tsv"] {
        std::fs::copy(with_suffix(&s0, ext), with_suffix(&cut, ext)).unwrap();
    }
    let f = std::fs::OpenOptions::new().write(true).open(&cut).unwrap();
    f.set_len(shard0.len() as u64 - 20).unwrap();
    let o = dustoff(&["merge", "--output", s(&d.join("m3.jsonl")), s(&cut), s(&s1)], &[]);
    expect_code(&o, 2, "merge of a truncated shard");
    assert!(stderr(&o).contains("changed since its run finished it"), "{}", stderr(&o));
    // The nightly flow: the shards run again (--restart) over a grown input, merged into the
    // same output, which holds the earlier merge of the smaller input: replaced, and said.
    let input = d.join("grows.jsonl");
    let news = std::fs::read_to_string(repo().join(NEWS)).unwrap();
    std::fs::write(&input, news.lines().take(6).map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let (g0, g1, nightly) = (d.join("g0.jsonl"), d.join("g1.jsonl"), d.join("nightly.jsonl"));
    let shards = |extra: &[&str]| {
        for (k, out) in [(0, &g0), (1, &g1)] {
            let spec = format!("{k}/2");
            let mut args = vec!["--shard", spec.as_str()];
            args.extend(extra);
            let o = dustoff(&run_args(Some(s(&b.pipeline)), s(&input), s(out), &args), &[]);
            expect_code(&o, 0, &format!("shard {spec} {extra:?}"));
        }
    };
    shards(&[]);
    expect_code(&dustoff(&["merge", "--output", s(&nightly), s(&g0), s(&g1)], &[]), 0, "first night's merge");
    std::fs::write(&input, &news).unwrap();
    shards(&["--restart"]);
    let o = dustoff(&["merge", "--output", s(&nightly), s(&g0), s(&g1)], &[]);
    expect_code(&o, 0, "second night's merge over the first");
    assert!(stderr(&o).contains("replacing"), "{}", stderr(&o));
    assert_eq!(read_bytes(&nightly), read_bytes(&b.output), "the 12 rows of the unsharded run");

    // Kubernetes Indexed Job: JOB_COMPLETION_INDEX plus a count (dry run: no model steps).
    let o = dustoff(
        &run_args(Some(s(&b.pipeline)), NEWS, s(&d.join("k8s.jsonl")), &["--shard-count", "2", "--dry-run", "--json"]),
        &[("JOB_COMPLETION_INDEX", "0")],
    );
    expect_code(&o, 0, "dry run of JOB_COMPLETION_INDEX=0");
    let dry: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(dry["records"].as_u64(), Some(r0.len() as u64), "{dry}");
    // An index without a count is a usage error.
    let o = dustoff(
        &run_args(Some(s(&b.pipeline)), NEWS, s(&d.join("x.jsonl")), &["--dry-run"]),
        &[("JOB_COMPLETION_INDEX", "0")],
    );
    expect_code(&o, 2, "JOB_COMPLETION_INDEX without a count");
    assert!(stderr(&o).contains("DUSTOFF_SHARD_COUNT"), "{}", stderr(&o));
}

#[test]
fn a_file_no_run_wrote_is_not_overwritten_unasked() {
    let b = baseline();
    let d = tmpdir("foreign");
    let out = d.join("precious.jsonl");
    std::fs::write(&out, "precious\n").unwrap();
    let o = dustoff(&run_args(Some(s(&b.pipeline)), NEWS, s(&out), &["--dry-run"]), &[]);
    expect_code(&o, 2, "a run into someone's file");
    assert!(stderr(&o).contains("is not the output of a dustoff run"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "precious\n");
    // A report beside it that no run wrote (garbage; a merge's) does not make it a run's output.
    for report in
        ["not json", r#"{"merged": {"job": "x", "shards": [], "rows": 1, "error_rows": 0, "output_blake3": "y"}}"#]
    {
        std::fs::write(with_suffix(&out, ".report.json"), report).unwrap();
        let o = dustoff(&run_args(Some(s(&b.pipeline)), NEWS, s(&out), &[]), &[]);
        expect_code(&o, 2, &format!("a run into someone's file beside the report {report:?}"));
        assert!(stderr(&o).contains("is not the output of a dustoff run"), "{}", stderr(&o));
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "precious\n");
    }
    let o = dustoff(&run_args(Some(s(&b.pipeline)), NEWS, s(&out), &["--dry-run", "--restart"]), &[]);
    expect_code(&o, 0, "--restart says replace it");
}

#[test]
fn the_input_kind_must_match_the_command_and_a_bom_is_not_a_record() {
    let b = baseline();
    let d = tmpdir("input-kind");
    let out = d.join("o.jsonl");
    // Records of a pipeline without the pipeline: refused before anything runs, not 12 error rows.
    let o = dustoff(&run_args(None, NEWS, s(&out), &[]), &[]);
    expect_code(&o, 2, "pipeline records without a pipeline");
    assert!(stderr(&o).contains("name a pipeline"), "{}", stderr(&o));
    assert!(!out.exists());
    // OpenAI Batch requests with a pipeline.
    let batch = repo().join("samples/openai-batch.jsonl");
    let o = dustoff(&run_args(Some(s(&b.pipeline)), s(&batch), s(&out), &["--dry-run"]), &[]);
    expect_code(&o, 2, "batch requests with a pipeline");
    assert!(stderr(&o).contains("leave out the pipeline"), "{}", stderr(&o));
    // A byte-order mark before the first record is not a malformed line.
    let news = std::fs::read_to_string(repo().join(NEWS)).unwrap();
    let bom = d.join("bom.jsonl");
    std::fs::write(&bom, format!("\u{feff}{news}")).unwrap();
    let o = dustoff(&run_args(Some(s(&b.pipeline)), s(&bom), s(&out), &["--dry-run", "--json"]), &[]);
    expect_code(&o, 0, "a BOM");
    let dry: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((dry["records"].as_u64(), dry["errors"].as_u64()), (Some(12), Some(0)), "{dry}");
}

#[test]
fn greedy_rows_do_not_depend_on_slots_or_on_the_other_records() {
    let b = baseline();
    // The first 6 news records, one slot: the same bytes as the first 6 rows of the 4-slot run
    // over all 12.
    let news = std::fs::read_to_string(repo().join(NEWS)).unwrap();
    let first6: String = news.lines().take(6).map(|l| format!("{l}\n")).collect();
    let input = b.dir.join("news6.jsonl");
    std::fs::write(&input, first6).unwrap();
    let out = b.dir.join("one-slot.jsonl");
    let mut args = run_args(Some(s(&b.pipeline)), s(&input), s(&out), &[]);
    let slots = args.iter().position(|a| *a == "--slots").unwrap();
    args[slots + 1] = "1";
    let o = dustoff(&args, &[]);
    expect_code(&o, 0, "--slots 1");
    let base = String::from_utf8(read_bytes(&b.output)).unwrap();
    let want: String = base.lines().take(6).map(|l| format!("{l}\n")).collect();
    assert_eq!(String::from_utf8(read_bytes(&out)).unwrap(), want);
    assert_eq!(report(&out)["engine"]["slots"], 1);
}
