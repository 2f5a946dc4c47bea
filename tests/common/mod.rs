//! Shared helpers of the integration tests: the sample model and the reference data.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use dustoff::model::loader::{load_model, LoadedModel, SAMPLE_MODEL};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The sample model; fails with the fetch command when it is missing.
pub fn sample_model() -> LoadedModel {
    let p = repo().join(SAMPLE_MODEL);
    assert!(p.exists(), "sample model missing: run samples/fetch-model.sh");
    load_model(&p).expect("load sample model")
}

pub fn read_cases(name: &str) -> Vec<serde_json::Value> {
    let p = repo().join("tests/data/smollm2").join(name);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("reference line is JSON"))
        .collect()
}

pub fn ids(v: &serde_json::Value, key: &str) -> Vec<u32> {
    v[key].as_array().unwrap_or_else(|| panic!("{key} missing")).iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

pub fn floats(v: &serde_json::Value, key: &str) -> Vec<f64> {
    v[key].as_array().unwrap_or_else(|| panic!("{key} missing")).iter().map(|x| x.as_f64().unwrap()).collect()
}

/// The dustoff binary built for this test run.
pub fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_dustoff"))
}

pub fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dustoff-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
