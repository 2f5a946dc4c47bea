//! `dustoff doctor`, `DUSTOFF_CPU_PATH`, `--numa` and `--threads` through the real binary.
//! The doctor report is checked against what /proc and sysfs say on the machine running the
//! tests (CI: a CPU-only box, so the CPU must be the usable default device).

mod common;

use std::collections::BTreeSet;
use std::process::{Command, Output};

use serde_json::Value;

use common::*;

fn dustoff(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin());
    c.current_dir(repo()).args(args).env_remove("DUSTOFF_CPU_PATH").envs(env.iter().copied());
    c.output().expect("start dustoff")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn doctor_json(extra: &[&str], env: &[(&str, &str)]) -> (Value, i32) {
    let mut args = vec!["doctor", "--json"];
    args.extend(extra);
    let o = dustoff(&args, env);
    let v: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("doctor --json: {e}; stderr {}", stderr(&o)));
    (v, o.status.code().unwrap_or(-1))
}

fn cpuinfo_flags() -> BTreeSet<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    let line = text.lines().find(|l| l.starts_with("flags")).unwrap_or("");
    line.split_once(':').map(|(_, f)| f.split_whitespace().map(str::to_string).collect()).unwrap_or_default()
}

fn has_avx2() -> bool {
    let f = cpuinfo_flags();
    ["avx2", "fma", "f16c"].iter().all(|x| f.contains(*x))
}

#[test]
fn doctor_json_matches_proc_and_sysfs() {
    let (v, code) = doctor_json(&["--no-measure"], &[]);
    let cpu = &v["cpu"];

    // Logical CPUs = the kernel's online list; sockets = distinct physical ids.
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let online = dustoff::sys::topology::parse_cpu_list(&online).unwrap();
    assert_eq!(cpu["logical_cpus"].as_u64(), Some(online.len() as u64));
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    let packages: BTreeSet<&str> =
        cpuinfo.lines().filter(|l| l.starts_with("physical id")).filter_map(|l| l.split(':').nth(1)).collect();
    if !packages.is_empty() {
        assert_eq!(cpu["sockets"].as_u64(), Some(packages.len() as u64));
    }
    let cores = cpu["cores"].as_u64().unwrap();
    assert!(cores >= 1 && cores <= online.len() as u64, "cores {cores}");

    // NUMA nodes = the nodeN folders (one node when the kernel has none).
    let nodes: BTreeSet<u64> = std::fs::read_dir("/sys/devices/system/node")
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok()).collect())
        .unwrap_or_default();
    let reported: BTreeSet<u64> =
        cpu["numa_nodes"].as_array().unwrap().iter().map(|n| n["id"].as_u64().unwrap()).collect();
    if nodes.is_empty() {
        assert_eq!(reported, BTreeSet::from([0]));
    } else {
        assert_eq!(reported, nodes);
    }

    // Features and the kernel path agree with /proc/cpuinfo's flags.
    let flags = cpuinfo_flags();
    for (key, flag) in [("avx2", "avx2"), ("fma", "fma"), ("f16c", "f16c"), ("avx512f", "avx512f")] {
        assert_eq!(cpu["features"][key].as_bool(), Some(flags.contains(flag)), "{key}");
    }
    let best = if has_avx2() && flags.contains("avx512f") {
        "avx512"
    } else if has_avx2() {
        "avx2"
    } else {
        "scalar"
    };
    assert_eq!(cpu["kernel_path_best"], best);
    assert_eq!(cpu["kernel_path"], best);

    // GPUs: whatever the driver reports; the CPU is always usable, and on a box without a GPU
    // it is the default device and doctor exits 0.
    let usable: Vec<&str> = v["usable_devices"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();
    assert!(usable.contains(&"cpu"));
    let gpus = v["cuda"]["gpus"].as_array().unwrap();
    if gpus.is_empty() {
        assert_eq!(v["default_device"], "cpu");
        assert_eq!((code, v["exit_code"].as_u64()), (0, Some(0)));
        // --require-gpu turns "no GPU" into a failure.
        let (v2, code2) = doctor_json(&["--no-measure", "--require-gpu"], &[]);
        assert_eq!(code2, 1);
        assert!(v2["problems"].to_string().contains("--require-gpu"), "{}", v2["problems"]);
    }
    for g in gpus {
        let cc = g["compute_capability"].as_array().unwrap();
        assert_eq!(g["arch"], format!("compute_{}{}", cc[0], cc[1]));
    }
}

#[test]
fn doctor_plans_the_sample_model_and_projects_a_cpu_rate() {
    let (v, code) =
        doctor_json(&["--model", dustoff::model::loader::SAMPLE_MODEL, "--ctx", "1024", "--slots", "2"], &[]);
    let plan = &v["model"]["plans"][0];
    assert_eq!(plan["device"], "cpu");
    assert_eq!(v["model"]["layers"], 30);
    // KV: 30 layers x K and V x 192 (3 KV heads x 64) x f32 per position, 2 x 1024 positions.
    assert_eq!(plan["kv_bytes"].as_u64(), Some(30 * 2 * 192 * 4 * 2048));
    let weights = plan["weights_bytes"].as_u64().unwrap();
    let file = std::fs::metadata(repo().join(dustoff::model::loader::SAMPLE_MODEL)).unwrap().len();
    assert!(weights > file / 2 && weights <= file, "weights {weights} of a {file}-byte file");
    assert!(plan["projected_decode_tok_s"].as_f64().unwrap() > 0.0);
    assert!(v["cpu"]["copy_bandwidth_gb_s"].as_f64().unwrap() > 0.0);
    if v["cuda"]["gpus"].as_array().unwrap().is_empty() {
        assert_eq!(code, 0);
    }
    assert!(v["model"]["error"].is_null(), "{}", v["model"]["error"]);
    // A model that cannot be read fails the check (a setup script can test the exit code).
    let bad = std::env::temp_dir().join(format!("dustoff-doctor-bad-{}.gguf", std::process::id()));
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00").unwrap();
    let (v, code) = doctor_json(&["--no-measure", "--model", bad.to_str().unwrap()], &[]);
    std::fs::remove_file(&bad).ok();
    assert_eq!((code, v["exit_code"].as_u64()), (1, Some(1)));
    let why = v["model"]["error"].as_str().unwrap();
    assert!(why.contains("dustoff-doctor-bad") && why.contains("tensor count"), "{why}");
}

#[test]
fn bad_path_numa_and_thread_values_are_usage_errors() {
    let o = dustoff(&["doctor", "--no-measure"], &[("DUSTOFF_CPU_PATH", "sse9")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("DUSTOFF_CPU_PATH=sse9"), "{}", stderr(&o));
    let o = dustoff(&["doctor", "--no-measure", "--numa", "99"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--numa 99"), "{}", stderr(&o));
    let o = dustoff(&["doctor", "--no-measure", "--threads", "0"], &[]);
    assert_eq!(o.status.code(), Some(2));
    let o = dustoff(&["doctor", "--no-measure", "--numa", "socket"], &[]);
    assert_eq!(o.status.code(), Some(2));
    if !cpuinfo_flags().contains("avx512f") {
        let o = dustoff(&["doctor", "--no-measure"], &[("DUSTOFF_CPU_PATH", "avx512")]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    }
}

/// Greedy generation on the forced AVX2 path: the same tokens with 1 slot as with 4 (the AVX2
/// GEMV and the AVX2 GEMM tile sum in the same order), the path named in the log, and
/// `--threads` taken.
#[test]
fn avx2_path_is_named_and_batch_invariant() {
    if !has_avx2() {
        eprintln!("skipped: no AVX2 on this CPU");
        return;
    }
    let dir = tmpdir("sys-avx2");
    let input = dir.join("prompts.jsonl");
    let prompts = [
        "The capital of France is",
        "Write one sentence about the sea.",
        "List three colors:",
        "The capital of France is a city that",
        "Once upon a time",
    ];
    let lines: String =
        prompts.iter().enumerate().map(|(i, p)| format!("{{\"id\":\"p{i}\",\"prompt\":{p:?}}}\n")).collect();
    std::fs::write(&input, lines).unwrap();
    let mut outs = Vec::new();
    for slots in ["1", "4"] {
        let out = dir.join(format!("out{slots}.jsonl"));
        let args = [
            "generate",
            "--device",
            "cpu",
            "--threads",
            "2",
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--max-tokens",
            "12",
            "--slots",
            slots,
        ];
        let o = dustoff(&args, &[("DUSTOFF_CPU_PATH", "avx2")]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(stderr(&o).contains("threads: 2"), "{}", stderr(&o));
        let rows: Vec<(String, Value)> = std::fs::read_to_string(&out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|v| (v["id"].as_str().unwrap().to_string(), v["token_ids"].clone()))
            .collect();
        assert_eq!(rows.len(), prompts.len());
        outs.push(rows);
    }
    let (mut a, mut b) = (outs[0].clone(), outs[1].clone());
    a.sort_by(|x, y| x.0.cmp(&y.0));
    b.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(a, b);
    let o = dustoff(
        &["generate", "--device", "cpu", "--prompt", "Hi", "--max-tokens", "2"],
        &[("DUSTOFF_CPU_PATH", "avx2")],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("avx2 kernels"), "{}", stderr(&o));
    let o = dustoff(&["doctor", "--json", "--no-measure"], &[("DUSTOFF_CPU_PATH", "avx2")]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["cpu"]["kernel_path"], "avx2");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An unpacked offline bundle: the binary finds `ptx/` beside itself (also when started through
/// a symlink elsewhere, as from /usr/local/bin) and doctor names that folder; an explicit
/// `--ptx-dir` wins, and a binary with no `ptx/` beside it uses NVRTC.
#[test]
fn ptx_folder_beside_the_binary_is_used_without_flags() {
    let dir = std::env::temp_dir().join(format!("dustoff-bundle-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let exe = dir.join("dustoff");
    std::fs::copy(bin(), &exe).unwrap();
    let link = dir.join("bin/dustoff");
    std::os::unix::fs::symlink(&exe, &link).unwrap();
    let kernels = |exe: &std::path::Path, extra: &[&str]| -> String {
        let o = Command::new(exe)
            .current_dir(std::env::temp_dir())
            .args(["doctor", "--json", "--no-measure"])
            .args(extra)
            .env_remove("DUSTOFF_PTX_DIR")
            .output()
            .unwrap();
        let v: Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("doctor --json: {e}; {}", stderr(&o)));
        v["cuda"]["kernels"].as_str().unwrap_or_else(|| panic!("no cuda.kernels in {v}")).to_string()
    };
    assert_eq!(kernels(&exe, &[]), "NVRTC");
    std::fs::create_dir(dir.join("ptx")).unwrap();
    let beside = format!("PTX from {}", dir.join("ptx").display());
    assert_eq!(kernels(&exe, &[]), beside);
    assert_eq!(kernels(&link, &[]), beside);
    let other = dir.join("other");
    assert_eq!(kernels(&exe, &["--ptx-dir", other.to_str().unwrap()]), format!("PTX from {}", other.display()));
    std::fs::remove_dir_all(&dir).unwrap();
}
