//! `kill -9` at random instants: the real `dustoff run summarize` job over the 12 news records
//! (sample model, CPU, a checkpoint commit after every row) is killed again and again at
//! pseudo-random instants and resumed with the same command each time; the final output must be
//! byte-identical to an unbroken run's. A resume that lost a committed row, ran a record twice or
//! assembled the parts wrongly fails the comparison.
//!
//! The kill instants: as soon as the first run has made its checkpoint, then in the first moments
//! of the resume (both before any commit), then a fixed list of fractions of a run's expected
//! duration followed by delays drawn uniformly from 50 ms to that duration, from a seed printed
//! in the test output (`DUSTOFF_CRASH_SEED=<seed>` replays the same draws; the instants still vary
//! with timing). A run's expected duration is the unbroken run's start-up plus its pace over the
//! records not yet committed, so most kills land while work is left, some near or past the end.
//! A run that completes before its kill starts a new job on a new output (its output is compared
//! too). The last run is killed as soon as its report says it completed, before it exits if the
//! kill lands in time (either way the output must be complete and the checkpoint gone).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::*;

const NEWS: &str = "samples/news.jsonl";
const RECORDS: u64 = 12;
/// Kills at a delay from the fixed list or drawn from the seed (the two early kills and the one
/// after completion come on top).
const TIMED_KILLS: usize = 8;
/// The first timed kills, as fractions of the run's expected duration.
const FIXED: [f64; 3] = [0.3, 0.6, 0.9];

/// splitmix64: a few reproducible draws without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    fn uniform(&mut self, lo: Duration, hi: Duration) -> Duration {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        lo + hi.saturating_sub(lo).mul_f64(u)
    }
}

fn seed() -> u64 {
    match std::env::var("DUSTOFF_CRASH_SEED") {
        Ok(s) => s.trim().parse().expect("DUSTOFF_CRASH_SEED is an unsigned integer"),
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
    }
}

fn checkpoint_dir(output: &Path) -> PathBuf {
    with_suffix(output, ".dustoff")
}

/// `dustoff run summarize --input samples/news.jsonl --output OUT --device cpu --slots 4 --quiet`
/// in the repo root, committing after every row, stderr to `log`.
fn spawn(output: &Path, log: &Path) -> Child {
    let mut c = Command::new(bin());
    c.current_dir(repo()).args([
        "run",
        "summarize",
        "--input",
        NEWS,
        "--output",
        s(output),
        "--device",
        "cpu",
        "--slots",
        "4",
        "--quiet",
    ]);
    for k in ["SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_COUNT", "JOB_COMPLETION_INDEX"] {
        c.env_remove(k);
    }
    c.env_remove("DUSTOFF_SHARD_COUNT").env("DUSTOFF_COMMIT_ROWS", "1");
    let f = std::fs::File::create(log).unwrap();
    c.stdout(Stdio::null()).stderr(f).spawn().expect("start dustoff")
}

/// Rows committed in the journal of `output`'s checkpoint (complete lines only: a torn last
/// line is not a commit); 0 without a checkpoint.
fn committed(output: &Path) -> u64 {
    let Ok(text) = std::fs::read_to_string(checkpoint_dir(output).join("journal.jsonl")) else { return 0 };
    text.split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|e| e["rows"].as_u64().unwrap())
        .sum()
}

fn log_tail(log: &Path) -> String {
    let t = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Waits for the child to end on its own, up to `limit`.
fn wait_up_to(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let until = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn kill_9(child: &mut Child) -> ExitStatus {
    child.kill().unwrap();
    child.wait().unwrap()
}

/// The report beside `output` once it is completely written (it is written after the output is
/// in place and the checkpoint removed).
fn completed_report(output: &Path) -> Option<Value> {
    let v: Value = serde_json::from_slice(&std::fs::read(with_suffix(output, ".report.json")).ok()?).ok()?;
    (v["outcome"] == "completed").then_some(v)
}

/// What happened to one run.
#[derive(Debug)]
enum Ending {
    /// Killed by SIGKILL at this instant; the job is not complete yet.
    Killed,
    /// Killed, but only after the job had completed (output in place, checkpoint removed).
    KilledAfterCompletion,
    /// Exited 0 before the kill.
    Completed,
}

struct Job {
    dir: PathBuf,
    want: Vec<u8>,
    /// The output of the job now being killed and resumed, its number, and its runs so far.
    output: PathBuf,
    number: usize,
    runs: usize,
    /// Rows committed after the last run (never decreases within a job).
    committed: u64,
    log: Vec<String>,
}

impl Job {
    fn new_output(&mut self) {
        self.number += 1;
        self.output = self.dir.join(format!("job{}.jsonl", self.number));
        self.committed = 0;
    }

    /// Checks the state after a run ended: a complete output (if any) equals the unbroken run's,
    /// committed rows never go back.
    fn check(&mut self, what: &str, st: ExitStatus, log: &Path) -> Ending {
        let killed = st.signal() == Some(9);
        assert!(killed || st.success(), "{what}: run ended with {st}; stderr:\n{}", log_tail(log));
        // The output is renamed into place complete, so whenever it exists it must be the
        // unbroken run's bytes.
        if self.output.exists() {
            let got = std::fs::read(&self.output).unwrap();
            assert!(
                got == self.want,
                "{what}: output differs from the unbroken run's:\n{}",
                String::from_utf8_lossy(&got)
            );
        }
        let done = self.output.exists() && !checkpoint_dir(&self.output).exists();
        assert!(done || !st.success(), "{what}: exit 0 without a complete output");
        if done {
            assert!(
                !with_suffix(&self.output, ".partial").exists(),
                "{what}: a partial output is left beside the complete one"
            );
            return if killed { Ending::KilledAfterCompletion } else { Ending::Completed };
        }
        let now = committed(&self.output);
        assert!(now >= self.committed, "{what}: committed rows went back from {} to {now}", self.committed);
        assert!(now <= RECORDS, "{what}: {now} rows committed for {RECORDS} records");
        self.committed = now;
        Ending::Killed
    }

    /// One run of the job on the current output, killed after `delay` unless it ends first.
    fn run_killed_after(&mut self, what: &str, delay: Duration) -> Ending {
        let log = self.dir.join(format!("job{}-run{}.log", self.number, self.runs));
        self.runs += 1;
        let before = self.committed;
        let mut child = spawn(&self.output, &log);
        let st = match wait_up_to(&mut child, delay) {
            Some(st) => st,
            None => kill_9(&mut child),
        };
        let ending = self.check(what, st, &log);
        self.log.push(format!(
            "job {} {what}: kill at {:>4} ms -> {ending:?}, committed {before} -> {}",
            self.number,
            delay.as_millis(),
            self.committed
        ));
        ending
    }
}

#[test]
fn kill_9_at_random_instants_then_resume_gives_the_unbroken_output() {
    let started = Instant::now();
    let seed = seed();
    println!("seed {seed} (DUSTOFF_CRASH_SEED={seed} replays these delays)");
    let mut rng = Rng(seed);
    let dir = tmpdir("crash-random");

    // The unbroken run; its checkpoint's first appearance and first commit are timed too.
    let unbroken = dir.join("unbroken.jsonl");
    let log = dir.join("unbroken.log");
    let t = Instant::now();
    let mut child = spawn(&unbroken, &log);
    let (mut t_checkpoint, mut t_commit) = (None, None);
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t_checkpoint.is_none() && checkpoint_dir(&unbroken).join("job.json").exists() {
            t_checkpoint = Some(t.elapsed());
        }
        if t_commit.is_none() && committed(&unbroken) > 0 {
            t_commit = Some(t.elapsed());
        }
        assert!(t.elapsed() < Duration::from_secs(120), "the unbroken run takes over 2 minutes");
        std::thread::sleep(Duration::from_millis(1));
    };
    let full = t.elapsed();
    assert!(st.success(), "unbroken run: {st}; stderr:\n{}", log_tail(&log));
    let (t_checkpoint, t_commit) = (t_checkpoint.unwrap(), t_commit.unwrap());
    let want = std::fs::read(&unbroken).unwrap();
    assert_eq!(want.iter().filter(|&&b| b == b'\n').count() as u64, RECORDS);
    println!(
        "unbroken run: {} ms (checkpoint at {} ms, first commit at {} ms)",
        full.as_millis(),
        t_checkpoint.as_millis(),
        t_commit.as_millis()
    );

    let mut job =
        Job { dir: dir.clone(), want, output: PathBuf::new(), number: 0, runs: 0, committed: 0, log: Vec::new() };
    job.new_output();

    // As soon as this run has made the checkpoint (before any commit: the first one comes a
    // record's generation later).
    let log = dir.join("job1-checkpoint.log");
    let mut child = spawn(&job.output, &log);
    let t = Instant::now();
    while !checkpoint_dir(&job.output).join("job.json").exists() {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before its checkpoint existed");
        assert!(t.elapsed() < Duration::from_secs(60), "no checkpoint within 60 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    let st = kill_9(&mut child);
    let at = t.elapsed();
    assert!(matches!(job.check("checkpoint made", st, &log), Ending::Killed));
    assert_eq!(job.committed, 0, "killed as soon as job.json existed, before any commit");
    job.log.push(format!("job 1 killed as soon as the checkpoint existed ({} ms)", at.as_millis()));
    // The very first moments of the resume: before or while it opens the checkpoint.
    let early = rng.uniform(Duration::ZERO, t_checkpoint.min(t_commit / 2));
    assert!(matches!(job.run_killed_after("first moments", early), Ending::Killed));
    assert_eq!(job.committed, 0, "killed {} ms after the start, before any commit", early.as_millis());

    // Timed kills: the fixed fractions, then delays drawn from the seed.
    let (mut kills, mut draws) = (0, 0);
    while kills < TIMED_KILLS {
        draws += 1;
        // Up to about when this run should end: the start-up, then the unbroken run's pace over
        // the records left (a kill that comes after the end finds the job complete).
        let left = (RECORDS - job.committed + 1) as f64 / RECORDS as f64;
        let end = (t_checkpoint + full.saturating_sub(t_checkpoint).mul_f64(left)).min(full);
        let delay = match FIXED.get(draws - 1) {
            Some(f) => end.mul_f64(*f),
            None => rng.uniform(Duration::from_millis(50), end),
        };
        let what = format!("timed kill {draws}");
        match job.run_killed_after(&what, delay) {
            Ending::Killed => kills += 1,
            // The job completed before the kill (or the kill landed after completion): its output
            // was checked; kill and resume a new one.
            ending => {
                kills += usize::from(matches!(ending, Ending::KilledAfterCompletion));
                job.new_output();
            }
        }
        assert!(started.elapsed() < Duration::from_secs(300), "over 5 minutes: {:#?}", job.log);
    }

    // The last resume, killed as soon as its report says the job completed.
    let before = job.committed;
    let log = dir.join(format!("job{}-last.log", job.number));
    let mut child = spawn(&job.output, &log);
    let t = Instant::now();
    let report = loop {
        if let Some(r) = completed_report(&job.output) {
            break r;
        }
        if let Some(st) = child.try_wait().unwrap() {
            // Ended without a report: only a failure does that.
            panic!("the last resume ended ({st}) without a completed report; stderr:\n{}", log_tail(&log));
        }
        assert!(t.elapsed() < Duration::from_secs(120), "the last resume takes over 2 minutes");
        std::thread::sleep(Duration::from_millis(1));
    };
    let st = kill_9(&mut child);
    let ending = job.check("last resume", st, &log);
    job.log.push(format!("job {} last resume: killed after its report -> {ending:?}", job.number));
    if matches!(ending, Ending::Killed) {
        // The report is written before the checkpoint is removed (checkpoint.rs, `finish`: a kill
        // there leaves a checkpoint the same command finishes from), so a kill that lands between
        // the two finds the job not yet complete: the next run only removes the checkpoint.
        let after = job.run_killed_after("after the report", Duration::from_secs(120));
        assert!(matches!(after, Ending::Completed), "the run after the report: {after:?}; report: {report}");
    }
    assert_eq!(std::fs::read(&job.output).unwrap(), job.want, "resumed output equals the unbroken run's");
    assert!(!checkpoint_dir(&job.output).exists());
    let c = &report["counts"];
    assert_eq!(c["records"].as_u64(), Some(RECORDS), "{c}");
    assert_eq!(c["skipped_done"].as_u64(), Some(before), "committed rows are not recomputed: {c}");
    assert_eq!(c["ok"].as_u64(), Some(RECORDS - before), "{c}");

    for l in &job.log {
        println!("{l}");
    }
    println!(
        "{} jobs, {} runs, {TIMED_KILLS} timed kills + 2 early + 1 after completion; {:.1} s in all",
        job.number,
        job.runs + 2,
        started.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
