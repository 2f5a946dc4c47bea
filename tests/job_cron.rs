//! Nightly jobs from cron or systemd (issue 31, item 6): samples/cron/dustoff-nightly.sh run the
//! way cron runs it, from a folder that has no pipelines/ and no samples/ (a temporary one as
//! the current folder), with the model from DUSTOFF_MODEL and the pipeline found through
//! DUSTOFF_PIPELINES; the real binary, the sample model, the CPU backend, 8 generated tokens.
//! - night 1 computes the archive; night 2, after the archive grew, only the new records;
//! - a night whose predecessor still runs (the job's lock held) is skipped with exit 0;
//! - a pipeline name found nowhere exits 2 naming the places looked;
//! - the crontab line and the systemd units start that script with settings it reads.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

const SCRIPT: &str = "samples/cron/dustoff-nightly.sh";

/// The wrapper in `cwd` with only the settings given (plus PATH for bash and date).
fn nightly(cwd: &Path, settings: &[(&str, &str)]) -> Output {
    let mut c = Command::new("bash");
    c.arg(repo().join(SCRIPT)).current_dir(cwd).env_clear();
    c.env("PATH", std::env::var_os("PATH").unwrap_or_default());
    c.envs(settings.iter().copied());
    c.output().expect("start bash")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The first `n` records of the news sample.
fn news(n: usize) -> String {
    let t = std::fs::read_to_string(repo().join("samples/news.jsonl")).unwrap();
    t.lines().take(n).map(|l| format!("{l}\n")).collect()
}

#[test]
fn the_nightly_wrapper_works_from_another_folder_and_maps_exit_codes() {
    let cwd = tmpdir("cron");
    let pipes = cwd.join("etc/pipelines");
    std::fs::create_dir_all(&pipes).unwrap();
    let short = short_pipeline(&cwd);
    std::fs::rename(&short, pipes.join("nightly-summary.toml")).unwrap();
    std::fs::write(cwd.join("archive.jsonl"), news(4)).unwrap();
    assert!(!cwd.join("pipelines").exists() && !cwd.join("samples").exists());
    let model = repo().join(dustoff::model::loader::SAMPLE_MODEL);
    let bin = bin().to_str().unwrap().to_string();
    let settings: Vec<(&str, &str)> = vec![
        ("DUSTOFF", &bin),
        ("DUSTOFF_MODEL", s(&model)),
        ("DUSTOFF_PIPELINES", s(&pipes)),
        ("PIPELINE", "nightly-summary"),
        // Relative paths: against the current folder, as a crontab line would give them.
        ("INPUT", "archive.jsonl"),
        ("OUTPUT", "out/summaries.jsonl"),
        ("DEVICE", "cpu"),
    ];
    let out = cwd.join("out/summaries.jsonl");
    let log = cwd.join("out/summaries.jsonl.log");

    // Night 1.
    let o = nightly(&cwd, &settings);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("dustoff-nightly: done: out/summaries.jsonl"), "{}", text(&o));
    assert_eq!(read_jsonl(&out).len(), 4);
    let night1 = std::fs::read_to_string(&log).unwrap();
    assert!(night1.contains("done: 4 records (4 ok"), "the log holds dustoff's summary: {night1}");

    // Night 2: the archive grew by two records; only those are computed.
    std::fs::write(cwd.join("archive.jsonl"), news(6)).unwrap();
    let o = nightly(&cwd, &settings);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let rows = read_jsonl(&out);
    assert_eq!(rows.len(), 6);
    let all = std::fs::read_to_string(&log).unwrap();
    let night2 = &all[night1.len()..];
    assert!(night2.contains("incremental: 2 new, 0 changed (computed), 4 reused unchanged"), "{night2}");

    // Night 3 while night 2 would still be running: skipped, exit 0, nothing written.
    {
        let lock = std::fs::File::create(with_suffix(&out, ".dustoff.lock")).unwrap();
        lock.try_lock().unwrap();
        let before = std::fs::read(&out).unwrap();
        let o = nightly(&cwd, &settings);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        assert!(text(&o).contains("skipped: an earlier run of this job is still working"), "{}", text(&o));
        assert_eq!(std::fs::read(&out).unwrap(), before);
    }

    // A pipeline name found nowhere: exit 2, the places looked in the log.
    let mut bad = settings.clone();
    bad.retain(|(k, _)| *k != "PIPELINE");
    bad.push(("PIPELINE", "no-such-pipeline"));
    let o = nightly(&cwd, &bad);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let all = std::fs::read_to_string(&log).unwrap();
    assert!(all.contains(&format!("{}/no-such-pipeline.toml (DUSTOFF_PIPELINES)", pipes.display())), "{all}");
    assert!(all.contains(&format!("{}/pipelines/no-such-pipeline.toml (current folder)", cwd.display())), "{all}");

    // Without INPUT/OUTPUT the script says what to set.
    let o = nightly(&cwd, &[("DUSTOFF", &bin)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("set INPUT"), "{}", text(&o));
}

/// `KEY=value` settings the wrapper documents (its header's `#   NAME  meaning` lines).
fn documented_settings() -> Vec<String> {
    let t = std::fs::read_to_string(repo().join(SCRIPT)).unwrap();
    t.lines()
        .filter_map(|l| l.strip_prefix("#   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_crontab_line_and_the_systemd_units_start_the_wrapper_with_its_settings() {
    let known = documented_settings();
    assert!(known.len() >= 8, "{known:?}");
    let cron_dir = repo().join("samples/cron");
    let read = |f: &str| std::fs::read_to_string(cron_dir.join(f)).unwrap_or_else(|e| panic!("samples/cron/{f}: {e}"));

    // crontab: five time fields, then KEY=value settings the script reads, then the script.
    let crontab = read("crontab");
    let line = crontab.lines().find(|l| !l.starts_with('#') && !l.trim().is_empty()).expect("a crontab line");
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&fields[..5], &["30", "2", "*", "*", "*"], "{line}");
    let mut rest = fields[5..].iter();
    let mut set = Vec::new();
    let script = loop {
        let f = rest.next().expect("the crontab line names the script");
        match f.split_once('=') {
            Some((k, _)) => set.push(k.to_string()),
            None => break *f,
        }
    };
    assert!(script.ends_with(SCRIPT), "{script}");
    for k in ["INPUT", "OUTPUT", "DUSTOFF_MODEL"] {
        assert!(set.iter().any(|s| s == k), "the crontab line sets {k}: {line}");
    }
    for k in &set {
        assert!(known.contains(k), "{k} is not a setting of the script ({known:?})");
    }

    // The EnvironmentFile example holds settings of the script only.
    let env = read("nightly.env");
    for l in env.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let k = l.split_once('=').map(|(k, _)| k).unwrap_or_else(|| panic!("not KEY=value: {l}"));
        assert!(known.iter().any(|x| x == k), "{k} is not a setting of the script ({known:?})");
    }

    // The service runs the script once per start with that file; the timer starts the service.
    let service = read("dustoff-nightly.service");
    let key = |unit: &str, k: &str| -> Option<String> {
        unit.lines().find_map(|l| l.strip_prefix(&format!("{k}="))).map(str::to_string)
    };
    assert_eq!(key(&service, "Type").as_deref(), Some("oneshot"));
    assert!(key(&service, "ExecStart").unwrap().ends_with(SCRIPT));
    assert!(key(&service, "EnvironmentFile").is_some());
    assert_eq!(key(&service, "KillSignal").as_deref(), Some("SIGTERM"), "dustoff commits its rows on SIGTERM");
    let timer = read("dustoff-nightly.timer");
    assert_eq!(key(&timer, "OnCalendar").as_deref(), Some("*-*-* 02:30:00"));
    assert_eq!(key(&timer, "Persistent").as_deref(), Some("true"));
    // A timer starts the service of its own name (no Unit= needed).
    assert!(cron_dir.join("dustoff-nightly.service").exists() && key(&timer, "Unit").is_none());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let path: PathBuf = repo().join(SCRIPT);
        assert!(path.metadata().unwrap().permissions().mode() & 0o111 != 0, "the script is executable");
    }
}
