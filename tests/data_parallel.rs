//! Data parallel `dustoff run` (`--engines N` on the CPU: the same engine pool, routing and work
//! stealing as `--devices 0,1` on GPUs): the real binary and the sample model. N engines must
//! write the bytes one engine writes (greedy rows do not depend on the engine that ran them),
//! keep input order, resume after a kill with one checkpoint, and route records that share a
//! prompt prefix to the engine that computed it.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::*;

const NEWS: &str = "samples/news.jsonl";

/// A copy of a shipped pipeline with a smaller `max_tokens` (fast; the rows are real output).
fn short_pipeline(dir: &Path, name: &str, from: &str, to: &str) -> PathBuf {
    let text = std::fs::read_to_string(repo().join(format!("pipelines/{name}.toml"))).unwrap();
    assert!(text.contains(from), "pipelines/{name}.toml changed: update this test");
    let p = dir.join(format!("{name}-short.toml"));
    std::fs::write(&p, text.replace(from, to)).unwrap();
    // The extraction pipeline names its schema file relative to itself.
    let schema = repo().join("pipelines/entities.schema.json");
    std::fs::copy(&schema, dir.join("entities.schema.json")).unwrap();
    p
}

fn cmd(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(bin());
    c.current_dir(repo()).args(args);
    for k in ["SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "JOB_COMPLETION_INDEX", "DUSTOFF_COMMIT_ROWS"] {
        c.env_remove(k);
    }
    c.envs(env.iter().copied());
    c
}

/// `dustoff run [PIPELINE] --input IN --output OUT --device cpu --slots 2 --quiet EXTRA...`.
fn run_args(pipeline: Option<&Path>, input: &Path, output: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = vec!["run".to_string()];
    a.extend(pipeline.map(|p| p.display().to_string()));
    for x in ["--input", s(input), "--output", s(output), "--device", "cpu", "--slots", "2", "--quiet"] {
        a.push(x.to_string());
    }
    a.extend(extra.iter().map(|x| x.to_string()));
    a
}

fn dustoff(args: &[String], env: &[(&str, &str)]) -> Output {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    cmd(&a, env).output().expect("start dustoff")
}

fn expect_code(o: &Output, want: i32, what: &str) {
    let code = o.status.code().unwrap_or(-1);
    assert_eq!(code, want, "{what}: exit code {code}; stderr:\n{}", String::from_utf8_lossy(&o.stderr));
}

fn text(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn report(output: &Path) -> Value {
    serde_json::from_str(&text(&with_suffix(output, ".report.json"))).unwrap()
}

fn ids(path: &Path, key: &str) -> Vec<String> {
    text(path).lines().map(|l| serde_json::from_str::<Value>(l).unwrap()[key].as_str().unwrap().to_string()).collect()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// The per-engine part of a data-parallel report, checked for shape: `n` engines, every
/// request finished by exactly one of them.
fn engines(output: &Path, n: usize, requests: u64) -> Vec<Value> {
    let e = &report(output)["engine"];
    assert_eq!(e["engine_count"], n, "{e}");
    let per = e["engines"].as_array().unwrap_or_else(|| panic!("no per-engine metrics: {e}")).clone();
    assert_eq!(per.len(), n);
    let finished: u64 = per.iter().map(|x| u(&x["routing"]["finished"])).sum();
    let routed: u64 = per.iter().map(|x| u(&x["routing"]["routed"])).sum();
    assert_eq!((finished, routed), (requests, requests), "{e}");
    // The total is the sum of the engines.
    let prompt: u64 = per.iter().map(|x| u(&x["prompt_tokens"])).sum();
    assert_eq!(u(&e["prompt_tokens"]), prompt, "{e}");
    per
}

#[test]
fn n_cpu_engines_write_the_bytes_of_one_engine_summarize_and_extract() {
    let d = tmpdir("dp-identical");
    let summarize = short_pipeline(&d, "summarize", "max_tokens = 64", "max_tokens = 8");
    let one = d.join("one.jsonl");
    expect_code(&dustoff(&run_args(Some(&summarize), Path::new(NEWS), &one, &[]), &[]), 0, "one engine");
    let three = d.join("three.jsonl");
    let o = dustoff(&run_args(Some(&summarize), Path::new(NEWS), &three, &["--engines", "3"]), &[]);
    expect_code(&o, 0, "three engines");
    assert_eq!(text(&three), text(&one), "three CPU engines write the bytes of one");
    assert_eq!(ids(&three, "id"), ids(&repo().join(NEWS), "id"), "input order");
    let per = engines(&three, 3, 12);
    // Every news prompt starts with the pipeline's system prompt: after the first, each one
    // follows that shared prefix; the idle engines steal from the queue it fills.
    let by_prefix: u64 = per.iter().map(|x| u(&x["routing"]["routed_by_prefix"])).sum();
    assert_eq!(by_prefix, 11, "{per:?}");
    let stolen: u64 = per.iter().map(|x| u(&x["routing"]["stolen"])).sum();
    assert!(stolen >= 1, "work stealing spread the one-prefix job: {per:?}");
    assert!(per.iter().filter(|x| u(&x["routing"]["finished"]) > 0).count() >= 2, "{per:?}");
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(log.contains("data parallel: 3 engines (cpu#0, cpu#1, cpu#2)"), "{log}");

    // Schema-constrained extraction: every engine decodes under its own copy of the grammar.
    // Four records, answers of up to 96 tokens: a few seconds on two cores.
    let extract = short_pipeline(&d, "extract-entities", "max_tokens = 320", "max_tokens = 96");
    let four = d.join("news4.jsonl");
    std::fs::write(&four, text(&repo().join(NEWS)).lines().take(4).map(|l| format!("{l}\n")).collect::<String>())
        .unwrap();
    let one = d.join("entities1.jsonl");
    let o1 = dustoff(&run_args(Some(&extract), &four, &one, &[]), &[]);
    let two = d.join("entities2.jsonl");
    let o2 = dustoff(&run_args(Some(&extract), &four, &two, &["--engines", "2"]), &[]);
    // Rows cut off at 96 tokens are error rows (exit 3) in both runs alike.
    assert_eq!(o1.status.code(), o2.status.code(), "{}", String::from_utf8_lossy(&o2.stderr));
    assert!(matches!(o1.status.code(), Some(0 | 3)), "{}", String::from_utf8_lossy(&o1.stderr));
    assert_eq!(text(&two), text(&one), "two CPU engines write the bytes of one (constrained)");
    let per = engines(&two, 2, 4);
    let constrained: u64 = per.iter().map(|x| u(&x["constraint"]["constrained_requests"])).sum();
    assert_eq!(constrained, 4);
    assert_eq!(report(&two)["engine"]["constraint"]["constrained_requests"], 4);
}

/// An OpenAI batch file of `n` chat requests alternating between two long system prompts that
/// differ from their first word (so from their first KV block).
fn two_prefix_batch(path: &Path, n: usize) {
    let systems = [
        "Archivist mode. You read old station logbooks and answer with one short line. Keep names, dates and \
         places exactly as written, never guess a missing value, and say unknown when the log is silent.",
        "Translator mode. You turn terse engineering notes into plain English for a newsletter. Keep every \
         number and unit, expand abbreviations once, and never add facts that the note does not state.",
    ];
    let mut out = String::new();
    for i in 0..n {
        let body = serde_json::json!({
            "model": "m",
            "max_tokens": 4,
            "messages": [
                {"role": "system", "content": systems[i % 2]},
                {"role": "user", "content": format!("Entry {i}: pump {} restarted at {}:{:02}.", i * 7 % 13, 6 + i % 12, i * 11 % 60)},
            ],
        });
        let line = serde_json::json!({"custom_id": format!("r{i}"), "method": "POST", "url": "/v1/chat/completions", "body": body});
        out += &format!("{line}\n");
    }
    std::fs::write(path, out).unwrap();
}

#[test]
fn prefix_routing_keeps_shared_prefix_records_on_the_engine_that_computed_them() {
    let d = tmpdir("dp-routing");
    let input = d.join("batch.jsonl");
    two_prefix_batch(&input, 16);
    let one = d.join("one.jsonl");
    expect_code(&dustoff(&run_args(None, &input, &one, &[]), &[]), 0, "one engine");
    let two = d.join("two.jsonl");
    expect_code(&dustoff(&run_args(None, &input, &two, &["--engines", "2"]), &[]), 0, "two engines");
    assert_eq!(text(&two), text(&one), "two engines write the bytes of one");
    assert_eq!(ids(&two, "custom_id"), ids(&input, "custom_id"), "input order");

    let per = engines(&two, 2, 16);
    // Each group's first request is routed by load, every later one by its prefix.
    let by_prefix: u64 = per.iter().map(|x| u(&x["routing"]["routed_by_prefix"])).sum();
    assert_eq!(by_prefix, 14, "{per:?}");
    // Prefix hits: one engine computes each system prompt once. Two engines compute more only
    // where an engine got a group's request for the first time by stealing it (at most that
    // request's prompt). A router that ignored prefixes (round robin) would compute both prompts
    // on both engines with nothing stolen, and fail this.
    let computed_one = u(&report(&one)["engine"]["prompt_tokens_computed"]);
    let computed_two = u(&report(&two)["engine"]["prompt_tokens_computed"]);
    let stolen: u64 = per.iter().map(|x| u(&x["routing"]["stolen"])).sum();
    let longest = text(&one)
        .lines()
        .map(|l| u(&serde_json::from_str::<Value>(l).unwrap()["response"]["body"]["usage"]["prompt_tokens"]))
        .max()
        .unwrap();
    assert!(
        computed_two <= computed_one + stolen * longest,
        "computed {computed_two} prompt tokens on two engines, {computed_one} on one, {stolen} stolen (prompts <= {longest}): {per:?}"
    );
    let cached: u64 = per.iter().map(|x| u(&x["prompt_tokens_cached"])).sum();
    assert!(cached > 0, "{per:?}");
}

/// splitmix64: reproducible draws without a dependency.
fn draw(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[test]
fn kill_9_at_a_random_point_then_resume_with_three_engines_gives_the_one_engine_output() {
    // The 12 news records, a commit every 2 rows.
    let d = tmpdir("dp-kill");
    let pipeline = short_pipeline(&d, "summarize", "max_tokens = 64", "max_tokens = 8");
    let input = repo().join(NEWS);
    let unbroken = d.join("unbroken.jsonl");
    expect_code(&dustoff(&run_args(Some(&pipeline), &input, &unbroken, &[]), &[]), 0, "one engine, unbroken");

    let mut seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("kill delays from seed {seed}");
    let out = d.join("resumed.jsonl");
    let args = run_args(Some(&pipeline), &input, &out, &["--engines", "3"]);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let env = [("DUSTOFF_COMMIT_ROWS", "2")];
    let journal = with_suffix(&out, ".dustoff").join("journal.jsonl");
    let mut kills = 0;
    for round in 0..2 {
        let log = std::fs::File::create(d.join(format!("round{round}.log"))).unwrap();
        let mut child = cmd(&a, &env).stdout(Stdio::null()).stderr(log).spawn().unwrap();
        // After the first commit of this round, a random delay of up to 400 ms, then kill -9.
        let before = std::fs::read_to_string(&journal).map(|t| t.lines().count()).unwrap_or(0);
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::fs::read_to_string(&journal).map(|t| t.lines().count()).unwrap_or(0) <= before {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            assert!(Instant::now() < deadline, "no commit within 60 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(draw(&mut seed) % 400));
        child.kill().unwrap();
        let st = child.wait().unwrap();
        if st.code() == Some(0) {
            // Finished before the kill landed: nothing left to resume.
            break;
        }
        kills += usize::from(st.code().is_none());
    }
    assert!(kills >= 1, "at least one run was killed mid-job");
    if out.exists() {
        eprintln!("the second run completed before its kill");
    } else {
        expect_code(&dustoff(&args, &env), 0, "final resume");
    }
    assert_eq!(text(&out), text(&unbroken), "resumed three-engine output equals the unbroken one-engine run");
    let r = report(&out);
    assert_eq!(r["counts"]["records"], 12);
    assert!(!with_suffix(&out, ".dustoff").exists(), "checkpoint removed after completion");
    // The last run computed only what the kills left: the report counts the rest as done.
    let done = u(&r["counts"]["skipped_done"]);
    assert!(done > 0, "the resume skipped the committed rows: {r}");
    engines(&out, 3, 12 - done);
}
